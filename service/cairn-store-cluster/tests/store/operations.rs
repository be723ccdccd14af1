//! Cluster-only behaviour on a real node: bootstrap is idempotent, and an index created
//! by hand with the wrong types is reported instead of written into.

use serde_json::json;

#[tokio::test]
async fn bootstrap_is_idempotent_and_reports_a_wrong_mapping() {
    let Some((url, store, _cleanup)) = super::unprepared("CAIRN_TEST_OPENSEARCH_URL").await else {
        return;
    };
    let first = store.bootstrap().await.expect("bootstrap");
    assert_eq!(first.created.len(), cairn_store_cluster::INDICES.len());
    let second = store.bootstrap().await.expect("bootstrap again");
    assert!(second.created.is_empty());
    assert_eq!(second.existing.len(), cairn_store_cluster::INDICES.len());

    // Another prefix whose facts index was made by hand: text as a keyword, no vector.
    let Some((_, other, _cleanup_other)) = super::unprepared("CAIRN_TEST_OPENSEARCH_URL").await else {
        return;
    };
    let wrong = other.prefix().to_owned();
    let client = reqwest_free_put(
        &url,
        &format!("{wrong}-facts"),
        json!({
            "mappings": { "properties": { "text": { "type": "keyword" }, "tenant": { "type": "keyword" } } }
        }),
    )
    .await;
    assert!(client, "index created by hand");
    let error = other.bootstrap().await.expect_err("a mismatch is reported");
    let message = error.to_string();
    assert!(message.contains(&format!("{wrong}-facts")), "{message}");
    assert!(message.contains("text is keyword, expected text"), "{message}");
    assert_eq!(error.code(), "mapping_mismatch");
    use cairn_core::MemoryStore;
    let scope = cairn_store_tests::scope("acme", "alice");
    let refused = other.get_fact(&scope, "fact_x").await;
    assert!(
        matches!(refused, Err(cairn_core::Error::Unavailable(ref reason)) if reason.contains("mapping")),
        "{refused:?}"
    );
}

/// A process embedding with another model than the one whose vectors the store holds
/// is refused at bootstrap, before it could read or write anything; the process whose
/// model the store holds keeps working, and a later process on that model is let in.
#[tokio::test]
async fn bootstrap_refuses_another_embedding_model_before_any_read_or_write() {
    use cairn_core::MemoryStore;
    let Some((url, store, _cleanup)) = super::unprepared("CAIRN_TEST_OPENSEARCH_URL").await else {
        return;
    };
    store
        .bootstrap_claiming(Some(("model-a", 3)))
        .await
        .expect("the first claim");
    let alice = cairn_store_tests::scope("acme", "alice");
    let episode = cairn_store_tests::session_episode("My sister lives in Porto");
    store
        .commit(&alice, cairn_store_tests::ingest(&alice, vec![episode.clone()]))
        .await
        .expect("ingest");

    let connect = || cairn_store_cluster::ClusterStore::connect(&url, store.prefix(), 3);
    let other = connect().await.expect("a second process");
    let refused = other.bootstrap_claiming(Some(("model-b", 3))).await;
    assert!(
        matches!(&refused, Err(cairn_core::Error::Unavailable(message))
            if message.contains("model-a/3") && message.contains("model-b/3")),
        "{refused:?}"
    );
    assert!(other.refusal().is_some_and(|reason| reason.contains("model-a/3")));
    let read = other.get_episode(&alice, &episode.id).await;
    assert!(
        matches!(&read, Err(cairn_core::Error::Unavailable(reason)) if reason.contains("model-a/3")),
        "{read:?}"
    );
    let write = other
        .commit(
            &alice,
            cairn_store_tests::ingest(&alice, vec![cairn_store_tests::session_episode("She moved")]),
        )
        .await;
    assert!(
        matches!(write, Err(cairn_core::Error::Unavailable(_))),
        "{write:?}"
    );

    assert!(
        store
            .get_episode(&alice, &episode.id)
            .await
            .expect("read")
            .is_some()
    );
    let same = connect().await.expect("a third process");
    same.bootstrap_claiming(Some(("model-a", 3)))
        .await
        .expect("the store's own model");
    assert!(same.refusal().is_none());
    assert!(
        same.get_episode(&alice, &episode.id)
            .await
            .expect("read")
            .is_some()
    );
}

#[tokio::test]
async fn bootstrap_adds_fields_a_newer_template_brings() {
    let Some((url, store, _cleanup)) = super::unprepared("CAIRN_TEST_OPENSEARCH_URL").await else {
        return;
    };
    // The episodes index as an earlier release made it: the template without `context`.
    let templates: serde_json::Value =
        serde_json::from_str(include_str!("../../../../mappings/opensearch.json")).expect("templates parse");
    let mut earlier = templates["episodes"]["template"].clone();
    let properties = earlier["mappings"]["properties"]
        .as_object_mut()
        .expect("properties");
    assert!(properties.remove("context").is_some());
    properties["embedding"]["dimension"] = json!(3);
    assert!(
        reqwest_free_put(&url, &format!("{}-episodes", store.prefix()), earlier).await,
        "earlier index created"
    );
    let prefix = store.prefix().to_owned();
    let report = store.bootstrap().await.expect("bootstrap extends it");
    assert_eq!(report.extended, vec![format!("{prefix}-episodes")]);
    assert_eq!(report.created.len(), cairn_store_cluster::INDICES.len() - 1);
    let again = store.bootstrap().await.expect("bootstrap again");
    assert!(again.extended.is_empty() && again.created.is_empty());
}

/// Creates an index with a plain HTTP request (std only), as an operator might by hand.
async fn reqwest_free_put(url: &str, index: &str, body: serde_json::Value) -> bool {
    raw_put(url, &format!("/{index}"), body).await == Some(200)
}

/// A `PUT` by plain HTTP (std only); the answer's status.
async fn raw_put(url: &str, path: &str, body: serde_json::Value) -> Option<u16> {
    let address = url.trim_start_matches("http://").trim_end_matches('/').to_owned();
    let path = path.to_owned();
    let payload = body.to_string();
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(&address).ok()?;
        let request = format!(
            "PUT {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{payload}",
            payload.len()
        );
        stream.write_all(request.as_bytes()).ok()?;
        // The status line is enough; the connection may stay open after the body.
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).ok()?;
        std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
    })
    .await
    .ok()
    .flatten()
}

