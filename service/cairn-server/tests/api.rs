//! The REST API served in process by the real application: auth, isolation, the write
//! gates, bad input, limits, and the operational routes.

use actix_web::dev::{Service, ServiceResponse};
use actix_web::http::{Method, StatusCode};
use actix_web::{test, web};
use cairn_server::auth::{MintRequest, mint};
use cairn_server::config::Config;
use cairn_server::{build_state, http};
use serde_json::{Value, json};

#[path = "api/consolidation.rs"]
mod consolidation;
#[path = "api/contract.rs"]
mod contract;
#[path = "api/mcp.rs"]
mod mcp;
#[path = "api/portability.rs"]
mod portability;
#[path = "api/review.rs"]
mod review;

const SECRET: &str = "test-secret-test-secret-test-secret!";

struct Harness<S> {
    service: S,
    state: web::Data<http::AppState>,
    _directory: tempfile::TempDir,
}

fn config(directory: &tempfile::TempDir) -> Config {
    Config {
        data_dir: directory.path().to_path_buf(),
        jwt_secret: Some(SECRET.into()),
        rate_limit_per_second: 0,
        max_text_chars: 500,
        max_body_bytes: 16 * 1024,
        models_dir: std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.models"),
        ..Config::default()
    }
}

async fn harness_with(
    adjust: impl FnOnce(&mut Config),
) -> Harness<
    impl Service<
        actix_http::Request,
        Response = ServiceResponse<impl actix_web::body::MessageBody>,
        Error = actix_web::Error,
    >,
> {
    let directory = tempfile::tempdir().expect("temp dir");
    let mut config = config(&directory);
    adjust(&mut config);
    let state = web::Data::new(build_state(&config).await.expect("state"));
    let service = test::init_service(http::app(state.clone())).await;
    Harness {
        service,
        state,
        _directory: directory,
    }
}

fn token_with(
    tenant: &str,
    scopes: &str,
    user: Option<&str>,
    ttl_seconds: i64,
    audience: Option<&str>,
    secret: &str,
) -> String {
    mint(
        &MintRequest {
            subject: format!("{tenant}-service"),
            tenant: tenant.into(),
            scopes: scopes.split(',').map(str::to_owned).collect(),
            user: user.map(str::to_owned),
            ttl_seconds,
            audience: audience.map(str::to_owned),
            issuer: None,
        },
        Some(secret),
        None,
    )
    .expect("mint")
}

fn token(tenant: &str, scopes: &str) -> String {
    token_with(tenant, scopes, None, 3600, None, SECRET)
}

const ALL: &str = "memory:read,memory:write,memory:admin";

/// Sends a request and returns status, headers of interest and the JSON body.
async fn call<S, B>(
    service: &S,
    method: Method,
    path: &str,
    bearer: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value, actix_web::http::header::HeaderMap)
where
    S: Service<actix_http::Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: actix_web::body::MessageBody,
{
    let mut request = test::TestRequest::default().method(method).uri(path);
    if let Some(bearer) = bearer {
        request = request.insert_header(("authorization", format!("Bearer {bearer}")));
    }
    if let Some(body) = body {
        request = request.set_json(body);
    }
    let response = test::call_service(service, request.to_request()).await;
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = test::read_body(response).await;
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value, headers)
}

async fn raw<S, B>(
    service: &S,
    path: &str,
    bearer: &str,
    content_type: &str,
    body: Vec<u8>,
) -> (StatusCode, Value)
where
    S: Service<actix_http::Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: actix_web::body::MessageBody,
{
    let request = test::TestRequest::post()
        .uri(path)
        .insert_header(("authorization", format!("Bearer {bearer}")))
        .insert_header(("content-type", content_type))
        .set_payload(body)
        .to_request();
    let response = test::call_service(service, request).await;
    let status = response.status();
    let bytes = test::read_body(response).await;
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("<none>")
}

fn assert_error_shape(body: &Value) {
    assert!(body["error"]["code"].is_string(), "{body}");
    assert!(
        body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(
        body["error"]["request_id"]
            .as_str()
            .is_some_and(|r| r.starts_with("req_")),
        "{body}"
    );
}

async fn count_facts<S, B>(service: &S, tenant: &str, user: &str) -> usize
where
    S: Service<actix_http::Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: actix_web::body::MessageBody,
{
    let (status, body, _) = call(
        service,
        Method::GET,
        &format!("/v1/users/{user}/facts?status=all"),
        Some(&token(tenant, ALL)),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["items"].as_array().map(Vec::len).unwrap_or(0)
}

async fn write<S, B>(service: &S, bearer: &str, user: &str, body: Value) -> (StatusCode, Value)
where
    S: Service<actix_http::Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: actix_web::body::MessageBody,
{
    let (status, body, _) = call(
        service,
        Method::POST,
        &format!("/v1/users/{user}/facts"),
        Some(bearer),
        Some(body),
    )
    .await;
    (status, body)
}

/// Signs arbitrary claims with an HS256 secret, for claims `cairn token mint` never makes.
fn signed(claims: Value, secret: &str) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
    )
    .expect("sign")
}

/// A console login ticket works once, also in the clock leeway after its expiry, where
/// it still verifies: the redeemed set keeps it until then.
#[actix_web::test]
async fn a_used_login_ticket_is_refused_through_the_clock_leeway() {
    let harness = harness_with(|config| config.jwt_leeway_seconds = 30).await;
    let service = &harness.service;
    let now = chrono::Utc::now().timestamp();
    let ticket = signed(
        json!({ "sub": "ops", "tenant": "acme", "scope": "memory:read", "exp": now - 2,
                "iat": now - 100, "purpose": "ui-login", "session_seconds": 3600,
                "jti": format!("login_{}", uuid::Uuid::now_v7().simple()) }),
        SECRET,
    );
    let redeem = || {
        call(
            service,
            Method::POST,
            "/ui/session",
            None,
            Some(json!({ "ticket": ticket })),
        )
    };
    let (status, body, headers) = redeem().await;
    assert_eq!(
        status,
        StatusCode::OK,
        "expired 2 s ago, inside the 30 s leeway: {body}"
    );
    assert_eq!(
        headers.get("cache-control").and_then(|value| value.to_str().ok()),
        Some("no-store"),
        "the answer is a token no cache may keep"
    );
    for _ in 0..3 {
        let (status, body, _) = redeem().await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "a used ticket: {body}");
    }
}

/// A console login ticket used on one replica is refused on another sharing the store.
#[actix_web::test]
async fn a_login_ticket_used_on_one_replica_is_refused_on_another() {
    use cairn_server::config::Backend;
    let Some(url) = test_cluster("CAIRN_TEST_OPENSEARCH_URL") else {
        eprintln!("skipped: CAIRN_TEST_OPENSEARCH_URL is not set");
        return;
    };
    let prefix = format!("cairn-api-{}", uuid::Uuid::now_v7().simple());
    let replica = || {
        harness_with(|config| {
            config.backend = Backend::Opensearch;
            config.cluster_url = Some(url.clone());
            config.index_prefix = prefix.clone();
        })
    };
    let (first, second) = (replica().await, replica().await);
    for harness in [&first, &second] {
        until_ready(&harness.service, "the replica").await;
    }
    let now = chrono::Utc::now().timestamp();
    let ticket = signed(
        json!({ "sub": "ops", "tenant": "acme", "scope": "memory:read", "exp": now + 120,
                "iat": now, "purpose": "ui-login", "session_seconds": 3600,
                "jti": format!("login_{}", uuid::Uuid::now_v7().simple()) }),
        SECRET,
    );
    let redeem = |service| {
        call(
            service,
            Method::POST,
            "/ui/session",
            None,
            Some(json!({ "ticket": ticket })),
        )
    };
    let (status, body, _) = redeem(&first.service).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body, _) = redeem(&second.service).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "used on the other replica: {body}"
    );
    drop_indices(&url, &prefix).await;
}

/// Identity for production: several HS256 secrets at once (rotation), `aud` as a
/// string or an array, an issuer allow-list, and a maximum token lifetime.
#[actix_web::test]
async fn rotated_secrets_audience_arrays_issuers_and_lifetimes() {
    let next = "next-secret-next-secret-next-secret!!";
    let harness = harness_with(|config| {
        config.jwt_secret = Some(format!("{next} {SECRET}"));
        config.jwt_audience = Some("cairn".into());
        config.jwt_issuer = Some("https://idp.one, https://idp.two".into());
        config.jwt_max_ttl_seconds = 3600;
    })
    .await;
    let service = &harness.service;
    let now = chrono::Utc::now().timestamp();
    let claims = |aud: Value, iss: &str, iat: Option<i64>, exp: i64| {
        let mut claims = json!({ "sub": "svc", "tenant": "acme", "scope": ALL.replace(',', " "),
                                 "aud": aud, "iss": iss, "exp": exp });
        if let Some(iat) = iat {
            claims["iat"] = json!(iat);
        }
        claims
    };
    let good = claims(json!("cairn"), "https://idp.one", Some(now), now + 600);
    let cases = [
        ("the old secret", signed(good.clone(), SECRET), StatusCode::OK),
        ("the new secret", signed(good.clone(), next), StatusCode::OK),
        (
            "a retired secret",
            signed(good.clone(), "retired-secret-retired-secret-retired"),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "an audience array holding ours",
            signed(
                claims(
                    json!(["billing", "cairn"]),
                    "https://idp.two",
                    Some(now),
                    now + 600,
                ),
                SECRET,
            ),
            StatusCode::OK,
        ),
        (
            "an audience array without ours",
            signed(
                claims(
                    json!(["billing", "search"]),
                    "https://idp.one",
                    Some(now),
                    now + 600,
                ),
                SECRET,
            ),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "an issuer not on the list",
            signed(
                claims(json!("cairn"), "https://idp.three", Some(now), now + 600),
                SECRET,
            ),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "a lifetime past the maximum",
            signed(
                claims(json!("cairn"), "https://idp.one", Some(now), now + 7200),
                SECRET,
            ),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "no iat, so no provable lifetime",
            signed(claims(json!("cairn"), "https://idp.one", None, now + 600), SECRET),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "issued in the future",
            signed(
                claims(json!("cairn"), "https://idp.one", Some(now + 3000), now + 3600),
                SECRET,
            ),
            StatusCode::UNAUTHORIZED,
        ),
    ];
    for (case, bearer, expected) in cases {
        let (status, body, _) =
            call(service, Method::GET, "/v1/users/alice/facts", Some(&bearer), None).await;
        assert_eq!(status, expected, "{case}: {body}");
        if status == StatusCode::UNAUTHORIZED {
            assert_eq!(error_code(&body), "invalid_token", "{case}: {body}");
        }
    }
}

