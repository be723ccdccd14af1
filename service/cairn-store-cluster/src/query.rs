//! Every query body the cluster backend sends is built here, from a [`Scope`] that only
//! authentication produces. Each starts from [`scope_filter`]; the kNN bodies put it
//! inside the kNN clause so the cluster pre-filters before ranking. Snapshot tests
//! (`tests/queries.rs`) pin the bodies for both engines, so a missing scope filter shows
//! up in review.

use crate::client::Engine;
use crate::docs::micros;
use crate::recalled;
use cairn_core::TenantScope;
use cairn_core::bm25::Term;
use cairn_core::{Scope, SearchFilter, TextQuery, Tier};
use serde_json::{Value, json};

/// `tenant` and `user` must both match.
pub fn scope_filter(scope: &Scope) -> Vec<Value> {
    vec![
        json!({ "term": { "tenant": scope.tenant().as_str() } }),
        json!({ "term": { "user": scope.user().as_str() } }),
    ]
}

/// None of `conditions` holds. A record matches when the field a condition reads is
/// missing, so "missing, or after `t`" is written as "not at or before `t`": the node
/// checks the few records that hold the field instead of testing every record for it.
fn none_of(conditions: Vec<Value>) -> Value {
    json!({ "bool": { "must_not": conditions } })
}

/// Scope plus currency at `as_of` for one tier: the same conditions as the embedded
/// store's legs.
pub fn restrictions(scope: &Scope, filter: &SearchFilter) -> Vec<Value> {
    let mut conditions = scope_filter(scope);
    let as_of = micros(filter.as_of);
    // Validity and expiry are event time: `valid_at` when asked, else `as_of`.
    let event = micros(filter.valid_at.unwrap_or(filter.as_of));
    match filter.tier {
        Tier::Semantic => {
            let statuses = if filter.include_pending {
                json!(["active", "superseded", "pending"])
            } else {
                json!(["active", "superseded"])
            };
            conditions.push(json!({ "terms": { "status": statuses } }));
            conditions.push(json!({ "range": { "created_at": { "lte": as_of } } }));
            // Not expired, already valid and, unless history is asked for, not ended or
            // superseded: a missing time is no bound.
            let mut ended = vec![
                json!({ "range": { "expires_at": { "lte": event } } }),
                json!({ "range": { "valid_from": { "gt": event } } }),
            ];
            if filter.valid_at.is_some() {
                // What held then, whether or not it has been superseded since.
                ended.push(json!({ "range": { "valid_to": { "lte": event } } }));
            } else if !filter.include_history {
                ended.push(json!({ "range": { "valid_to": { "lte": as_of } } }));
                ended.push(json!({ "range": { "superseded_at": { "lte": as_of } } }));
            }
            conditions.push(none_of(ended));
            if !filter.fact_types.is_empty() {
                let types: Vec<&str> = filter.fact_types.iter().map(|kind| kind.as_str()).collect();
                conditions.push(json!({ "terms": { "fact_type": types } }));
            }
        }
        Tier::Episodic => {
            conditions.push(json!({ "range": { "ingested_at": { "lte": as_of } } }));
            if filter.valid_at.is_some() {
                // Said by then (a timestamp after ingestion counts as the ingestion).
                conditions.push(json!({ "bool": { "should": [
                    { "range": { "occurred_at": { "lte": event } } },
                    { "range": { "ingested_at": { "lte": event } } }
                ], "minimum_should_match": 1 } }));
            }
            if let Some(session) = &filter.session_id {
                conditions.push(json!({ "term": { "session_id": session } }));
            }
        }
        Tier::Procedural => {
            conditions.push(json!({ "range": { "created_at": { "lte": as_of } } }));
        }
    }
    conditions
}

/// What a read of records by id takes of each `_source`: never the indexed stems nor
/// the `record` and `record_vector` that older indices keep there too, and the vector
/// (`vector`, or `embedding` in indices made before it) only when the caller needs
/// vectors.
fn read_fields(filter: &SearchFilter) -> Value {
    if filter.with_vectors {
        json!({ "excludes": ["terms", "context_terms", recalled::FIELD, recalled::VECTOR] })
    } else {
        json!({ "excludes": [
            "terms", "context_terms", recalled::FIELD, recalled::VECTOR, "embedding", "vector"
        ] })
    }
}

/// The records of a tier with these `ids`, in the scope: for the hits of a recall
/// search whose documents carry no `record` (see `recalled`).
pub fn records_by_id(scope: &Scope, filter: &SearchFilter, ids: &[&str]) -> Value {
    let mut body = scoped(scope, vec![json!({ "terms": { "id": ids } })], None, ids.len());
    body["_source"] = read_fields(filter);
    body
}