/// The facts index as an earlier release made it: the template (standard analysis, 3
/// dimensions) without the field `missing`.
fn earlier_facts(store: &cairn_store_cluster::ClusterStore, missing: &str) -> serde_json::Value {
    let template = cairn_store_cluster::mappings::template_with(
        store.engine(),
        store.prefix(),
        "facts",
        3,
        cairn_store_cluster::mappings::Analysis::Standard,
    )
    .expect("template");
    let mut earlier = template["template"].clone();
    let properties = earlier["mappings"]["properties"]
        .as_object_mut()
        .expect("properties");
    assert!(properties.remove(missing).is_some(), "the template has {missing}");
    earlier
}

/// Facts written by a release whose index had no stem fields are given their stems by
/// bootstrap and found by recall afterwards, on both engines (the bare Elasticsearch
/// node also shows the fallback to the standard analyzer).
#[tokio::test]
async fn bootstrap_gives_older_documents_their_stems() {
    use cairn_core::{MemoryStore, TextQuery};
    use cairn_store_cluster::{Engine, mappings};
    for variable in ["CAIRN_TEST_OPENSEARCH_URL", "CAIRN_TEST_ELASTICSEARCH_URL"] {
        let Some((url, store, _cleanup)) = super::unprepared(variable).await else {
            continue;
        };
        let index = format!("{}-facts", store.prefix());
        let earlier = earlier_facts(&store, "terms");
        assert!(
            reqwest_free_put(&url, &index, earlier).await,
            "{variable}: earlier index created"
        );
        let fact = json!({
            "tenant": "acme", "user": "alice", "id": "f-old", "fact_type": "preference",
            "text": "The user loves running shoes", "status": "active", "confidence": 0.9,
            "source_episode_ids": [], "created_at": 1_700_000_000_000_000_i64, "use_count": 0
        });
        let written = raw_put(
            &url,
            &format!("/{index}/_doc/f-old?routing=acme&refresh=true"),
            fact,
        )
        .await;
        assert_eq!(written, Some(201), "{variable}: older fact written");

        let report = store.bootstrap().await.expect("bootstrap");
        assert_eq!(report.extended, vec![index.clone()], "{variable}");
        assert_eq!(report.backfilled, 1, "{variable}");
        assert_eq!(report.recorded, 1, "{variable}: and its record");
        if store.engine() == Engine::Elasticsearch {
            assert_eq!(
                report.analysis,
                mappings::Analysis::Standard,
                "the bare node has no porter_stem"
            );
        }
        let scope = cairn_store_tests::scope("acme", "alice");
        let filter = cairn_core::SearchFilter {
            with_vectors: true,
            ..cairn_store_tests::current_in(cairn_core::Tier::Semantic)
        };
        let query = TextQuery::new(filter, "runs shoe");
        let hits = store.search_text(&scope, &query).await.expect("search");
        assert_eq!(hits.len(), 1, "{variable}: the older fact is found by its stems");
        assert!(hits[0].score > 0.0);
        let again = store.bootstrap().await.expect("bootstrap again");
        assert_eq!(again.backfilled, 0, "{variable}");
        assert_eq!(again.recorded, 0, "{variable}");
    }
}

/// Recall reads records from doc values. A fact written without one (by an earlier
/// release, into an index made before `record`) is still found, read from its source by
/// id beside a fact that has one; bootstrap gives it its record, and the index that
/// keeps records in `_source` too is named. On both engines.
#[tokio::test]
async fn facts_written_without_a_record_are_found_and_given_one() {
    use cairn_core::{MemoryStore, TextQuery};
    for variable in ["CAIRN_TEST_OPENSEARCH_URL", "CAIRN_TEST_ELASTICSEARCH_URL"] {
        let Some((url, store, _cleanup)) = super::unprepared(variable).await else {
            continue;
        };
        let index = format!("{}-facts", store.prefix());
        let mut earlier = earlier_facts(&store, "record");
        earlier["mappings"]["_source"] = json!({ "excludes": ["embedding"] });
        assert!(
            reqwest_free_put(&url, &index, earlier).await,
            "{variable}: earlier index created"
        );
        let older = |id: &str, text: &str| {
            json!({
                "tenant": "acme", "user": "alice", "id": id, "fact_type": "preference",
                "text": text, "terms": cairn_core::bm25::index_terms(text), "status": "active",
                "confidence": 0.9, "source_episode_ids": [], "created_at": 1_700_000_000_000_000_i64,
                "use_count": 0
            })
        };
        let path = |id: &str| format!("/{index}/_doc/{id}?routing=acme&refresh=true");
        let written = raw_put(
            &url,
            &path("f-old"),
            older("f-old", "The user loves running shoes"),
        )
        .await;
        assert_eq!(written, Some(201), "{variable}: older fact written");

        let report = store.bootstrap().await.expect("bootstrap");
        assert_eq!(report.recorded, 1, "{variable}");
        assert_eq!(report.records_in_source, vec![index.clone()], "{variable}");
        // Written by an older process after bootstrap: no record until the next one.
        let written = raw_put(
            &url,
            &path("f-late"),
            older("f-late", "The user runs in trail shoes"),
        )
        .await;
        assert_eq!(written, Some(201), "{variable}: late fact written");

        let scope = cairn_store_tests::scope("acme", "alice");
        let query = TextQuery::new(
            cairn_store_tests::current_in(cairn_core::Tier::Semantic),
            "running shoes",
        );
        let texts = |hits: &[cairn_core::TextHit]| {
            let mut texts: Vec<String> = hits
                .iter()
                .map(|hit| match &hit.memory {
                    cairn_core::Memory::Fact(fact) => fact.text.clone(),
                    other => panic!("{variable}: not a fact: {other:?}"),
                })
                .collect();
            texts.sort();
            texts
        };
        let expected = vec![
            "The user loves running shoes".to_owned(),
            "The user runs in trail shoes".to_owned(),
        ];
        let hits = store.search_text(&scope, &query).await.expect("search");
        assert_eq!(
            texts(&hits),
            expected,
            "{variable}: found with and without a record"
        );
        let other = cairn_store_tests::scope("acme", "bob");
        assert!(
            store
                .search_text(&other, &query)
                .await
                .expect("search")
                .is_empty(),
            "{variable}: another user finds neither"
        );
        let again = store.bootstrap().await.expect("bootstrap again");
        assert_eq!(again.recorded, 1, "{variable}: the late fact");
        let hits = store.search_text(&scope, &query).await.expect("search");
        assert_eq!(texts(&hits), expected, "{variable}: both from their records");
    }
}

