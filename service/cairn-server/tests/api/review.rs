//! Human review over REST: a policy holds outcomes as pending, reviewers approve or
//! reject them, and nothing held changes memory until then.

use super::*;

const REVIEWER: &str = "memory:review";

/// The semantic hits of a recall, as `(text, status)`.
async fn facts_recalled<S, B>(service: &S, user: &str, query: &str, pending: bool) -> Vec<(String, String)>
where
    S: Service<actix_http::Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: actix_web::body::MessageBody,
{
    let (status, body, _) = call(
        service,
        Method::POST,
        &format!("/v1/users/{user}/recall"),
        Some(&token("acme", ALL)),
        Some(json!({ "query": query, "tiers": ["semantic"], "include_pending": pending })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
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
        .collect()
}

/// Says `text` as the user and consolidates at once.
async fn say<S, B>(service: &S, user: &str, text: &str) -> Value
where
    S: Service<actix_http::Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: actix_web::body::MessageBody,
{
    let (status, body, _) = call(
        service,
        Method::POST,
        &format!("/v1/users/{user}/episodes"),
        Some(&token("acme", ALL)),
        Some(json!({ "messages": [{ "role": "user", "content": text }], "consolidate": "sync" })),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body
}

/// The user's pending reviews.
async fn queue<S, B>(service: &S, user: &str) -> Vec<Value>
where
    S: Service<actix_http::Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: actix_web::body::MessageBody,
{
    let (status, body, _) = call(
        service,
        Method::GET,
        &format!("/v1/users/{user}/reviews"),
        Some(&token("acme", REVIEWER)),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["items"].as_array().cloned().unwrap_or_default()
}

async fn decide<S, B>(
    service: &S,
    bearer: &str,
    user: &str,
    review: &str,
    verb: &str,
    body: Option<Value>,
) -> (StatusCode, Value)
where
    S: Service<actix_http::Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: actix_web::body::MessageBody,
{
    let (status, body, _) = call(
        service,
        Method::POST,
        &format!("/v1/users/{user}/reviews/{review}/{verb}"),
        Some(bearer),
        body,
    )
    .await;
    (status, body)
}

/// "I live in Porto", then "I moved to Lisbon", under a policy holding supersessions:
/// the move waits in the queue and Porto stays current. Returns the review.
async fn held_move<S, B>(service: &S, user: &str) -> Value
where
    S: Service<actix_http::Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: actix_web::body::MessageBody,
{
    say(service, user, "I live in Porto").await;
    let moved = say(service, user, "I moved to Lisbon").await;
    let decisions = moved["consolidation"]["run"]["decisions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        decisions
            .iter()
            .any(|decision| decision["kind"] == "HELD_FOR_REVIEW"),
        "{moved}"
    );
    let held = queue(service, user).await;
    assert_eq!(held.len(), 1, "{held:?}");
    held[0].clone()
}

fn texts(hits: &[(String, String)]) -> Vec<&str> {
    hits.iter().map(|(text, _)| text.as_str()).collect()
}

#[actix_web::test]
async fn a_held_supersession_waits_for_a_reviewer() {
    let harness = harness_with(|config| config.review = "supersession".into()).await;
    let service = &harness.service;
    let review = held_move(service, "u1").await;
    assert_eq!(review["kind"], "supersession");
    assert_eq!(review["status"], "pending");
    assert_eq!(review["rule"], "supersession");
    assert_eq!(review["user"], "u1");
    assert!(
        review["fact"]["text"]
            .as_str()
            .is_some_and(|text| text.contains("Lisbon")),
        "{review}"
    );
    assert_eq!(review["fact"]["status"], "pending");
    assert!(
        review["target"]["text"]
            .as_str()
            .is_some_and(|text| text.contains("Porto")),
        "{review}"
    );
    assert_eq!(review["target"]["status"], "active");
    let review_id = review["id"].as_str().expect("id");

    // Held: recall still says Porto; Lisbon shows only when asked for, marked pending.
    let before = facts_recalled(service, "u1", "where does the user live", false).await;
    assert!(
        texts(&before).iter().any(|text| text.contains("Porto")),
        "{before:?}"
    );
    assert!(
        !texts(&before).iter().any(|text| text.contains("Lisbon")),
        "{before:?}"
    );
    let shown = facts_recalled(service, "u1", "where does the user live", true).await;
    assert!(
        shown
            .iter()
            .any(|(text, status)| text.contains("Lisbon") && status == "pending"),
        "{shown:?}"
    );

    // Only a reviewer decides: not a writer, not a reader, not another user's token.
    for scopes in ["memory:write", "memory:read", "memory:read,memory:write"] {
        let (status, body) = decide(service, &token("acme", scopes), "u1", review_id, "approve", None).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{scopes}: {body}");
        assert_eq!(error_code(&body), "insufficient_scope");
    }
    let elsewhere = token_with("acme", REVIEWER, Some("u2"), 3600, None, SECRET);
    let (status, _) = decide(service, &elsewhere, "u1", review_id, "approve", None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, body) = decide(
        service,
        &token("globex", REVIEWER),
        "u1",
        review_id,
        "approve",
        None,
    )
    .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "another tenant's reviewer finds nothing: {body}"
    );
    assert_eq!(
        queue(service, "u1").await.len(),
        1,
        "refused approvals change nothing"
    );

    // Approved: Lisbon is current and Porto is history.
    let (status, approved) = decide(
        service,
        &token("acme", REVIEWER),
        "u1",
        review_id,
        "approve",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{approved}");
    assert_eq!(approved["review"]["status"], "approved");
    assert_eq!(approved["review"]["resolved_by"], "acme-service");
    assert_eq!(approved["fact"]["status"], "active");
    assert_eq!(approved["decision"]["kind"], "APPROVED");
    assert_eq!(approved["decision"]["gate"], "review");
    let after = facts_recalled(service, "u1", "where does the user live", false).await;
    assert!(
        texts(&after).iter().any(|text| text.contains("Lisbon")),
        "{after:?}"
    );
    assert!(
        !texts(&after).iter().any(|text| text.contains("Porto")),
        "{after:?}"
    );
    assert!(queue(service, "u1").await.is_empty());
    let (status, body) = decide(
        service,
        &token("acme", "memory:admin"),
        "u1",
        review_id,
        "approve",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(error_code(&body), "review_resolved");

    // The decision log tells the story in order.
    let (_, log, _) = call(
        service,
        Method::GET,
        "/v1/users/u1/decisions",
        Some(&token("acme", ALL)),
        None,
    )
    .await;
    let kinds: Vec<&str> = log["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|decision| decision["kind"].as_str())
        .filter(|kind| ["HELD_FOR_REVIEW", "APPROVED", "REJECTED"].contains(kind))
        .collect();
    assert_eq!(kinds, vec!["APPROVED", "HELD_FOR_REVIEW"], "newest first");
    let (_, trail, _) = call(
        service,
        Method::GET,
        "/v1/users/u1/audit",
        Some(&token("acme", ALL)),
        None,
    )
    .await;
    assert!(
        trail["items"]
            .as_array()
            .expect("items")
            .iter()
            .any(|event| event["action"] == "review.approve" && event["subject"] == "acme-service"),
        "{trail}"
    );
}

#[actix_web::test]
async fn a_rejected_value_stays_out_and_is_not_queued_again() {
    let harness = harness_with(|config| config.review = "supersession".into()).await;
    let service = &harness.service;
    let review = held_move(service, "u1").await;
    let review_id = review["id"].as_str().expect("id");
    let (status, rejected) = decide(
        service,
        &token("acme", REVIEWER),
        "u1",
        review_id,
        "reject",
        Some(json!({ "reason": "the user only visited Lisbon" })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{rejected}");
    assert_eq!(rejected["review"]["status"], "rejected");
    assert_eq!(rejected["review"]["note"], "the user only visited Lisbon");
    assert_eq!(rejected["fact"]["status"], "retracted");
    assert_eq!(rejected["decision"]["kind"], "REJECTED");
    let after = facts_recalled(service, "u1", "where does the user live", true).await;
    assert!(
        texts(&after).iter().any(|text| text.contains("Porto")),
        "{after:?}"
    );
    assert!(
        !texts(&after).iter().any(|text| text.contains("Lisbon")),
        "{after:?}"
    );

    // The same statement again is known as the rejected value, not queued again.
    let again = say(service, "u1", "I moved to Lisbon").await;
    assert!(queue(service, "u1").await.is_empty(), "{again}");
    let decisions = again["consolidation"]["run"]["decisions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        decisions.iter().any(|decision| decision["kind"] == "DUPLICATE"
            && decision["reason"]
                .as_str()
                .is_some_and(|reason| reason.contains("rejected"))),
        "{again}"
    );
    let (status, body) = decide(
        service,
        &token("acme", REVIEWER),
        "u1",
        review_id,
        "approve",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");

    // With a tombstone, the value cannot be written back either.
    let second = held_move(service, "u2").await;
    let (status, body) = decide(
        service,
        &token("acme", REVIEWER),
        "u2",
        second["id"].as_str().expect("id"),
        "reject",
        Some(json!({ "tombstone": true })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = write(
        service,
        &token("acme", ALL),
        "u2",
        json!({ "text": second["fact"]["text"] }),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(error_code(&body), "tombstoned");
}

#[actix_web::test]
async fn two_approvals_at_once_apply_once_and_a_moved_world_refuses() {
    let harness = harness_with(|config| config.review = "supersession".into()).await;
    let service = &harness.service;
    let reviewer = token("acme", REVIEWER);
    let review = held_move(service, "u1").await;
    let review_id = review["id"].as_str().expect("id");
    let (one, two) = tokio::join!(
        decide(service, &reviewer, "u1", review_id, "approve", None),
        decide(service, &reviewer, "u1", review_id, "approve", None)
    );
    let mut statuses = [one.0, two.0];
    statuses.sort();
    assert_eq!(
        statuses,
        [StatusCode::OK, StatusCode::CONFLICT],
        "{one:?} {two:?}"
    );
    let current = facts_recalled(service, "u1", "where does the user live", false).await;
    assert_eq!(
        current.iter().filter(|(text, _)| text.contains("Lisbon")).count(),
        1,
        "{current:?}"
    );

    // The fact a held supersession replaces is forgotten meanwhile: approving is a 409
    // and changes nothing.
    let review = held_move(service, "u2").await;
    let porto = review["target"]["id"].as_str().expect("target");
    let (status, body, _) = call(
        service,
        Method::DELETE,
        &format!("/v1/users/u2/facts/{porto}"),
        Some(&token("acme", ALL)),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = decide(
        service,
        &reviewer,
        "u2",
        review["id"].as_str().expect("id"),
        "approve",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(error_code(&body), "review_stale");
    let left = queue(service, "u2").await;
    assert_eq!(left.len(), 1, "still pending");
    assert_eq!(left[0]["fact"]["status"], "pending");
    let shown = facts_recalled(service, "u2", "where does the user live", false).await;
    assert!(shown.is_empty(), "nothing became current: {shown:?}");

    // Erasure takes the queue with it and says so.
    let (status, receipt, _) = call(
        service,
        Method::DELETE,
        "/v1/users/u2",
        Some(&token("acme", ALL)),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{receipt}");
    assert_eq!(receipt["deleted"]["reviews"], 1);
    assert!(queue(service, "u2").await.is_empty());
}

/// The operator's scrape credential in these tests.
const OPERATOR: &str = "operator-scrape-credential-0123456789";

#[actix_web::test]
async fn a_tenant_holding_everything_activates_nothing_unreviewed() {
    let harness = harness_with(|config| {
        config.metrics_token = Some(OPERATOR.into());
        config.tenants.insert(
            "strict".into(),
            cairn_server::config::TenantConfig {
                review: Some("all".into()),
                review_min_confidence: None,
            },
        );
    })
    .await;
    let service = &harness.service;
    let strict = token("strict", ALL);
    for text in ["I live in Porto", "I am vegetarian", "My sister Anna is a nurse"] {
        let (status, body, _) = call(
            service,
            Method::POST,
            "/v1/users/u1/episodes",
            Some(&strict),
            Some(json!({ "messages": [{ "role": "user", "content": text }], "consolidate": "sync" })),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let (status, body) = write(service, &strict, "u1", json!({ "text": "The user drinks tea" })).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["fact"]["status"], "pending");
    assert_eq!(body["decision"]["kind"], "HELD_FOR_REVIEW");
    let (status, again) = write(service, &strict, "u1", json!({ "text": "The user drinks tea" })).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a pending value is not held twice: {again}"
    );
    assert_eq!(again["fact"]["id"], body["fact"]["id"]);
    let (_, active, _) = call(
        service,
        Method::GET,
        "/v1/users/u1/facts?status=active",
        Some(&strict),
        None,
    )
    .await;
    assert_eq!(active["items"].as_array().map(Vec::len), Some(0), "{active}");
    let (_, pending, _) = call(
        service,
        Method::GET,
        "/v1/users/u1/facts?status=pending",
        Some(&strict),
        None,
    )
    .await;
    let held = pending["items"].as_array().map(Vec::len).unwrap_or(0);
    assert!(held >= 4, "{pending}");

    // The tenant's queue: oldest first, paged, with counts by kind.
    let (status, first, _) = call(
        service,
        Method::GET,
        "/v1/reviews?limit=2",
        Some(&token("strict", REVIEWER)),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["counts"]["total"].as_u64(), Some(held as u64), "{first}");
    assert_eq!(first["counts"]["new_fact"].as_u64(), Some(held as u64), "{first}");
    assert!(first["counts"]["oldest"].is_string());
    let items = first["items"].as_array().expect("items");
    assert_eq!(items.len(), 2);
    assert!(items[0]["created_at"].as_str() <= items[1]["created_at"].as_str());
    let cursor = first["next_cursor"].as_str().expect("another page");
    let (status, second, _) = call(
        service,
        Method::GET,
        &format!("/v1/reviews?limit=50&cursor={cursor}"),
        Some(&token("strict", REVIEWER)),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["items"].as_array().map(Vec::len), Some(held - 2));
    let bound = token_with("strict", REVIEWER, Some("u1"), 3600, None, SECRET);
    let (status, _, _) = call(service, Method::GET, "/v1/reviews", Some(&bound), None).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a token bound to one user reads only its user's queue"
    );
    let (status, _, _) = call(
        service,
        Method::GET,
        "/v1/reviews",
        Some(&token("strict", ALL)),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "admin implies review");

    // The queue shows in the metrics: summed for everyone, per tenant for the
    // operator's scrape credential alone (a tenant's admin token reads no tenant names).
    for bearer in [None, Some(token("strict", ALL)), Some(token("other", ALL))] {
        let (_, metrics, _) = call(service, Method::GET, "/metrics", bearer.as_deref(), None).await;
        let metrics = metrics.as_str().unwrap_or_default();
        assert!(
            metrics.contains(&format!("cairn_review_queue_pending {held}")),
            "{metrics}"
        );
        assert!(
            metrics.contains("cairn_review_queue_oldest_pending_seconds"),
            "{metrics}"
        );
        assert!(!metrics.contains("tenant=\"strict\""), "{metrics}");
    }
    let (_, metrics, _) = call(service, Method::GET, "/metrics", Some(OPERATOR), None).await;
    let metrics = metrics.as_str().unwrap_or_default();
    assert!(
        metrics.contains(&format!("cairn_review_queue_depth{{tenant=\"strict\"}} {held}")),
        "{metrics}"
    );
    assert!(
        metrics.contains("cairn_review_queue_oldest_age_seconds{tenant=\"strict\"}"),
        "{metrics}"
    );

    // A request may ask for review where the policy holds nothing; the rule says so.
    let (status, asked) = write(
        service,
        &token("acme", ALL),
        "u2",
        json!({ "text": "The user is allergic to penicillin", "review": true }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{asked}");
    assert_eq!(asked["fact"]["status"], "pending");
    let asked_queue = queue(service, "u2").await;
    assert_eq!(asked_queue.len(), 1);
    assert_eq!(asked_queue[0]["rule"], "request");
    // The same value made active meanwhile (through a supersession, which skips the
    // duplicate gate): approving the held one would hold it twice, so it is stale.
    let (_, other) = write(
        service,
        &token("acme", ALL),
        "u2",
        json!({ "text": "The user has no allergies" }),
    )
    .await;
    let (status, body) = write(
        service,
        &token("acme", ALL),
        "u2",
        json!({ "text": "The user is allergic to penicillin", "supersedes": other["fact"]["id"] }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = decide(
        service,
        &token("acme", REVIEWER),
        "u2",
        asked_queue[0]["id"].as_str().expect("id"),
        "approve",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(error_code(&body), "review_stale");

    // Another tenant without the override writes as before.
    let (status, body) = write(
        service,
        &token("acme", ALL),
        "u1",
        json!({ "text": "The user drinks tea" }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["fact"]["status"], "active");
}

#[actix_web::test]
async fn the_review_queue_moves_with_an_export() {
    let harness = harness_with(|config| config.review = "supersession".into()).await;
    let service = &harness.service;
    let review = held_move(service, "u1").await;
    let admin = token("acme", ALL);
    let (status, mut document, _) =
        call(service, Method::GET, "/v1/users/u1/export", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK, "{document}");
    assert_eq!(
        document["reviews"].as_array().map(Vec::len),
        Some(1),
        "{document}"
    );
    assert_eq!(document["reviews"][0]["kind"], "supersession");

    let (status, report, _) = call(
        service,
        Method::POST,
        "/v1/users/u2/import",
        Some(&admin),
        Some(document.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{report}");
    assert_eq!(report["imported"]["reviews"], 1);
    let moved = queue(service, "u2").await;
    assert_eq!(moved.len(), 1);
    assert_ne!(moved[0]["id"], review["id"], "new ids");
    assert_eq!(moved[0]["fact"]["text"], review["fact"]["text"]);
    assert_eq!(moved[0]["target"]["text"], review["target"]["text"]);
    assert_eq!(
        moved[0]["proposed_by"],
        format!("import:{}", review["proposed_by"].as_str().unwrap_or_default()),
        "an imported review says it came with an import: {moved:?}"
    );
    let (status, approved) = decide(
        service,
        &token("acme", REVIEWER),
        "u2",
        moved[0]["id"].as_str().expect("id"),
        "approve",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{approved}");
    let after = facts_recalled(service, "u2", "where does the user live", false).await;
    assert!(
        texts(&after).iter().any(|text| text.contains("Lisbon")),
        "{after:?}"
    );

    // A pending fact without its review would wait forever: the document is refused whole.
    document["reviews"] = json!([]);
    let (status, body, _) = call(
        service,
        Method::POST,
        "/v1/users/u3/import",
        Some(&admin),
        Some(document),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("pending")),
        "{body}"
    );
    assert_eq!(count_facts(service, "acme", "u3").await, 0);
}

/// The review-queue gauges come from the store: a replica that served none of a
/// tenant's reviews shows the same queue as the one that held them, and an erasure
/// empties it on every replica.
#[actix_web::test]
async fn review_gauges_agree_across_replicas_and_follow_an_erasure() {
    use cairn_server::config::Backend;
    let Some(url) = super::test_cluster("CAIRN_TEST_OPENSEARCH_URL") else {
        eprintln!("skipped: CAIRN_TEST_OPENSEARCH_URL is not set");
        return;
    };
    let prefix = format!("cairn-api-{}", uuid::Uuid::now_v7().simple());
    let replica = || {
        harness_with(|config| {
            config.backend = Backend::Opensearch;
            config.cluster_url = Some(url.clone());
            config.index_prefix = prefix.clone();
            config.metrics_token = Some(OPERATOR.into());
            config.tenants.insert(
                "strict".into(),
                cairn_server::config::TenantConfig {
                    review: Some("all".into()),
                    review_min_confidence: None,
                },
            );
        })
    };
    let (first, second) = (replica().await, replica().await);
    for harness in [&first, &second] {
        until_ready(&harness.service, "the replica").await;
    }
    let strict = token("strict", ALL);
    let (status, body) = write(
        &first.service,
        &strict,
        "u1",
        json!({ "text": "The user drinks tea" }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let gauge = |metrics: &Value| {
        metrics
            .as_str()
            .unwrap_or_default()
            .lines()
            .find(|line| line.starts_with("cairn_review_queue_depth{tenant=\"strict\"}"))
            .map(str::to_owned)
    };
    let (_, metrics, _) = call(&second.service, Method::GET, "/metrics", Some(OPERATOR), None).await;
    assert_eq!(
        gauge(&metrics).as_deref(),
        Some("cairn_review_queue_depth{tenant=\"strict\"} 1"),
        "the replica that held nothing shows the queue: {metrics}"
    );
    let (status, _, _) = call(
        &first.service,
        Method::DELETE,
        "/v1/users/u1",
        Some(&strict),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    tokio::time::sleep(std::time::Duration::from_millis(2200)).await;
    for harness in [&first, &second] {
        let (_, metrics, _) = call(&harness.service, Method::GET, "/metrics", Some(OPERATOR), None).await;
        assert_eq!(gauge(&metrics), None, "the erased queue is gone: {metrics}");
    }
    drop_indices(&url, &prefix).await;
}
