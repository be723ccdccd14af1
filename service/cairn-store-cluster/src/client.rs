//! The HTTP side: one reqwest client per node (the REST API is plain JSON, the same on
//! OpenSearch and Elasticsearch) with the deployment's credentials and TLS trust, engine
//! detection, and the error mapping of cluster answers. Secrets never reach an error message: each message
//! is built from the cluster's answer or the transport error with every configured
//! secret masked.

use base64::Engine as _;
use cairn_core::{Error, Result};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use serde_json::Value;
#[cfg(test)]
use serde_json::json;
use std::time::Duration;

/// The HTTP methods of the cluster API Cairn uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Put,
    Post,
    Delete,
    Head,
}

impl Method {
    fn http(self) -> reqwest::Method {
        match self {
            Method::Get => reqwest::Method::GET,
            Method::Put => reqwest::Method::PUT,
            Method::Post => reqwest::Method::POST,
            Method::Delete => reqwest::Method::DELETE,
            Method::Head => reqwest::Method::HEAD,
        }
    }
}

/// One node: its base URL (without a trailing slash) and a client for it.
struct Node {
    base: String,
    client: reqwest::Client,
}

/// Which search engine answers (see [`Cluster::detect`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    OpenSearch,
    Elasticsearch,
}

impl Engine {
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::OpenSearch => "opensearch",
            Engine::Elasticsearch => "elasticsearch",
        }
    }
}

/// A cluster answer: HTTP status and JSON body (`Null` when empty).
pub struct Answer {
    pub status: u16,
    pub body: Value,
    /// The `X-elastic-product` header: Elasticsearch 7.14 and later send it.
    pub elastic: bool,
}

impl Answer {
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// How the cluster authenticates Cairn: at most one scheme sends an `Authorization`
/// header (a client certificate in [`Access`] may come with it or alone).
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    Basic {
        username: String,
        password: String,
    },
    /// An Elasticsearch API key in its encoded form (`base64(id:key)`), sent as
    /// `Authorization: ApiKey <encoded>`.
    ApiKey(String),
    /// Sent as `Authorization: Bearer <token>`.
    Bearer(String),
}

impl Credentials {
    fn header(&self) -> String {
        match self {
            Credentials::Basic { username, password } => format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"))
            ),
            Credentials::ApiKey(encoded) => format!("ApiKey {encoded}"),
            Credentials::Bearer(token) => format!("Bearer {token}"),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Credentials::Basic { .. } => "basic authentication",
            Credentials::ApiKey(_) => "API key",
            Credentials::Bearer(_) => "bearer token",
        }
    }

    fn secrets(&self) -> Vec<String> {
        match self {
            // The encoded header too: a server may echo it.
            Credentials::Basic { password, .. } => vec![password.clone(), self.header()],
            Credentials::ApiKey(encoded) => vec![encoded.clone()],
            Credentials::Bearer(token) => vec![token.clone()],
        }
    }
}

/// Credentials and TLS settings for reaching the cluster. `Debug` shows which are set,
/// never their values.
#[derive(Clone, Default)]
pub struct Access {
    pub credentials: Option<Credentials>,
    /// PEM certificates of the CAs to trust, besides the usual roots.
    pub ca_pem: Option<Vec<u8>>,
    /// A client certificate and its private key, PEM, for mutual TLS.
    pub client_pem: Option<Vec<u8>>,
    /// Accept any certificate (never in production; warned about at start).
    pub insecure: bool,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Access")
            .field("credentials", &self.credentials.as_ref().map(Credentials::kind))
            .field("ca", &self.ca_pem.is_some())
            .field("client_certificate", &self.client_pem.is_some())
            .field("insecure", &self.insecure)
            .finish()
    }
}

impl Access {
    /// What is configured, for logs: the kinds, never the values.
    pub fn describe(&self) -> String {
        let mut parts = vec![
            self.credentials
                .as_ref()
                .map_or("no credentials", Credentials::kind)
                .to_owned(),
        ];
        if self.ca_pem.is_some() {
            parts.push("custom CA".into());
        }
        if self.client_pem.is_some() {
            parts.push("client certificate".into());
        }
        if self.insecure {
            parts.push("certificate verification OFF".into());
        }
        parts.join(", ")
    }
}