/// A fact written before vectors had a doc value of their own (`record_vector`) keeps
/// its vector inside `record`: bootstrap adds the field to its index, and the fact and a
/// fact written afterwards (whose vector is only in `record_vector`) give their vectors
/// to a search that asks, and none to one that does not. On both engines.
#[tokio::test]
async fn facts_whose_record_holds_their_vector_keep_working() {
    use base64::Engine as _;
    use cairn_core::{Memory, MemoryStore, SearchFilter, Tier, VectorQuery};
    for variable in ["CAIRN_TEST_OPENSEARCH_URL", "CAIRN_TEST_ELASTICSEARCH_URL"] {
        let Some((url, store, _cleanup)) = super::unprepared(variable).await else {
            continue;
        };
        let index = format!("{}-facts", store.prefix());
        let mut earlier = earlier_facts(&store, "record_vector");
        earlier["mappings"]["_source"] = json!({ "excludes": ["embedding", "record"] });
        assert!(
            reqwest_free_put(&url, &index, earlier).await,
            "{variable}: earlier index created"
        );
        let codec = base64::engine::general_purpose::STANDARD;
        let bytes: Vec<u8> = [0.6_f32, 0.8, 0.0]
            .iter()
            .flat_map(|value| value.to_le_bytes())
            .collect();
        let vector = codec.encode(bytes);
        let record = json!({
            "id": "f-old", "fact_type": "preference", "text": "The user likes green tea",
            "status": "active", "confidence": 0.9, "source_episode_ids": [],
            "created_at": 1_700_000_000_000_000_i64, "use_count": 0, "vector": vector
        });
        let mut fact = record.clone();
        fact["tenant"] = json!("acme");
        fact["user"] = json!("alice");
        fact["terms"] = json!(cairn_core::bm25::index_terms("The user likes green tea"));
        fact["embedding"] = json!([0.6, 0.8, 0.0]);
        fact["record"] = json!(codec.encode(record.to_string()));
        let written = raw_put(
            &url,
            &format!("/{index}/_doc/f-old?routing=acme&refresh=true"),
            fact,
        )
        .await;
        assert_eq!(written, Some(201), "{variable}: older fact written");

        let report = store.bootstrap().await.expect("bootstrap");
        assert_eq!(
            report.extended,
            vec![index.clone()],
            "{variable}: record_vector added"
        );
        assert_eq!(report.records_in_source, vec![index.clone()], "{variable}");
        assert_eq!(
            report.recorded, 0,
            "{variable}: the older record is read as it is"
        );
        let scope = cairn_store_tests::scope("acme", "alice");
        let mut newer = cairn_store_tests::fact("The user likes green apples", chrono::Utc::now());
        newer.embedding = Some(vec![0.0, 0.6, 0.8]);
        store
            .commit(
                &scope,
                cairn_core::ChangeSet::new(cairn_store_tests::audit(&scope, "fact.create"))
                    .with(cairn_core::Change::InsertFact(newer.clone())),
            )
            .await
            .expect("insert");
        let vectors = |hits: &[cairn_core::TextHit]| {
            let mut found: Vec<(String, Option<Vec<f32>>)> = hits
                .iter()
                .map(|hit| match &hit.memory {
                    Memory::Fact(fact) => (fact.text.clone(), fact.embedding.clone()),
                    other => panic!("{variable}: not a fact: {other:?}"),
                })
                .collect();
            found.sort_by(|a, b| a.0.cmp(&b.0));
            found
        };
        for with_vectors in [true, false] {
            let filter = SearchFilter {
                limit: 5,
                with_vectors,
                ..cairn_store_tests::current_in(Tier::Semantic)
            };
            let expected = vec![
                (
                    "The user likes green apples".to_owned(),
                    with_vectors.then(|| vec![0.0, 0.6, 0.8]),
                ),
                (
                    "The user likes green tea".to_owned(),
                    with_vectors.then(|| vec![0.6, 0.8, 0.0]),
                ),
            ];
            let query = cairn_core::TextQuery::new(filter.clone(), "green");
            let by_text = store.search_text(&scope, &query).await.expect("text");
            assert_eq!(
                vectors(&by_text),
                expected,
                "{variable}: text, vectors {with_vectors}"
            );
            let query = VectorQuery {
                filter,
                vector: vec![0.3, 0.7, 0.4],
            };
            let by_vector = store.search_vector(&scope, &query).await.expect("knn");
            assert_eq!(
                vectors(&by_vector),
                expected,
                "{variable}: kNN, vectors {with_vectors}"
            );
        }
    }
}

/// An index made before vectors left `_source` (no `_source.excludes`, no `vector`
/// field) keeps working: bootstrap adds `vector` and names the index, its vectors read
/// back, its records stay in the kNN index and are counted, on both engines.
#[tokio::test]
async fn indices_that_keep_vectors_in_source_keep_working() {
    use cairn_core::{MemoryStore, SearchFilter, Tier, UseCount, VectorQuery};
    use cairn_store_cluster::mappings;
    for variable in ["CAIRN_TEST_OPENSEARCH_URL", "CAIRN_TEST_ELASTICSEARCH_URL"] {
        let Some((url, store, _cleanup)) = super::unprepared(variable).await else {
            continue;
        };
        let index = format!("{}-facts", store.prefix());
        let mut template = mappings::template_with(
            store.engine(),
            store.prefix(),
            "facts",
            3,
            mappings::Analysis::Standard,
        )
        .expect("template");
        mappings::keep_vectors_in_source(&mut template, store.engine(), &store.version());
        let mut earlier = template["template"].clone();
        let layout = earlier["mappings"].as_object_mut().expect("mappings");
        assert!(
            layout.remove("_source").is_some(),
            "the template leaves vectors out of _source"
        );
        assert!(
            layout["properties"]
                .as_object_mut()
                .expect("properties")
                .remove("vector")
                .is_some()
        );
        assert!(
            reqwest_free_put(&url, &index, earlier).await,
            "{variable}: earlier index created"
        );
        let fact = json!({
            "tenant": "acme", "user": "alice", "id": "f-vec", "fact_type": "preference",
            "text": "The user likes green tea", "terms": ["user", "like", "green", "tea"],
            "status": "active", "confidence": 0.9, "source_episode_ids": [],
            "created_at": 1_700_000_000_000_000_i64, "use_count": 0, "embedding": [0.6, 0.8, 0.0]
        });
        let written = raw_put(
            &url,
            &format!("/{index}/_doc/f-vec?routing=acme&refresh=true"),
            fact,
        )
        .await;
        assert_eq!(written, Some(201), "{variable}: older fact written");

        let report = store.bootstrap().await.expect("bootstrap");
        assert_eq!(report.vectors_in_source, vec![index.clone()], "{variable}");
        assert_eq!(report.extended, vec![index.clone()], "{variable}: vector added");
        let scope = cairn_store_tests::scope("acme", "alice");
        let read = store
            .get_fact(&scope, "f-vec")
            .await
            .expect("get")
            .expect("present");
        assert_eq!(read.embedding, Some(vec![0.6, 0.8, 0.0]), "{variable}");
        let usage = UseCount {
            id: "f-vec".into(),
            count: 2,
            last_used_at: chrono::Utc::now(),
        };
        store.record_usage(&scope, &[usage]).await.expect("usage");
        let query = VectorQuery {
            filter: SearchFilter {
                limit: 5,
                with_vectors: true,
                ..cairn_store_tests::current_in(Tier::Semantic)
            },
            vector: vec![0.6, 0.8, 0.0],
        };
        let hits = store.search_vector(&scope, &query).await.expect("knn");
        let Some(cairn_core::Memory::Fact(found)) = hits.first().map(|hit| &hit.memory) else {
            panic!("{variable}: the older fact is in the kNN index: {hits:?}");
        };
        assert_eq!(found.id, "f-vec", "{variable}");
        assert_eq!(found.embedding, Some(vec![0.6, 0.8, 0.0]), "{variable}");
        let counted = store
            .get_fact(&scope, "f-vec")
            .await
            .expect("get")
            .expect("present");
        assert_eq!(counted.use_count, 2, "{variable}: counted");
        let again = store.bootstrap().await.expect("bootstrap again");
        assert_eq!(again.vectors_in_source, vec![index], "{variable}: still reported");
    }
}

