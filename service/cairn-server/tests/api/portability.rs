//! Data portability: a user's whole memory exported, erased and imported back answers
//! recalls as before with its tombstones still blocking; mem0 exports come in through
//! the write gates.

use super::{ALL, call, count_facts, drop_indices, error_code, harness_with, token, until_ready, write};
use actix_web::http::{Method, StatusCode};
use serde_json::{Value, json};

const QUERIES: [&str; 4] = [
    "where does the user live",
    "which instrument does the user play",
    "what is the user allergic to",
    "how does the user get to work",
];

async fn recalled<S, B>(service: &S, bearer: &str, user: &str) -> Vec<Vec<(String, String)>>
where
    S: actix_web::dev::Service<
            actix_http::Request,
            Response = actix_web::dev::ServiceResponse<B>,
            Error = actix_web::Error,
        >,
    B: actix_web::body::MessageBody,
{
    let mut answers = Vec::new();
    for query in QUERIES {
        let (status, body, _) = call(
            service,
            Method::POST,
            &format!("/v1/users/{user}/recall"),
            Some(bearer),
            Some(json!({ "query": query, "k": 3, "tiers": ["semantic", "procedural"] })),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        answers.push(
            body["hits"]
                .as_array()
                .expect("hits")
                .iter()
                .map(|hit| {
                    (
                        hit["text"].as_str().unwrap_or_default().to_owned(),
                        hit["status"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect(),
        );
    }
    answers
}

/// (text, status) of every fact of the user, sorted.
async fn all_facts<S, B>(service: &S, bearer: &str, user: &str) -> Vec<(String, String)>
where
    S: actix_web::dev::Service<
            actix_http::Request,
            Response = actix_web::dev::ServiceResponse<B>,
            Error = actix_web::Error,
        >,
    B: actix_web::body::MessageBody,
{
    let (_, body, _) = call(
        service,
        Method::GET,
        &format!("/v1/users/{user}/facts?status=all&limit=100"),
        Some(bearer),
        None,
    )
    .await;
    let mut facts: Vec<(String, String)> = body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|fact| {
            (
                fact["text"].as_str().unwrap_or_default().to_owned(),
                fact["status"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    facts.sort();
    facts
}

#[actix_web::test]
async fn an_export_erased_and_imported_answers_as_before() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    let (status, body, _) = call(
        service,
        Method::POST,
        "/v1/users/u1/episodes",
        Some(&owner),
        Some(json!({
            "session_id": "s1",
            "messages": [
                { "role": "user", "content": "I live in Lisbon." },
                { "role": "user", "content": "I am allergic to peanuts." },
                { "role": "user", "content": "I drive a Civic to work." }
            ],
            "consolidate": "sync"
        })),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (_, cello) = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user plays the cello" }),
    )
    .await;
    let (status, _) = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user plays the viola", "supersedes": cello["fact"]["id"] }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let (_, kiln) = write(service, &owner, "u1", json!({ "text": "The user owns a kiln" })).await;
    let kiln = kiln["fact"]["id"].as_str().expect("id").to_owned();
    call(
        service,
        Method::POST,
        &format!("/v1/users/u1/facts/{kiln}/retract"),
        Some(&owner),
        None,
    )
    .await;
    let (_, hint) = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user's PIN hint is moon" }),
    )
    .await;
    let hint = hint["fact"]["id"].as_str().expect("id").to_owned();
    let (status, _, _) = call(
        service,
        Method::DELETE,
        &format!("/v1/users/u1/facts/{hint}"),
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (_, playbook, _) = call(
        service,
        Method::POST,
        "/v1/users/u1/playbooks",
        Some(&owner),
        Some(json!({ "name": "Commute", "trigger": "the user drives to work", "steps": ["check traffic"] })),
    )
    .await;
    let playbook = playbook["playbook"]["id"].as_str().expect("id").to_owned();
    call(
        service,
        Method::POST,
        &format!("/v1/users/u1/playbooks/{playbook}/versions"),
        Some(&owner),
        Some(json!({ "steps": ["check traffic", "leave early"], "base_version": 1 })),
    )
    .await;
    let before = recalled(service, &owner, "u1").await;
    let facts_before = all_facts(service, &owner, "u1").await;
    assert!(before.iter().all(|hits| !hits.is_empty()), "{before:?}");

    // Only an admin may export.
    let (status, _, _) = call(
        service,
        Method::GET,
        "/v1/users/u1/export",
        Some(&token("acme", "memory:read,memory:write")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, export, _) = call(service, Method::GET, "/v1/users/u1/export", Some(&owner), None).await;
    assert_eq!(status, StatusCode::OK, "{export}");
    assert_eq!(
        (export["format"].as_str(), export["version"].as_u64()),
        (Some("cairn-export"), Some(1))
    );
    assert_eq!(export["episodes"].as_array().map(Vec::len), Some(3));
    assert_eq!(export["consolidated_episodes"], 3);
    let statuses: Vec<&str> = export["facts"]
        .as_array()
        .expect("facts")
        .iter()
        .filter_map(|fact| fact["status"].as_str())
        .collect();
    assert!(
        statuses.contains(&"superseded") && statuses.contains(&"retracted"),
        "{statuses:?}"
    );
    assert_eq!(export["tombstones"].as_array().map(Vec::len), Some(2));
    assert_eq!(
        export["playbooks"][0]["versions"].as_array().map(Vec::len),
        Some(2)
    );
    assert!(
        export["facts"][0].get("embedding").is_none(),
        "vectors are not exported"
    );
    assert!(
        !export.to_string().contains("PIN hint is moon"),
        "a forgotten value is not exported"
    );

    // Into a user that already holds memory: refused, nothing written.
    let (status, body, _) = call(
        service,
        Method::POST,
        "/v1/users/u1/import",
        Some(&owner),
        Some(export.clone()),
    )
    .await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::CONFLICT, "scope_not_empty")
    );

    let (status, _, _) = call(service, Method::DELETE, "/v1/users/u1", Some(&owner), None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, report, _) = call(
        service,
        Method::POST,
        "/v1/users/u1/import",
        Some(&owner),
        Some(export.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{report}");
    assert_eq!(
        report["imported"],
        json!({ "episodes": 3, "facts": export["facts"].as_array().map(Vec::len), "playbooks": 1,
                "playbook_versions": 2, "tombstones": 2, "decisions": export["decisions"].as_array().map(Vec::len),
                "reviews": 0 })
    );
    assert_eq!(recalled(service, &owner, "u1").await, before);
    assert_eq!(all_facts(service, &owner, "u1").await, facts_before);
    for value in ["The user owns a kiln", "the user's PIN hint is moon"] {
        let (status, body) = write(service, &owner, "u1", json!({ "text": value })).await;
        assert_eq!(
            (status, error_code(&body)),
            (StatusCode::CONFLICT, "tombstoned"),
            "{value}"
        );
    }
    let (_, versions, _) = call(
        service,
        Method::GET,
        &format!(
            "/v1/users/u1/playbooks/{}/versions",
            export["playbooks"][0]["id"].as_str().unwrap_or_default()
        ),
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(
        versions["error"]["code"], "not_found",
        "imported records get new ids"
    );
    // The imported episodes count as consolidated: a run derives nothing twice.
    let facts = count_facts(service, "acme", "u1").await;
    let (status, run, _) = call(
        service,
        Method::POST,
        "/v1/users/u1/consolidate",
        Some(&owner),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(count_facts(service, "acme", "u1").await, facts);
    let (_, trail, _) = call(
        service,
        Method::GET,
        "/v1/users/u1/audit?limit=5",
        Some(&owner),
        None,
    )
    .await;
    assert!(
        trail["items"]
            .as_array()
            .expect("items")
            .iter()
            .any(|event| event["action"] == "user.import"),
        "{trail}"
    );
    // The history the import brought is marked as imported wherever it is shown, and
    // audited with the import.
    let (_, decisions, _) = call(
        service,
        Method::GET,
        "/v1/users/u1/decisions?limit=100",
        Some(&owner),
        None,
    )
    .await;
    let imported: Vec<&Value> = decisions["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|decision| {
            decision["origin"]
                .as_str()
                .is_some_and(|origin| origin.starts_with("import:"))
        })
        .collect();
    assert_eq!(
        imported.len(),
        export["decisions"].as_array().map_or(0, Vec::len),
        "every imported decision says so: {decisions}"
    );
    let (_, full_trail, _) = call(
        service,
        Method::GET,
        "/v1/users/u1/audit?limit=100",
        Some(&owner),
        None,
    )
    .await;
    let import_event = full_trail["items"]
        .as_array()
        .and_then(|events| {
            events
                .iter()
                .find(|event| event["action"] == "user.import" && !event["detail"]["history"].is_null())
        })
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(
        import_event["detail"]["history"]["decisions"],
        imported.len(),
        "{full_trail}"
    );

    // A document that does not hold together is refused whole.
    let mut broken = export.clone();
    broken["facts"][0]["superseded_by"] = json!("fact_missing");
    let (status, body, _) = call(
        service,
        Method::POST,
        "/v1/users/u3/import",
        Some(&owner),
        Some(broken),
    )
    .await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request"),
        "{body}"
    );
    // Every record is held to the limits its write route keeps.
    for (path, value) in [
        ("/playbooks/0/versions/0/steps", json!(vec!["a step"; 503])),
        ("/playbooks/0/versions/0/steps", json!(["x".repeat(2_000)])),
        ("/playbooks/0/versions/0/steps", json!([" "])),
        ("/facts/0/source_span", json!("y".repeat(2_000))),
        ("/decisions/0/reason", json!("z".repeat(2_000))),
    ] {
        let mut oversized = export.clone();
        *oversized.pointer_mut(path).expect("the field") = value;
        let (status, body, _) = call(
            service,
            Method::POST,
            "/v1/users/u3/import",
            Some(&owner),
            Some(oversized),
        )
        .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{path}: {body}");
    }

    // Nor may a document make active a value its own unlifted tombstone refuses.
    let mut resurrecting = export.clone();
    let active = resurrecting["facts"]
        .as_array()
        .and_then(|facts| facts.iter().find(|fact| fact["status"] == "active"))
        .and_then(|fact| fact["text"].as_str())
        .expect("an active fact")
        .to_owned();
    resurrecting["tombstones"][0]["fingerprint"] = json!(cairn_core::text::fingerprint(&active));
    resurrecting["tombstones"][0]["lifted_at"] = Value::Null;
    let (status, body, _) = call(
        service,
        Method::POST,
        "/v1/users/u3/import",
        Some(&owner),
        Some(resurrecting),
    )
    .await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request"),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("tombstone")),
        "{body}"
    );
    let (status, body, _) = call(
        service,
        Method::POST,
        "/v1/users/u3/import?format=yaml",
        Some(&owner),
        Some(export.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(count_facts(service, "acme", "u3").await, 0);
    let (_, episodes, _) = call(service, Method::GET, "/v1/users/u3/episodes", Some(&owner), None).await;
    assert_eq!(episodes["items"], json!([]));
}

#[actix_web::test]
async fn a_mem0_export_comes_in_through_the_write_gates() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    let document: Value =
        serde_json::from_str(include_str!("../../../../tests/fixtures/mem0_get_all.json")).expect("fixture");

    // Memories of another user refuse the whole document.
    let (status, body, _) = call(
        service,
        Method::POST,
        "/v1/users/bob/import?format=mem0",
        Some(&owner),
        Some(document.clone()),
    )
    .await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request"),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("user_id"),
        "{body}"
    );
    assert_eq!(count_facts(service, "acme", "bob").await, 0);

    let import = |document: Value| async {
        let (status, body, _) = call(
            service,
            Method::POST,
            "/v1/users/alice/import?format=mem0",
            Some(&owner),
            Some(document),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["imported"].clone()
    };
    assert_eq!(
        import(document.clone()).await,
        json!({ "created": 4, "duplicates": 0, "tombstoned": 0 })
    );
    let (_, facts, _) = call(service, Method::GET, "/v1/users/alice/facts", Some(&owner), None).await;
    let vegetarian = facts["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|fact| fact["text"] == "Is a vegetarian and avoids dairy")
        .expect("imported");
    assert_eq!(vegetarian["fact_type"], "constraint");
    let lisbon = facts["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|fact| fact["text"] == "Lives in Lisbon")
        .and_then(|fact| fact["id"].as_str())
        .expect("imported")
        .to_owned();
    let (status, recall, _) = call(
        service,
        Method::POST,
        "/v1/users/alice/recall",
        Some(&owner),
        Some(json!({ "query": "which sport does alice play", "k": 1 })),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(recall["hits"][0]["text"], "Likes to play cricket on weekends");

    // Importing again duplicates nothing; a value the user forgot stays forgotten.
    call(
        service,
        Method::DELETE,
        &format!("/v1/users/alice/facts/{lisbon}"),
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(
        import(document.clone()).await,
        json!({ "created": 0, "duplicates": 3, "tombstoned": 1 })
    );
    // The bare list of older releases is read too.
    let list = document["results"].clone();
    assert_eq!(
        import(list).await,
        json!({ "created": 0, "duplicates": 3, "tombstoned": 1 })
    );
    let mut bad = document.clone();
    bad["results"][0]["created_at"] = json!("last tuesday");
    let (status, body, _) = call(
        service,
        Method::POST,
        "/v1/users/carol/import?format=mem0",
        Some(&owner),
        Some(bad),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(count_facts(service, "acme", "carol").await, 0);
}

#[actix_web::test]
async fn the_user_list_shows_a_tenants_users_to_its_admins_only() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    for (user, text) in [
        ("ada", "The user knits"),
        ("ada", "The user rows"),
        ("bo", "The user sings"),
    ] {
        let (status, _) = write(service, &owner, user, json!({ "text": text })).await;
        assert_eq!(status, StatusCode::CREATED);
    }
    write(
        service,
        &token("evil", ALL),
        "ada",
        json!({ "text": "Another tenant's fact" }),
    )
    .await;

    let (status, body, _) = call(service, Method::GET, "/v1/users?limit=1", Some(&owner), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["items"][0]["user"], "ada");
    assert_eq!(body["items"][0]["facts"], 2);
    assert_eq!(body["items"][0]["active_facts"], 2);
    assert!(body["items"][0]["last_activity"].is_string(), "{body}");
    let cursor = body["next_cursor"].as_str().expect("a next page").to_owned();
    let (_, next, _) = call(
        service,
        Method::GET,
        &format!("/v1/users?limit=1&cursor={cursor}"),
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(next["items"][0]["user"], "bo");
    let (_, evil, _) = call(service, Method::GET, "/v1/users", Some(&token("evil", ALL)), None).await;
    assert_eq!(evil["items"].as_array().map(Vec::len), Some(1), "{evil}");
    assert_eq!(evil["items"][0]["facts"], 1);

    let write_only = token("acme", "memory:read,memory:write");
    let (status, body, _) = call(service, Method::GET, "/v1/users", Some(&write_only), None).await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::FORBIDDEN, "insufficient_scope")
    );
    let bound = super::token_with("acme", ALL, Some("ada"), 3600, None, super::SECRET);
    let (status, body, _) = call(service, Method::GET, "/v1/users", Some(&bound), None).await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::FORBIDDEN, "user_mismatch")
    );
    let (status, _, _) = call(service, Method::GET, "/v1/users", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body, _) = call(
        service,
        Method::GET,
        "/v1/users?cursor=%00bad",
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
}

/// Two replicas (two services on one cluster prefix, each with its own process-local
/// locks) importing into the same empty user at once: the store's claim lets one write
/// and refuses the other with 409 `scope_not_empty`; the user's memory is not doubled.
#[actix_web::test]
async fn two_imports_into_one_user_on_two_replicas_let_one_write() {
    use cairn_server::config::Backend;
    for (variable, backend) in [
        ("CAIRN_TEST_OPENSEARCH_URL", Backend::Opensearch),
        ("CAIRN_TEST_ELASTICSEARCH_URL", Backend::Elasticsearch),
    ] {
        let Some(url) = super::test_cluster(variable) else {
            eprintln!("skipped on {backend:?}: {variable} is not set");
            continue;
        };
        let prefix = format!("cairn-api-{}", uuid::Uuid::now_v7().simple());
        let replica = || {
            harness_with(|config| {
                config.backend = backend;
                config.cluster_url = Some(url.clone());
                config.index_prefix = prefix.clone();
            })
        };
        let (first, second) = (replica().await, replica().await);
        for harness in [&first, &second] {
            until_ready(&harness.service, &format!("{backend:?}: the replica")).await;
        }
        let owner = token("acme", ALL);
        for index in 0..40 {
            let (status, body, _) = call(
                &first.service,
                Method::POST,
                "/v1/users/source/episodes",
                Some(&owner),
                Some(json!({ "messages": [{ "role": "user",
                    "content": format!("Note {index}: I water the plants on the balcony") }],
                    "consolidate": "none" })),
            )
            .await;
            assert_eq!(status, StatusCode::CREATED, "{body}");
        }
        let (status, export, _) = call(
            &first.service,
            Method::GET,
            "/v1/users/source/export",
            Some(&owner),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{export}");
        let import = |service| {
            let export = export.clone();
            let owner = owner.clone();
            async move {
                let (status, body, _) = call(
                    service,
                    Method::POST,
                    "/v1/users/target/import",
                    Some(&owner),
                    Some(export),
                )
                .await;
                (status, body)
            }
        };
        let (one, other) = tokio::join!(import(&first.service), import(&second.service));
        let mut statuses = [one.0, other.0];
        statuses.sort();
        assert_eq!(
            statuses,
            [StatusCode::CREATED, StatusCode::CONFLICT],
            "{backend:?}: one import writes: {one:?} {other:?}"
        );
        let refused = if one.0 == StatusCode::CONFLICT {
            &one.1
        } else {
            &other.1
        };
        assert_eq!(error_code(refused), "scope_not_empty", "{refused}");
        let (status, page, _) = call(
            &second.service,
            Method::GET,
            "/v1/users/target/episodes?limit=100",
            Some(&owner),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert_eq!(
            page["items"].as_array().map(Vec::len),
            Some(40),
            "{backend:?}: the user's memory is not doubled"
        );
        drop_indices(&url, &prefix).await;
    }
}

/// A write of a value that lands while an import of the same value is under way (after
/// its emptiness check, while it embeds) never leaves the value active twice: whichever
/// commits second is refused as the duplicate.
#[actix_web::test]
async fn a_write_during_an_import_never_makes_a_value_active_twice() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    let at = "2026-11-01T10:00:00Z";
    let episodes: Vec<Value> = (0..300)
        .map(|index| json!({ "id": format!("e{index}"), "session_id": null,
            "text": format!("Note {index}: the user keeps a garden journal"), "occurred_at": at, "ingested_at": at }))
        .collect();
    let document = json!({
        "format": "cairn-export", "version": 1, "exported_at": at, "tenant": "acme", "user": "source",
        "consolidated_episodes": 0, "episodes": episodes,
        "facts": [{ "id": "f1", "fact_type": "preference", "text": "The user lives in Porto", "confidence": 0.9,
                    "status": "active", "source_episode_ids": ["e0"], "created_at": at, "use_count": 0 }],
        "playbooks": [], "tombstones": [], "decisions": [], "reviews": []
    });
    let import = call(
        service,
        Method::POST,
        "/v1/users/target/import",
        Some(&owner),
        Some(document),
    );
    let written = async {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        write(
            service,
            &owner,
            "target",
            json!({ "text": "The user lives in Porto" }),
        )
        .await
    };
    let ((imported, report, _), (wrote, body)) = tokio::join!(import, written);
    assert!(
        [StatusCode::CREATED, StatusCode::CONFLICT].contains(&imported),
        "{imported}: {report}"
    );
    assert!(
        [StatusCode::CREATED, StatusCode::CONFLICT].contains(&wrote),
        "{wrote}: {body}"
    );
    let (_, facts, _) = call(
        service,
        Method::GET,
        "/v1/users/target/facts?status=active",
        Some(&owner),
        None,
    )
    .await;
    let porto = facts["items"].as_array().map_or(0, |items| {
        items
            .iter()
            .filter(|fact| fact["text"] == "The user lives in Porto")
            .count()
    });
    assert_eq!(
        porto, 1,
        "import {imported} {report}; write {wrote} {body}; facts {facts}"
    );
}

/// Forgets `$forgotten` in `$user` and answers the user's export.
macro_rules! export_forgetting {
    ($service:expr, $owner:expr, $user:expr, $forgotten:expr) => {{
        let (_, fact) = write($service, $owner, $user, json!({ "text": $forgotten })).await;
        let id = fact["fact"]["id"].as_str().expect("id").to_owned();
        let path = format!("/v1/users/{}/facts/{id}", $user);
        let (status, _, _) = call($service, Method::DELETE, &path, Some($owner), None).await;
        assert_eq!(status, StatusCode::OK);
        let path = format!("/v1/users/{}/export", $user);
        let (status, export, _) = call($service, Method::GET, &path, Some($owner), None).await;
        assert_eq!(status, StatusCode::OK, "{export}");
        export
    }};
}

/// Imports `$document` into `$user`: status and body.
macro_rules! import_into {
    ($service:expr, $owner:expr, $user:expr, $document:expr) => {{
        let path = format!("/v1/users/{}/import", $user);
        let (status, body, _) = call($service, Method::POST, &path, Some($owner), Some($document)).await;
        (status, body)
    }};
}

/// What writing `$text` again into `$user` answers: status and error code.
macro_rules! written_again {
    ($service:expr, $owner:expr, $user:expr, $text:expr) => {{
        let (status, body) = write($service, $owner, $user, json!({ "text": $text })).await;
        (status, error_code(&body).to_owned())
    }};
}

/// An export carries each tombstoned value sealed (never the unkeyed hash a reader could
/// confirm a guess with): under the tenant's key kept in the store, or under
/// `CAIRN_EXPORT_KEY` when the operator sets one. The same store, or any service with
/// the same export key, opens them on import and keeps refusing the values; a service
/// with another key refuses the file instead of dropping the tombstones.
#[actix_web::test]
async fn exported_tombstones_are_sealed_and_open_only_with_their_key() {
    let forgotten = "The user's PIN hint is moon";
    let raw = cairn_core::text::fingerprint(forgotten);
    let owner = token("acme", ALL);
    let blocked = (StatusCode::CONFLICT, "tombstoned".to_owned());

    let home = harness_with(|_| ()).await;
    let export = export_forgetting!(&home.service, &owner, "u1", forgotten);
    let sealed = export["tombstones"][0]["fingerprint"]
        .as_str()
        .expect("a tombstone")
        .to_owned();
    assert!(sealed.starts_with("sealed-v1:"), "{sealed}");
    let hex = raw.trim_start_matches("sha256:");
    assert!(
        !export.to_string().contains(hex),
        "no unkeyed hash of the value: {export}"
    );
    let (_, again, _) = call(
        &home.service,
        Method::GET,
        "/v1/users/u1/export",
        Some(&owner),
        None,
    )
    .await;
    assert_ne!(
        again["tombstones"][0]["fingerprint"],
        json!(sealed),
        "sealed afresh each time"
    );

    let (status, body) = import_into!(&home.service, &owner, "u2", export.clone());
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(
        written_again!(&home.service, &owner, "u2", forgotten),
        blocked,
        "the tombstone came along"
    );

    let elsewhere = harness_with(|_| ()).await;
    let (status, body) = import_into!(&elsewhere.service, &owner, "u1", export);
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body.to_string().contains("tombstones[0].fingerprint"), "{body}");
    assert_eq!(
        count_facts(&elsewhere.service, "acme", "u1").await,
        0,
        "bad input changes nothing"
    );

    // Two services sharing CAIRN_EXPORT_KEY exchange exports.
    let key = "an-export-key-shared-by-two-services-0123456789";
    let from = harness_with(|config| config.export_key = Some(key.into())).await;
    let to = harness_with(|config| config.export_key = Some(key.into())).await;
    let export = export_forgetting!(&from.service, &owner, "u1", forgotten);
    let (status, body) = import_into!(&to.service, &owner, "u1", export);
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(written_again!(&to.service, &owner, "u1", forgotten), blocked);
}
