//! Fixtures and figures shared by the benchmarks: deterministic sentences, a scope as
//! authentication would make it, fact loading, percentiles and peak memory.

#![allow(dead_code)]

use cairn_core::{
    Change, ChangeSet, Embedder, Fact, FactType, MemoryStore, Permission, Principal, Scope, TenantId, new_id,
};
use std::time::Duration;

pub const SUBJECTS: &[&str] = &[
    "sister",
    "manager",
    "dentist",
    "neighbour",
    "coach",
    "landlord",
    "cousin",
    "teacher",
];
pub const VERBS: &[&str] = &[
    "prefers",
    "dislikes",
    "recommends",
    "mentioned",
    "bought",
    "booked",
    "cancelled",
    "visited",
];
pub const OBJECTS: &[&str] = &[
    "oat milk",
    "a trip to Kyoto",
    "the jazz festival",
    "sourdough bread",
    "a standing desk",
    "hiking boots",
    "the Friday meeting",
    "a vegan restaurant",
    "an electric bike",
    "the chess club",
    "a piano lesson",
    "green tea",
    "the marathon",
    "a guitar",
    "the pottery class",
    "a rental car",
];

/// A deterministic pseudo-random sequence (xorshift), so runs are comparable.
pub struct Sequence(pub u64);

impl Sequence {
    pub fn next(&mut self, bound: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % bound as u64) as usize
    }

    /// A question about one of the sentences' subjects and objects.
    pub fn question(&mut self) -> String {
        format!(
            "what does the {} think about {}",
            SUBJECTS[self.next(SUBJECTS.len())],
            OBJECTS[self.next(OBJECTS.len())]
        )
    }

    pub fn sentence(&mut self, index: usize) -> String {
        format!(
            "The user's {} {} {} (note {index})",
            SUBJECTS[self.next(SUBJECTS.len())],
            VERBS[self.next(VERBS.len())],
            OBJECTS[self.next(OBJECTS.len())]
        )
    }
}

pub fn scope(tenant: &str) -> Scope {
    scope_of(tenant, "user-1")
}

#[allow(clippy::disallowed_methods)]
pub fn scope_of(tenant: &str, user: &str) -> Scope {
    let tenant = TenantId::parse(tenant).expect("tenant");
    Principal::from_verified_credential("bench".into(), tenant, None, vec![Permission::Admin])
        .scope_for(user, Permission::Admin)
        .expect("scope")
}

/// The value given after `flag` on the command line (`--flag value`), if any.
pub fn flag_value(arguments: &[String], flag: &str) -> Option<String> {
    arguments
        .iter()
        .position(|argument| argument == flag)
        .and_then(|index| arguments.get(index + 1))
        .cloned()
}

pub fn percentile(sorted: &[Duration], share: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * share).round() as usize;
    sorted[index].as_secs_f64() * 1000.0
}

pub fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with("VmHWM:"))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<f64>().ok())
        })
        .map(|kib| kib / 1024.0)
        .unwrap_or(0.0)
}

/// Adds `count` embedded facts to a scope in batches (fixture loading, not measured).
pub async fn load(
    store: &dyn MemoryStore,
    embedder: &dyn Embedder,
    scope: &Scope,
    count: usize,
    sequence: &mut Sequence,
) {
    let mut index = 0;
    while index < count {
        let texts: Vec<String> = (index..(index + 64).min(count))
            .map(|i| sequence.sentence(i))
            .collect();
        let vectors = embedder.embed(texts.clone()).await.expect("embed");
        let mut change_set = ChangeSet::new(cairn_core::AuditEvent {
            id: new_id("aud"),
            at: chrono::Utc::now(),
            subject: "bench".into(),
            tenant: scope.tenant().as_str().into(),
            user: scope.user().as_str().into(),
            action: "bench.load".into(),
            target_ids: Vec::new(),
            request_id: "bench".into(),
            detail: serde_json::Value::Null,
        });
        for (text, vector) in texts.into_iter().zip(vectors) {
            change_set.changes.push(Change::InsertFact(Fact {
                embedding: Some(vector),
                ..Fact::new_active(new_id("fact"), FactType::World, text, 1.0, chrono::Utc::now())
            }));
        }
        store.commit(scope, change_set).await.expect("load");
        index += 64;
    }
}

/// The benchmarks' runtime: two workers, as on the machine the figures come from.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Waits until the search cluster at `url` runs no segment merge (two polls in a row,
/// a minute at most) and answers how long that took. A bulk load can leave the node
/// merging its new segments, kNN graphs included, for seconds afterwards; the recall
/// benchmark times recall right after the load and again after this wait (the first
/// round also meets every cold cache: the scope's term counts, the node's pages).
pub async fn merges_settled(url: &str) -> Duration {
    let client = reqwest::Client::new();
    let started = std::time::Instant::now();
    let mut quiet = 0;
    while quiet < 2 && started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let merging = async {
            let answer: serde_json::Value = client
                .get(format!("{}/_stats/merge", url.trim_end_matches('/')))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            answer["_all"]["total"]["merges"]["current"].as_u64()
        };
        // A node that cannot say (no index, no answer) is not waited for.
        quiet = if merging.await.unwrap_or(0) == 0 {
            quiet + 1
        } else {
            0
        };
    }
    started.elapsed()
}