#[derive(Clone)]
pub struct Cluster {
    /// One client per node URL (`CAIRN_CLUSTER_URL` may list several, comma-separated).
    clients: std::sync::Arc<Vec<Node>>,
    /// The node requests go to first: the last one that answered.
    current: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Every configured secret, masked in any message built from an answer or error.
    secrets: std::sync::Arc<Vec<String>>,
    /// What authenticated Cairn, for messages about a refusal.
    credentials: &'static str,
}

impl Cluster {
    pub fn new(url: &str, timeout: Duration) -> Result<Self> {
        Cluster::with_access(url, &Access::default(), timeout)
    }

    /// A client of the nodes at `urls` (comma-separated); requests go to one node and
    /// move to the next when a node cannot be connected to.
    pub fn with_access(urls: &str, access: &Access, timeout: Duration) -> Result<Self> {
        let mut clients = Vec::new();
        for url in urls.split(',').map(str::trim).filter(|url| !url.is_empty()) {
            clients.push(Cluster::client(url, access, timeout)?);
        }
        if clients.is_empty() {
            return Err(Error::invalid("cluster_url", "names no node"));
        }
        let mut secrets = access
            .credentials
            .as_ref()
            .map(Credentials::secrets)
            .unwrap_or_default();
        secrets.retain(|secret| !secret.is_empty());
        Ok(Cluster {
            clients: std::sync::Arc::new(clients),
            current: std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            secrets: std::sync::Arc::new(secrets),
            credentials: access.credentials.as_ref().map_or(
                if access.client_pem.is_some() {
                    "client certificate"
                } else {
                    "no credentials"
                },
                Credentials::kind,
            ),
        })
    }

    fn client(url: &str, access: &Access, timeout: Duration) -> Result<Node> {
        let parsed =
            reqwest::Url::parse(url).map_err(|error| Error::invalid("cluster_url", error.to_string()))?;
        let mut headers = HeaderMap::new();
        if let Some(credentials) = &access.credentials {
            let mut value = HeaderValue::from_str(&credentials.header())
                .map_err(|_| Error::invalid("cluster_credentials", "cannot be sent in an HTTP header"))?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        let mut builder = reqwest::Client::builder()
            .no_proxy()
            .timeout(timeout)
            .default_headers(headers);
        if let Some(pem) = &access.client_pem {
            let identity = reqwest::Identity::from_pem(pem).map_err(|error| {
                Error::invalid(
                    "cluster_client_cert",
                    format!("is not a PEM certificate and key: {error}"),
                )
            })?;
            builder = builder.identity(identity);
        }
        if access.insecure {
            builder = builder.tls_danger_accept_invalid_certs(true);
        } else if let Some(pem) = &access.ca_pem {
            let roots = reqwest::Certificate::from_pem_bundle(pem).map_err(|error| {
                Error::invalid("cluster_ca_cert", format!("is not a PEM certificate: {error}"))
            })?;
            builder = builder.tls_certs_merge(roots);
        }
        let client = builder.build().map_err(|error| {
            Error::invalid(
                "cluster_tls",
                format!("cannot set up the cluster client: {error}"),
            )
        })?;
        Ok(Node {
            base: parsed.as_str().trim_end_matches('/').to_owned(),
            client,
        })
    }

    /// `text` with every configured secret masked.
    fn mask(&self, text: &str) -> String {
        self.secrets.iter().fold(text.to_owned(), |text, secret| {
            text.replace(secret.as_str(), "***")
        })
    }

    /// An `Unavailable` error for a transport failure, saying what went wrong in terms an
    /// operator can act on (an untrusted certificate, a refused client certificate) when
    /// the error chain shows it.
    fn transport_error(&self, error: &reqwest::Error) -> Error {
        let mut chain = error.to_string();
        let mut source = std::error::Error::source(error);
        while let Some(cause) = source {
            chain.push_str(": ");
            chain.push_str(&cause.to_string());
            source = cause.source();
        }
        let chain = self.mask(&chain);
        let lower = chain.to_ascii_lowercase();
        let diagnosis = if lower.contains("unknownissuer") || lower.contains("unknown issuer") {
            "TLS: the search cluster's certificate is signed by an unknown CA (set CAIRN_CLUSTER_CA_CERT to the CA that signed it)"
        } else if lower.contains("notvalidforname") || lower.contains("not valid for name") {
            "TLS: the search cluster's certificate does not name the host in CAIRN_CLUSTER_URL"
        } else if lower.contains("expired") && lower.contains("certificate") {
            "TLS: the search cluster's certificate has expired"
        } else if lower.contains("certificaterequired") || lower.contains("certificate required") {
            "TLS: the search cluster requires a client certificate (CAIRN_CLUSTER_CLIENT_CERT and CAIRN_CLUSTER_CLIENT_KEY)"
        } else if lower.contains("badcertificate")
            || lower.contains("bad certificate")
            || lower.contains("alert: certificateunknown")
            || lower.contains("alert: unknownca")
        {
            "TLS: the search cluster refused the client certificate"
        } else if lower.contains("invalidcontenttype") || lower.contains("corrupt message") {
            "TLS: the search cluster did not answer TLS (is CAIRN_CLUSTER_URL https:// on a plain HTTP port?)"
        } else {
            "search cluster unreachable"
        };
        Error::Unavailable(format!("{diagnosis}{}{chain}", cairn_core::error::SPECIFICS))
    }

    /// An `Unavailable` error for a 401 or 403: the credentials were rejected, or lack a
    /// privilege (or the index is blocked), with the cluster's reason.
    fn refusal(&self, status: u16, body: &Value) -> Error {
        let error = &body["error"];
        let mut reason = error["reason"].as_str().unwrap_or_default().to_owned();
        if let Some(more) = error["additional_unsuccessful_credentials"].as_str() {
            reason.push_str(&format!(" ({more})"));
        }
        if reason.is_empty() {
            reason = body
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| body.to_string());
        }
        let reason = self.mask(&reason);
        if status == 401 {
            Error::Unavailable(format!(
                "the search cluster rejected the credentials ({}; 401){}{reason}",
                self.credentials,
                cairn_core::error::SPECIFICS
            ))
        } else {
            Error::Unavailable(format!(
                "the search cluster refused the request ({}; 403){}{reason}",
                self.credentials,
                cairn_core::error::SPECIFICS
            ))
        }
    }