#[tokio::test]
async fn a_replayed_batch_writes_nothing_twice() {
    use cairn_core::{
        AuditEvent, Change, ChangeSet, Decision, DecisionKind, MemoryStore, PageRequest, StatusFilter,
    };
    let Some((store, _cleanup)) = super::fresh("CAIRN_TEST_OPENSEARCH_URL").await else {
        return;
    };
    let scope = cairn_store_tests::scope("acme", "alice");
    let now = chrono::Utc::now();
    let fact = cairn_store_tests::fact("The user lives in Lyon", now);
    let decision = Decision {
        id: "dec_replayed".into(),
        kind: DecisionKind::New,
        reason: "test".into(),
        fact_id: Some(fact.id.clone()),
        target_ids: Vec::new(),
        origin: "run_x".into(),
        created_at: now,
    };
    let audit = || AuditEvent {
        id: cairn_core::new_id("aud"),
        at: now,
        subject: "test".into(),
        tenant: "acme".into(),
        user: "alice".into(),
        action: "consolidation.run".into(),
        target_ids: Vec::new(),
        request_id: "req".into(),
        detail: serde_json::Value::Null,
    };
    // A first attempt that died before moving the watermark wrote the fact and decision.
    let partial = ChangeSet::new(audit())
        .with(Change::InsertFact(fact.clone()))
        .with_decision(decision.clone());
    store.commit(&scope, partial).await.expect("partial");
    let replay = ChangeSet::new(audit())
        .with(Change::InsertFact(fact.clone()))
        .with(Change::MoveWatermark { expected: 0, to: 1 })
        .with_decision(decision);
    store.commit(&scope, replay).await.expect("the replay succeeds");
    let page = PageRequest {
        limit: 10,
        cursor: None,
    };
    let facts = store
        .list_facts(&scope, StatusFilter::All, now, &page)
        .await
        .expect("facts");
    assert_eq!(facts.items.len(), 1, "one fact, not two");
    assert_eq!(
        store
            .list_decisions(&scope, None, &page)
            .await
            .expect("decisions")
            .items
            .len(),
        1
    );
    assert_eq!(store.watermark(&scope).await.expect("watermark"), 1);
}

/// A consolidation run's watermark and an ingest's episode positions are documents of
/// their own: runs that move the watermark while ingests reserve positions never
/// conflict, while a run that read a stale watermark still does. A watermark an earlier
/// release kept in the state document counts until the first move, and an erasure
/// starts the watermark over. On both engines.
#[tokio::test]
async fn watermark_moves_beside_ingests_are_no_conflict() {
    use cairn_core::{Change, ChangeSet, Error, ErrorCode, MemoryStore};
    for variable in ["CAIRN_TEST_OPENSEARCH_URL", "CAIRN_TEST_ELASTICSEARCH_URL"] {
        let Some((url, store, _cleanup)) = super::unprepared(variable).await else {
            continue;
        };
        store.bootstrap().await.expect("bootstrap");
        let alice = cairn_store_tests::scope("acme", "alice");
        let run = |expected: u64, to: u64| {
            ChangeSet::new(cairn_store_tests::audit(&alice, "consolidation.run"))
                .with(Change::MoveWatermark { expected, to })
        };
        let ingests = async {
            for turn in 0..30 {
                let said = cairn_store_tests::session_episode(&format!("Turn {turn}: I repaint the kitchen"));
                store
                    .commit(&alice, cairn_store_tests::ingest(&alice, vec![said]))
                    .await
                    .expect("ingest");
            }
        };
        let moves = async {
            for position in 0..30 {
                store
                    .commit(&alice, run(position, position + 1))
                    .await
                    .expect("a move beside ingests is no conflict");
            }
        };
        tokio::join!(ingests, moves);
        assert_eq!(
            store.watermark(&alice).await.expect("watermark"),
            30,
            "{variable}"
        );
        let positions: Vec<u64> = store
            .episodes_after(&alice, 0, 100)
            .await
            .expect("episodes")
            .into_iter()
            .map(|logged| logged.position)
            .collect();
        assert_eq!(
            positions,
            (1..=30).collect::<Vec<_>>(),
            "{variable}: every position once"
        );
        let stale = store.commit(&alice, run(3, 31)).await;
        assert!(
            matches!(
                &stale,
                Err(Error::Conflict {
                    code: ErrorCode::WatermarkMoved,
                    ..
                })
            ),
            "{variable}: a stale watermark conflicts: {stale:?}"
        );
        assert_eq!(
            store.watermark(&alice).await.expect("watermark"),
            30,
            "{variable}: unmoved"
        );

        let bob = cairn_store_tests::scope("acme", "bob");
        let earlier = serde_json::json!({ "tenant": "acme", "user": "bob", "id": "acme/bob",
                                          "watermark": 7, "allocated": 9 });
        let path = format!(
            "/{}-state/_doc/acme%2Fbob?routing=acme&refresh=true",
            store.prefix()
        );
        assert_eq!(
            raw_put(&url, &path, earlier).await,
            Some(201),
            "{variable}: an earlier state"
        );
        assert_eq!(
            store.watermark(&bob).await.expect("watermark"),
            7,
            "{variable}: read as it was"
        );
        let bob_run = ChangeSet::new(cairn_store_tests::audit(&bob, "consolidation.run"))
            .with(Change::MoveWatermark { expected: 7, to: 9 });
        store
            .commit(&bob, bob_run)
            .await
            .expect("moved from the earlier watermark");
        assert_eq!(store.watermark(&bob).await.expect("watermark"), 9, "{variable}");

        store
            .erase_scope(&alice, cairn_store_tests::audit(&alice, "user.erase"))
            .await
            .expect("erase");
        assert_eq!(
            store.watermark(&alice).await.expect("watermark"),
            0,
            "{variable}: starts over"
        );
        assert_eq!(
            store.watermark(&bob).await.expect("watermark"),
            9,
            "{variable}: bob keeps his"
        );
    }
}

