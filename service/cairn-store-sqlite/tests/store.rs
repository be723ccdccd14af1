//! The embedded store against the shared conformance suite, plus durability checks.

use cairn_store_sqlite::SqliteStore;

/// A store in a fresh temporary directory, removed when the test ends.
fn fresh_store() -> (SqliteStore, tempfile::TempDir) {
    let directory = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(directory.path()).expect("open store");
    (store, directory)
}

cairn_store_tests::conformance_suite!(fresh_store());

/// Commits one new fact of `text` to the scope and returns it.
async fn insert_fact(store: &SqliteStore, scope: &cairn_core::Scope, text: &str) -> cairn_core::Fact {
    use cairn_core::MemoryStore;
    let record = cairn_store_tests::fact(text, chrono::Utc::now());
    let event = cairn_store_tests::audit(scope, "fact.create");
    store
        .commit(
            scope,
            cairn_core::ChangeSet::new(event).with(cairn_core::Change::InsertFact(record.clone())),
        )
        .await
        .expect("commit");
    record
}

#[tokio::test]
async fn data_survives_reopening() {
    use cairn_core::MemoryStore;
    let directory = tempfile::tempdir().expect("temp dir");
    let scope = cairn_store_tests::scope("acme", "alice");
    let record = {
        let store = SqliteStore::open(directory.path()).expect("open");
        insert_fact(&store, &scope, "The user speaks Welsh").await
    };
    let reopened = SqliteStore::open(directory.path()).expect("reopen");
    let found = reopened.get_fact(&scope, &record.id).await.expect("get");
    assert_eq!(found.map(|fact| fact.text), Some(record.text));
}

/// The live store is owner-only whatever the umask: the data directory 0700, and the
/// database, its write-ahead log, its shared memory and the lock file 0600; a store
/// whose files an earlier release left readable is made owner-only when it opens.
#[cfg(unix)]
#[tokio::test]
async fn the_store_files_are_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let parent = tempfile::tempdir().expect("temp dir");
    let directory = parent.path().join("data");
    let mode = |name: &str| {
        let path = if name.is_empty() {
            directory.clone()
        } else {
            directory.join(name)
        };
        std::fs::metadata(&path)
            .map(|metadata| metadata.permissions().mode() & 0o777)
            .unwrap_or_else(|error| panic!("{}: {error}", path.display()))
    };
    let scope = cairn_store_tests::scope("acme", "alice");
    {
        let _lock = cairn_store_sqlite::lock_data_dir(&directory).expect("lock");
        let store = SqliteStore::open(&directory).expect("open");
        insert_fact(&store, &scope, "The user keeps a diary").await;
        for name in [
            "",
            "cairn.sqlite3",
            "cairn.sqlite3-wal",
            "cairn.sqlite3-shm",
            "cairn.lock",
        ] {
            let expected = if name.is_empty() { 0o700 } else { 0o600 };
            assert_eq!(mode(name), expected, "{name:?}: {:o}", mode(name));
        }
    }
    // As an earlier release left them, under a umask of 022.
    for name in ["cairn.sqlite3", "cairn.sqlite3-wal", "cairn.sqlite3-shm"] {
        let path = directory.join(name);
        if path.exists() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        }
    }
    std::fs::set_permissions(&directory, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let _reopened = SqliteStore::open(&directory).expect("reopen");
    assert_eq!(mode(""), 0o700);
    assert_eq!(mode("cairn.sqlite3"), 0o600);
}

/// Erased text is gone from the files, not only from queries: the database's freed
/// pages are zeroed and the write-ahead log holding their earlier images is truncated.
#[tokio::test]
async fn erased_text_leaves_the_database_and_its_log() {
    use cairn_core::MemoryStore;
    let (store, directory) = fresh_store();
    let scope = cairn_store_tests::scope("acme", "alice");
    let secret = "Quetzalcoatlus-7781";
    let record = cairn_store_tests::fact(
        &format!("The user's passphrase hint is {secret}"),
        chrono::Utc::now(),
    );
    let event = |action: &str| cairn_store_tests::audit(&scope, action);
    store
        .commit(
            &scope,
            cairn_core::ChangeSet::new(event("fact.create")).with(cairn_core::Change::InsertFact(record)),
        )
        .await
        .expect("commit");
    let files_hold = |needle: &str| {
        std::fs::read_dir(directory.path())
            .expect("list")
            .filter_map(|entry| std::fs::read(entry.ok()?.path()).ok())
            .any(|bytes| {
                bytes
                    .windows(needle.len())
                    .any(|window| window == needle.as_bytes())
            })
    };
    assert!(files_hold(secret), "the text is on disk before the erasure");
    store
        .erase_scope(&scope, event("user.erase"))
        .await
        .expect("erase");
    assert!(!files_hold(secret), "no file keeps the erased text");
}