/// The candidates of a text search: any of the query's stems among a record's indexed
/// stems (`terms`, and an episode's `context_terms`: see `bm25::index_terms`), inside
/// the tier's scope and currency filter, ranked by the index. Their scores are computed
/// afresh from the scope's own statistics: [`term_statistics`], counted by the same
/// request when `count` (the store keeps counts a while, see `statistics`). `None`
/// without a searchable term.
pub fn text_search(scope: &Scope, query: &TextQuery, terms: &[Term], count: bool) -> Option<Value> {
    let filter = &query.filter;
    if terms.is_empty() {
        return None;
    }
    let stems: Vec<&str> = terms.iter().map(|term| term.stem.as_str()).collect();
    let mut body = json!({
        "size": filter.limit,
        "track_total_hits": false,
        "query": { "bool": {
            "filter": restrictions(scope, filter),
            "must": matching(query, stems.join(" "))
        } }
    });
    recalled::read_from_doc_values(&mut body, filter.with_vectors);
    if count {
        body["aggs"] = json!({ "scope": term_statistics(scope, query, terms) });
    }
    Some(body)
}

/// The aggregation a text search carries for its scores: the scope's documents in a
/// tier and, per term, how many of them hold it in the searched fields. `global` leaves
/// the search's own query behind (the routed shard holds the whole tenant), and the
/// scope filter under it counts the scope's records alone.
pub fn term_statistics(scope: &Scope, query: &TextQuery, terms: &[Term]) -> Value {
    let fields: &[&str] = if query.searches_context() {
        &["terms", "context_terms"]
    } else {
        &["terms"]
    };
    let per_term: Vec<Value> = terms
        .iter()
        .map(|term| json!({ "multi_match": { "query": term.stem, "fields": fields } }))
        .collect();
    json!({
        "global": {},
        "aggs": { "in_scope": {
            "filter": { "bool": { "filter": scope_filter(scope) } },
            "aggs": { "terms": { "filters": { "filters": per_term } } }
        } }
    })
}

/// The scoring clause of a text search: episodes match on their text and, with the
/// query's context weight, on their context (the episodes around them in the session).
fn matching(query: &TextQuery, terms: String) -> Value {
    match query.filter.tier {
        Tier::Episodic if query.searches_context() => {
            json!({ "multi_match": {
            "query": terms,
            "fields": ["terms", format!("context_terms^{:?}", query.context_weight)],
            "type": "most_fields",
            "operator": "or"
        } })
        }
        Tier::Episodic | Tier::Semantic | Tier::Procedural => {
            json!({ "match": { "terms": { "query": terms, "operator": "or" } } })
        }
    }
}

/// The id and text of the latest episode of a session in the scope (its context is
/// updated later by id, from a fresh read).
pub fn last_of_session(scope: &Scope, session_id: &str) -> Value {
    let mut body = scoped(
        scope,
        vec![json!({ "term": { "session_id": session_id } })],
        Some(json!([{ "position": "desc" }])),
        1,
    );
    body["_source"] = json!(["id", "text"]);
    body
}

/// How a kNN search is written for the cluster at hand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KnnForm {
    /// OpenSearch's `knn` query.
    OpenSearch,
    /// Elasticsearch's `knn` query (8.12 and later): it runs in the query phase, so a
    /// search makes no separate DFS round before it.
    ElasticsearchQuery,
    /// Elasticsearch's top-level `knn` section, for nodes before 8.12.
    ElasticsearchSection,
}

impl KnnForm {
    /// The form for `engine` at `version` (`major.minor.patch`); an unreadable
    /// Elasticsearch version gets the top-level section, which every 8.x and 9.x node reads.
    pub fn of(engine: Engine, version: &str) -> KnnForm {
        match engine {
            Engine::OpenSearch => KnnForm::OpenSearch,
            Engine::Elasticsearch => {
                let mut parts = version.split('.').map(|part| part.parse::<u32>().ok());
                match (parts.next().flatten(), parts.next().flatten()) {
                    (Some(major), Some(minor)) if (major, minor) >= (8, 12) => KnnForm::ElasticsearchQuery,
                    _ => KnnForm::ElasticsearchSection,
                }
            }
        }
    }
}

/// How many candidates a kNN leg gathers from each segment's graph before it keeps its
/// `limit` best (Elasticsearch's `num_candidates`; OpenSearch's Lucene engine takes its
/// `k` as the breadth of the graph search too, so `k` is this and `size` the limit).
/// HNSW with a breadth of only the limit misses true neighbours: at 10k facts in a scope
/// a 20-hit leg found 81% of the exact top 20 with a breadth of 20, 95% with 100 (the
/// embedded store rescores exactly and misses almost none).
pub fn knn_candidates(limit: usize) -> usize {
    (limit * 5).clamp(100, 10_000)
}

