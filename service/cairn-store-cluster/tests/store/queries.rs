//! Snapshots of every query body, for both engines. A scope filter that goes missing,
//! or a kNN filter that moves out of the kNN clause, changes a snapshot.

use cairn_core::bm25;
use cairn_core::{FactStatus, FactType, SearchFilter, TextQuery, Tier};
use cairn_store_cluster::query::KnnForm;
use cairn_store_cluster::{Engine, mappings, query};
use chrono::{DateTime, Utc};

/// The body with object keys in sorted order, whatever map order serde_json was built
/// with (the workspace may enable `preserve_order`), so snapshots compare the same.
fn sorted(value: &serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let mut out = serde_json::Map::new();
            for key in keys {
                out.insert(key.clone(), sorted(&map[key]));
            }
            serde_json::Value::Object(out)
        }
        serde_json::Value::Array(items) => serde_json::Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

fn filter(tier: Tier) -> SearchFilter {
    SearchFilter {
        as_of: DateTime::<Utc>::from_timestamp(1_800_000_000, 0).expect("time"),
        fact_types: vec![FactType::Preference],
        session_id: Some("s1".into()),
        limit: 50,
        with_vectors: true,
        ..cairn_store_tests::current_in(tier)
    }
}

#[test]
fn text_queries_filter_scope_and_currency() {
    let scope = cairn_store_tests::scope("acme", "alice");
    let terms = bm25::query_terms("Which sneakers does the user like?");
    for tier in [Tier::Semantic, Tier::Episodic, Tier::Procedural] {
        let query = TextQuery::new(filter(tier), "Which sneakers does the user like?");
        let body = query::text_search(&scope, &query, &terms, true).expect("terms");
        insta::assert_json_snapshot!(format!("text_{}", tier.as_str()), sorted(&body));
        // The statistics that score the candidates count the scope's records alone.
        let statistics = query::term_statistics(&scope, &query, &terms);
        insta::assert_json_snapshot!(format!("text_statistics_{}", tier.as_str()), sorted(&statistics));
    }
    assert!(query::text_search(&scope, &TextQuery::new(filter(Tier::Semantic), "?!"), &[], true).is_none());
    // Recall reads no stored field: the id and record doc values only, and the vector's
    // when asked for.
    let body = query::text_search(
        &scope,
        &TextQuery::new(filter(Tier::Semantic), "sneakers"),
        &terms,
        false,
    )
    .expect("terms");
    assert_eq!(body["_source"], false);
    assert_eq!(body["stored_fields"], "_none_");
    assert_eq!(
        body["docvalue_fields"],
        serde_json::json!(["id", "record", "record_vector"])
    );
    let body = query::text_search(
        &scope,
        &TextQuery::new(cairn_store_tests::current_in(Tier::Semantic), "sneakers"),
        &terms,
        false,
    )
    .expect("terms");
    assert_eq!(body["docvalue_fields"], serde_json::json!(["id", "record"]));
    let without_context = TextQuery {
        context_weight: 0.0,
        ..TextQuery::new(filter(Tier::Episodic), "sneakers")
    };
    let sneakers = bm25::query_terms("sneakers");
    let body = query::text_search(&scope, &without_context, &sneakers, true).expect("terms");
    let known = query::text_search(&scope, &without_context, &sneakers, false).expect("terms");
    assert!(
        known.get("aggs").is_none(),
        "counts the store knows are not counted again"
    );
    assert_eq!(known["query"], body["query"]);
    assert_eq!(
        body["query"]["bool"]["must"]["match"]["terms"]["query"], "sneaker",
        "the index is searched by Cairn's stems"
    );
    let counted = &body["aggs"]["scope"];
    assert_eq!(
        counted,
        &query::term_statistics(&scope, &without_context, &sneakers)
    );
    assert_eq!(
        counted["aggs"]["in_scope"]["aggs"]["terms"]["filters"]["filters"][0]["multi_match"]["fields"],
        serde_json::json!(["terms"])
    );
}

#[test]
fn records_read_by_id_stay_in_the_scope_and_leave_stems_and_records_out() {
    let scope = cairn_store_tests::scope("acme", "alice");
    let body = query::records_by_id(&scope, &filter(Tier::Semantic), &["f1", "f2"]);
    insta::assert_json_snapshot!("records_by_id", sorted(&body));
    let conditions = body["query"]["bool"]["filter"].to_string();
    assert!(
        conditions.contains("\"tenant\":\"acme\"") && conditions.contains("\"user\":\"alice\""),
        "{conditions}"
    );
    assert_eq!(body["size"], 2);
    let without = query::records_by_id(&scope, &cairn_store_tests::current_in(Tier::Semantic), &["f1"]);
    assert_eq!(
        without["_source"]["excludes"],
        serde_json::json!([
            "terms",
            "context_terms",
            "record",
            "record_vector",
            "embedding",
            "vector"
        ]),
        "the vector only when asked for"
    );
}

#[test]
fn elasticsearch_9_1_and_later_keep_vectors_in_the_source() {
    for (engine, version, kept) in [
        (Engine::Elasticsearch, "8.19.0", None),
        (Engine::Elasticsearch, "9.0.0", None),
        (Engine::Elasticsearch, "9.2.0", Some(false)),
        (Engine::Elasticsearch, "10.0.1", Some(false)),
        (Engine::OpenSearch, "3.1.0", None),
    ] {
        let mut template = mappings::template(engine, "cairn", "facts", 384).expect("template");
        mappings::keep_vectors_in_source(&mut template, engine, version);
        let setting = template["template"]["settings"]["index.mapping.exclude_source_vectors"].as_bool();
        assert_eq!(setting, kept, "{engine:?} {version}");
    }
}

