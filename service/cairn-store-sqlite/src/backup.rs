//! Online backup and offline restore of the embedded store, the lock that tells a
//! store in use from one at rest, and the backup taken before a schema upgrade.
//!
//! A backup is `VACUUM INTO` a new file: one read transaction, so it is a consistent
//! snapshot of every commit before it began, taken while the service goes on writing
//! (WAL readers never block the writer). A restore replaces the database file while
//! nothing has it open, keeping the replaced files beside it.

use crate::{DATABASE_FILE, schema, storage};
use cairn_core::{Error, Result};
use rusqlite::{Connection, OpenFlags, OptionalExtension};
use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

const LOCK_FILE: &str = "cairn.lock";
/// Where backups taken before a schema upgrade go, inside the data directory.
pub const UPGRADE_BACKUPS: &str = "backups";

/// An exclusive hold on a data directory: `cairn serve` keeps one while it runs, and
/// a restore takes one, so neither can happen under the other. Released on drop (or
/// when the process ends, however it ends).
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
}

/// Takes the data directory's lock, or says that another process holds it.
pub fn lock_data_dir(data_dir: &Path) -> Result<DataDirLock> {
    std::fs::create_dir_all(data_dir).map_err(|error| io(data_dir, &error))?;
    let path = data_dir.join(LOCK_FILE);
    let mut options = OpenOptions::new();
    options.create(true).truncate(false).write(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let file = options.open(&path).map_err(|error| io(&path, &error))?;
    match file.try_lock() {
        Ok(()) => Ok(DataDirLock { _file: file }),
        Err(TryLockError::WouldBlock) => Err(Error::Conflict {
            code: cairn_core::ErrorCode::StoreInUse,
            message: format!(
                "the store in {} is in use by another process (a running `cairn serve`?)",
                data_dir.display()
            ),
        }),
        Err(TryLockError::Error(error)) => Err(io(&path, &error)),
    }
}

/// What a backup wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupReport {
    pub bytes: u64,
    pub schema_version: i64,
}

/// Writes a consistent copy of the store in `data_dir` to `to`, which must not exist.
/// The copy is made under a temporary name beside `to`, checked, and renamed into
/// place, readable by its owner only (it holds the store's secrets).
pub fn backup(data_dir: &Path, to: &Path) -> Result<BackupReport> {
    let database = data_dir.join(DATABASE_FILE);
    if !database.is_file() {
        return Err(Error::invalid(
            "CAIRN_DATA_DIR",
            format!("no embedded store at {}", database.display()),
        ));
    }
    if to.exists() {
        return Err(Error::invalid("--to", format!("{} already exists", to.display())));
    }
    let source = Connection::open_with_flags(&database, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(storage)?;
    source
        .busy_timeout(std::time::Duration::from_secs(30))
        .map_err(storage)?;
    // The copy is written in a directory of its own, owner-only, beside `to`: in a
    // directory other local users may write to, none of them can swap the file for a
    // link between its creation and the copy into it.
    let staging = private_directory_beside(to)?;
    let partial = staging.join("backup.sqlite3");
    let checked = copy_into(&source, &partial)
        .and_then(|()| check(&partial))
        .and_then(|version| {
            std::fs::rename(&partial, to).map_err(|error| io(to, &error))?;
            Ok(version)
        });
    let _ = std::fs::remove_dir_all(&staging);
    let schema_version = checked?;
    Ok(BackupReport {
        bytes: std::fs::metadata(to).map_err(|error| io(to, &error))?.len(),
        schema_version,
    })
}

/// A new directory beside `path` (`<path>.partial-<pid>-<nanos>`), created, never
/// reused, readable by its owner only.
fn private_directory_beside(path: &Path) -> Result<PathBuf> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or_default();
    let mut name = partial_name(path).into_os_string();
    name.push(format!("-{}-{nanos}", std::process::id()));
    let directory = PathBuf::from(name);
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder
        .create(&directory)
        .map_err(|error| io(&directory, &error))?;
    Ok(directory)
}

/// What a restore did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreReport {
    pub schema_version: i64,
    /// Where the database that was replaced now is, if there was one.
    pub replaced: Option<PathBuf>,
}

