//! The `cairn` command line: serve, mint tokens, bootstrap storage, back up and restore,
//! export and import users.

use actix_web::{HttpServer, web};
use anyhow::Context;
use cairn_server::auth::{MintRequest, mint, mint_login_ticket, parse_ttl};
use cairn_server::cli::{Cli, Command, DashboardsCommand, TokenCommand};
use cairn_server::config::{Backend, Config};
use cairn_server::{
    build_state, cluster_store, http, open_store, spawn_consolidation_worker, spawn_maintenance, telemetry,
};
use clap::Parser;

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("cairn: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Installs or checks the storage: the embedded schema, or the search cluster's index
/// templates and indices (idempotent; a mapping mismatch is an error naming the index).
fn bootstrap(config: &Config) -> anyhow::Result<()> {
    match config.backend {
        Backend::Embedded => {
            // Opening may upgrade the schema: never under a running service.
            let _lock = cairn_store_sqlite::lock_data_dir(&config.data_dir)
                .context("stop the service first: it upgrades the store itself when it starts")?;
            open_store(config)?;
            println!("storage is ready (embedded, {})", config.data_dir.display());
            Ok(())
        }
        Backend::Opensearch | Backend::Elasticsearch => {
            let store = cluster_store(config)?;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let report = runtime
                .block_on(store.bootstrap())
                .map_err(|error| anyhow::anyhow!("CAIRN_CLUSTER_URL: {error}"))?;
            println!(
                "storage is ready ({} {}, prefix {}): {} indices created, {} already in place",
                store.engine().as_str(),
                store.version(),
                config.index_prefix,
                report.created.len(),
                report.existing.len()
            );
            println!("text analysis: {}", report.analysis.describe());
            println!(
                "replicas: {} per index ({}; {} data node{})",
                report.replicas,
                if report.replicas_configured {
                    "CAIRN_CLUSTER_REPLICAS"
                } else {
                    "1 on several data nodes, 0 on one"
                },
                report.data_nodes,
                if report.data_nodes == 1 { "" } else { "s" }
            );
            if !report.extended.is_empty() {
                println!(
                    "fields added to {} ({} older documents given their stems)",
                    report.extended.join(", "),
                    report.backfilled
                );
            }
            if report.recorded > 0 {
                println!(
                    "{} older documents given the record recall reads from doc values",
                    report.recorded
                );
            }
            if !report.records_in_source.is_empty() {
                println!(
                    "records also kept in _source by {} (made by an earlier version): their sources are larger, recall is not slower",
                    report.records_in_source.join(", ")
                );
            }
            if !report.vectors_in_source.is_empty() {
                println!(
                    "vectors kept in _source by {} (made by an earlier version): recall reads more per hit; \
                     `cairn export` and `cairn import` of each user into a new CAIRN_INDEX_PREFIX move them to the current layout",
                    report.vectors_in_source.join(", ")
                );
            }
            Ok(())
        }
    }
}

/// Asks the service listening on `CAIRN_LISTEN` (on loopback when it listens on every
/// address) whether it is ready: one plain HTTP/1.1 request to `/readyz`.
fn healthcheck(config: &Config, timeout: std::time::Duration) -> anyhow::Result<()> {
    use std::io::Write;
    use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
    let mut address: SocketAddr = config
        .listen
        .to_socket_addrs()
        .context("CAIRN_LISTEN")?
        .next()
        .with_context(|| format!("CAIRN_LISTEN: {} names no address", config.listen))?;
    if address.ip().is_unspecified() {
        address.set_ip(match address {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let mut stream = TcpStream::connect_timeout(&address, timeout)
        .with_context(|| format!("nothing answers on {address}"))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let request = format!("GET /readyz HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    let mut answer = Vec::new();
    match &config.tls_cert {
        // The listener speaks HTTPS: whichever certificate it serves (see `loopback_client`).
        Some(_) => {
            let client = std::sync::Arc::new(cairn_server::tls::loopback_client()?);
            let name = rustls::pki_types::ServerName::try_from("localhost")?;
            let connection = rustls::ClientConnection::new(client, name)?;
            let mut tls = rustls::StreamOwned::new(connection, stream);
            tls.write_all(request.as_bytes())
                .with_context(|| format!("no TLS handshake with {address}"))?;
            read_answer(&mut tls, &mut answer, address)?;
        }
        None => {
            stream.write_all(request.as_bytes())?;
            read_answer(&mut stream, &mut answer, address)?;
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    let status = answer.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) == Some("200") {
        println!("ready");
        Ok(())
    } else {
        let detail = answer.split("\r\n\r\n").nth(1).unwrap_or_default().trim();
        anyhow::bail!("not ready ({status}): {detail}")
    }
}

/// Reads a response until the server closes the connection (a TLS peer may close
/// without a notify alert once it has answered, which is not an error here).
fn read_answer(
    stream: &mut impl std::io::Read,
    answer: &mut Vec<u8>,
    address: std::net::SocketAddr,
) -> anyhow::Result<()> {
    let mut buffer = [0u8; 8192];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return Ok(()),
            Ok(read) if answer.len() < 64 * 1024 => answer.extend_from_slice(&buffer[..read]),
            Ok(_) => return Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof && !answer.is_empty() => {
                return Ok(());
            }
            Err(error) => return Err(anyhow::anyhow!("{address} did not answer: {error}")),
        }
    }
}

/// Backups are of the embedded store; a search cluster has its own snapshots.
fn embedded_only(config: &Config, command: &str) -> anyhow::Result<()> {
    match config.backend {
        Backend::Embedded => Ok(()),
        Backend::Opensearch | Backend::Elasticsearch => anyhow::bail!(
            "`cairn {command}` works on the embedded store; back up a search cluster with its \
             snapshot API (see docs/src/operators/backup.md)"
        ),
    }
}

fn backup(config: &Config, to: &std::path::Path) -> anyhow::Result<()> {
    embedded_only(config, "backup")?;
    let started = std::time::Instant::now();
    let report = cairn_store_sqlite::backup(&config.data_dir, to)?;
    println!(
        "backed up {} ({} bytes, schema {}) to {} in {:.1} s",
        config.data_dir.display(),
        report.bytes,
        report.schema_version,
        to.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn restore(config: &Config, from: &std::path::Path) -> anyhow::Result<()> {
    embedded_only(config, "restore")?;
    let report = cairn_store_sqlite::restore(&config.data_dir, from)?;
    // Opening brings an older backup's schema up to date (copying it aside first).
    open_store(config)?;
    match &report.replaced {
        Some(aside) => println!(
            "restored {} (schema {}) into {}; the store it replaced is {}",
            from.display(),
            report.schema_version,
            config.data_dir.display(),
            aside.display()
        ),
        None => println!(
            "restored {} (schema {}) into {}",
            from.display(),
            report.schema_version,
            config.data_dir.display()
        ),
    }
    Ok(())
}

/// The use cases over the configured store, for a command run by the operator. The
/// embedded store is taken for the command's lifetime: a running service keeps its own
/// caches of it, so while it runs, its REST routes are the way in.
struct Local {
    runtime: tokio::runtime::Runtime,
    cairn: cairn_app::Cairn,
    _lock: Option<cairn_store_sqlite::DataDirLock>,
}

fn local(config: &Config, route: &str) -> anyhow::Result<Local> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (store, lock): (std::sync::Arc<dyn cairn_core::MemoryStore>, _) = match config.backend {
        Backend::Embedded => {
            let lock = cairn_store_sqlite::lock_data_dir(&config.data_dir)
                .with_context(|| format!("while the service runs, use {route}"))?;
            (open_store(config)?, Some(lock))
        }
        Backend::Opensearch | Backend::Elasticsearch => {
            let store = cluster_store(config)?;
            runtime
                .block_on(store.bootstrap())
                .map_err(|error| anyhow::anyhow!("CAIRN_CLUSTER_URL: {error}"))?;
            (std::sync::Arc::new(store), None)
        }
    };
    let cairn = cairn_server::build_cairn(config, store)?;
    runtime
        .block_on(cairn.claim_embedding_space())
        .context("CAIRN_EMBEDDING_MODEL_DIR")?;
    Ok(Local {
        runtime,
        cairn,
        _lock: lock,
    })
}

/// `cairn reembed`: beside a running service on the embedded store (which keeps its
/// lock and leases), or against a search cluster.
fn reembed(config: &Config, batch: usize) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let store: std::sync::Arc<dyn cairn_core::MemoryStore> = match config.backend {
        Backend::Embedded => std::sync::Arc::new(
            cairn_store_sqlite::SqliteStore::open_beside_service(&config.data_dir)
                .map_err(|error| anyhow::anyhow!("CAIRN_DATA_DIR: {error}"))?,
        ),
        Backend::Opensearch | Backend::Elasticsearch => std::sync::Arc::new(cluster_store(config)?),
    };
    let cairn = cairn_server::build_cairn(config, store)?;
    let started = std::time::Instant::now();
    let mut last_line = std::time::Instant::now() - std::time::Duration::from_secs(1);
    let finished = runtime.block_on(cairn.reembed(batch, |progress| {
        if last_line.elapsed() < std::time::Duration::from_millis(500) && progress.built < progress.total {
            return;
        }
        last_line = std::time::Instant::now();
        eprint!("\r{}", progress_line(progress, started.elapsed()));
    }))?;
    eprintln!();
    println!(
        "the store's vectors are now {} ({} records, {:.1} s); restart the service with CAIRN_EMBEDDING_MODEL={}",
        finished.target,
        finished.built,
        started.elapsed().as_secs_f64(),
        finished.target.split('/').next().unwrap_or(&finished.target)
    );
    Ok(())
}

/// `re-embedding [#####.....]  1,200 / 10,000  12%  310 records/s  eta 28 s`
fn progress_line(progress: &cairn_app::ReembedProgress, elapsed: std::time::Duration) -> String {
    const WIDTH: u64 = 30;
    let total = progress.total.max(1);
    let done = progress.built.min(total);
    let filled = usize::try_from(done * WIDTH / total).unwrap_or(0);
    let rate = progress.this_run as f64 / elapsed.as_secs_f64().max(1e-3);
    let left = total - done;
    let eta = if rate > 0.0 {
        format!("{:.0} s", left as f64 / rate)
    } else {
        "-".to_owned()
    };
    format!(
        "re-embedding [{}{}] {done} / {total}  {}%  {rate:.0} records/s  eta {eta}   ",
        "#".repeat(filled),
        ".".repeat(usize::try_from(WIDTH).unwrap_or(30) - filled),
        done * 100 / total
    )
}

fn operator_scope(tenant: &str, user: &str) -> anyhow::Result<cairn_core::Scope> {
    let principal = cairn_server::auth::local_operator(tenant, "operator")?;
    principal
        .scope_for(user, cairn_core::Permission::Admin)
        .map_err(|error| anyhow::anyhow!("--user: {error}"))
}

fn export(config: &Config, tenant: &str, user: &str, out: Option<&std::path::Path>) -> anyhow::Result<()> {
    let scope = operator_scope(tenant, user)?;
    let local = local(config, "GET /v1/users/{user}/export")?;
    let document = local.runtime.block_on(local.cairn.export_scope(&scope))?;
    let text = serde_json::to_string_pretty(&document)?;
    match out {
        Some(path) => {
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            let mut file = options
                .open(path)
                .with_context(|| format!("--out: cannot create {}", path.display()))?;
            std::io::Write::write_all(&mut file, text.as_bytes())?;
            file.sync_all()?;
            eprintln!(
                "exported {} episodes, {} facts, {} playbooks, {} tombstones and {} decisions to {}",
                document.episodes.len(),
                document.facts.len(),
                document.playbooks.len(),
                document.tombstones.len(),
                document.decisions.len(),
                path.display()
            );
        }
        None => println!("{text}"),
    }
    Ok(())
}

fn import(
    config: &Config,
    tenant: &str,
    user: &str,
    from: &std::path::Path,
    format: &str,
) -> anyhow::Result<()> {
    let scope = operator_scope(tenant, user)?;
    let text = std::fs::read(from).with_context(|| format!("--from: cannot read {}", from.display()))?;
    let context = cairn_app::RequestContext {
        request_id: format!("cli_{}", cairn_core::new_id("req")),
    };
    let report = match format {
        "cairn" => {
            let document: cairn_app::ScopeExport = serde_json::from_slice(&text)
                .with_context(|| format!("{} is not a Cairn export", from.display()))?;
            let local = local(config, "POST /v1/users/{user}/import")?;
            let report = local
                .runtime
                .block_on(local.cairn.import_scope(&scope, &context, document))?;
            serde_json::to_value(report)?
        }
        "mem0" => {
            let document: cairn_app::Mem0Document = serde_json::from_slice(&text)
                .with_context(|| format!("{} is not a mem0 get_all document", from.display()))?;
            let local = local(config, "POST /v1/users/{user}/import?format=mem0")?;
            let report = local
                .runtime
                .block_on(local.cairn.import_mem0(&scope, &context, document))?;
            serde_json::to_value(report)?
        }
        other => anyhow::bail!("--format: must be cairn or mem0, not {other:?}"),
    };
    println!("{}", serde_json::json!({ "format": format, "imported": report }));
    Ok(())
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let config = Config::load(cli.config.as_deref())?;
    match cli.command {
        Command::Serve => serve(config),
        Command::Bootstrap => bootstrap(&config),
        Command::Healthcheck { timeout } => {
            healthcheck(&config, std::time::Duration::from_secs(timeout.max(1)))
        }
        Command::Backup { to } => backup(&config, &to),
        Command::Reembed { batch } => reembed(&config, batch),
        Command::Restore { from } => restore(&config, &from),
        Command::Export { tenant, user, out } => export(&config, &tenant, &user, out.as_deref()),
        Command::Dashboards {
            command: DashboardsCommand::Export { target, out },
        } => {
            let target = cairn_server::dashboards::Target::parse(&target)?;
            let objects = cairn_server::dashboards::export(target, &config.index_prefix);
            match out {
                Some(path) => {
                    std::fs::write(&path, objects).with_context(|| format!("cannot write {}", path.display()))
                }
                None => {
                    print!("{objects}");
                    Ok(())
                }
            }
        }
        Command::Import {
            tenant,
            user,
            from,
            format,
        } => import(&config, &tenant, &user, &from, &format),
        Command::Token {
            command:
                TokenCommand::Mint {
                    tenant,
                    scope,
                    user,
                    ttl,
                    sub,
                    private_key,
                    ui,
                    url,
                },
        } => {
            let private_key = private_key
                .map(|path| {
                    std::fs::read(&path)
                        .with_context(|| format!("--private-key: cannot read {}", path.display()))
                })
                .transpose()?;
            // Without a configured secret, a development server's generated one is used.
            let secret = config
                .jwt_secrets()
                .first()
                .map(|secret| (*secret).to_owned())
                .or_else(|| {
                    std::fs::read_to_string(config.dev_secret_path())
                        .ok()
                        .map(|secret| secret.trim().to_owned())
                });
            let request = MintRequest {
                subject: sub,
                tenant,
                scopes: scope
                    .split(|c: char| c == ',' || c.is_whitespace())
                    .filter(|part| !part.is_empty())
                    .map(str::to_owned)
                    .collect(),
                user,
                ttl_seconds: parse_ttl(&ttl)?,
                // The server accepts any audience and issuer of its lists: the first.
                audience: cairn_server::auth::list(config.jwt_audience.as_deref())
                    .into_iter()
                    .next(),
                issuer: cairn_server::auth::list(config.jwt_issuer.as_deref())
                    .into_iter()
                    .next(),
            };
            let longest = i64::try_from(config.jwt_max_ttl_seconds).unwrap_or(i64::MAX);
            if longest > 0 && request.ttl_seconds > longest {
                anyhow::bail!(
                    "--ttl: the server accepts tokens of at most {longest} s (CAIRN_JWT_MAX_TTL_SECONDS); ask for less"
                );
            }
            if ui {
                let ticket = mint_login_ticket(&request, secret.as_deref(), private_key.as_deref())?;
                let scheme = if config.tls_cert.is_some() {
                    "https"
                } else {
                    "http"
                };
                let base = url.unwrap_or_else(|| format!("{scheme}://{}", config.listen));
                // The ticket rides in the fragment, which browsers never send to a server.
                println!("{}/ui#ticket={ticket}", base.trim_end_matches('/'));
            } else {
                println!("{}", mint(&request, secret.as_deref(), private_key.as_deref())?);
            }
            Ok(())
        }
    }
}

fn serve(config: Config) -> anyhow::Result<()> {
    let telemetry = telemetry::init(&config)?;
    // The embedded store belongs to this process while it serves: a second server or a
    // restore on the same directory is refused instead of corrupting it.
    let _lock = match config.backend {
        Backend::Embedded => {
            Some(cairn_store_sqlite::lock_data_dir(&config.data_dir).context("CAIRN_DATA_DIR")?)
        }
        Backend::Opensearch | Backend::Elasticsearch => None,
    };
    let listen = config.listen.clone();
    let workers = config.workers;
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(certificate), Some(key)) => Some(cairn_server::tls::server_config(certificate, key)?),
        _ => None,
    };
    tracing::info!(listen = %listen, backend = ?config.backend, data_dir = %config.data_dir.display(), "cairn starting");
    let result = actix_web::rt::System::new().block_on(async move {
        let state = web::Data::new(build_state(&config).await?);
        let worker = config
            .consolidation_worker
            .then(|| spawn_consolidation_worker(state.clone()));
        spawn_maintenance(state.clone());
        let serving = state.clone();
        let grace = std::time::Duration::from_secs(config.shutdown_grace_seconds);
        let server = HttpServer::new(move || http::app(serving.clone()))
            .workers(workers)
            .shutdown_timeout(config.shutdown_grace_seconds);
        let server = match &tls {
            Some(tls) => server.bind_rustls_0_23(&listen, tls.clone()),
            None => server.bind(&listen),
        }
        .with_context(|| format!("CAIRN_LISTEN: cannot bind {listen}"))?;
        let served = server.run().await.context("server failed");
        // SIGTERM (a rolling update): no new job is taken; the run in progress finishes
        // within the grace, or its job is given back, due at once, for another replica.
        if let Some(worker) = worker {
            worker.stop(&state, grace).await;
        }
        // Use counts noted since the last flush are written before the process ends.
        if let Err(error) = state.cairn.flush_usage().await {
            tracing::warn!(error = %error, "writing the last use counts failed");
        }
        served
    });
    tracing::info!("cairn stopped");
    telemetry.shutdown();
    result
}