/// Recall indexes Cairn's own Porter stems (`cairn_core::porter`); the `cairn_text`
/// analyzer of the text fields people search in Discover must find the same stems, so
/// the two searches agree. (Lucene's `porter_stem` is also the reference the stemmer is
/// checked against.)
#[tokio::test]
async fn the_index_analyzer_stems_as_scoring_does() {
    let Some((url, store, _cleanup)) = super::unprepared("CAIRN_TEST_OPENSEARCH_URL").await else {
        return;
    };
    store.bootstrap().await.expect("bootstrap");
    let words = cairn_store_tests::vocabulary();
    let path = format!("{url}/{}-facts/_analyze", store.prefix());
    let answer: serde_json::Value = reqwest::Client::new()
        .post(&path)
        .json(&json!({ "analyzer": "cairn_text", "text": words.join(" ") }))
        .send()
        .await
        .expect("analyze")
        .json()
        .await
        .expect("analysis");
    let tokens: Vec<&str> = answer["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .filter_map(|token| token["token"].as_str())
        .collect();
    assert_eq!(tokens.len(), words.len(), "one token per word");
    let disagreements: Vec<String> = words
        .iter()
        .zip(&tokens)
        .filter(|(word, index)| cairn_core::porter::stem(word) != **index)
        .map(|(word, index)| format!("{word}: index {index}, ours {}", cairn_core::porter::stem(word)))
        .collect();
    assert!(disagreements.is_empty(), "{disagreements:?}");
}

/// The visibility an ingest promises on a cluster, which does not refresh for it: its
/// episodes are readable by id, citable as evidence, handed to consolidation and erased
/// the moment it answers; the next ingest of the session gives them context; a search
/// finds them within the refresh interval (1 s). On both engines.
#[tokio::test]
async fn an_ingest_is_read_at_once_and_searched_within_the_refresh_interval() {
    use cairn_core::{Change, ChangeSet, Episode, MemoryStore, SearchFilter, TextQuery, Tier};
    use chrono::Utc;
    use std::time::{Duration, Instant};
    for variable in ["CAIRN_TEST_OPENSEARCH_URL", "CAIRN_TEST_ELASTICSEARCH_URL"] {
        let Some((store, _cleanup)) = super::fresh(variable).await else {
            continue;
        };
        let alice = cairn_store_tests::scope("acme", "alice");
        let said = cairn_store_tests::session_episode;
        let ingest = |episode: Episode| cairn_store_tests::ingest(&alice, vec![episode]);
        let first = said("Which espresso grinder should I buy");
        let second = said("Probably a burr grinder from Niche");
        let started = Instant::now();
        store.commit(&alice, ingest(first.clone())).await.expect("ingest");
        store
            .commit(&alice, ingest(second.clone()))
            .await
            .expect("ingest");

        let read = store.get_episode(&alice, &first.id).await.expect("get");
        assert_eq!(
            read.map(|episode| episode.text),
            Some(first.text.clone()),
            "{variable}: by id at once"
        );
        let logged = store.episodes_after(&alice, 0, 10).await.expect("log");
        let positions: Vec<(u64, &str)> = logged
            .iter()
            .map(|logged| (logged.position, logged.episode.id.as_str()))
            .collect();
        assert_eq!(
            positions,
            vec![(1, first.id.as_str()), (2, second.id.as_str())],
            "{variable}: consolidation sees both"
        );
        let mut derived = cairn_store_tests::fact("The user wants a burr grinder", Utc::now());
        derived.source_episode_ids = vec![second.id.clone()];
        let cited = ChangeSet::new(cairn_store_tests::audit(&alice, "fact.create"))
            .with(Change::RequireEpisodes(vec![second.id.clone()]))
            .with(Change::InsertFact(derived));
        store
            .commit(&alice, cited)
            .await
            .expect("{variable}: the episode is evidence at once");

        // Searched within the refresh interval; "Niche" is only in the second episode,
        // so the first is found by the context the second gave it.
        let filter = SearchFilter {
            as_of: Utc::now() + chrono::Duration::seconds(5),
            ..cairn_store_tests::current_in(Tier::Episodic)
        };
        let query = TextQuery::new(filter, "niche");
        let mut found = Vec::new();
        while started.elapsed() < Duration::from_secs(3) {
            found = store.search_text(&alice, &query).await.expect("search");
            if found.len() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut ids: Vec<&str> = found.iter().map(|hit| hit.memory.id()).collect();
        ids.sort_unstable();
        let mut expected = vec![first.id.as_str(), second.id.as_str()];
        expected.sort_unstable();
        assert_eq!(
            ids, expected,
            "{variable}: searchable within the refresh interval, context included"
        );
        eprintln!(
            "{variable}: searchable {} ms after the first ingest",
            started.elapsed().as_millis()
        );

        let third = said("and a scale");
        store.commit(&alice, ingest(third)).await.expect("ingest");
        let receipt = store
            .erase_scope(&alice, cairn_store_tests::audit(&alice, "user.erase"))
            .await
            .expect("erase");
        assert_eq!(
            receipt.episodes, 3,
            "{variable}: an ingest just answered is erased too"
        );
        store.make_ingests_searchable().await.expect("refresh");
        assert!(
            store.episodes_after(&alice, 0, 10).await.expect("log").is_empty(),
            "{variable}"
        );
    }
}

/// A plain HTTP request (std only) with `Connection: close`; the answer's body as JSON.
pub(super) async fn raw_json(url: &str, method: &str, path: &str) -> Option<serde_json::Value> {
    raw_json_body(url, method, path, serde_json::Value::Null).await
}

/// [`raw_json`] with a JSON body (none for `null`).
pub(super) async fn raw_json_body(
    url: &str,
    method: &str,
    path: &str,
    body: serde_json::Value,
) -> Option<serde_json::Value> {
    let address = url.trim_start_matches("http://").trim_end_matches('/').to_owned();
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(&address).ok()?;
        stream.write_all(request.as_bytes()).ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        let (_, body) = answer.split_once("\r\n\r\n")?;
        serde_json::from_str(body.trim()).ok()
    })
    .await
    .ok()
    .flatten()
}