#[actix_web::test]
async fn auth_matrix_refuses_and_changes_nothing() {
    let harness = harness_with(|config| config.jwt_audience = Some("cairn".into())).await;
    let service = &harness.service;
    let fact = json!({ "text": "The user likes tea" });
    let good = token_with("acme", ALL, None, 3600, Some("cairn"), SECRET);
    let cases: Vec<(Option<String>, StatusCode, &str)> = vec![
        (None, StatusCode::UNAUTHORIZED, "missing_token"),
        (Some("garbage".into()), StatusCode::UNAUTHORIZED, "invalid_token"),
        (
            Some(token_with(
                "acme",
                ALL,
                None,
                3600,
                Some("cairn"),
                "some-other-secret-some-other-secret",
            )),
            StatusCode::UNAUTHORIZED,
            "invalid_token",
        ),
        (
            Some(token_with("acme", ALL, None, -3600, Some("cairn"), SECRET)),
            StatusCode::UNAUTHORIZED,
            "token_expired",
        ),
        (
            Some(token_with("acme", ALL, None, 3600, Some("elsewhere"), SECRET)),
            StatusCode::UNAUTHORIZED,
            "invalid_token",
        ),
        (
            Some(token_with("acme", ALL, None, 3600, None, SECRET)),
            StatusCode::UNAUTHORIZED,
            "invalid_token",
        ),
        (
            Some(token_with(
                "acme",
                "memory:read",
                None,
                3600,
                Some("cairn"),
                SECRET,
            )),
            StatusCode::FORBIDDEN,
            "insufficient_scope",
        ),
        (
            Some(token_with("acme", ALL, Some("bob"), 3600, Some("cairn"), SECRET)),
            StatusCode::FORBIDDEN,
            "user_mismatch",
        ),
    ];
    for (bearer, expected, code) in cases {
        let (status, body, headers) = call(
            service,
            Method::POST,
            "/v1/users/alice/facts",
            bearer.as_deref(),
            Some(fact.clone()),
        )
        .await;
        assert_eq!(status, expected, "{bearer:?}: {body}");
        assert_eq!(error_code(&body), code, "{body}");
        assert_error_shape(&body);
        if status == StatusCode::UNAUTHORIZED {
            assert!(
                headers
                    .get("www-authenticate")
                    .is_some_and(|v| v.to_str().is_ok_and(|v| v.starts_with("Bearer")))
            );
        }
    }
    let (status, body, _) = call(
        service,
        Method::GET,
        "/v1/users/alice/facts?status=all",
        Some(&good),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body["items"].as_array().map(Vec::len),
        Some(0),
        "nothing was written: {body}"
    );
    // A bound token works for its own user, and reading the audit needs admin.
    let bound = token_with(
        "acme",
        "memory:read,memory:write",
        Some("alice"),
        3600,
        Some("cairn"),
        SECRET,
    );
    let (status, _) = write(service, &bound, "alice", fact).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body, _) = call(service, Method::GET, "/v1/users/alice/audit", Some(&bound), None).await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::FORBIDDEN, "insufficient_scope")
    );
}

