//! Prometheus metrics: requests by route and status, and latency histograms.

use cairn_app::ConsolidationOutcome;
use prometheus::{
    Counter, Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    latency: HistogramVec,
    consolidation_runs: IntCounterVec,
    decisions: IntCounterVec,
    llm_calls: IntCounter,
    llm_tokens: IntCounterVec,
    llm_cost: Counter,
    dead_letters: IntCounter,
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
        let consolidation_runs = IntCounterVec::new(
            Opts::new(
                "consolidation_runs_total",
                "Consolidation runs by trigger and result",
            ),
            &["trigger", "result"],
        )?;
        let decisions = IntCounterVec::new(
            Opts::new("consolidation_decisions_total", "Consolidation decisions by kind"),
            &["kind"],
        )?;
        let llm_calls = IntCounter::new("llm_calls_total", "LLM provider calls made by consolidation")?;
        let llm_tokens = IntCounterVec::new(
            Opts::new(
                "llm_tokens_total",
                "LLM tokens spent by consolidation, input and output",
            ),
            &["direction"],
        )?;
        let llm_cost = Counter::new("llm_cost_usd_total", "Estimated LLM cost in US dollars")?;
        let dead_letters = IntCounter::new(
            "consolidation_dead_letters_total",
            "Consolidation jobs dead-lettered after failing too often",
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(latency.clone()))?;
        registry.register(Box::new(consolidation_runs.clone()))?;
        registry.register(Box::new(decisions.clone()))?;
        registry.register(Box::new(llm_calls.clone()))?;
        registry.register(Box::new(llm_tokens.clone()))?;
        registry.register(Box::new(llm_cost.clone()))?;
        registry.register(Box::new(dead_letters.clone()))?;
        Ok(Metrics {
            registry,
            requests,
            latency,
            consolidation_runs,
            decisions,
            llm_calls,
            llm_tokens,
            llm_cost,
            dead_letters,
        })
    }

    /// Counts a finished run (dry runs count as runs; their decisions are not counted).
    pub fn observe_consolidation(&self, outcome: &ConsolidationOutcome, trigger: &str) {
        let result = if outcome.dry_run {
            "dry_run"
        } else if outcome.deferred_until.is_some() {
            "deferred"
        } else {
            "ok"
        };
        self.consolidation_runs
            .with_label_values(&[trigger, result])
            .inc();
        if !outcome.dry_run {
            for decision in &outcome.decisions {
                self.decisions.with_label_values(&[decision.kind.as_str()]).inc();
            }
        }
        self.llm_calls.inc_by(outcome.usage.calls);
        self.llm_tokens
            .with_label_values(&["input"])
            .inc_by(outcome.usage.input_tokens);
        self.llm_tokens
            .with_label_values(&["output"])
            .inc_by(outcome.usage.output_tokens);
        self.llm_cost.inc_by(outcome.usage.cost_usd.max(0.0));
    }

    pub fn observe_dead_letter(&self) {
        self.dead_letters.inc();
    }

    pub fn observe_consolidation_failure(&self, trigger: &str) {
        self.consolidation_runs
            .with_label_values(&[trigger, "error"])
            .inc();
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
