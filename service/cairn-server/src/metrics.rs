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
    /// Each tenant's pending reviews and oldest pending review, as last counted.
    reviews: std::sync::Mutex<std::collections::HashMap<String, QueueCount>>,
    /// When every tenant's queue was last counted from the store.
    recounted: std::sync::Mutex<Option<std::time::Instant>>,
}

/// How long a count of every tenant's review queue serves scrapes before the store is
/// asked again.
const RECOUNT_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

/// Tenants' queues read from the store at most.
const RECOUNTED_TENANTS: usize = 1000;

/// The label of an HTTP method: the methods RFC 9110 and RFC 5789 define by name,
/// and `other` for every extension method. HTTP lets a caller send a method of any
/// length, and each distinct label value is a series kept for the process's life.
pub fn method_label(method: &actix_web::http::Method) -> &'static str {
    match method.as_str() {
        "GET" => "GET",
        "HEAD" => "HEAD",
        "POST" => "POST",
        "PUT" => "PUT",
        "DELETE" => "DELETE",
        "PATCH" => "PATCH",
        "OPTIONS" => "OPTIONS",
        "CONNECT" => "CONNECT",
        "TRACE" => "TRACE",
        _ => "other",
    }
}

/// Seconds from `oldest` to `now` (0 when nothing is pending).
fn age_seconds(now: chrono::DateTime<chrono::Utc>, oldest: Option<chrono::DateTime<chrono::Utc>>) -> f64 {
    oldest.map_or(0.0, |at| (now - at).num_milliseconds().max(0) as f64 / 1000.0)
}

/// A tenant's pending reviews and when the oldest was held.
type QueueCount = (u64, Option<chrono::DateTime<chrono::Utc>>);