    /// Sends one request. Transport failures (refused, timed out) and gateway answers
    /// (502-504) are `Unavailable`; any other status comes back as an [`Answer`] for
    /// the caller to judge.
    async fn send(
        &self,
        method: Method,
        path: &str,
        content_type: &'static str,
        query: &[(&str, String)],
        body: Option<String>,
    ) -> Result<Answer> {
        use std::sync::atomic::Ordering;
        let started = std::time::Instant::now();
        // Shared, so trying another node does not copy a bulk body.
        let body = body.map(bytes::Bytes::from);
        let sent = body.as_ref().map_or(0, bytes::Bytes::len);
        let first = self.current.load(Ordering::Relaxed) % self.clients.len();
        let mut attempt = 0;
        let response = loop {
            let index = (first + attempt) % self.clients.len();
            let node = &self.clients[index];
            let mut request = node
                .client
                .request(method.http(), format!("{}{path}", node.base))
                .query(query);
            if let Some(body) = &body {
                request = request.header(CONTENT_TYPE, content_type).body(body.clone());
            }
            match request.send().await {
                Ok(response) => {
                    if index != first {
                        self.current.store(index, Ordering::Relaxed);
                    }
                    break response;
                }
                // Nothing reached a node it could not connect to: the next one may serve
                // the request. Any other failure may have reached the node, and is
                // reported rather than repeated.
                Err(error) if attempt + 1 < self.clients.len() && error.is_connect() => attempt += 1,
                Err(error) => return Err(self.transport_error(&error)),
            }
        };
        let status = response.status().as_u16();
        let elastic = response
            .headers()
            .get("x-elastic-product")
            .is_some_and(|product| product.as_bytes().eq_ignore_ascii_case(b"elasticsearch"));
        let text = response
            .text()
            .await
            .map_err(|error| self.transport_error(&error))?;
        tracing::debug!(
            method = method.http().as_str(),
            path,
            status,
            sent,
            received = text.len(),
            micros = started.elapsed().as_micros() as u64,
            "search cluster request"
        );
        let body = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if matches!(status, 502..=504) {
            return Err(Error::Unavailable(format!("search cluster answered {status}")));
        }
        // No request of Cairn's is one a working deployment is refused: a 401 or 403 is
        // the deployment's credentials, never the caller's request.
        if matches!(status, 401 | 403) {
            return Err(self.refusal(status, &body));
        }
        Ok(Answer {
            status,
            body,
            elastic,
        })
    }