/// How many commit journals the prefix holds, after a refresh.
async fn journals(url: &str, prefix: &str) -> u64 {
    raw_json(url, "POST", &format!("/{prefix}-commits/_refresh"))
        .await
        .expect("refresh");
    let counted = raw_json(url, "GET", &format!("/{prefix}-commits/_count"))
        .await
        .expect("count");
    counted["count"].as_u64().expect("a count")
}

/// An ingest answers before its journal is deleted: the deletion follows on its own
/// moments later (or with the next bulk), and this process's recovery deletes its own
/// finished journals instead of taking them for a failed process's.
#[tokio::test]
async fn an_ingest_journal_is_retired_after_the_ingest() {
    use cairn_core::{Episode, MemoryStore};
    let Some((url, store, _cleanup)) = super::unprepared("CAIRN_TEST_OPENSEARCH_URL").await else {
        return;
    };
    store.bootstrap().await.expect("bootstrap");
    let scope = cairn_store_tests::scope("acme", "alice");
    let ingest = |text: &str| {
        let episode = Episode {
            embedding: Some(vec![0.25, -0.5, 1.0]),
            ..cairn_store_tests::session_episode(text)
        };
        let change_set = cairn_store_tests::ingest(&scope, vec![episode.clone()]);
        (episode, change_set)
    };
    let mut ids = Vec::new();
    for text in ["I live in Porto", "I work at Nimbus", "I like jazz"] {
        let (episode, change_set) = ingest(text);
        store.commit(&scope, change_set).await.expect("ingest");
        ids.push(episode.id);
    }
    assert_eq!(
        store
            .recover_commits(std::time::Duration::ZERO)
            .await
            .expect("recovery"),
        0,
        "finished ingests are not taken for left-behind commits"
    );
    assert_eq!(journals(&url, store.prefix()).await, 0, "recovery deleted them");

    let (episode, change_set) = ingest("I moved to Lisbon");
    store.commit(&scope, change_set).await.expect("ingest");
    ids.push(episode.id);
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(
        journals(&url, store.prefix()).await,
        0,
        "the journal is deleted shortly after"
    );
    for id in &ids {
        let read = store.get_episode(&scope, id).await.expect("read");
        assert!(read.is_some(), "episode {id} was written");
    }
}

/// An ingest readied while its episodes are embedded (`prepare_episodes`: positions
/// reserved, the session's last episode read) commits what an unreadied one does: the
/// episodes in log order, each stored one given the next as context. One readied but
/// never committed (its embedding failed) leaves only an unused position, at which
/// consolidation waits as for an ingest in flight.
#[tokio::test]
async fn an_ingest_readied_while_it_is_embedded_commits_as_one_that_is_not() {
    use cairn_core::{Episode, MemoryStore};
    let Some((url, store, _cleanup)) = super::unprepared("CAIRN_TEST_OPENSEARCH_URL").await else {
        return;
    };
    store.bootstrap().await.expect("bootstrap");
    let scope = cairn_store_tests::scope("acme", "alice");
    let episode = cairn_store_tests::session_episode;
    let commit = |episode: &Episode| {
        let mut embedded = episode.clone();
        embedded.embedding = Some(vec![0.25, -0.5, 1.0]);
        cairn_store_tests::ingest(&scope, vec![embedded])
    };
    let texts = [
        "I live in Porto",
        "I work at Nimbus",
        "I like jazz",
        "I moved to Lisbon",
    ];
    let mut written = Vec::new();
    for (index, text) in texts.iter().enumerate() {
        let said = episode(text);
        if index > 0 {
            store
                .prepare_episodes(&scope, std::slice::from_ref(&said))
                .await
                .expect("ready");
        }
        if index == 2 {
            // Readied, then never committed; the next ingest is readied and committed.
            // The session's last episode is then found by a search, which sees what the
            // last refresh (each second) made searchable.
            tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
            let next = episode("I play the cello");
            store
                .prepare_episodes(&scope, std::slice::from_ref(&next))
                .await
                .expect("ready");
            store.commit(&scope, commit(&next)).await.expect("ingest");
            written.push(next);
            continue;
        }
        store.commit(&scope, commit(&said)).await.expect("ingest");
        written.push(said);
    }
    raw_json(&url, "POST", &format!("/{}-episodes/_refresh", store.prefix()))
        .await
        .expect("refresh");
    // Consolidation reads on to the gap and waits there (until the reservation is old
    // enough that it cannot fill), as for any reservation whose commit is in flight.
    let readable = store.episodes_after(&scope, 0, 10).await.expect("log");
    assert_eq!(readable.len(), 2, "the log is read up to the unused position");
    let logged = store.episodes_up_to(&scope, 1_000, 10).await.expect("log");
    let ids: Vec<&str> = logged.iter().map(|logged| logged.episode.id.as_str()).collect();
    let expected: Vec<&str> = written.iter().map(|episode| episode.id.as_str()).collect();
    assert_eq!(ids, expected, "every committed episode, in the order committed");
    let positions: Vec<u64> = logged.iter().map(|logged| logged.position).collect();
    assert!(
        positions.windows(2).all(|pair| pair[0] < pair[1]),
        "{positions:?}"
    );
    assert!(
        positions.windows(2).any(|pair| pair[1] > pair[0] + 1),
        "the ingest readied and dropped left a gap: {positions:?}"
    );
    for pair in written.windows(2) {
        let path = format!("/{}-episodes/_doc/{}?routing=acme", store.prefix(), pair[0].id);
        let stored = raw_json(&url, "GET", &path).await.expect("read");
        let context = stored["_source"]["context"].as_str().unwrap_or_default();
        assert!(
            context.contains(&pair[1].text),
            "{:?} has the next episode {:?} as context: {context:?}",
            pair[0].text,
            pair[1].text
        );
    }
}