/// Makes the backup `from` the store of `data_dir`. Refuses while another process holds
/// the directory, and refuses a file that is not a sound Cairn store of a schema this
/// build knows. A store already there is kept beside it, renamed with the time.
pub fn restore(data_dir: &Path, from: &Path) -> Result<RestoreReport> {
    let _lock = lock_data_dir(data_dir)?;
    let schema_version = check(from)?;
    let database = data_dir.join(DATABASE_FILE);
    let incoming = partial_name(&database);
    let _ = std::fs::remove_file(&incoming);
    std::fs::copy(from, &incoming).map_err(|error| io(&incoming, &error))?;
    private(&incoming)?;
    File::open(&incoming)
        .and_then(|file| file.sync_all())
        .map_err(|error| io(&incoming, &error))?;
    let replaced = if database.exists() {
        let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
        let aside = data_dir.join(format!("{DATABASE_FILE}.replaced-{stamp}"));
        // The write-ahead log belongs to the database it was written for: it moves with
        // it, or its pages would be replayed into the restored file.
        for suffix in ["", "-wal", "-shm"] {
            let from = PathBuf::from(format!("{}{suffix}", database.display()));
            if from.exists() {
                let to = PathBuf::from(format!("{}{suffix}", aside.display()));
                std::fs::rename(&from, &to).map_err(|error| io(&from, &error))?;
            }
        }
        Some(aside)
    } else {
        None
    };
    std::fs::rename(&incoming, &database).map_err(|error| io(&database, &error))?;
    File::open(data_dir)
        .and_then(|directory| directory.sync_all())
        .map_err(|error| io(data_dir, &error))?;
    Ok(RestoreReport {
        schema_version,
        replaced,
    })
}

/// Copies the open store of `connection` to a new file in `data_dir`'s backup
/// directory before its schema is upgraded from `version`; returns the file.
pub(crate) fn before_upgrade(connection: &Connection, data_dir: &Path, version: i64) -> Result<PathBuf> {
    let directory = data_dir.join(UPGRADE_BACKUPS);
    std::fs::create_dir_all(&directory).map_err(|error| io(&directory, &error))?;
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%S%.6fZ");
    let path = directory.join(format!("cairn-schema-v{version}-{stamp}.sqlite3"));
    let partial = partial_name(&path);
    copy_into(connection, &partial)?;
    std::fs::rename(&partial, &path).map_err(|error| io(&path, &error))?;
    Ok(path)
}

/// `VACUUM INTO` a new file made readable by its owner only before anything is in it.
fn copy_into(connection: &Connection, path: &Path) -> Result<()> {
    let _ = std::fs::remove_file(path);
    let file = create_private(path)?;
    drop(file);
    let target = path
        .to_str()
        .ok_or_else(|| Error::invalid("path", format!("{} is not UTF-8", path.display())))?;
    connection
        .execute("VACUUM INTO ?1", [target])
        .map(|_| ())
        .map_err(|error| {
            let _ = std::fs::remove_file(path);
            storage(error)
        })
}

/// Opens a backup read-only and checks it: SQLite's quick check, and a schema version
/// this build can open. Returns the version.
fn check(path: &Path) -> Result<i64> {
    let refuse = |reason: String| Error::invalid("backup", format!("{}: {reason}", path.display()));
    if !path.is_file() {
        return Err(refuse("no such file".into()));
    }
    let connection = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(storage)?;
    let verdict: String = connection
        .query_row("PRAGMA quick_check", [], |row| row.get(0))
        .map_err(|error| refuse(format!("not a readable database ({error})")))?;
    if verdict != "ok" {
        return Err(refuse(format!("damaged ({verdict})")));
    }
    let version: Option<String> = connection
        .query_row("SELECT value FROM schema_meta WHERE key = 'version'", [], |row| {
            row.get(0)
        })
        .optional()
        .map_err(|_| refuse("not a Cairn store (no schema_meta)".into()))?;
    let version = version
        .and_then(|value| value.parse::<i64>().ok())
        .ok_or_else(|| refuse("not a Cairn store (no schema version)".into()))?;
    if version > schema::SCHEMA_VERSION {
        return Err(refuse(format!(
            "written by a newer Cairn (schema {version}; this build knows up to {})",
            schema::SCHEMA_VERSION
        )));
    }
    Ok(version)
}

fn partial_name(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

fn create_private(path: &Path) -> Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path).map_err(|error| io(path, &error))
}

fn private(path: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|error| io(path, &error))?;
    }
    Ok(())
}

/// Makes the data directory and the database owner-only whatever the umask: the
/// directory 0700 (left as it is, with a warning, when this process may not change it,
/// as on a volume another user owns), the database file created 0600 or made so, and
/// its write-ahead log and shared memory 0600 where they exist (SQLite creates them
/// with the database file's mode).
pub(crate) fn keep_private(data_dir: &Path, database: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Err(error) = std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(0o700)) {
            tracing::warn!(
                directory = %data_dir.display(),
                error = %error,
                "cannot make the data directory owner-only; keep it from other local users"
            );
        }
        if !database.exists() {
            match create_private(database) {
                Ok(_) => {}
                // Created meanwhile by another opener: made private below.
                Err(_) if database.exists() => {}
                Err(error) => return Err(error),
            }
        }
        for suffix in ["", "-wal", "-shm"] {
            let mut name = database.as_os_str().to_owned();
            name.push(suffix);
            let file = PathBuf::from(name);
            if file.exists() {
                private(&file)?;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = (data_dir, database);
    Ok(())
}

fn io(path: &Path, error: &std::io::Error) -> Error {
    Error::Unavailable(format!("{}: {error}", path.display()))
}
