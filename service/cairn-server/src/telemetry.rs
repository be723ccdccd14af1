//! Logging and tracing set-up: JSON (or text) logs on stdout, and OpenTelemetry traces
//! exported over OTLP/HTTP when an endpoint is configured.

use crate::config::{Config, LogFormat};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Keeps the trace pipeline alive; shut it down to flush spans at exit.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(error) = provider.shutdown()
        {
            eprintln!("cairn: flushing traces failed: {error}");
        }
    }
}

/// Installs the global subscriber. Call once, before the async runtime starts (the OTLP
/// exporter uses a blocking HTTP client on its own thread).
pub fn init(config: &Config) -> anyhow::Result<Telemetry> {
    let filter =
        EnvFilter::try_new(&config.log_level).map_err(|error| anyhow::anyhow!("CAIRN_LOG_LEVEL: {error}"))?;
    let format = match config.log_format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .boxed(),
        LogFormat::Text => tracing_subscriber::fmt::layer().boxed(),
    };
    let (provider, otel_layer) = match &config.otlp_endpoint {
        Some(endpoint) => {
            let exporter = SpanExporter::builder()
                .with_http()
                .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
                .build()?;
            let provider = SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(Resource::builder().with_service_name("cairn").build())
                .build();
            let tracer = provider.tracer("cairn");
            (
                Some(provider),
                Some(tracing_opentelemetry::layer().with_tracer(tracer)),
            )
        }
        None => (None, None),
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(format)
        .with(otel_layer)
        .try_init()
        .map_err(|error| anyhow::anyhow!("logging is already initialised: {error}"))?;
    Ok(Telemetry { provider })
}

/// Where a log field appears in a JSON log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldPlace {
    /// Under `span`: the request's context, on every line the request logs.
    Span,
    /// Under `fields`, beside `message`: the event's own values.
    Event,
}

/// One field the service writes into its logs.
pub struct LogField {
    pub name: &'static str,
    pub place: FieldPlace,
    pub meaning: &'static str,
}

const fn span(name: &'static str, meaning: &'static str) -> LogField {
    LogField {
        name,
        place: FieldPlace::Span,
        meaning,
    }
}

const fn event(name: &'static str, meaning: &'static str) -> LogField {
    LogField {
        name,
        place: FieldPlace::Event,
        meaning,
    }
}

/// Every field a log line of the service can carry, besides the formatter's own
/// (`timestamp`, `level`, `target`, `fields.message`). The test suite reads every
/// logging call in the sources and fails on a field missing here or listed but unused.
pub const LOG_FIELDS: &[LogField] = &[
    span(
        "request_id",
        "The request's id: the `x-request-id` response header and the `request_id` of its audit events.",
    ),
    span(
        "method",
        "The HTTP method (`GET`, `POST`, …; `other` for a method outside the standard ones).",
    ),
    span(
        "route",
        "The route pattern, such as `/v1/users/{user}/recall` (`unmatched` when no route matched).",
    ),
    span(
        "tenant",
        "The tenant, once the token is verified; on events, the tenant the work belongs to.",
    ),
    span(
        "trace_id",
        "The OpenTelemetry trace id when tracing is on (`CAIRN_OTLP_ENDPOINT`), as in the exported trace.",
    ),
    event(
        "status",
        "The HTTP status answered (`request completed`), or the search cluster's answer (`search cluster request`, debug level).",
    ),
    event(
        "latency_ms",
        "Milliseconds from the request's arrival to its answer.",
    ),
    event(
        "code",
        "The error code of a request that failed inside the service (see the errors reference).",
    ),
    event("error", "What went wrong, as one line of text."),
    event(
        "subject",
        "The token subject that redeemed a console login ticket.",
    ),
    event("job", "The id of a consolidation job."),
    event("run", "The id of a consolidation run."),
    event("attempts", "How many times the job has run."),
    event("retry_in_s", "Seconds until a failed job runs again."),
    event("until", "When the tenant's token budget resets (RFC 3339)."),
    event("episodes", "Episodes read by a run, erased or imported."),
    event("facts", "Facts erased or imported."),
    event("decisions", "Decisions a consolidation run made."),
    event("dry_run", "Whether the run was a dry run (nothing written)."),
    event("jobs", "Jobs given back for another worker at shutdown."),
    event("resolved", "Half-applied commits that recovery finished."),
    event(
        "reranker",
        "The reranker that failed or answered unusable scores.",
    ),
    event("expected", "How many scores the reranker should have answered."),
    event("got", "How many scores it answered."),
    event("listen", "The address the service listens on."),
    event(
        "backend",
        "The store backend (`sqlite`, `elasticsearch` or `opensearch`).",
    ),
    event("data_dir", "The embedded store's data directory."),
    event(
        "directory",
        "A data directory whose permissions could not be narrowed.",
    ),
    event("from", "The embedded store's schema version before an upgrade."),
    event("to", "The schema version after it."),
    event("backup", "Where the copy made before a schema upgrade is."),
    event(
        "engine",
        "The search cluster's engine (`elasticsearch` or `opensearch`).",
    ),
    event("version", "The search cluster's version."),
    event("created", "Indices the start-up created."),
    event("existing", "Indices that already existed and match the mappings."),
    event(
        "backfilled",
        "Documents written before their index had the stem fields, given them at start-up.",
    ),
    event(
        "recorded",
        "Documents written without a stored `record`, given theirs at start-up.",
    ),
    event("replicas", "Replicas per index."),
    event("data_nodes", "Data nodes in the cluster."),
    event("analysis", "The text analysis the indices use."),
    event(
        "indices",
        "Indices that keep vectors in `_source` (made by an earlier version).",
    ),
    event("keys", "Keys fetched from `CAIRN_JWT_JWKS_URL`."),
    event("url", "A key set URL served over plain http."),
    event("certificate", "The TLS certificate file reloaded."),
    event("path", "The search cluster path requested (debug level)."),
    event("sent", "Bytes sent to the search cluster (debug level)."),
    event("received", "Bytes received from it (debug level)."),
    event(
        "micros",
        "Microseconds the search cluster request took (debug level).",
    ),
];