#[tokio::test]
async fn a_remembered_session_end_never_overwrites_a_change_or_brings_back_a_deletion() {
    use cairn_core::MemoryStore;
    for variable in ["CAIRN_TEST_OPENSEARCH_URL", "CAIRN_TEST_ELASTICSEARCH_URL"] {
        let Some((url, store, _cleanup)) = super::unprepared(variable).await else {
            continue;
        };
        store.bootstrap().await.expect("bootstrap");
        let scope = cairn_store_tests::scope("acme", "alice");
        let said = cairn_store_tests::session_episode;
        let ingest = |episode: &cairn_core::Episode| cairn_store_tests::ingest(&scope, vec![episode.clone()]);
        let path = |id: &str| format!("/{}-episodes/_doc/{id}?routing=acme", store.prefix());

        // Each ingest appends its text to the context of the session's episode before.
        let first = said("I live in Porto");
        let second = said("I work at Nimbus");
        store.commit(&scope, ingest(&first)).await.expect("ingest");
        store.commit(&scope, ingest(&second)).await.expect("ingest");
        let stored = raw_json(&url, "GET", &path(&first.id)).await.expect("read");
        assert_eq!(stored["_source"]["context"], "I work at Nimbus", "{variable}");

        // The session's last episode changes elsewhere: the next ingest leaves it as it is.
        let mut changed = raw_json(&url, "GET", &path(&second.id)).await.expect("read")["_source"].clone();
        changed["context"] = serde_json::json!("written elsewhere");
        assert!(
            matches!(raw_put(&url, &path(&second.id), changed).await, Some(200)),
            "{variable}"
        );
        let third = said("I like jazz");
        store.commit(&scope, ingest(&third)).await.expect("ingest");
        let stored = raw_json(&url, "GET", &path(&second.id)).await.expect("read");
        let context = stored["_source"]["context"].as_str().unwrap_or_default();
        assert!(
            context.starts_with("written elsewhere"),
            "{variable}: {context:?}"
        );

        // Deleted elsewhere: the next ingest does not bring it back.
        let deleted = raw_json(&url, "DELETE", &path(&third.id)).await.expect("delete");
        assert_eq!(deleted["result"], "deleted", "{variable}");
        let fourth = said("I moved to Lisbon");
        store.commit(&scope, ingest(&fourth)).await.expect("ingest");
        let gone = raw_json(&url, "GET", &path(&third.id)).await.expect("read");
        assert_eq!(gone["found"], false, "{variable}: {gone}");
        assert!(
            store
                .get_episode(&scope, &fourth.id)
                .await
                .expect("get")
                .is_some(),
            "{variable}"
        );
    }
}

/// A consolidation run reads the positions this process reserved by id, without a
/// refresh: with the episodes index's scheduled refresh off, the run gets an ingest that
/// a search cannot see yet. Positions another process reserved, and positions that
/// start over after an erasure made there, come from the search instead (the ids
/// remembered here are gone). On both engines.
#[tokio::test]
async fn a_run_reads_the_positions_reserved_here_by_id_without_a_refresh() {
    use cairn_core::MemoryStore;
    for variable in ["CAIRN_TEST_OPENSEARCH_URL", "CAIRN_TEST_ELASTICSEARCH_URL"] {
        let Some((url, store, _cleanup)) = super::unprepared(variable).await else {
            continue;
        };
        store.bootstrap().await.expect("bootstrap");
        let elsewhere = cairn_store_cluster::ClusterStore::connect(&url, store.prefix(), 3)
            .await
            .expect("a second process");
        elsewhere.bootstrap().await.expect("bootstrap");
        // The episodes index made again with its scheduled refresh off from the start
        // (the template gives it the rest): turning the setting off on a live index makes
        // the node run one more refresh, at a moment of its own choosing.
        let episodes = format!("/{}-episodes", store.prefix());
        let removed = raw_json(&url, "DELETE", &episodes).await.expect("delete");
        assert_eq!(removed["acknowledged"], true, "{variable}: {removed}");
        let unrefreshed = serde_json::json!({ "settings": { "index": { "refresh_interval": "-1" } } });
        assert_eq!(
            raw_put(&url, &episodes, unrefreshed).await,
            Some(200),
            "{variable}: scheduled refresh off"
        );
        let alice = cairn_store_tests::scope("acme", "alice");
        let said = cairn_store_tests::session_episode;
        let ingest = |episodes| cairn_store_tests::ingest(&alice, episodes);
        let read = |position: u64, limit: usize| {
            let store = &store;
            let alice = &alice;
            async move {
                let logged = store
                    .episodes_after(alice, position, limit)
                    .await
                    .expect("episodes after");
                logged
                    .into_iter()
                    .map(|logged| (logged.position, logged.episode.id))
                    .collect::<Vec<_>>()
            }
        };

        let first = said("My sister lives in Porto");
        let second = said("She teaches chemistry");
        store
            .commit(&alice, ingest(vec![first.clone(), second.clone()]))
            .await
            .expect("ingest");
        assert_eq!(
            read(0, 10).await,
            vec![(1, first.id.clone()), (2, second.id.clone())],
            "{variable}: the run reads both"
        );
        let searchable = raw_json(&url, "GET", &format!("{episodes}/_count"))
            .await
            .expect("count");
        assert_eq!(
            searchable["count"].as_u64(),
            Some(0),
            "{variable}: read by id, nothing refreshed"
        );
        assert_eq!(
            read(0, 1).await,
            vec![(1, first.id.clone())],
            "{variable}: the limit holds"
        );

        let third = said("She moved there in 2019");
        elsewhere
            .commit(&alice, ingest(vec![third.clone()]))
            .await
            .expect("ingest elsewhere");
        assert_eq!(
            read(2, 10).await,
            vec![(3, third.id.clone())],
            "{variable}: a position reserved elsewhere is searched"
        );

        elsewhere
            .erase_scope(&alice, cairn_store_tests::audit(&alice, "user.erase"))
            .await
            .expect("erase elsewhere");
        let fourth = said("I started learning Portuguese");
        elsewhere
            .commit(&alice, ingest(vec![fourth.clone()]))
            .await
            .expect("ingest after the erasure");
        // Positions go on after an erasure (none is used twice), and a run reads from
        // the erased scope's floor: the positions this process remembers for the
        // erased episodes are not read.
        assert_eq!(
            read(0, 10).await,
            vec![(4, fourth.id.clone())],
            "{variable}: only the episode after the erasure is read"
        );
    }
}