/// Tenants named in the review queue metrics; the rest are summed under `other`.
const REVIEW_TENANT_LABELS: usize = 50;

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
            reviews: std::sync::Mutex::default(),
            recounted: std::sync::Mutex::default(),
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
        if let Some(queue) = &outcome.review_queue {
            self.observe_review_queue(&queue.0, &queue.1);
        }
    }

    pub fn observe_dead_letter(&self) {
        self.dead_letters.inc();
    }

    pub fn observe_consolidation_failure(&self, trigger: &str) {
        self.consolidation_runs
            .with_label_values(&[trigger, "error"])
            .inc();
    }

    /// Counts a finished request. `route` is the matched route pattern (or
    /// `unmatched`) and `method` one of [`method_label`]'s values, so no label holds
    /// text a caller chose.
    pub fn observe_request(&self, route: &str, method: &'static str, status: u16, seconds: f64) {
        self.requests
            .with_label_values(&[route, method, &status.to_string()])
            .inc();
        self.latency.with_label_values(&[route, method]).observe(seconds);
    }

    /// Notes a tenant's review queue as just counted.
    pub fn observe_review_queue(&self, tenant: &str, summary: &cairn_core::ReviewSummary) {
        if let Ok(mut reviews) = self.reviews.lock() {
            if summary.total() == 0 {
                reviews.remove(tenant);
            } else {
                reviews.insert(tenant.to_owned(), (summary.total(), summary.oldest));
            }
        }
    }

    /// Counts every tenant's review queue from the store, unless it was counted within
    /// [`RECOUNT_AFTER`]: the gauges are the same on every replica, whichever served
    /// the reviews, and an erasure's or another replica's decisions show. A failure
    /// keeps the last counts.
    pub async fn recount_review_queues(&self, cairn: &cairn_app::Cairn) {
        let fresh = self
            .recounted
            .lock()
            .ok()
            .and_then(|at| *at)
            .is_some_and(|at| at.elapsed() < RECOUNT_AFTER);
        if fresh {
            return;
        }
        match cairn.review_queues(RECOUNTED_TENANTS).await {
            Ok(queues) => {
                if let Ok(mut reviews) = self.reviews.lock() {
                    *reviews = queues
                        .into_iter()
                        .map(|queue| (queue.tenant, (queue.pending, queue.oldest)))
                        .collect();
                }
                if let Ok(mut at) = self.recounted.lock() {
                    *at = Some(std::time::Instant::now());
                }
            }
            Err(error) => tracing::warn!(error = %error, "counting the review queues failed"),
        }
    }

    /// Counts the queue of the scope's tenant again (after a review was held or decided
    /// there). A failure leaves the last count; it never fails the request.
    pub async fn refresh_review_queue(&self, cairn: &cairn_app::Cairn, scope: &cairn_core::Scope) {
        match cairn.review_summary(scope).await {
            Ok(summary) => self.observe_review_queue(scope.tenant().as_str(), &summary),
            Err(error) => tracing::warn!(error = %error, "counting the review queue failed"),
        }
    }

    /// The review queue summed over tenants, naming none: outcomes pending and the age
    /// of the oldest.
    fn review_totals(&self) -> Vec<prometheus::proto::MetricFamily> {
        let Ok(reviews) = self.reviews.lock() else {
            return Vec::new();
        };
        let now = chrono::Utc::now();
        let pending: u64 = reviews.values().map(|(count, _)| count).sum();
        let oldest = reviews.values().filter_map(|(_, first)| *first).min();
        let oldest = age_seconds(now, oldest);
        let registry = Registry::new_custom(Some("cairn".into()), None);
        let depth = prometheus::IntGauge::new("review_queue_pending", "Outcomes pending review, all tenants");
        let age = prometheus::Gauge::new(
            "review_queue_oldest_pending_seconds",
            "Age of the oldest outcome pending review, all tenants",
        );
        let (Ok(registry), Ok(depth), Ok(age)) = (registry, depth, age) else {
            return Vec::new();
        };
        depth.set(i64::try_from(pending).unwrap_or(i64::MAX));
        age.set(oldest);
        if registry.register(Box::new(depth)).is_err() || registry.register(Box::new(age)).is_err() {
            return Vec::new();
        }
        registry.gather()
    }

    /// The review queue gauges: depth and oldest age per tenant, the deepest
    /// [`REVIEW_TENANT_LABELS`] tenants by name and the rest as `other`.
    fn review_families(&self) -> Vec<prometheus::proto::MetricFamily> {
        let Ok(reviews) = self.reviews.lock() else {
            return Vec::new();
        };
        let mut tenants: Vec<(&String, &QueueCount)> = reviews.iter().collect();
        tenants.sort_by(|a, b| b.1.0.cmp(&a.1.0).then_with(|| a.0.cmp(b.0)));
        let now = chrono::Utc::now();
        let age = |oldest: &Option<chrono::DateTime<chrono::Utc>>| age_seconds(now, *oldest);
        let registry = Registry::new_custom(Some("cairn".into()), None);
        let depth = prometheus::IntGaugeVec::new(
            Opts::new("review_queue_depth", "Outcomes pending review, per tenant"),
            &["tenant"],
        );
        let oldest = prometheus::GaugeVec::new(
            Opts::new(
                "review_queue_oldest_age_seconds",
                "Age of the oldest outcome pending review, per tenant",
            ),
            &["tenant"],
        );
        let (Ok(registry), Ok(depth), Ok(oldest)) = (registry, depth, oldest) else {
            return Vec::new();
        };
        let mut other = (0_u64, 0.0_f64);
        for (index, (tenant, (count, first))) in tenants.into_iter().enumerate() {
            if index < REVIEW_TENANT_LABELS {
                depth
                    .with_label_values(&[tenant])
                    .set(i64::try_from(*count).unwrap_or(i64::MAX));
                oldest.with_label_values(&[tenant]).set(age(first));
            } else {
                other.0 += count;
                other.1 = other.1.max(age(first));
            }
        }
        if other.0 > 0 {
            depth
                .with_label_values(&["other"])
                .set(i64::try_from(other.0).unwrap_or(i64::MAX));
            oldest.with_label_values(&["other"]).set(other.1);
        }
        if registry.register(Box::new(depth)).is_err() || registry.register(Box::new(oldest)).is_err() {
            return Vec::new();
        }
        registry.gather()
    }

    /// The registry in the Prometheus text exposition format; the review queue per
    /// tenant when `per_tenant` (the operator's view), else summed over tenants.
    pub fn render(&self, per_tenant: bool) -> String {
        let mut buffer = Vec::new();
        let mut families = self.registry.gather();
        if per_tenant {
            families.extend(self.review_families());
        } else {
            families.extend(self.review_totals());
        }
        if TextEncoder::new().encode(&families, &mut buffer).is_err() {
            return String::new();
        }
        String::from_utf8(buffer).unwrap_or_default()
    }
}