/// kNN on `embedding`, with the scope and currency filter inside the kNN clause
/// (OpenSearch `knn.embedding.filter`, Elasticsearch `knn.filter`), so the cluster
/// pre-filters before ranking. Scores come back as `(1 + cosine) / 2` on both engines.
/// Each segment's graph is searched [`knn_candidates`] wide.
pub fn vector_search(form: KnnForm, scope: &Scope, filter: &SearchFilter, vector: &[f32]) -> Value {
    let restrict = json!({ "bool": { "filter": restrictions(scope, filter) } });
    let candidates = knn_candidates(filter.limit);
    let mut body = match form {
        KnnForm::OpenSearch => json!({
            "size": filter.limit,
            "query": { "knn": { "embedding": {
                "vector": vector,
                "k": candidates,
                "filter": restrict
            } } }
        }),
        KnnForm::ElasticsearchQuery => json!({
            "size": filter.limit,
            "query": { "knn": {
                "field": "embedding",
                "query_vector": vector,
                "num_candidates": candidates,
                "filter": restrict
            } }
        }),
        KnnForm::ElasticsearchSection => json!({
            "size": filter.limit,
            "knn": {
                "field": "embedding",
                "query_vector": vector,
                "k": filter.limit,
                "num_candidates": candidates,
                "filter": restrict
            }
        }),
    };
    recalled::read_from_doc_values(&mut body, filter.with_vectors);
    body
}

/// Up to `size` documents of the scope matching `extra`, in `sort` order when given.
pub fn scoped(scope: &Scope, extra: Vec<Value>, sort: Option<Value>, size: usize) -> Value {
    let mut filter = scope_filter(scope);
    filter.extend(extra);
    let mut body = json!({ "size": size, "query": { "bool": { "filter": filter } } });
    if let Some(sort) = sort {
        body["sort"] = sort;
    }
    body
}

/// Every document of the scope matching `extra`, newest first by `sort_field`, after
/// the cursor `(time, id)` when given.
pub fn listing(
    scope: &Scope,
    extra: Vec<Value>,
    sort_field: &str,
    limit: usize,
    after: Option<(i64, &str)>,
) -> Value {
    let sort = json!([ { sort_field: "desc" }, { "id": "desc" } ]);
    let mut body = scoped(scope, extra, Some(sort), limit);
    if let Some((time, id)) = after {
        body["search_after"] = json!([time, id]);
    }
    body
}

/// The newest document of the scope (by `created_at`, then id) for each of `values` of
/// its `fingerprint` that has one matching `extra`: collapsed on the fingerprint, so no
/// value's documents crowd another's out of the page.
pub fn newest_per_value(scope: &Scope, values: &[String], extra: Value) -> Value {
    let mut body = listing(
        scope,
        vec![json!({ "terms": { "fingerprint": values } }), extra],
        "created_at",
        values.len(),
        None,
    );
    body["collapse"] = json!({ "field": "fingerprint" });
    body
}

/// Jobs of every scope that are due at `now` and not leased, oldest first: the one
/// query without a scope filter, because the job queue hands out work across scopes
/// (each job then restores the scope it was enqueued in).
pub fn due_jobs(now: i64, after_tenant: Option<&str>, size: usize) -> Value {
    let mut filter = vec![
        json!({ "range": { "run_after": { "lte": now } } }),
        json!({ "bool": { "should": [
            { "bool": { "must_not": { "exists": { "field": "leased_until" } } } },
            { "range": { "leased_until": { "lte": now } } }
        ], "minimum_should_match": 1 } }),
        json!({ "bool": { "must_not": { "exists": { "field": "dead_at" } } } }),
    ];
    // Tenants take turns: the next tenant in name order after the last one served.
    if let Some(tenant) = after_tenant {
        filter.push(json!({ "range": { "tenant": { "gt": tenant } } }));
    }
    json!({
        "size": size,
        "seq_no_primary_term": true,
        "query": { "bool": { "filter": filter } },
        "sort": [{ "tenant": "asc" }, { "run_after": "asc" }, { "created_at": "asc" }]
    })
}

