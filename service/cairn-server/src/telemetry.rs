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