#[tokio::test]
async fn upgrading_from_version_2_indexes_episode_context() {
    use cairn_core::{Change, ChangeSet, MemoryStore, SearchFilter, TextQuery, Tier};
    let directory = tempfile::tempdir().expect("temp dir");
    let scope = cairn_store_tests::scope("acme", "alice");
    let episode = cairn_store_tests::session_episode;
    let (question, reply) = (
        episode("Which marathon are you training for?"),
        episode("The one in Lisbon."),
    );
    {
        let store = SqliteStore::open(directory.path()).expect("open");
        let event = cairn_store_tests::audit(&scope, "episode.ingest");
        store
            .commit(
                &scope,
                ChangeSet::new(event).with(Change::InsertEpisodes(vec![question.clone(), reply.clone()])),
            )
            .await
            .expect("commit");
    }
    // Put the file back into its version 2 shape: a full-text table without context, jobs
    // without dead letters, scope state without audit keys or generations, no re-embedding.
    {
        let connection =
            rusqlite::Connection::open(directory.path().join("cairn.sqlite3")).expect("open file");
        connection
            .execute_batch(
                "CREATE TABLE saved AS SELECT rowid AS seq, text, scope_key FROM episodes_fts;
                 DROP TABLE episodes_fts;
                 DROP INDEX episodes_session;
                 CREATE VIRTUAL TABLE episodes_fts USING fts5 (text, scope_key, tokenize = 'porter unicode61 remove_diacritics 2');
                 INSERT INTO episodes_fts (rowid, text, scope_key) SELECT seq, text, scope_key FROM saved;
                 DROP TABLE saved;
                 DROP INDEX jobs_by_tenant;
                 ALTER TABLE jobs DROP COLUMN dead_at;
                 ALTER TABLE consolidation_state DROP COLUMN audit_key;
                 ALTER TABLE consolidation_state DROP COLUMN generation;
                 ALTER TABLE consolidation_state DROP COLUMN import_claim;
                 ALTER TABLE consolidation_state DROP COLUMN import_claimed_at;
                 ALTER TABLE consolidation_state DROP COLUMN runs_holder;
                 ALTER TABLE consolidation_state DROP COLUMN runs_until;
                 DROP TABLE used_once;
                 DROP TABLE reviews;
                 DROP TABLE reembedding;
                 DROP TRIGGER episodes_reembedding_deleted;
                 DROP TRIGGER episodes_reembedding_changed;
                 DROP TRIGGER facts_reembedding_deleted;
                 DROP TRIGGER facts_reembedding_changed;
                 DROP TRIGGER playbooks_reembedding_deleted;
                 DROP TRIGGER playbooks_reembedding_changed;
                 UPDATE schema_meta SET value = '2' WHERE key = 'version';",
            )
            .expect("downgrade");
    }
    let store = SqliteStore::open(directory.path()).expect("reopen and migrate");
    // The version 2 file was copied aside before the upgrade, whole.
    let copies: Vec<std::path::PathBuf> =
        std::fs::read_dir(directory.path().join(cairn_store_sqlite::UPGRADE_BACKUPS))
            .expect("backups directory")
            .filter_map(|entry| Some(entry.ok()?.path()))
            .collect();
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert!(
        copies[0].to_string_lossy().contains("cairn-schema-v2-"),
        "{copies:?}"
    );
    let copy = rusqlite::Connection::open(&copies[0]).expect("open the copy");
    let (version, episodes): (String, i64) = copy
        .query_row(
            "SELECT (SELECT value FROM schema_meta WHERE key = 'version'), (SELECT count(*) FROM episodes)",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .expect("read the copy");
    assert_eq!((version.as_str(), episodes), ("2", 2));
    let search = |text: &str| {
        TextQuery::new(
            SearchFilter {
                with_vectors: true,
                ..cairn_store_tests::current_in(Tier::Episodic)
            },
            text,
        )
    };
    let ids = |hits: Vec<cairn_core::TextHit>| -> Vec<String> {
        hits.into_iter().map(|hit| hit.memory.id().to_owned()).collect()
    };
    assert_eq!(
        ids(store
            .search_text(&scope, &search("marathon"))
            .await
            .expect("search")),
        vec![question.id.clone(), reply.id.clone()]
    );
    assert_eq!(
        ids(store
            .search_text(&scope, &search("Lisbon"))
            .await
            .expect("search")),
        vec![reply.id.clone(), question.id.clone()],
        "the question is indexed with the reply that followed it"
    );
}

/// BM25 applies currency before ranking: current facts that score below thousands of
/// expired ones are still the hits.
#[tokio::test]
async fn current_facts_below_many_stale_matches_are_found() {
    use cairn_core::{Change, ChangeSet, MemoryStore, SearchFilter, TextQuery, Tier};
    let (store, _directory) = fresh_store();
    let scope = cairn_store_tests::scope("acme", "alice");
    let now = chrono::Utc::now();
    let audit = || cairn_store_tests::audit(&scope, "fact.create");
    let current: Vec<cairn_core::Fact> = ["The user drinks tea with lemon", "The user buys tea in bulk"]
        .iter()
        .map(|text| cairn_store_tests::fact(text, now - chrono::Duration::hours(1)))
        .collect();
    let search_after = |stale: usize| {
        let store = store.clone();
        let scope = scope.clone();
        let current = current.clone();
        async move {
            let mut changes = ChangeSet::new(audit());
            for index in 0..stale {
                let mut fact =
                    cairn_store_tests::fact(&format!("tea tea {index}"), now - chrono::Duration::hours(2));
                fact.expires_at = Some(now - chrono::Duration::minutes(30));
                changes = changes.with(Change::InsertFact(fact));
            }
            store.commit(&scope, changes).await.expect("insert stale facts");
            let filter = SearchFilter {
                as_of: now,
                limit: 2,
                with_vectors: true,
                ..cairn_store_tests::current_in(Tier::Semantic)
            };
            let mut found: Vec<String> = store
                .search_text(&scope, &TextQuery::new(filter, "tea"))
                .await
                .expect("search")
                .into_iter()
                .map(|hit| hit.memory.id().to_owned())
                .collect();
            found.sort();
            let mut expected: Vec<String> = current.iter().map(|fact| fact.id.clone()).collect();
            expected.sort();
            assert_eq!(found, expected, "after {stale} stale facts");
        }
    };
    let mut changes = ChangeSet::new(audit());
    for fact in &current {
        changes = changes.with(Change::InsertFact(fact.clone()));
    }
    store.commit(&scope, changes).await.expect("insert current facts");
    search_after(100).await;
    search_after(5_000).await;
}

/// Rows are numbered across tenants; page cursors must not reveal that numbering (how
/// many rows other tenants wrote between two pages), and one scope's cursor is refused
/// in another.
#[tokio::test]
async fn page_cursors_reveal_nothing_of_other_scopes() {
    use cairn_core::{Change, ChangeSet, Error, MemoryStore, PageRequest, StatusFilter};
    let (store, _directory) = fresh_store();
    let alice = cairn_store_tests::scope("acme", "alice");
    let mallory = cairn_store_tests::scope("evil", "alice");
    let event = |scope: &cairn_core::Scope| cairn_store_tests::audit(scope, "fact.create");
    let write = |scope: cairn_core::Scope, text: String| {
        let store = store.clone();
        async move {
            let fact = cairn_store_tests::fact(&text, chrono::Utc::now());
            store
                .commit(
                    &scope,
                    ChangeSet::new(event(&scope)).with(Change::InsertFact(fact)),
                )
                .await
                .expect("write");
        }
    };
    write(alice.clone(), "first".into()).await;
    for index in 0..50 {
        write(mallory.clone(), format!("noise {index}")).await;
    }
    write(alice.clone(), "second".into()).await;
    write(alice.clone(), "third".into()).await;
    let page = |cursor: Option<String>| PageRequest { limit: 1, cursor };
    let mut cursors = Vec::new();
    let mut texts = Vec::new();
    let mut cursor = None;
    loop {
        let listed = store
            .list_facts(
                &alice,
                StatusFilter::All,
                chrono::Utc::now(),
                &page(cursor.clone()),
            )
            .await
            .expect("page");
        texts.extend(listed.items.iter().map(|fact| fact.text.clone()));
        match listed.next_cursor {
            Some(next) => {
                cursors.push(next.clone());
                cursor = Some(next);
            }
            None => break,
        }
    }
    assert_eq!(texts, ["third", "second", "first"]);
    for cursor in &cursors {
        assert!(cursor.parse::<i64>().is_err(), "not a row number: {cursor}");
        match store
            .list_facts(
                &mallory,
                StatusFilter::All,
                chrono::Utc::now(),
                &page(Some(cursor.clone())),
            )
            .await
        {
            Err(Error::Invalid { field, .. }) => assert_eq!(field, "cursor"),
            other => panic!("another scope's cursor was accepted: {other:?}"),
        }
    }
}

/// A backup taken while writes go on holds every write acknowledged before it began,
/// and restores into another directory as a working store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_writes_restores_every_acknowledged_write() {
    use cairn_core::MemoryStore;
    use std::sync::{Arc, Mutex};
    let (store, directory) = fresh_store();
    let scope = cairn_store_tests::scope("acme", "alice");
    let acknowledged = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (store, scope, acknowledged, stop) =
            (store.clone(), scope.clone(), acknowledged.clone(), stop.clone());
        tokio::spawn(async move {
            let mut index = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                index += 1;
                let record = insert_fact(&store, &scope, &format!("The user owns {index} books")).await;
                acknowledged.lock().expect("list").push(record.id);
            }
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let before: Vec<String> = acknowledged.lock().expect("list").clone();
    let target = directory.path().join("copy.sqlite3");
    let report = {
        let (data, target) = (directory.path().to_owned(), target.clone());
        tokio::task::spawn_blocking(move || cairn_store_sqlite::backup(&data, &target))
            .await
            .expect("join")
            .expect("backup")
    };
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    writer.await.expect("writer");
    assert!(before.len() > 5, "writes went on: {}", before.len());
    assert_eq!(report.schema_version, 8);
    // The copy was staged in an owner-only directory of its own, removed after.
    let staged: Vec<String> = std::fs::read_dir(directory.path())
        .expect("list")
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.contains(".partial"))
        .collect();
    assert!(staged.is_empty(), "{staged:?}");
    assert!(report.bytes > 0);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&target).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the backup holds secrets");
    }
    let refused = cairn_store_sqlite::backup(directory.path(), &target).expect_err("no overwrite");
    assert!(refused.to_string().contains("already exists"), "{refused}");

    let elsewhere = tempfile::tempdir().expect("temp dir");
    let restored = cairn_store_sqlite::restore(elsewhere.path(), &target).expect("restore");
    assert_eq!(restored.replaced, None);
    let copy = SqliteStore::open(elsewhere.path()).expect("open the restored store");
    for id in &before {
        assert!(
            copy.get_fact(&scope, id).await.expect("get").is_some(),
            "{id} was acknowledged before the backup"
        );
    }
}