/// A gap in the episode log (a position reserved by an ingest that never wrote it) is
/// passed once its own reservation is older than the patience, however recently the
/// scope's later positions were reserved; until then the run stops at it, and
/// `gap_after` says when it stops holding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_is_passed_once_its_own_reservation_is_old() {
    use cairn_core::MemoryStore;
    for variable in ["CAIRN_TEST_OPENSEARCH_URL", "CAIRN_TEST_ELASTICSEARCH_URL"] {
        let Some((_, store, _cleanup)) = super::unprepared(variable).await else {
            continue;
        };
        let patience = std::time::Duration::from_millis(1500);
        let store = store.with_gap_patience(patience);
        store.bootstrap().await.expect("bootstrap");
        let alice = cairn_store_tests::scope("acme", "alice");
        let said = cairn_store_tests::session_episode;
        let read = |position: u64| {
            let (store, alice) = (&store, &alice);
            async move {
                store
                    .episodes_after(alice, position, 10)
                    .await
                    .expect("episodes after")
                    .into_iter()
                    .map(|logged| (logged.position, logged.episode.id))
                    .collect::<Vec<_>>()
            }
        };
        // An ingest readied (its position reserved) whose embedding then failed.
        let abandoned = said("I adopted a greyhound");
        store
            .prepare_episodes(&alice, std::slice::from_ref(&abandoned))
            .await
            .expect("ready an ingest");
        let second = said("She is called Pepper");
        store
            .commit(&alice, cairn_store_tests::ingest(&alice, vec![second.clone()]))
            .await
            .expect("ingest");
        assert_eq!(read(0).await, Vec::new(), "{variable}: a young gap holds the run");
        let settles = store
            .gap_after(&alice, 0)
            .await
            .expect("gap")
            .expect("a gap after position 0");
        assert!(settles > chrono::Utc::now(), "{variable}: {settles}");

        tokio::time::sleep(patience + std::time::Duration::from_millis(200)).await;
        // A new ingest keeps the scope's newest reservation young; the gap's own is old.
        let third = said("Pepper sleeps on the sofa");
        store
            .commit(&alice, cairn_store_tests::ingest(&alice, vec![third.clone()]))
            .await
            .expect("ingest");
        assert_eq!(
            read(0).await,
            vec![(2, second.id.clone()), (3, third.id.clone())],
            "{variable}: the old gap is passed"
        );
        assert_eq!(
            store.gap_after(&alice, 3).await.expect("gap"),
            None,
            "{variable}: nothing waits after the last position"
        );
        assert!(
            store
                .get_episode(&alice, &abandoned.id)
                .await
                .expect("get")
                .is_none(),
            "{variable}: the abandoned episode was never written"
        );
    }
}

/// A deterministic stream of numbers in [-1, 1) (xorshift), for test vectors.
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// A unit vector near `centre`.
    fn near(&mut self, centre: &[f32], spread: f32) -> Vec<f32> {
        let vector: Vec<f32> = centre.iter().map(|value| value + spread * self.next()).collect();
        let norm = vector.iter().map(|value| value * value).sum::<f32>().sqrt();
        vector.iter().map(|value| value / norm).collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vector_leg_finds_the_exact_neighbours_of_a_large_scope() {
    use cairn_core::{Change, ChangeSet, MemoryStore, Tier, VectorQuery};
    const DIMENSION: usize = 96;
    const LIMIT: usize = 20;
    for variable in ["CAIRN_TEST_OPENSEARCH_URL", "CAIRN_TEST_ELASTICSEARCH_URL"] {
        let Some((store, _cleanup)) = super::fresh_with(variable, DIMENSION).await else {
            continue;
        };
        // Two scopes of one tenant, their vectors loosely around shared topics: the
        // searched scope is half the index, so the graph is searched with the scope as a
        // filter. A graph searched only as wide as the leg's 20 hits found 85% of the
        // exact 20 on OpenSearch here.
        let mut noise = Noise(0x9e37_79b9_7f4a_7c15);
        let topics: Vec<Vec<f32>> = (0..30)
            .map(|_| (0..DIMENSION).map(|_| noise.next()).collect())
            .collect();
        let alice = cairn_store_tests::scope("acme", "alice");
        let bob = cairn_store_tests::scope("acme", "bob");
        let mut kept: Vec<(String, Vec<f32>)> = Vec::new();
        for (scope, searched) in [(&alice, true), (&bob, false)] {
            for chunk in 0..6 {
                let mut change_set = ChangeSet::new(cairn_store_tests::audit(scope, "test.load"));
                for index in 0..500 {
                    let vector = noise.near(&topics[(chunk * 500 + index) % topics.len()], 3.0);
                    let mut fact = cairn_store_tests::fact("a fact", chrono::Utc::now());
                    fact.embedding = Some(vector.clone());
                    if searched {
                        kept.push((fact.id.clone(), vector));
                    }
                    change_set.changes.push(Change::InsertFact(fact));
                }
                store.commit(scope, change_set).await.expect("load");
            }
        }
        let queries: Vec<Vec<f32>> = (0..40)
            .map(|index| noise.near(&topics[index % topics.len()], 1.5))
            .collect();
        let legs: Vec<VectorQuery> = queries
            .iter()
            .map(|vector| {
                let mut filter = cairn_store_tests::current_in(Tier::Semantic);
                filter.limit = LIMIT;
                VectorQuery {
                    filter,
                    vector: vector.clone(),
                }
            })
            .collect();
        let answers = store.search_vectors(&alice, &legs).await.expect("search");
        let mut found = 0;
        for (query, hits) in queries.iter().zip(&answers) {
            let mut exact: Vec<(f32, &str)> = kept
                .iter()
                .map(|(id, vector)| {
                    let cosine = vector.iter().zip(query).map(|(a, b)| a * b).sum::<f32>();
                    (cosine, id.as_str())
                })
                .collect();
            exact.sort_by(|left, right| right.0.total_cmp(&left.0));
            let best: std::collections::HashSet<&str> = exact.iter().take(LIMIT).map(|(_, id)| *id).collect();
            assert_eq!(hits.len(), LIMIT, "{variable}: a full leg");
            found += hits.iter().filter(|hit| best.contains(hit.memory.id())).count();
        }
        let recall = found as f64 / (LIMIT * queries.len()) as f64;
        eprintln!("{variable}: the vector leg found {recall:.3} of the exact top {LIMIT}");
        assert!(
            recall >= 0.9,
            "{variable}: the vector leg found {recall:.3} of the exact top {LIMIT}"
        );
    }
}