#[test]
fn text_analysis_falls_back_to_the_standard_analyzer_on_a_bare_node() {
    for engine in [Engine::OpenSearch, Engine::Elasticsearch] {
        for kind in cairn_store_cluster::INDICES {
            let bare = mappings::template_with(engine, "cairn", kind, 384, mappings::Analysis::Standard)
                .expect("template");
            let text = serde_json::to_string(&bare).expect("json");
            assert!(
                !text.contains("cairn_text") && !text.contains("porter_stem"),
                "{kind}: {text}"
            );
            assert!(bare["template"]["settings"]["analysis"].is_null(), "{kind}");
            let full = mappings::template(engine, "cairn", kind, 384).expect("template");
            for field in ["terms", "context_terms"] {
                let stems = &full["template"]["mappings"]["properties"][field];
                if !stems.is_null() {
                    assert_eq!(stems["analyzer"], "whitespace", "{kind}.{field}");
                }
            }
        }
    }
}

#[test]
fn knn_queries_filter_inside_the_knn_clause() {
    let scope = cairn_store_tests::scope("acme", "alice");
    for (form, name) in [
        (KnnForm::OpenSearch, "opensearch"),
        (KnnForm::ElasticsearchQuery, "elasticsearch"),
        (KnnForm::ElasticsearchSection, "elasticsearch_before_8_12"),
    ] {
        let body = query::vector_search(form, &scope, &filter(Tier::Semantic), &[0.6, 0.8, 0.0]);
        insta::assert_json_snapshot!(format!("knn_{name}"), sorted(&body));
        let inner = match form {
            KnnForm::OpenSearch => &body["query"]["knn"]["embedding"]["filter"],
            KnnForm::ElasticsearchQuery => &body["query"]["knn"]["filter"],
            KnnForm::ElasticsearchSection => &body["knn"]["filter"],
        };
        let text = inner.to_string();
        assert!(
            text.contains("\"tenant\":\"acme\"") && text.contains("\"user\":\"alice\""),
            "{text}"
        );
    }
}

#[test]
fn elasticsearch_uses_the_knn_query_from_8_12_on() {
    let cases = [
        (Engine::OpenSearch, "2.19.1", KnnForm::OpenSearch),
        (Engine::OpenSearch, "3.0.0", KnnForm::OpenSearch),
        (Engine::Elasticsearch, "8.11.4", KnnForm::ElasticsearchSection),
        (Engine::Elasticsearch, "8.12.0", KnnForm::ElasticsearchQuery),
        (Engine::Elasticsearch, "8.19.0", KnnForm::ElasticsearchQuery),
        (Engine::Elasticsearch, "9.2.0", KnnForm::ElasticsearchQuery),
        (Engine::Elasticsearch, "", KnnForm::ElasticsearchSection),
        (Engine::Elasticsearch, "unknown", KnnForm::ElasticsearchSection),
    ];
    for (engine, version, form) in cases {
        assert_eq!(KnnForm::of(engine, version), form, "{engine:?} {version}");
    }
}

#[test]
fn listings_and_status_conditions() {
    let scope = cairn_store_tests::scope("acme", "alice");
    let body = query::listing(
        &scope,
        query::status_condition(Some(FactStatus::Active), 1_800_000_000_000_000),
        "created_at",
        21,
        Some((1_700_000_000_000_000, "fact_x")),
    );
    insta::assert_json_snapshot!("listing_active_facts", sorted(&body));
    let last = query::last_of_session(&scope, "s1");
    insta::assert_json_snapshot!("last_episode_of_session", sorted(&last));
}

#[test]
fn templates_per_engine() {
    for engine in [Engine::OpenSearch, Engine::Elasticsearch] {
        let facts = mappings::template(engine, "cairn", "facts", 384).expect("template");
        insta::assert_json_snapshot!(format!("template_facts_{}", engine.as_str()), sorted(&facts));
        let vector = &facts["template"]["mappings"]["properties"]["embedding"];
        match engine {
            Engine::OpenSearch => {
                assert_eq!(vector["type"], "knn_vector");
                assert_eq!(vector["method"]["engine"], "lucene");
                assert_eq!(facts["template"]["settings"]["knn"], true);
            }
            Engine::Elasticsearch => {
                assert_eq!(vector["type"], "dense_vector");
                assert_eq!(vector["similarity"], "cosine");
            }
        }
        for kind in cairn_store_cluster::INDICES {
            let template = mappings::template(engine, "cairn", kind, 384).expect("template");
            let properties = &template["template"]["mappings"]["properties"];
            assert_eq!(properties["tenant"]["type"], "keyword", "{kind}");
            assert_eq!(properties["user"]["type"], "keyword", "{kind}");
        }
    }
}

#[test]
fn the_job_queue_is_the_one_unscoped_query() {
    let body = query::due_jobs(1_800_000_000_000_000, None, 10);
    insta::assert_json_snapshot!("due_jobs", sorted(&body));
    // Tenants take turns: the tenant appears only as the order of the turns, never as a
    // scope filter (no term on tenant or user).
    let body = query::due_jobs(1_800_000_000_000_000, Some("acme"), 10);
    insta::assert_json_snapshot!("due_jobs_after_a_tenant", sorted(&body));
    for body in [
        query::due_jobs(1_800_000_000_000_000, None, 10),
        query::due_jobs(1_800_000_000_000_000, Some("acme"), 10),
    ] {
        let text = body.to_string();
        assert!(!text.contains("\"term\"") && !text.contains("\"user\""), "{text}");
    }
}