/// A restore refuses a directory another process holds, and files that are not a sound
/// store; otherwise it keeps the store it replaces beside the restored one.
#[tokio::test]
async fn a_restore_refuses_a_store_in_use_and_keeps_what_it_replaces() {
    use cairn_core::MemoryStore;
    let source = tempfile::tempdir().expect("temp dir");
    let scope = cairn_store_tests::scope("acme", "alice");
    let record = {
        let store = SqliteStore::open(source.path()).expect("open");
        insert_fact(&store, &scope, "The user plays the oboe").await
    };
    let backup = source.path().join("backup.sqlite3");
    cairn_store_sqlite::backup(source.path(), &backup).expect("backup");

    let (target_store, target) = fresh_store();
    drop(target_store);
    let before = std::fs::read(target.path().join("cairn.sqlite3")).expect("read");
    {
        let _serving = cairn_store_sqlite::lock_data_dir(target.path()).expect("lock");
        let refused = cairn_store_sqlite::restore(target.path(), &backup).expect_err("in use");
        assert_eq!(refused.code(), "store_in_use", "{refused}");
        assert_eq!(
            std::fs::read(target.path().join("cairn.sqlite3")).expect("read"),
            before
        );
    }
    let garbage = source.path().join("garbage");
    std::fs::write(&garbage, b"not a database at all, just some bytes").expect("write");
    // A store of a schema this build does not know yet: neither restored nor opened.
    let newer = source.path().join("newer.sqlite3");
    std::fs::copy(&backup, &newer).expect("copy");
    rusqlite::Connection::open(&newer)
        .and_then(|connection| {
            connection.execute("UPDATE schema_meta SET value = '99' WHERE key = 'version'", [])
        })
        .expect("mark newer");
    let newer_store = tempfile::tempdir().expect("temp dir");
    std::fs::copy(&newer, newer_store.path().join("cairn.sqlite3")).expect("copy");
    let refused = SqliteStore::open(newer_store.path())
        .err()
        .expect("a newer schema is refused");
    assert!(refused.to_string().contains("newer Cairn"), "{refused}");
    for bad in [garbage, newer, source.path().join("missing")] {
        let refused = cairn_store_sqlite::restore(target.path(), &bad).expect_err("refused");
        assert_eq!(refused.code(), "invalid_request", "{refused}");
    }
    assert_eq!(
        std::fs::read(target.path().join("cairn.sqlite3")).expect("read"),
        before
    );

    let report = cairn_store_sqlite::restore(target.path(), &backup).expect("restore");
    let aside = report.replaced.expect("the replaced store is kept");
    assert_eq!(std::fs::read(&aside).expect("read aside"), before);
    let restored = SqliteStore::open(target.path()).expect("open");
    assert!(
        restored
            .get_fact(&scope, &record.id)
            .await
            .expect("get")
            .is_some()
    );
}