/// Facts by their status at `as_of` (`None`: every status).
pub fn status_condition(status: Option<cairn_core::FactStatus>, as_of: i64) -> Vec<Value> {
    use cairn_core::FactStatus;
    // Current at `as_of`: not superseded by then, nor ended as `ended` says.
    let current = |mut ended: Vec<Value>| {
        ended.push(json!({ "range": { "superseded_at": { "lte": as_of } } }));
        vec![
            json!({ "terms": { "status": ["active", "superseded"] } }),
            json!({ "range": { "created_at": { "lte": as_of } } }),
            none_of(ended),
        ]
    };
    match status {
        None => Vec::new(),
        Some(FactStatus::Active) => current(vec![json!({ "range": { "expires_at": { "lte": as_of } } })]),
        Some(FactStatus::Expired) => {
            let mut conditions = current(Vec::new());
            conditions.push(json!({ "range": { "expires_at": { "lte": as_of } } }));
            conditions
        }
        Some(FactStatus::Superseded) => vec![
            json!({ "term": { "status": "superseded" } }),
            json!({ "range": { "superseded_at": { "lte": as_of } } }),
        ],
        Some(FactStatus::Retracted) => vec![json!({ "term": { "status": "retracted" } })],
        Some(FactStatus::Forgotten) => vec![json!({ "bool": { "must_not": { "match_all": {} } } })],
        Some(FactStatus::Pending) => vec![json!({ "term": { "status": "pending" } })],
    }
}

/// The tenant's users in the episodes, facts and playbooks indices, a page at a time by
/// user id (a composite aggregation after the cursor), with each user's documents per
/// index, active facts and latest `timestamp`.
pub fn tenant_users(tenant: &TenantScope, after: Option<&str>, limit: usize) -> Value {
    let mut users = json!({
        "size": limit,
        "sources": [{ "user": { "terms": { "field": "user" } } }]
    });
    if let Some(after) = after {
        users["after"] = json!({ "user": after });
    }
    json!({
        "size": 0,
        "query": { "bool": { "filter": [{ "term": { "tenant": tenant.tenant().as_str() } }] } },
        "aggs": { "users": {
            "composite": users,
            "aggs": {
                "kinds": { "terms": { "field": "_index", "size": 3 } },
                "active": { "filter": { "term": { "status": "active" } } },
                "latest": { "max": { "field": "timestamp" } }
            }
        } }
    })
}

/// The latest audit event of each of `users` in the tenant.
pub fn latest_audit(tenant: &TenantScope, users: &[&str]) -> Value {
    json!({
        "size": 0,
        "query": { "bool": { "filter": [
            { "term": { "tenant": tenant.tenant().as_str() } },
            { "terms": { "user": users } }
        ] } },
        "aggs": { "users": {
            "terms": { "field": "user", "size": users.len().max(1) },
            "aggs": { "latest": { "max": { "field": "timestamp" } } }
        } }
    })
}

/// Pending reviews of every user of the tenant, oldest first, after the cursor
/// `(time, id)` when given.
pub fn tenant_review_queue(tenant: &TenantScope, limit: usize, after: Option<(i64, &str)>) -> Value {
    review_queue(
        vec![json!({ "term": { "tenant": tenant.tenant().as_str() } })],
        limit,
        after,
    )
}

/// Pending reviews of the scope, oldest first, like [`tenant_review_queue`].
pub fn scope_review_queue(scope: &Scope, limit: usize, after: Option<(i64, &str)>) -> Value {
    review_queue(scope_filter(scope), limit, after)
}

fn review_queue(mut filter: Vec<Value>, limit: usize, after: Option<(i64, &str)>) -> Value {
    filter.push(json!({ "term": { "status": "pending" } }));
    let mut body = json!({
        "size": limit,
        "query": { "bool": { "filter": filter } },
        "sort": [{ "created_at": "asc" }, { "id": "asc" }]
    });
    if let Some((time, id)) = after {
        body["search_after"] = json!([time, id]);
    }
    body
}

/// A tenant's pending reviews counted by kind, with the oldest one's time.
/// Every tenant's pending reviews, the deepest `limit` tenants (for the operator's
/// metrics alone: it names tenants).
pub fn review_queues(limit: usize) -> Value {
    json!({
        "size": 0,
        "query": { "bool": { "filter": [ { "term": { "status": "pending" } } ] } },
        "aggs": { "tenants": {
            "terms": { "field": "tenant", "size": limit.max(1), "order": [{ "_count": "desc" }, { "_key": "asc" }] },
            "aggs": { "oldest": { "min": { "field": "created_at" } } }
        } }
    })
}

pub fn review_summary(tenant: &TenantScope) -> Value {
    json!({
        "size": 0,
        "query": { "bool": { "filter": [
            { "term": { "tenant": tenant.tenant().as_str() } },
            { "term": { "status": "pending" } }
        ] } },
        "aggs": {
            "kinds": { "terms": { "field": "kind", "size": 16 } },
            "oldest": { "min": { "field": "created_at" } }
        }
    })
}
