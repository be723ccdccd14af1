//! Prometheus metrics: requests by route and status, and latency histograms.

use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder};

pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    latency: HistogramVec,
}

const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new_custom(Some("cairn".into()), None)?;
        let requests = IntCounterVec::new(
            Opts::new("http_requests_total", "HTTP requests by route, method and status"),
            &["route", "method", "status"],
        )?;
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "http_request_duration_seconds",
                "HTTP request latency by route and method",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["route", "method"],
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(latency.clone()))?;
        Ok(Metrics {
            registry,
            requests,
            latency,
        })
    }

    pub fn observe_request(&self, route: &str, method: &str, status: u16, seconds: f64) {
        self.requests
            .with_label_values(&[route, method, &status.to_string()])
            .inc();
        self.latency.with_label_values(&[route, method]).observe(seconds);
    }

    /// The registry in the Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        let families = self.registry.gather();
        if TextEncoder::new().encode(&families, &mut buffer).is_err() {
            return String::new();
        }
        String::from_utf8(buffer).unwrap_or_default()
    }
}