#[actix_web::test]
async fn tenants_and_users_are_isolated() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    let (_, created) = write(
        service,
        &owner,
        "alice",
        json!({ "text": "Alice keeps bees on her roof" }),
    )
    .await;
    let fact_id = created["fact"]["id"].as_str().expect("id").to_owned();
    let (status, _, _) = call(
        service,
        Method::POST,
        "/v1/users/alice/episodes",
        Some(&owner),
        Some(json!({ "messages": [{ "role": "user", "content": "my bees swarmed today" }] })),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);

    for (intruder, user) in [(token("globex", ALL), "alice"), (token("acme", ALL), "bob")] {
        let base = format!("/v1/users/{user}");
        let (status, body, _) = call(
            service,
            Method::GET,
            &format!("{base}/facts/{fact_id}"),
            Some(&intruder),
            None,
        )
        .await;
        assert_eq!((status, error_code(&body)), (StatusCode::NOT_FOUND, "not_found"));
        let (_, body, _) = call(
            service,
            Method::GET,
            &format!("{base}/facts?status=all"),
            Some(&intruder),
            None,
        )
        .await;
        assert_eq!(body["items"], json!([]));
        let (_, body, _) = call(
            service,
            Method::POST,
            &format!("{base}/recall"),
            Some(&intruder),
            Some(json!({ "query": "bees roof swarmed" })),
        )
        .await;
        assert_eq!(
            body["hits"],
            json!([]),
            "a search with no match in scope returns nothing"
        );
        let (status, _) = write(
            service,
            &intruder,
            user,
            json!({ "text": "hijacked", "supersedes": fact_id }),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (status, _, _) = call(
            service,
            Method::POST,
            &format!("{base}/facts/{fact_id}/retract"),
            Some(&intruder),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (status, _, _) = call(
            service,
            Method::DELETE,
            &format!("{base}/facts/{fact_id}"),
            Some(&intruder),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (status, body, _) = call(service, Method::DELETE, &base, Some(&intruder), None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["deleted"]["facts"], 0);
        assert_eq!(body["deleted"]["episodes"], 0);
    }
    let (status, body, _) = call(
        service,
        Method::GET,
        &format!("/v1/users/alice/facts/{fact_id}"),
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "active");
    assert_eq!(count_facts(service, "acme", "alice").await, 1);
    let (_, body, _) = call(
        service,
        Method::POST,
        "/v1/users/alice/recall",
        Some(&owner),
        Some(json!({ "query": "bees" })),
    )
    .await;
    assert_eq!(
        body["hits"].as_array().map(Vec::len),
        Some(2),
        "the owner still finds fact and episode: {body}"
    );
}

#[actix_web::test]
async fn supersession_chain_keeps_history_and_one_concurrent_winner() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    let (_, a) = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user lives in Paris", "fact_type": "identity" }),
    )
    .await;
    let a_id = a["fact"]["id"].as_str().expect("id").to_owned();
    let (status, b) = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user lives in Lyon", "supersedes": a_id }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{b}");
    assert_eq!(b["decision"]["kind"], "UPDATES");
    let b_id = b["fact"]["id"].as_str().expect("id").to_owned();
    let (_, c) = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user lives in Nice", "supersedes": b_id }),
    )
    .await;
    let c_id = c["fact"]["id"].as_str().expect("id").to_owned();

    let (status, body) = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user lives in Lille", "supersedes": a_id }),
    )
    .await;
    assert_eq!((status, error_code(&body)), (StatusCode::CONFLICT, "not_active"));

    let recall = |history: bool| json!({ "query": "where does the user live", "include_history": history, "tiers": ["semantic"], "explain": true });
    let (_, current, _) = call(
        service,
        Method::POST,
        "/v1/users/u1/recall",
        Some(&owner),
        Some(recall(false)),
    )
    .await;
    let ids: Vec<&str> = current["hits"]
        .as_array()
        .expect("hits")
        .iter()
        .filter_map(|h| h["id"].as_str())
        .collect();
    assert_eq!(ids, vec![c_id.as_str()]);
    assert_eq!(current["hits"][0]["explain"]["bm25_rank"], 1);
    assert_eq!(current["hits"][0]["explain"]["knn_rank"], 1);
    assert_eq!(
        current["hits"][0]["explain"]["prior"], 1.0,
        "priors are off by default"
    );
    let (_, history, _) = call(
        service,
        Method::POST,
        "/v1/users/u1/recall",
        Some(&owner),
        Some(recall(true)),
    )
    .await;
    let mut statuses: Vec<(String, String)> = history["hits"]
        .as_array()
        .expect("hits")
        .iter()
        .map(|h| {
            (
                h["id"].as_str().unwrap_or("").to_owned(),
                h["status"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    statuses.sort();
    let mut expected = vec![
        (a_id.clone(), "superseded".to_owned()),
        (b_id.clone(), "superseded".to_owned()),
        (c_id.clone(), "active".to_owned()),
    ];
    expected.sort();
    assert_eq!(statuses, expected);
    let (_, superseded, _) = call(
        service,
        Method::GET,
        "/v1/users/u1/facts?status=superseded",
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(superseded["items"].as_array().map(Vec::len), Some(2));

    // Each fact's history is the whole chain, oldest first, from any point in it; and
    // another tenant asking for it finds nothing.
    for id in [&a_id, &b_id, &c_id] {
        let (status, history, _) = call(
            service,
            Method::GET,
            &format!("/v1/users/u1/facts/{id}/history"),
            Some(&owner),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{history}");
        let chain: Vec<(&str, &str)> = history["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|f| (f["id"].as_str().unwrap_or(""), f["status"].as_str().unwrap_or("")))
            .collect();
        assert_eq!(
            chain,
            [
                (a_id.as_str(), "superseded"),
                (b_id.as_str(), "superseded"),
                (c_id.as_str(), "active")
            ],
            "from {id}"
        );
    }
    let (status, _, _) = call(
        service,
        Method::GET,
        &format!("/v1/users/u1/facts/{b_id}/history"),
        Some(&token("globex", ALL)),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, updates, _) = call(
        service,
        Method::GET,
        "/v1/users/u1/decisions?kind=UPDATES",
        Some(&owner),
        None,
    )
    .await;
    let kinds: Vec<(&str, &str)> = updates["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|d| (d["kind"].as_str().unwrap_or(""), d["gate"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(kinds, [("UPDATES", "judge"), ("UPDATES", "judge")], "{updates}");
    let (status, body, _) = call(
        service,
        Method::GET,
        "/v1/users/u1/decisions?kind=MAYBE",
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request")
    );

    // Two concurrent supersessions of C: exactly one wins.
    let first = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user lives in Brest", "supersedes": c_id }),
    );
    let second = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user lives in Metz", "supersedes": c_id }),
    );
    let ((s1, _), (s2, _)) = futures_util::future::join(first, second).await;
    let mut outcomes = [s1, s2];
    outcomes.sort();
    assert_eq!(outcomes, [StatusCode::CREATED, StatusCode::CONFLICT]);
    let (_, active, _) = call(
        service,
        Method::GET,
        "/v1/users/u1/facts?status=active",
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(active["items"].as_array().map(Vec::len), Some(1));
}

#[actix_web::test]
async fn retraction_tombstones_and_forgetting_erases() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    let (_, created) = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user is vegetarian", "fact_type": "constraint" }),
    )
    .await;
    let id = created["fact"]["id"].as_str().expect("id").to_owned();
    let (status, body, _) = call(
        service,
        Method::POST,
        &format!("/v1/users/u1/facts/{id}/retract"),
        Some(&owner),
        Some(json!({ "reason": "misheard" })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["fact"]["status"], "retracted");
    let (status, body, _) = call(
        service,
        Method::POST,
        &format!("/v1/users/u1/facts/{id}/retract"),
        Some(&owner),
        None,
    )
    .await;
    assert_eq!((status, error_code(&body)), (StatusCode::CONFLICT, "not_active"));

    let (status, body) = write(
        service,
        &owner,
        "u1",
        json!({ "text": "the user is VEGETARIAN." }),
    )
    .await;
    assert_eq!((status, error_code(&body)), (StatusCode::CONFLICT, "tombstoned"));
    assert_eq!(
        count_facts(service, "acme", "u1").await,
        1,
        "the refused write stored nothing"
    );
    let (status, tombstones, _) = call(
        service,
        Method::GET,
        "/v1/users/u1/tombstones",
        Some(&token("acme", "memory:read")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{tombstones}");
    assert_eq!(
        tombstones["items"].as_array().map(Vec::len),
        Some(1),
        "{tombstones}"
    );
    assert_eq!(tombstones["items"][0]["fact_id"], id.as_str());
    assert_eq!(tombstones["items"][0]["reason"], "retracted");
    assert!(
        !tombstones.to_string().contains("vegetarian") && tombstones["items"][0].get("fingerprint").is_none(),
        "a tombstone shows neither the value nor a fingerprint that could confirm a guess: {tombstones}"
    );
    let (_, elsewhere, _) = call(
        service,
        Method::GET,
        "/v1/users/u1/tombstones",
        Some(&token("globex", ALL)),
        None,
    )
    .await;
    assert_eq!(elsewhere["items"], json!([]));
    assert!(
        !body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("reassert"),
        "the refusal does not advertise a way around it: {body}"
    );

    // Reasserting needs evidence: a user episode, newer than the tombstone, stating the
    // value. A write token alone cannot lift it, nor can an unrelated or older episode.
    let (status, body) = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user is vegetarian", "reassert": true }),
    )
    .await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::CONFLICT, "tombstoned"),
        "{body}"
    );
    let ingest = |text: &'static str| {
        call(
            service,
            Method::POST,
            "/v1/users/u1/episodes",
            Some(&owner),
            Some(json!({ "messages": [{ "role": "user", "content": text }], "consolidate": "none" })),
        )
    };
    let (status, unrelated, _) = ingest("I had a salad for lunch").await;
    assert_eq!(status, StatusCode::CREATED, "{unrelated}");
    let unrelated_id = unrelated["episode_ids"][0]
        .as_str()
        .expect("episode id")
        .to_owned();
    let (status, body) = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user is vegetarian", "reassert": true, "evidence_episode_id": unrelated_id }),
    )
    .await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::CONFLICT, "tombstoned"),
        "{body}"
    );
    let (status, _) = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user is vegetarian", "reassert": true, "evidence_episode_id": "epi_elsewhere" }),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(count_facts(service, "acme", "u1").await, 1, "nothing was lifted");

    let (status, restated, _) = ingest("Actually I am vegetarian again since March").await;
    assert_eq!(status, StatusCode::CREATED, "{restated}");
    let evidence = restated["episode_ids"][0]
        .as_str()
        .expect("episode id")
        .to_owned();
    let (status, body) = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user is vegetarian", "reassert": true }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["fact"]["source_episode_ids"], json!([evidence]), "{body}");
    let reasserted = body["fact"]["id"].as_str().expect("id").to_owned();
    let (_, decisions, _) = call(service, Method::GET, "/v1/users/u1/decisions", Some(&owner), None).await;
    let kinds: Vec<&str> = decisions["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|d| d["kind"].as_str())
        .collect();
    for kind in ["NEW", "RETRACTED", "BLOCKED_BY_TOMBSTONE", "TOMBSTONE_LIFTED"] {
        assert!(kinds.contains(&kind), "{kind} missing from {kinds:?}");
    }
    let (status, duplicate) = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user is vegetarian!" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(duplicate["decision"]["kind"], "DUPLICATE");
    assert_eq!(duplicate["fact"]["id"], reasserted.as_str());

    let (status, _, _) = call(
        service,
        Method::DELETE,
        &format!("/v1/users/u1/facts/{reasserted}"),
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = call(
        service,
        Method::GET,
        &format!("/v1/users/u1/facts/{reasserted}"),
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, hits, _) = call(
        service,
        Method::POST,
        "/v1/users/u1/recall",
        Some(&owner),
        Some(json!({ "query": "vegetarian", "include_history": true, "tiers": ["semantic", "procedural"] })),
    )
    .await;
    assert_eq!(
        hits["hits"],
        json!([]),
        "the forgotten fact is gone even from history"
    );
    let (_, trail, _) = call(
        service,
        Method::GET,
        "/v1/users/u1/audit?limit=200",
        Some(&owner),
        None,
    )
    .await;
    let audited = |action: &str| {
        trail["items"]
            .as_array()
            .expect("items")
            .iter()
            .find(|e| e["action"] == action)
            .cloned()
    };
    let lift = audited("tombstone.lift").expect("the lift is audited as its own action");
    assert_eq!(lift["detail"]["evidence_episode_id"], evidence.as_str());
    assert_eq!(lift["target_ids"][1], reasserted.as_str());
    let forget = audited("fact.forget").expect("forget audited");
    assert_eq!(forget["target_ids"], json!([reasserted]));
    let kept = forget["detail"]["fingerprint"].as_str().unwrap_or_default();
    assert!(kept.starts_with("hmac-sha256:"), "a keyed fingerprint: {kept}");
    assert!(
        !kept.contains(&cairn_core::text::fingerprint("The user is vegetarian")[7..]),
        "not the plain hash anyone can compute from a guess"
    );
    assert!(
        !trail.to_string().to_lowercase().contains("vegetarian"),
        "the audit keeps no content"
    );
    let (status, body) = write(service, &owner, "u1", json!({ "text": "The user is vegetarian" })).await;
    assert_eq!((status, error_code(&body)), (StatusCode::CONFLICT, "tombstoned"));
}

#[actix_web::test]
async fn erasing_a_user_returns_an_exact_receipt() {
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
                { "role": "user", "content": "I started a pottery class" },
                { "role": "assistant", "content": "Pottery sounds fun!" },
                { "role": "user", "content": "It is every Tuesday", "timestamp": "2026-01-05T10:00:00Z" }
            ],
            "consolidate": "none"
        })),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(
        body["episode_ids"].as_array().map(Vec::len),
        Some(2),
        "assistant turns are not evidence"
    );
    assert_eq!(body["consolidation"]["ran"], false);
    let (_, first) = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user takes pottery classes" }),
    )
    .await;
    write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user takes pottery classes on Tuesdays", "supersedes": first["fact"]["id"] }),
    )
    .await;
    let (_, retractable) = write(service, &owner, "u1", json!({ "text": "The user owns a kiln" })).await;
    call(
        service,
        Method::POST,
        &format!(
            "/v1/users/u1/facts/{}/retract",
            retractable["fact"]["id"].as_str().expect("id")
        ),
        Some(&owner),
        None,
    )
    .await;
    let (status, playbook, _) = call(
        service,
        Method::POST,
        "/v1/users/u1/playbooks",
        Some(&owner),
        Some(json!({ "name": "Glaze", "trigger": "the user glazes a pot", "steps": ["dip", "dry"] })),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let playbook_id = playbook["playbook"]["id"].as_str().expect("id");
    let (status, version, _) = call(
        service,
        Method::POST,
        &format!("/v1/users/u1/playbooks/{playbook_id}/versions"),
        Some(&owner),
        Some(json!({ "steps": ["dip", "dry", "fire"], "base_version": 1 })),
    )
    .await;
    assert_eq!(
        (status, version["playbook"]["version"].as_u64()),
        (StatusCode::CREATED, Some(2))
    );
    let (status, body, _) = call(
        service,
        Method::POST,
        &format!("/v1/users/u1/playbooks/{playbook_id}/versions"),
        Some(&owner),
        Some(json!({ "steps": ["x"], "base_version": 1 })),
    )
    .await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::CONFLICT, "version_conflict")
    );
    let (_, outcome, _) = call(
        service,
        Method::POST,
        &format!("/v1/users/u1/playbooks/{playbook_id}/outcome"),
        Some(&owner),
        Some(json!({ "success": false })),
    )
    .await;
    assert_eq!(outcome["playbook"]["failure_count"], 1);
    write(service, &owner, "u2", json!({ "text": "Another user's fact" })).await;

    let (status, receipt, _) = call(service, Method::DELETE, "/v1/users/u1", Some(&owner), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        receipt["deleted"],
        json!({ "episodes": 2, "facts": 3, "playbooks": 1, "playbook_versions": 2,
        "edges": 1, "tombstones": 1, "decisions": 4, "jobs": 0, "reviews": 0 })
    );
    assert_eq!(count_facts(service, "acme", "u1").await, 0);
    assert_eq!(count_facts(service, "acme", "u2").await, 1);
    let (_, trail, _) = call(service, Method::GET, "/v1/users/u1/audit", Some(&owner), None).await;
    assert_eq!(trail["items"][0]["action"], "user.erase");
}