    /// A JSON request; see [`Cluster::send`].
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
    ) -> Result<Answer> {
        self.send(
            method,
            path,
            "application/json",
            query,
            body.map(|body| body.to_string()),
        )
        .await
    }

    /// Like [`Cluster::call`], but any non-2xx status is a storage error naming the request.
    pub async fn expect(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
    ) -> Result<Value> {
        let answer = self.call(method, path, query, body).await?;
        if answer.ok() {
            Ok(answer.body)
        } else {
            Err(failure(path, &answer))
        }
    }

    /// A `_bulk` request (newline-delimited JSON), refreshing before it answers when
    /// `refreshed`; any non-2xx status is a storage error.
    pub async fn bulk(&self, body: String, refreshed: bool) -> Result<Value> {
        let path = "/_bulk";
        let answer = self
            .send(
                Method::Post,
                path,
                "application/x-ndjson",
                &[("refresh", refreshed.to_string())],
                Some(body),
            )
            .await?;
        if answer.ok() {
            Ok(answer.body)
        } else {
            Err(failure(path, &answer))
        }
    }

    /// An `_msearch` request (newline-delimited header and body lines): one answer per
    /// search, in order, each with its own `status`. A search that failed is a storage
    /// error naming its index (unavailable, when its shards were).
    pub async fn msearch(&self, body: String, indices: &[String]) -> Result<Vec<Value>> {
        let path = "/_msearch";
        let mut answer = self
            .send(Method::Post, path, "application/x-ndjson", &[], Some(body))
            .await?;
        if !answer.ok() {
            return Err(failure(path, &answer));
        }
        let Value::Array(responses) = answer.body["responses"].take() else {
            return Err(Error::Storage(format!("{path}: no responses in the answer")));
        };
        if responses.len() != indices.len() {
            return Err(Error::Storage(format!(
                "{path}: {} answers to {} searches",
                responses.len(),
                indices.len()
            )));
        }
        responses
            .into_iter()
            .zip(indices)
            .map(|(response, index)| {
                if response["error"].is_null() {
                    return Ok(response);
                }
                let one = Answer {
                    status: response["status"].as_u64().unwrap_or(500) as u16,
                    body: response,
                    elastic: answer.elastic,
                };
                // `failure` answers `Unavailable` for 502-504 and a cluster in transition.
                Err(failure(&format!("/{index}/_search"), &one))
            })
            .collect()
    }

    /// The engine and version of the node that answers. `GET /` is not used: the bare
    /// distributions answer it 405, and a restricted user may not read it. The local
    /// node's info is: Elasticsearch marks its answers with `X-elastic-product` (7.14
    /// and later) and reports a `build_flavor`, which OpenSearch dropped.
    pub async fn detect(&self) -> Result<(Engine, String)> {
        let path = "/_nodes/_local";
        let query = [("filter_path", "nodes.*.version,nodes.*.build_flavor".to_owned())];
        let answer = self.call(Method::Get, path, &query, None).await?;
        if !answer.ok() {
            return Err(failure(path, &answer));
        }
        let node = answer.body["nodes"]
            .as_object()
            .and_then(|nodes| nodes.values().next())
            .ok_or_else(|| Error::Unavailable(format!("{path}: the cluster described no node")))?;
        let version = node["version"]
            .as_str()
            .ok_or_else(|| Error::Unavailable(format!("{path}: the node reported no version")))?
            .to_owned();
        let engine = if answer.elastic || node["build_flavor"].is_string() {
            Engine::Elasticsearch
        } else {
            Engine::OpenSearch
        };
        Ok((engine, version))
    }
}

/// Error types a cluster answers with while nodes or shards come and go: the request may
/// succeed when retried, so they are `Unavailable` (503), not internal errors.
const TRANSIENT: [&str; 9] = [
    "search_phase_execution_exception",
    "no_shard_available_action_exception",
    "unavailable_shards_exception",
    "node_not_connected_exception",
    "node_disconnected_exception",
    "node_closed_exception",
    "cluster_block_exception",
    "process_cluster_event_timeout_exception",
    "primary_missing_action_exception",
];

