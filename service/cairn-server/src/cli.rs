//! The `cairn` command line's arguments (the binary in `main.rs` runs them; the
//! reference page is rendered from them).

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "cairn", version, about = "Multi-tenant memory service for AI agents")]
pub struct Cli {
    /// A TOML configuration file (environment variables override it).
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Start the service (REST on one port).
    Serve,
    /// Create or upgrade the storage of the configured backend (idempotent).
    Bootstrap,
    /// Exit 0 when the local service answers /readyz with 200 (for container health
    /// checks: no shell or HTTP client needed in the image).
    Healthcheck {
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 5)]
        timeout: u64,
    },
    /// Write a consistent copy of the embedded store to FILE while the service runs.
    Backup {
        /// The file to write; it must not exist.
        #[arg(long)]
        to: PathBuf,
    },
    /// Make a backup the embedded store of CAIRN_DATA_DIR (the service must be stopped;
    /// the store it replaces is kept beside it).
    Restore {
        #[arg(long)]
        from: PathBuf,
    },
    /// Move every stored vector to the configured CAIRN_EMBEDDING_MODEL: the new vectors
    /// are built beside the current ones while the service serves, then replace them in
    /// one step; restart the service with the new model afterwards. Resumable (run it
    /// again after an interruption).
    Reembed {
        /// Records embedded per batch.
        #[arg(long, default_value_t = 64)]
        batch: usize,
    },
    /// Write everything of one user as one JSON document (what GET
    /// /v1/users/{user}/export answers).
    Export {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        user: String,
        /// Write here instead of standard output (readable by its owner only).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Take an export, or a mem0 `get_all` document, into one user.
    Import {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        user: String,
        #[arg(long)]
        from: PathBuf,
        /// `cairn` (an export, into a user with no memory) or `mem0` (each memory through
        /// the write gates).
        #[arg(long, default_value = "cairn")]
        format: String,
    },
    /// Token operations.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Saved objects for Kibana or OpenSearch Dashboards.
    Dashboards {
        #[command(subcommand)]
        command: DashboardsCommand,
    },
}

#[derive(Subcommand)]
pub enum DashboardsCommand {
    /// Write data views, saved searches, visualizations and a dashboard over the
    /// indices of CAIRN_INDEX_PREFIX, as the NDJSON file the product imports.
    Export {
        /// `kibana` or `opensearch-dashboards`.
        #[arg(long)]
        target: String,
        /// Write here instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Print a signed JWT for the configured key.
    Mint {
        #[arg(long)]
        tenant: String,
        /// Comma- or space-separated: memory:read,memory:write,memory:review,memory:admin
        #[arg(long)]
        scope: String,
        /// Bind the token to one user.
        #[arg(long)]
        user: Option<String>,
        /// Lifetime, such as 90s, 15m, 1h, 7d.
        #[arg(long, default_value = "1h")]
        ttl: String,
        #[arg(long, default_value = "cairn-cli")]
        sub: String,
        /// Sign with this RS256/ES256 private key (PEM) instead of the HS256 secret.
        #[arg(long)]
        private_key: Option<PathBuf>,
        /// Print a login link for the console instead of a token: it carries a ticket
        /// that signs a browser tab in once, within 2 minutes, for a session of --ttl
        /// (at most 12h). The ticket is not a bearer token.
        #[arg(long)]
        ui: bool,
        /// The service's base URL for the --ui link (default: from CAIRN_LISTEN).
        #[arg(long)]
        url: Option<String>,
    },
}