/// The work of a recall is bounded by what it asks, not by the size of its body: list
/// inputs past their cap are a 422, and a tier named twice runs once.
#[actix_web::test]
async fn a_query_that_names_someone_prefers_the_memories_that_name_them() {
    // Every fact but one names Caroline, so her name weighs little in BM25, and the short
    // fact about Melanie's classes, which says "class" twice, leads the fused ranking
    // without the boost; naming whom the question names puts Caroline's class first.
    let texts = [
        "Melanie teaches a class, a yoga class",
        "Caroline signed up for a pottery class at the community centre downtown, on Tuesday evenings",
        "Caroline likes jazz",
        "Caroline has a dog called Rex",
        "Caroline works at the library",
        "Caroline may visit Lisbon",
    ];
    let ask =
        json!({ "query": "Which class did Caroline take?", "tiers": ["semantic"], "explain": true, "k": 6 });
    let mut orders = Vec::new();
    for boost in [0.0, 0.5] {
        let harness = harness_with(|config| config.name_boost = boost).await;
        let service = &harness.service;
        let owner = token("acme", ALL);
        for text in texts {
            let (status, body) = write(service, &owner, "u1", json!({ "text": text })).await;
            assert_eq!(status, StatusCode::CREATED, "{body}");
        }
        let (status, body, _) = call(
            service,
            Method::POST,
            "/v1/users/u1/recall",
            Some(&owner),
            Some(ask.clone()),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let hits = body["hits"].as_array().cloned().unwrap_or_default();
        assert_eq!(hits.len(), texts.len(), "{body}");
        for hit in &hits {
            let names_her = hit["text"].as_str().unwrap_or_default().contains("Caroline");
            let expected = if names_her { 1.0 + boost } else { 1.0 };
            assert_eq!(hit["explain"]["name_boost"], expected, "{hit}");
        }
        orders.push(
            hits.iter()
                .map(|hit| hit["text"].as_str().unwrap_or_default().to_owned())
                .collect::<Vec<_>>(),
        );
    }
    assert!(
        orders[0][0].starts_with("Melanie"),
        "without the boost, the fact saying \"class\" most leads: {:?}",
        orders[0]
    );
    assert_eq!(
        orders[1][0], texts[1],
        "with it, the fact naming Caroline that answers leads: {:?}",
        orders[1]
    );
}

/// A query that names a time ("in June") prefers what happened then: an episode said in
/// June outranks one that matches the words better but was said in September, and
/// `explain` shows the multiplier; with the boost off, the better match leads.
#[actix_web::test]
async fn a_query_that_names_a_time_prefers_what_happened_then() {
    let said = [
        (
            "2025-09-20T10:00:00Z",
            "I went hiking again, a long hiking day up in the hills",
        ),
        ("2025-06-14T10:00:00Z", "I went hiking by the lake with my sister"),
        ("2025-03-02T10:00:00Z", "I bought new walking boots"),
    ];
    let ask =
        json!({ "query": "Where did I go hiking in June?", "tiers": ["episodic"], "explain": true, "k": 3 });
    let mut orders = Vec::new();
    for boost in [0.0, 2.0] {
        let harness = harness_with(|config| config.time_boost = boost).await;
        let service = &harness.service;
        let owner = token("acme", ALL);
        for (at, text) in said {
            let message = json!({ "role": "user", "content": text, "timestamp": at });
            let (status, body, _) = call(
                service,
                Method::POST,
                "/v1/users/u1/episodes",
                Some(&owner),
                Some(json!({ "messages": [message], "consolidate": "none" })),
            )
            .await;
            assert_eq!(status, StatusCode::CREATED, "{body}");
        }
        let (status, body, _) = call(
            service,
            Method::POST,
            "/v1/users/u1/recall",
            Some(&owner),
            Some(ask.clone()),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let hits = body["hits"].as_array().cloned().unwrap_or_default();
        assert!(hits.len() >= 2, "{body}");
        for hit in &hits {
            let in_june = hit["text"].as_str().unwrap_or_default().contains("lake");
            let expected = if in_june { 1.0 + boost } else { 1.0 };
            assert_eq!(hit["explain"]["time_boost"], expected, "{hit}");
        }
        orders.push(
            hits.iter()
                .map(|hit| hit["text"].as_str().unwrap_or_default().to_owned())
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(
        orders[0][0], said[0].1,
        "without the boost, the better match leads: {:?}",
        orders[0]
    );
    assert_eq!(
        orders[1][0], said[1].1,
        "with it, what was said in June leads: {:?}",
        orders[1]
    );
}

#[actix_web::test]
async fn recall_list_inputs_are_capped_and_deduplicated() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    for text in ["The user drinks green tea", "The user likes black tea"] {
        let (status, body) = write(service, &owner, "u1", json!({ "text": text })).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let recall = |body: Value| {
        call(
            service,
            Method::POST,
            "/v1/users/u1/recall",
            Some(&owner),
            Some(body),
        )
    };

    let (status, body, _) = recall(json!({ "query": "tea", "tiers": vec!["semantic"; 100] })).await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request")
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("tiers"),
        "{body}"
    );
    let (status, body, _) = recall(json!({ "query": "tea", "fact_types": vec!["preference"; 40] })).await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request"),
        "many fact types are refused, not a 500: {body}"
    );

    let (status, once, _) = recall(json!({ "query": "tea", "tiers": ["semantic"], "explain": true })).await;
    assert_eq!(status, StatusCode::OK, "{once}");
    let (status, repeated, _) = recall(json!({ "query": "tea", "explain": true,
        "tiers": ["semantic", "semantic", "semantic", "semantic"],
        "fact_types": ["world", "world", "world"] }))
    .await;
    assert_eq!(status, StatusCode::OK, "{repeated}");
    let ids = |body: &Value| -> Vec<Value> {
        body["hits"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|hit| hit["id"].clone())
            .collect()
    };
    assert_eq!(ids(&once).len(), 2, "{once}");
    assert_eq!(
        ids(&once),
        ids(&repeated),
        "a repeated tier adds no hits and no legs"
    );
    assert_eq!(once["hits"][0]["explain"], repeated["hits"][0]["explain"]);
}

#[actix_web::test]
async fn bad_input_is_refused_clearly_and_stores_nothing() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    let bad_bodies = [
        ("/v1/users/u1/facts", json!({ "text": "" }), "text"),
        (
            "/v1/users/u1/facts",
            json!({ "text": "ok", "colour": "blue" }),
            "colour",
        ),
        ("/v1/users/u1/facts", json!({ "text": "x".repeat(501) }), "limit"),
        (
            "/v1/users/u1/facts",
            json!({ "text": "ok", "valid_from": "yesterday" }),
            "valid_from",
        ),
        (
            "/v1/users/u1/facts",
            json!({ "text": "ok", "fact_type": "gossip" }),
            "fact_type",
        ),
        (
            "/v1/users/u1/facts",
            json!({ "text": "ok", "confidence": 2.0 }),
            "confidence",
        ),
        (
            "/v1/users/u1/facts",
            json!({ "text": "ok", "confidence": -0.0 }),
            "confidence",
        ),
        (
            "/v1/users/u1/facts",
            json!({ "text": "ok", "valid_from": "2026-02-01T00:00:00Z", "valid_to": "2026-01-01T00:00:00Z" }),
            "valid_to",
        ),
        ("/v1/users/u1/episodes", json!({ "messages": [] }), "messages"),
        (
            "/v1/users/u1/episodes",
            json!({ "messages": [{ "role": "robot", "content": "hi" }] }),
            "role",
        ),
        (
            "/v1/users/u1/episodes",
            json!({ "messages": [{ "role": "user", "content": "hi", "timestamp": "2026-13-45" }] }),
            "timestamp",
        ),
        (
            "/v1/users/u1/episodes",
            json!({ "messages": [{ "role": "assistant", "content": "hi" }] }),
            "no user message",
        ),
        (
            "/v1/users/u1/recall",
            json!({ "query": "tea", "tiers": ["dreams"] }),
            "tier",
        ),
        ("/v1/users/u1/recall", json!({ "query": "tea", "k": 0 }), "k"),
        ("/v1/users/u1/recall", json!({ "query": "   " }), "query"),
        ("/v1/users/bad%20user/facts", json!({ "text": "ok" }), "user"),
        (
            "/v1/users/u1/playbooks",
            json!({ "name": "n", "trigger": "t", "steps": [] }),
            "steps",
        ),
    ];
    for (path, body, needle) in bad_bodies {
        let (status, response, _) = call(service, Method::POST, path, Some(&owner), Some(body.clone())).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {response}");
        assert_eq!(error_code(&response), "invalid_request");
        assert_error_shape(&response);
        let message = response["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains(needle), "{needle:?} not in {message:?}");
    }
    let long_user = "u".repeat(129);
    let (status, _, _) = call(
        service,
        Method::GET,
        &format!("/v1/users/{long_user}/facts"),
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, body) = raw(
        service,
        "/v1/users/u1/facts",
        &owner,
        "application/json",
        b"{\"text\": ".to_vec(),
    )
    .await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request")
    );
    let (status, body) = raw(
        service,
        "/v1/users/u1/facts",
        &owner,
        "application/json",
        vec![b' '; 17 * 1024],
    )
    .await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
    );
    // The retract route reads its optional body itself, with the same limit and shape.
    for size in [17 * 1024, 300 * 1024] {
        let (status, body) = raw(
            service,
            "/v1/users/u1/facts/fact_unknown/retract",
            &owner,
            "application/json",
            vec![b' '; size],
        )
        .await;
        assert_eq!(
            (status, error_code(&body)),
            (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            "{size} bytes: {body}"
        );
        assert_error_shape(&body);
    }
    let (status, _, _) = call(
        service,
        Method::GET,
        "/v1/users/u1/facts?status=maybe",
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _, _) = call(
        service,
        Method::GET,
        "/v1/users/u1/facts?limit=100000",
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(count_facts(service, "acme", "u1").await, 0);
    let (_, episodes, _) = call(service, Method::GET, "/v1/users/u1/episodes", Some(&owner), None).await;
    assert_eq!(episodes["items"], json!([]));
}

/// An explicit consolidation run costs more of the tenant's quota than one request,
/// so runs cannot be used to do unbounded work at the price of single requests.
#[actix_web::test]
async fn consolidation_runs_count_against_the_rate_limit() {
    let harness = harness_with(|config| {
        config.rate_limit_per_second = 1;
        config.rate_limit_burst = 20;
        config.consolidation_run_cost = 10;
    })
    .await;
    let service = &harness.service;
    let owner = token("runner", ALL);
    let run = || {
        call(
            service,
            Method::POST,
            "/v1/users/u1/consolidate",
            Some(&owner),
            None,
        )
    };
    let (status, body, _) = run().await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body, headers) = run().await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::TOO_MANY_REQUESTS, "rate_limited")
    );
    assert!(headers.contains_key("retry-after"));
    let (status, body, _) = call(
        service,
        Method::POST,
        "/v1/users/u1/episodes",
        Some(&owner),
        Some(json!({ "messages": [{ "role": "user", "content": "I paint murals" }], "consolidate": "sync" })),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "a synchronous run is charged too: {body}"
    );
    let (status, _, _) = call(service, Method::GET, "/v1/users/u1/episodes", Some(&owner), None).await;
    assert_eq!(status, StatusCode::OK, "single requests still fit");
    let (_, episodes, _) = call(service, Method::GET, "/v1/users/u1/episodes", Some(&owner), None).await;
    assert_eq!(episodes["items"], json!([]), "the refused ingest stored nothing");
}