/// The error for an unexpected answer, with the cluster's reason: `Unavailable` for a
/// 502-504 or an error of a cluster in transition, `Storage` otherwise.
pub fn failure(path: &str, answer: &Answer) -> Error {
    let error = &answer.body["error"];
    let mut reason = error["reason"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| error.to_string());
    if let Some(cause) = error["caused_by"]["reason"].as_str() {
        reason.push_str(": ");
        reason.push_str(cause);
    }
    let message = format!("{path}: {} {reason}", answer.status);
    if transient(answer.status, error) {
        Error::Unavailable(message)
    } else {
        Error::Storage(message)
    }
}

/// Whether an error answer (a whole request's, or one bulk item's) is one a cluster
/// gives while nodes or shards come and go: a 502-504, a rejection for load (429), or
/// an error type of [`TRANSIENT`].
pub fn transient(status: u16, error: &Value) -> bool {
    let types = std::iter::once(&error["type"])
        .chain(
            error["root_cause"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|cause| &cause["type"]),
        )
        .chain(std::iter::once(&error["caused_by"]["type"]))
        .filter_map(Value::as_str);
    matches!(status, 429 | 502..=504) || types.into_iter().any(|kind| TRANSIENT.contains(&kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_neither_shown_nor_repeated() {
        let access = Access {
            credentials: Some(Credentials::Basic {
                username: "cairn".into(),
                password: "hunter2-secret".into(),
            }),
            ..Access::default()
        };
        let shown = format!("{access:?} {}", access.describe());
        assert!(
            !shown.contains("hunter2") && shown.contains("basic authentication"),
            "{shown}"
        );
        let cluster =
            Cluster::with_access("https://127.0.0.1:9", &access, Duration::from_secs(1)).expect("client");
        let header = Credentials::Basic {
            username: "cairn".into(),
            password: "hunter2-secret".into(),
        }
        .header();
        let masked = cluster.mask(&format!("echoed {header} and hunter2-secret"));
        assert!(
            !masked.contains("hunter2") && !masked.contains(&header),
            "{masked}"
        );
        let refusal = cluster.refusal(
            401,
            &json!({ "error": { "reason": "bad password hunter2-secret" } }),
        );
        let text = refusal.to_string();
        assert!(
            text.contains("rejected the credentials (basic authentication; 401)")
                && !text.contains("hunter2")
        );
    }

    #[test]
    fn a_cluster_in_transition_is_unavailable_not_broken() {
        let answer = |status, body| Answer {
            status,
            body,
            elastic: false,
        };
        let lost = answer(
            500,
            json!({ "error": { "type": "search_phase_execution_exception", "reason": "all shards failed",
                "root_cause": [{ "type": "no_shard_available_action_exception" }] } }),
        );
        assert!(matches!(failure("/x", &lost), Error::Unavailable(_)));
        assert!(matches!(
            failure("/x", &answer(503, json!({}))),
            Error::Unavailable(_)
        ));
        let mapping = answer(
            400,
            json!({ "error": { "type": "mapper_parsing_exception", "reason": "bad field" } }),
        );
        assert!(matches!(failure("/x", &mapping), Error::Storage(_)));
        // Bulk items carry their own status and error.
        let item = json!({ "type": "unavailable_shards_exception", "reason": "primary shard is not active" });
        assert!(transient(503, &item));
        assert!(transient(
            429,
            &json!({ "type": "es_rejected_execution_exception" })
        ));
        assert!(!transient(400, &json!({ "type": "document_parsing_exception" })));
    }

    #[test]
    fn authorization_headers_follow_the_documented_formats() {
        let basic = Credentials::Basic {
            username: "elastic".into(),
            password: "changeme".into(),
        };
        assert_eq!(basic.header(), "Basic ZWxhc3RpYzpjaGFuZ2VtZQ==");
        assert_eq!(Credentials::ApiKey("aWQ6a2V5".into()).header(), "ApiKey aWQ6a2V5");
        assert_eq!(Credentials::Bearer("token".into()).header(), "Bearer token");
    }
}