/// On a search cluster the tenant's rate limit is one bucket for every replica, kept
/// in the store: two replicas together admit the burst once (not once each), and a
/// replica started afterwards finds the bucket as it was left.
#[actix_web::test]
async fn replicas_on_a_cluster_share_one_rate_limit_that_survives_a_restart() {
    use cairn_server::config::Backend;
    for (variable, backend) in [
        ("CAIRN_TEST_OPENSEARCH_URL", Backend::Opensearch),
        ("CAIRN_TEST_ELASTICSEARCH_URL", Backend::Elasticsearch),
    ] {
        let Some(url) = test_cluster(variable) else {
            eprintln!("skipped on {backend:?}: {variable} is not set");
            continue;
        };
        let prefix = format!("cairn-api-{}", uuid::Uuid::now_v7().simple());
        let replica = || {
            harness_with(|config| {
                config.backend = backend;
                config.cluster_url = Some(url.clone());
                config.index_prefix = prefix.clone();
                config.rate_limit_per_second = 1;
                config.rate_limit_burst = 6;
            })
        };
        let (first, second) = (replica().await, replica().await);
        for harness in [&first, &second] {
            until_ready(&harness.service, &format!("{backend:?}: the replica")).await;
        }
        let busy = token("busy", ALL);
        let started = std::time::Instant::now();
        let mut admitted = 0;
        for round in 0..12 {
            let service = if round % 2 == 0 {
                &first.service
            } else {
                &second.service
            };
            let (status, body, _) = call(service, Method::GET, "/v1/users/u1/facts", Some(&busy), None).await;
            match status {
                StatusCode::OK => admitted += 1,
                StatusCode::TOO_MANY_REQUESTS => assert_eq!(error_code(&body), "rate_limited"),
                other => panic!("{backend:?}: {other} {body}"),
            }
        }
        let refilled = started.elapsed().as_secs() + 1;
        assert!(
            (6..=6 + refilled).contains(&admitted),
            "{backend:?}: two replicas admitted {admitted} of 12 (burst 6, 1/s, {refilled} s)"
        );

        let drained = std::time::Instant::now();
        let restarted = replica().await;
        until_ready(&restarted.service, &format!("{backend:?}: the restarted replica")).await;
        let mut again = 0;
        for _ in 0..6 {
            let (status, _, _) = call(
                &restarted.service,
                Method::GET,
                "/v1/users/u1/facts",
                Some(&busy),
                None,
            )
            .await;
            again += u64::from(status == StatusCode::OK);
        }
        let refilled = drained.elapsed().as_secs() + 1;
        assert!(
            again <= refilled,
            "{backend:?}: a restarted replica admitted {again} of 6 after {refilled} s of refill"
        );
        let (status, _, _) = call(
            &restarted.service,
            Method::GET,
            "/v1/users/u1/facts",
            Some(&token("quiet", ALL)),
            None,
        )
        .await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{backend:?}: another tenant is unaffected"
        );
        drop_indices(&url, &prefix).await;
    }
}

#[actix_web::test]
async fn tenants_past_their_rate_limit_get_429_with_retry_after() {
    let harness = harness_with(|config| {
        config.rate_limit_per_second = 1;
        config.rate_limit_burst = 3;
    })
    .await;
    let service = &harness.service;
    let busy = token("busy", ALL);
    let mut statuses = Vec::new();
    let mut retry_after = None;
    for _ in 0..5 {
        let (status, body, headers) =
            call(service, Method::GET, "/v1/users/u1/facts", Some(&busy), None).await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(error_code(&body), "rate_limited");
            retry_after = headers
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
        }
        statuses.push(status);
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == StatusCode::OK).count(),
        3,
        "{statuses:?}"
    );
    assert!(retry_after.is_some_and(|seconds| seconds >= 1));
    let (status, _, _) = call(
        service,
        Method::GET,
        "/v1/users/u1/facts",
        Some(&token("quiet", ALL)),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "another tenant is unaffected");
}

#[actix_web::test]
async fn operational_routes_and_request_ids() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    let (status, body, _) = call(service, Method::GET, "/healthz", None, None).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("ok")));
    let (status, body, _) = call(service, Method::GET, "/readyz", None, None).await;
    assert_eq!(
        (status, body["checks"]["store"].as_str()),
        (StatusCode::OK, Some("ok"))
    );
    let (status, document, _) = call(service, Method::GET, "/openapi.json", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(document["openapi"], "3.1.0");
    let owner = token("acme", ALL);
    for route in cairn_server::routes::ROUTES {
        let (method, path) = (route.method, route.path);
        let method_name = method.to_lowercase();
        assert!(
            document["paths"][path][&method_name].is_object(),
            "{method} {path} missing from the document"
        );
        let concrete = path.replace("{user}", "u1").replace("{id}", "none");
        let method = Method::from_bytes(method.as_bytes()).expect("method");
        let (_, body, _) = call(service, method, &concrete, Some(&owner), None).await;
        assert_ne!(error_code(&body), "route_not_found", "{path} is not served");
    }
    let (status, body, _) = call(service, Method::GET, "/v2/nothing", None, None).await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::NOT_FOUND, "route_not_found")
    );

    let request = test::TestRequest::get()
        .uri("/v1/users/u1/facts/none")
        .insert_header(("authorization", format!("Bearer {owner}")))
        .insert_header(("x-request-id", "trace-me-42"))
        .to_request();
    let response = test::call_service(service, request).await;
    assert_eq!(
        response
            .headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok()),
        Some("trace-me-42")
    );
    let body: Value = test::read_body_json(response).await;
    assert_eq!(body["error"]["request_id"], "trace-me-42");

    let (_, created) = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user audits everything" }),
    )
    .await;
    let (_, trail, _) = call(service, Method::GET, "/v1/users/u1/audit", Some(&owner), None).await;
    let event = &trail["items"][0];
    assert_eq!(event["action"], "fact.create");
    assert_eq!(event["subject"], "acme-service");
    assert_eq!(event["target_ids"][0], created["fact"]["id"]);
    assert!(
        event["request_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("req_"))
    );

    let (status, metrics, _) = call(service, Method::GET, "/metrics", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let text = metrics.as_str().expect("text");
    assert!(
        text.contains(
            "cairn_http_requests_total{method=\"POST\",route=\"/v1/users/{user}/facts\",status=\"201\"}"
        ),
        "{text}"
    );
    assert!(text.contains("cairn_http_request_duration_seconds_bucket"));
}

#[actix_web::test]
async fn metrics_label_only_known_methods() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    // HTTP allows extension methods of any length; each distinct label value would be
    // a series kept for the life of the process.
    let long = "X".repeat(8_192);
    for method in [long.as_str(), "PROPFIND", "BREW"] {
        let method = Method::from_bytes(method.as_bytes()).expect("a valid token");
        let (status, _, _) = call(service, method, "/v1/users/u1/facts", None, None).await;
        assert!(status.is_client_error(), "{status}");
    }
    let (status, metrics, _) = call(service, Method::GET, "/metrics", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let text = metrics.as_str().expect("text");
    assert!(!text.contains("XXXX"), "an extension method became a label");
    assert!(!text.contains("PROPFIND") && !text.contains("BREW"));
    assert!(text.contains("method=\"other\""), "{text}");
    assert!(text.len() < 64 * 1024, "the metrics grew to {} bytes", text.len());
}

#[actix_web::test]
async fn metrics_can_require_an_admin_token() {
    let harness = harness_with(|config| config.metrics_require_auth = true).await;
    let service = &harness.service;
    let (status, _, _) = call(service, Method::GET, "/metrics", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) = call(
        service,
        Method::GET,
        "/metrics",
        Some(&token("acme", "memory:read")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _, _) = call(
        service,
        Method::GET,
        "/metrics",
        Some(&token("acme", "memory:admin")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

/// An answer's work is bounded whatever its question holds: however many names it
/// asks about, the user's own name is looked up by one recall, not one per name. Each
/// recall counts a use of the facts it finds, so the user's name fact counts the
/// lookups.
#[actix_web::test]
async fn an_answer_looks_up_the_users_name_once_for_any_number_of_names() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    let (status, written) = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user's name is Caroline" }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{written}");
    let id = written["fact"]["id"].as_str().expect("id").to_owned();
    let uses = || async {
        harness.state.cairn.flush_usage().await.expect("flush");
        let (_, fact, _) = call(
            service,
            Method::GET,
            &format!("/v1/users/u1/facts/{id}"),
            Some(&owner),
            None,
        )
        .await;
        fact["use_count"].as_u64().unwrap_or(0)
    };
    let before = uses().await;
    let names: Vec<String> = (0..50)
        .map(|index| format!("Zo{}{}", (b'a' + index / 26) as char, (b'a' + index % 26) as char))
        .collect();
    let question = format!("What did {} paint?", names.join(", "));
    let (status, answer, _) = call(
        service,
        Method::POST,
        "/v1/users/u1/answer",
        Some(&owner),
        Some(json!({ "query": question })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["known"], false, "{answer}");
    let looked_up = uses().await - before;
    assert!(
        looked_up <= 2,
        "the name fact was found by {looked_up} recalls for one answer"
    );
}

/// The console cannot be framed even by browsers older than CSP's `frame-ancestors`,
/// and a service on its own TLS tells browsers to keep to HTTPS.
#[actix_web::test]
async fn the_console_refuses_frames_and_tls_asks_for_strict_transport() {
    let plain = harness_with(|_| ()).await;
    let (status, _, headers) = call(&plain.service, Method::GET, "/ui", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        headers
            .get("x-frame-options")
            .and_then(|value| value.to_str().ok()),
        Some("DENY")
    );
    assert!(
        headers.get("strict-transport-security").is_none(),
        "not over plain HTTP"
    );
    let secured = harness_with(|config| {
        config.tls_cert = Some("/etc/cairn/tls.crt".into());
        config.tls_key = Some("/etc/cairn/tls.key".into());
    })
    .await;
    for path in ["/healthz", "/ui"] {
        let (_, _, headers) = call(&secured.service, Method::GET, path, None, None).await;
        assert_eq!(
            headers
                .get("strict-transport-security")
                .and_then(|value| value.to_str().ok()),
            Some("max-age=31536000"),
            "{path}"
        );
    }
}

/// A token whose subject holds a line break (which could forge lines in a text log and
/// the audit trail) or runs past 256 bytes is refused.
#[actix_web::test]
async fn a_subject_with_control_characters_is_refused() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    let now = chrono::Utc::now().timestamp();
    let long = "s".repeat(257);
    for sub in ["svc\nINFO forged line", "svc\r", long.as_str()] {
        let forged = signed(
            json!({ "sub": sub, "tenant": "acme", "scope": "memory:read", "exp": now + 600, "iat": now }),
            SECRET,
        );
        let (status, body, _) = call(service, Method::GET, "/v1/users/u1/facts", Some(&forged), None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{sub:?}: {body}");
    }
}

/// After a value is retracted, the user's own natural restatement ("I live in Oslo."
/// for "The user lives in Oslo.") is evidence enough to reassert it.
#[actix_web::test]
async fn a_natural_restatement_reasserts_a_retracted_value() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    let (status, written) = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user lives in Oslo." }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{written}");
    let id = written["fact"]["id"].as_str().expect("id").to_owned();
    let (status, body, _) = call(
        service,
        Method::POST,
        &format!("/v1/users/u1/facts/{id}/retract"),
        Some(&owner),
        Some(json!({ "reason": "not any more" })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, said, _) = call(
        service,
        Method::POST,
        "/v1/users/u1/episodes",
        Some(&owner),
        Some(
            json!({ "messages": [{ "role": "user", "content": "I live in Oslo." }], "consolidate": "none" }),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{said}");
    let evidence = said["episode_ids"][0].as_str().expect("episode").to_owned();
    let (status, body) = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user lives in Oslo.", "reassert": true, "evidence_episode_id": evidence }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["fact"]["source_episode_ids"], json!([evidence]), "{body}");
}

/// A decision's reason outlives the fact it replaced: once the old fact is forgotten,
/// no word of its value is left in the decision log or the export.
#[actix_web::test]
async fn a_forgotten_value_leaves_no_word_in_the_reasons() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    for text in ["I work on the fraud team", "I transferred to the search team"] {
        let (status, body, _) = call(
            service,
            Method::POST,
            "/v1/users/u1/episodes",
            Some(&owner),
            Some(json!({ "messages": [{ "role": "user", "content": text }], "consolidate": "sync" })),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let (_, facts, _) = call(
        service,
        Method::GET,
        "/v1/users/u1/facts?status=all",
        Some(&owner),
        None,
    )
    .await;
    let old = facts["items"]
        .as_array()
        .and_then(|items| {
            items
                .iter()
                .find(|fact| fact["text"].as_str().is_some_and(|text| text.contains("fraud")))
        })
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(old["status"], "superseded", "the transfer replaced it: {facts}");
    let id = old["id"].as_str().expect("id").to_owned();
    let (status, _, _) = call(
        service,
        Method::DELETE,
        &format!("/v1/users/u1/facts/{id}"),
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (_, decisions, _) = call(service, Method::GET, "/v1/users/u1/decisions", Some(&owner), None).await;
    assert!(
        decisions["items"]
            .as_array()
            .is_some_and(|items| items.iter().any(|decision| decision["kind"] == "UPDATES")),
        "{decisions}"
    );
    assert!(!decisions.to_string().contains("fraud"), "{decisions}");
    // (The user's own words stay in their episodes: forgetting is of the fact.)
    let (_, export, _) = call(service, Method::GET, "/v1/users/u1/export", Some(&owner), None).await;
    for part in ["decisions", "facts", "tombstones"] {
        assert!(!export[part].to_string().contains("fraud"), "{part}: {export}");
    }
}

/// `.` and `..` are refused as user ids: clients drop them from URL paths as dot
/// segments, so such a user could never be read or erased again.
#[actix_web::test]
async fn dot_segments_are_no_user_ids() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    for user in ["%2E", "%2E%2E"] {
        let (status, body, _) = call(
            service,
            Method::POST,
            &format!("/v1/users/{user}/facts"),
            Some(&owner),
            Some(json!({ "text": "The user hides behind a dot" })),
        )
        .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{user}: {body}");
    }
    let (status, body) = write(service, &owner, "...", json!({ "text": "Three dots are a name" })).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// `/readyz` says what is wrong with the store in general terms; the cluster's own
/// words (which name its hosts, accounts and realms) are for the operator's credential.
#[actix_web::test]
async fn readiness_keeps_the_clusters_words_for_the_operator() {
    use cairn_server::config::Backend;
    let operator = "operator-scrape-credential-0123456789";
    let harness = harness_with(|config| {
        config.backend = Backend::Opensearch;
        config.cluster_url = Some("http://127.0.0.1:9".into());
        config.metrics_token = Some(operator.into());
    })
    .await;
    let service = &harness.service;
    // Bootstrap tries the node in the background: its failure shows once it has.
    let mut public = Value::Null;
    for _ in 0..50 {
        let (status, body, _) = call(service, Method::GET, "/readyz", None, None).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        public = body;
        if public["detail"]
            .as_str()
            .is_some_and(|detail| detail.contains("unreachable"))
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let detail = public["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("unreachable"), "{public}");
    assert!(
        !detail.contains("127.0.0.1"),
        "no host in the public detail: {public}"
    );
    let (_, operator_view, _) = call(service, Method::GET, "/readyz", Some(operator), None).await;
    assert!(
        operator_view["detail"]
            .as_str()
            .is_some_and(|detail| detail.contains("127.0.0.1")),
        "{operator_view}"
    );
}

/// With an operator's scrape credential configured, it reads the metrics whether or
/// not they require a token; a wrong one is no credential at all.
#[actix_web::test]
async fn the_operator_credential_reads_the_metrics() {
    let operator = "operator-scrape-credential-0123456789";
    let harness = harness_with(|config| {
        config.metrics_require_auth = true;
        config.metrics_token = Some(operator.into());
    })
    .await;
    let service = &harness.service;
    let (status, body, _) = call(service, Method::GET, "/metrics", Some(operator), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        body.as_str()
            .is_some_and(|text| text.contains("cairn_llm_calls_total")),
        "{body}"
    );
    let wrong = "operator-scrape-credential-0123456780";
    let (status, _, _) = call(service, Method::GET, "/metrics", Some(wrong), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a wrong credential is none");
}

#[actix_web::test]
async fn profile_and_time_travel() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user's name is Ada", "fact_type": "identity" }),
    )
    .await;
    write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user cannot eat gluten", "fact_type": "constraint" }),
    )
    .await;
    let expires = (chrono::Utc::now() + chrono::Duration::hours(20)).to_rfc3339();
    let (_, exam) = write(service, &owner, "u1", json!({ "text": "The user has a chemistry exam tomorrow", "fact_type": "event", "expires_at": expires })).await;
    let (status, profile, _) = call(
        service,
        Method::GET,
        "/v1/users/u1/profile?query=chemistry%20exam",
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{profile}");
    assert_eq!(profile["static"].as_array().map(Vec::len), Some(2));
    assert_eq!(profile["dynamic"][0]["id"], exam["fact"]["id"]);
    let context = profile["context"].as_str().expect("context");
    assert!(
        context.contains("The user's name is Ada") && context.contains("chemistry exam"),
        "{context}"
    );

    let later = (chrono::Utc::now() + chrono::Duration::days(2)).to_rfc3339();
    let (_, hits, _) = call(
        service,
        Method::POST,
        "/v1/users/u1/recall",
        Some(&owner),
        Some(json!({ "query": "chemistry exam", "as_of": later })),
    )
    .await;
    let ids: Vec<&str> = hits["hits"]
        .as_array()
        .expect("hits")
        .iter()
        .filter_map(|h| h["id"].as_str())
        .collect();
    assert!(
        !ids.contains(&exam["fact"]["id"].as_str().expect("id")),
        "expired by then: {ids:?}"
    );
    assert_eq!(
        ids.len(),
        2,
        "the other facts are still current (vector neighbours)"
    );
    let (_, expired, _) = call(
        service,
        Method::GET,
        &format!(
            "/v1/users/u1/facts?status=expired&as_of={}",
            later.replace('+', "%2B")
        ),
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(expired["items"][0]["id"], exam["fact"]["id"]);
    // Uses are counted off the read path and written in batches (each second, by the
    // server's maintenance task).
    let unflushed = harness.state.cairn.flush_usage().await.expect("flush");
    assert!(unflushed >= 1, "the recalls noted uses: {unflushed}");
    let (_, fact, _) = call(
        service,
        Method::GET,
        &format!("/v1/users/u1/facts/{}", exam["fact"]["id"].as_str().expect("id")),
        Some(&owner),
        None,
    )
    .await;
    assert_eq!(
        fact["use_count"], 1,
        "returned by the profile's recall, so used once"
    );
}

#[actix_web::test]
async fn answers_cite_their_memories_or_say_they_are_not_known() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    let (_, dog) = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user's dog is a greyhound called Pepper", "fact_type": "world" }),
    )
    .await;
    write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user works as a nurse in Leeds", "fact_type": "identity" }),
    )
    .await;
    let ask = |user: &'static str, bearer: String, body: Value| async move {
        call(
            service,
            Method::POST,
            &format!("/v1/users/{user}/answer"),
            Some(&bearer),
            Some(body),
        )
        .await
    };
    let (status, known, _) = ask(
        "u1",
        token("acme", "memory:read"),
        json!({ "query": "What is the name of my dog?" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{known}");
    assert_eq!(known["known"], true, "{known}");
    assert_eq!(known["citations"][0], dog["fact"]["id"], "{known}");
    assert!(
        known["answer"].as_str().is_some_and(|a| a.contains("Pepper")),
        "{known}"
    );

    let (_, unknown, _) = ask(
        "u1",
        owner.clone(),
        json!({ "query": "Which guitar brand do I play?" }),
    )
    .await;
    assert_eq!(unknown["known"], false, "{unknown}");
    assert_eq!(unknown["answer"], "", "{unknown}");
    assert_eq!(unknown["citations"], json!([]), "{unknown}");

    // Another user's memories, and another tenant's, never answer.
    let (_, other_user, _) = ask(
        "u2",
        owner.clone(),
        json!({ "query": "What is the name of my dog?" }),
    )
    .await;
    assert_eq!(other_user["known"], false, "{other_user}");
    let (_, other_tenant, _) = ask(
        "u1",
        token("globex", ALL),
        json!({ "query": "What is the name of my dog?" }),
    )
    .await;
    assert_eq!(other_tenant["known"], false, "{other_tenant}");

    // As of before the fact was written, nothing was known.
    let before = (chrono::Utc::now() - chrono::Duration::days(1)).to_rfc3339();
    let (_, earlier, _) = ask(
        "u1",
        owner.clone(),
        json!({ "query": "What is the name of my dog?", "as_of": before }),
    )
    .await;
    assert_eq!(earlier["known"], false, "{earlier}");

    for (body, field) in [
        (json!({ "query": "  " }), "query"),
        (json!({ "query": "dog", "as_of": "yesterday" }), "as_of"),
        (json!({ "query": "dog", "k": 3 }), ""),
    ] {
        let (status, error, _) = ask("u1", owner.clone(), body.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body} -> {error}");
        assert_error_shape(&error);
        assert!(
            error["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(field)),
            "{error}"
        );
    }
    let (status, _, _) = ask("u1", token("acme", "memory:write"), json!({ "query": "dog" })).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[actix_web::test]
async fn a_backfilled_history_answers_on_both_clocks() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    // Last year's conversation, ingested today.
    let mut between = None;
    for (said, at) in [
        ("I live in Porto", "2025-03-01T10:00:00Z"),
        (
            "I just moved to Lisbon for a job at Nimbus",
            "2025-09-01T10:00:00Z",
        ),
    ] {
        let (status, body, _) = call(
            service,
            Method::POST,
            "/v1/users/u1/episodes",
            Some(&owner),
            Some(json!({ "consolidate": "sync",
                "messages": [{ "role": "user", "content": said, "timestamp": at }] })),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        if between.is_none() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            between = Some(chrono::Utc::now().to_rfc3339());
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    let (_, facts, _) = call(
        service,
        Method::GET,
        "/v1/users/u1/facts?status=all",
        Some(&owner),
        None,
    )
    .await;
    let porto = facts["items"]
        .as_array()
        .expect("facts")
        .iter()
        .find(|fact| fact["text"].as_str().is_some_and(|text| text.contains("Porto")))
        .cloned()
        .expect("the Porto fact");
    assert_eq!(porto["status"], "superseded", "{facts}");
    assert_eq!(
        porto["valid_from"], "2025-03-01T10:00:00.000000Z",
        "from when it was said"
    );
    assert_eq!(
        porto["valid_to"], "2025-09-01T10:00:00.000000Z",
        "until the move was said"
    );

    let owner = &owner;
    let lives = |body: Value| async move {
        let (status, hits, _) = call(
            service,
            Method::POST,
            "/v1/users/u1/recall",
            Some(owner),
            Some(body),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{hits}");
        hits["hits"]
            .as_array()
            .expect("hits")
            .iter()
            .filter_map(|hit| hit["text"].as_str().map(str::to_owned))
            .collect::<Vec<String>>()
    };
    let query = "where does the user live";
    let then =
        lives(json!({ "query": query, "tiers": ["semantic"], "valid_at": "2025-05-01T00:00:00Z" })).await;
    assert!(then.iter().any(|text| text.contains("Porto")), "{then:?}");
    assert!(!then.iter().any(|text| text.contains("Lisbon")), "{then:?}");
    let since =
        lives(json!({ "query": query, "tiers": ["semantic"], "valid_at": "2025-10-01T00:00:00Z" })).await;
    assert!(since.iter().any(|text| text.contains("Lisbon")), "{since:?}");
    assert!(!since.iter().any(|text| text.contains("Porto")), "{since:?}");
    let now = lives(json!({ "query": query, "tiers": ["semantic"] })).await;
    assert!(
        now.iter().any(|text| text.contains("Lisbon")) && !now.iter().any(|text| text.contains("Porto")),
        "{now:?}"
    );
    // Belief time: Cairn learned all of it today, so as of last year it knew nothing.
    let believed = lives(json!({ "query": query, "as_of": "2025-05-01T00:00:00Z" })).await;
    assert!(believed.is_empty(), "{believed:?}");
    // Both clocks: as believed between the two ingests, what held last May.
    let both = lives(json!({ "query": query, "tiers": ["semantic"], "as_of": between, "valid_at": "2025-05-01T00:00:00Z" })).await;
    assert!(both.iter().any(|text| text.contains("Porto")), "{both:?}");
    assert!(
        !both.iter().any(|text| text.contains("Lisbon")),
        "not yet learned: {both:?}"
    );
    // Episodes by event time: only what had been said by then.
    let episodes =
        lives(json!({ "query": "Lisbon Porto", "tiers": ["episodic"], "valid_at": "2025-05-01T00:00:00Z" }))
            .await;
    assert_eq!(episodes, ["I live in Porto"]);
    let (status, error, _) = call(
        service,
        Method::POST,
        "/v1/users/u1/recall",
        Some(owner),
        Some(json!({ "query": query, "valid_at": "last spring" })),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("valid_at")),
        "{error}"
    );
}

#[actix_web::test]
async fn entities_gather_what_the_facts_say_about_someone() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    let (_, berlin) = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user's sister Anna lives in Berlin", "fact_type": "world" }),
    )
    .await;
    let (_, nurse) = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user's sister is a nurse", "fact_type": "world" }),
    )
    .await;
    write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user works at Datadog", "fact_type": "identity" }),
    )
    .await;
    write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user's dog is called Pepper", "fact_type": "world" }),
    )
    .await;
    let (_, munich) = write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user's sister Anna lives in Munich", "supersedes": berlin["fact"]["id"] }),
    )
    .await;
    let get = |path: String, bearer: String| async move {
        let (status, body, _) = call(service, Method::GET, &path, Some(&bearer), None).await;
        (status, body)
    };
    let (status, listed) = get("/v1/users/u1/entities".into(), token("acme", "memory:read")).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let kinds: Vec<(String, String)> = listed["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|entity| {
            (
                entity["name"].as_str().unwrap_or_default().to_owned(),
                entity["kind"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    for expected in [
        ("Anna", "person"),
        ("Pepper", "pet"),
        ("Datadog", "organisation"),
        ("Munich", "place"),
    ] {
        assert!(
            kinds.contains(&(expected.0.to_owned(), expected.1.to_owned())),
            "{expected:?} in {kinds:?}"
        );
    }
    assert_eq!(
        listed["items"][0]["name"], "Anna",
        "most mentioned first: {listed}"
    );

    let (status, anna) = get("/v1/users/u1/entities/Anna".into(), owner.clone()).await;
    assert_eq!(status, StatusCode::OK, "{anna}");
    let ids = |list: &Value| -> Vec<String> {
        list.as_array()
            .expect("facts")
            .iter()
            .filter_map(|fact| fact["id"].as_str().map(str::to_owned))
            .collect()
    };
    let mut current = ids(&anna["facts"]);
    current.sort();
    let mut expected = vec![
        munich["fact"]["id"].as_str().expect("id").to_owned(),
        nurse["fact"]["id"].as_str().expect("id").to_owned(),
    ];
    expected.sort();
    assert_eq!(current, expected, "my sister and Anna are one entity: {anna}");
    assert_eq!(
        ids(&anna["history"]),
        [berlin["fact"]["id"].as_str().expect("id")]
    );
    assert_eq!(anna["aliases"], json!(["Anna", "the user's sister"]));
    let (_, by_relation) = get("/v1/users/u1/entities/my%20sister".into(), owner.clone()).await;
    assert_eq!(by_relation["id"], anna["id"]);
    let (_, by_id) = get(
        format!("/v1/users/u1/entities/{}", anna["id"].as_str().expect("id")),
        owner.clone(),
    )
    .await;
    assert_eq!(by_id["name"], "Anna");

    // Recall about Anna only.
    let (status, hits, _) = call(
        service,
        Method::POST,
        "/v1/users/u1/recall",
        Some(&owner),
        Some(json!({ "query": "where does she live and work", "entity": "Anna", "tiers": ["semantic"] })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{hits}");
    let texts: Vec<&str> = hits["hits"]
        .as_array()
        .expect("hits")
        .iter()
        .filter_map(|hit| hit["text"].as_str())
        .collect();
    assert!(
        texts.contains(&"The user's sister Anna lives in Munich"),
        "{texts:?}"
    );
    assert!(texts.iter().all(|text| text.contains("sister")), "{texts:?}");
    let (status, _, _) = call(
        service,
        Method::POST,
        "/v1/users/u1/recall",
        Some(&owner),
        Some(json!({ "query": "anything", "entity": "Zebedee" })),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // The profile groups its facts by entity.
    let (_, profile, _) = call(service, Method::GET, "/v1/users/u1/profile", Some(&owner), None).await;
    let group = profile["entities"]
        .as_array()
        .expect("entities")
        .iter()
        .find(|group| group["name"] == "Anna")
        .cloned()
        .expect("Anna's group");
    assert_eq!(group["fact_ids"].as_array().map(Vec::len), Some(2), "{group}");

    // Never across scopes.
    let (status, _) = get("/v1/users/u1/entities/Anna".into(), token("globex", ALL)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = get("/v1/users/u2/entities/Anna".into(), owner.clone()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = get("/v1/users/u1/entities".into(), token("acme", "memory:write")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

/// A fake rerank service on loopback: scores 1.0 for documents containing `favoured`,
/// 0.0 otherwise; or answers 500 when `broken`.
/// Slots are per person: a change about the user's sister, named, replaces her value and
/// leaves the user's own.
#[actix_web::test]
async fn a_change_about_a_named_relation_leaves_the_users_own_value() {
    let harness = harness_with(|_| ()).await;
    let service = &harness.service;
    for text in [
        "I work as a teacher.",
        "My sister Anna is a nurse.",
        "Anna became a doctor.",
    ] {
        let (status, body, _) = call(
            service,
            Method::POST,
            "/v1/users/u1/episodes",
            Some(&token("acme", ALL)),
            Some(json!({ "messages": [{ "role": "user", "content": text }], "consolidate": "sync" })),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let (_, active, _) = call(
        service,
        Method::GET,
        "/v1/users/u1/facts?status=active",
        Some(&token("acme", ALL)),
        None,
    )
    .await;
    let texts: Vec<&str> = active["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|fact| fact["text"].as_str())
        .collect();
    assert!(texts.iter().any(|text| text.contains("teacher")), "{texts:?}");
    assert!(texts.iter().any(|text| text.contains("doctor")), "{texts:?}");
    assert!(!texts.iter().any(|text| text.contains("nurse")), "{texts:?}");
}

async fn fake_reranker(favoured: &'static str, broken: bool) -> String {
    let server = actix_web::HttpServer::new(move || {
        actix_web::App::new().route(
            "/rerank",
            web::post().to(move |body: web::Json<Value>| async move {
                if broken {
                    return actix_web::HttpResponse::InternalServerError().finish();
                }
                let documents = body["documents"].as_array().cloned().unwrap_or_default();
                let results: Vec<Value> = documents
                    .iter()
                    .enumerate()
                    .map(|(index, document)| {
                        let score = if document.as_str().unwrap_or("").contains(favoured) {
                            1.0
                        } else {
                            0.0
                        };
                        json!({ "index": index, "relevance_score": score })
                    })
                    .collect();
                actix_web::HttpResponse::Ok().json(json!({ "results": results }))
            }),
        )
    })
    .workers(1)
    .bind(("127.0.0.1", 0))
    .expect("bind");
    let address = server.addrs()[0];
    actix_web::rt::spawn(server.run());
    format!("http://{address}/rerank")
}

async fn tea_ranking(rerank_url: Option<String>) -> Vec<(String, Value)> {
    let harness = harness_with(move |config| config.rerank_url = rerank_url).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    for text in [
        "The user drinks green tea every morning",
        "The user drinks tea with lemon",
        "The user once tried rooibos tea",
    ] {
        write(service, &owner, "u1", json!({ "text": text })).await;
    }
    let (status, body, _) = call(
        service,
        Method::POST,
        "/v1/users/u1/recall",
        Some(&owner),
        Some(json!({ "query": "green tea", "explain": true, "tiers": ["semantic"] })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["hits"]
        .as_array()
        .expect("hits")
        .iter()
        .map(|hit| {
            (
                hit["text"].as_str().unwrap_or("").to_owned(),
                hit["explain"]["rerank_score"].clone(),
            )
        })
        .collect()
}

#[actix_web::test]
async fn a_remote_reranker_reorders_and_a_failing_one_changes_nothing() {
    let fused = tea_ranking(None).await;
    assert_eq!(fused.len(), 3);
    assert!(fused[0].0.contains("green"), "{fused:?}");
    assert!(fused.iter().all(|(_, score)| score.is_null()));

    let reranked = tea_ranking(Some(fake_reranker("rooibos", false).await)).await;
    assert_eq!(reranked[0].0, "The user once tried rooibos tea", "{reranked:?}");
    assert_eq!(reranked[0].1, json!(1.0));
    assert!(reranked[1..].iter().all(|(_, score)| score == &json!(0.0)));

    let fallback = tea_ranking(Some(fake_reranker("rooibos", true).await)).await;
    let fused_texts: Vec<&str> = fused.iter().map(|(text, _)| text.as_str()).collect();
    let fallback_texts: Vec<&str> = fallback.iter().map(|(text, _)| text.as_str()).collect();
    assert_eq!(
        fallback_texts, fused_texts,
        "a failing reranker keeps the fused order"
    );
    assert!(fallback.iter().all(|(_, score)| score.is_null()));
}

#[actix_web::test]
async fn the_offline_late_interaction_reranker_is_wired() {
    let harness = harness_with(|config| config.rerank_offline = Some("late-interaction".into())).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user adopted a golden retriever" }),
    )
    .await;
    write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user files taxes every April" }),
    )
    .await;
    let (_, body, _) = call(
        service,
        Method::POST,
        "/v1/users/u1/recall",
        Some(&owner),
        Some(json!({ "query": "what breed is the dog", "explain": true, "tiers": ["semantic"] })),
    )
    .await;
    let hits = body["hits"].as_array().expect("hits");
    assert_eq!(hits[0]["text"], "The user adopted a golden retriever", "{body}");
    assert!(
        hits.iter().all(|hit| hit["explain"]["rerank_score"].is_f64()),
        "{body}"
    );
}

#[actix_web::test]
async fn a_local_cross_encoder_rescores_hits() {
    // The model is a plumbing fixture (MiniLM plus a fixed head): only the wiring is checked.
    let fixture =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.models/test-cross-encoder");
    let harness = harness_with(move |config| config.rerank_model_dir = Some(fixture)).await;
    let service = &harness.service;
    let owner = token("acme", ALL);
    write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user drinks green tea" }),
    )
    .await;
    write(
        service,
        &owner,
        "u1",
        json!({ "text": "The user plays the cello" }),
    )
    .await;
    let (status, body, _) = call(
        service,
        Method::POST,
        "/v1/users/u1/recall",
        Some(&owner),
        Some(json!({ "query": "tea", "explain": true, "tiers": ["semantic"] })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let hits = body["hits"].as_array().expect("hits");
    assert_eq!(hits.len(), 2);
    let scores: Vec<f64> = hits
        .iter()
        .filter_map(|hit| hit["explain"]["rerank_score"].as_f64())
        .collect();
    assert_eq!(scores.len(), 2, "every hit was rescored: {body}");
    assert!(
        scores[0] >= scores[1],
        "hits are ordered by the reranker: {scores:?}"
    );
}

/// A scope as the authentication layer would produce it, for a test that writes to a
/// store directly.
#[allow(clippy::disallowed_methods)]
fn scope_of(tenant: &str, user: &str) -> cairn_core::Scope {
    let tenant = cairn_core::TenantId::parse(tenant).expect("tenant");
    cairn_core::Principal::from_verified_credential(
        "test".into(),
        tenant,
        None,
        vec![cairn_core::Permission::Admin],
    )
    .scope_for(user, cairn_core::Permission::Admin)
    .expect("scope")
}

/// Waits until the service's store answers `/readyz` (a cluster store bootstraps its
/// indices in the background), for at most 30 s; `what` names the service in the failure.
async fn until_ready<S, B>(service: &S, what: &str)
where
    S: Service<actix_http::Request, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: actix_web::body::MessageBody,
{
    for _ in 0..120 {
        let (status, _, _) = call(service, Method::GET, "/readyz", None, None).await;
        if status == StatusCode::OK {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    panic!("{what}: not ready after 30 s");
}

/// Deletes the indices a test made under `prefix` on the cluster at `url`.
async fn drop_indices(url: &str, prefix: &str) {
    let store = cairn_store_cluster::ClusterStore::connect(url, prefix, 384)
        .await
        .expect("the test cluster answers");
    store.delete_indices().await.expect("clean up");
}

/// The test cluster's URL from `variable`, when one is set.
#[allow(clippy::disallowed_methods)]
fn test_cluster(variable: &str) -> Option<String> {
    std::env::var(variable).ok().filter(|url| !url.is_empty())
}

/// On a search cluster, where use counts live apart from the records, recall reads them
/// when the usage prior weighs them (and only then: no answer shows a count): a fact
/// that was used, a text hit and one found by meaning alone, gets the prior's boost.
#[actix_web::test]
async fn a_recall_on_a_cluster_weighs_use_counts_when_asked_to() {
    use cairn_server::config::Backend;
    for (variable, backend) in [
        ("CAIRN_TEST_OPENSEARCH_URL", Backend::Opensearch),
        ("CAIRN_TEST_ELASTICSEARCH_URL", Backend::Elasticsearch),
    ] {
        let Some(url) = test_cluster(variable) else {
            eprintln!("skipped on {backend:?}: {variable} is not set");
            continue;
        };
        let prefix = format!("cairn-api-{}", uuid::Uuid::now_v7().simple());
        let harness = harness_with(|config| {
            config.backend = backend;
            config.cluster_url = Some(url.clone());
            config.index_prefix = prefix.clone();
            config.usage_weight = 1.0;
        })
        .await;
        let service = &harness.service;
        // The store bootstraps its indices in the background; /readyz says when.
        until_ready(service, &format!("{backend:?}: the service")).await;
        let owner = token("acme", ALL);
        let mut ids = Vec::new();
        for text in [
            "The user prefers green tea in the morning",
            "The user's favourite drink is matcha",
        ] {
            let (status, written) = write(service, &owner, "u1", json!({ "text": text })).await;
            assert_eq!(status, StatusCode::CREATED, "{written}");
            ids.push(written["fact"]["id"].as_str().expect("id").to_owned());
        }
        let ask = json!({ "query": "beverage preferences", "tiers": ["semantic"], "explain": true });
        let recall = || {
            call(
                service,
                Method::POST,
                "/v1/users/u1/recall",
                Some(&owner),
                Some(ask.clone()),
            )
        };
        let hit_of = |answer: &Value, id: &str| {
            answer["hits"]
                .as_array()
                .and_then(|hits| hits.iter().find(|hit| hit["id"] == id).cloned())
                .unwrap_or(Value::Null)
        };
        let (_, first, _) = recall().await;
        // The matcha fact shares no word with the question: only the vector leg finds it.
        let by_meaning = hit_of(&first, &ids[1]);
        assert!(
            by_meaning["explain"]["bm25_rank"].is_null() && !by_meaning["explain"]["knn_rank"].is_null(),
            "{backend:?}: found by meaning alone: {first}"
        );
        assert!(
            !hit_of(&first, &ids[0])["explain"]["bm25_rank"].is_null(),
            "{backend:?}: found by its words: {first}"
        );
        for id in &ids {
            assert_eq!(
                hit_of(&first, id)["explain"]["prior"],
                1.0,
                "{backend:?}: not used yet: {first}"
            );
        }
        harness.state.cairn.flush_usage().await.expect("flush");
        // Counts are read as of the usage index's last refresh (each second).
        let mut boosted = Value::Null;
        for _ in 0..40 {
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            let (_, answer, _) = recall().await;
            let done = ids
                .iter()
                .all(|id| hit_of(&answer, id)["explain"]["prior"].as_f64().unwrap_or(0.0) > 1.0);
            boosted = answer;
            if done {
                break;
            }
        }
        for id in &ids {
            assert!(
                hit_of(&boosted, id)["explain"]["prior"].as_f64().unwrap_or(0.0) > 1.0,
                "{backend:?}: {id} was used, so weighs more: {boosted}"
            );
        }
        drop_indices(&url, &prefix).await;
    }
}
