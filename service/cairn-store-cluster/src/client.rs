//! The HTTP side: one `elasticsearch` client (plain JSON, so it speaks to OpenSearch as
//! well), engine detection, and the error mapping of cluster answers.

use cairn_core::{Error, Result};
use elasticsearch::Elasticsearch;
use elasticsearch::http::headers::{CONTENT_TYPE, HeaderMap, HeaderValue};
use elasticsearch::http::request::{Body, JsonBody};
use elasticsearch::http::transport::{SingleNodeConnectionPool, TransportBuilder};
use elasticsearch::http::{Method, Url};
use serde_json::Value;
use std::time::Duration;

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

#[derive(Clone)]
pub struct Cluster {
    client: Elasticsearch,
}

impl Cluster {
    pub fn new(url: &str, timeout: Duration) -> Result<Self> {
        let url = Url::parse(url).map_err(|error| Error::invalid("cluster_url", error.to_string()))?;
        let transport = TransportBuilder::new(SingleNodeConnectionPool::new(url))
            .disable_proxy()
            .timeout(timeout)
            .build()
            .map_err(|error| Error::Unavailable(format!("cluster client: {error}")))?;
        Ok(Cluster {
            client: Elasticsearch::new(transport),
        })
    }

    /// Sends one request. Transport failures (refused, timed out) and gateway answers
    /// (502-504) are `Unavailable`; any other status comes back as an [`Answer`] for
    /// the caller to judge.
    async fn send<B: Body>(
        &self,
        method: Method,
        path: &str,
        headers: HeaderMap,
        query: &[(&str, String)],
        body: Option<B>,
    ) -> Result<Answer> {
        let response = self
            .client
            .send(method, path, headers, Some(query), body, None)
            .await
            .map_err(|error| Error::Unavailable(format!("search cluster: {error}")))?;
        let status = response.status_code().as_u16();
        let elastic = response
            .headers()
            .get("x-elastic-product")
            .is_some_and(|product| product.as_bytes().eq_ignore_ascii_case(b"elasticsearch"));
        let text = response
            .text()
            .await
            .map_err(|error| Error::Unavailable(format!("search cluster: {error}")))?;
        let body = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if matches!(status, 502..=504) {
            return Err(Error::Unavailable(format!("search cluster answered {status}")));
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
        self.send(method, path, HeaderMap::new(), query, body.map(JsonBody::new))
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
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"));
        let path = "/_bulk";
        let answer = self
            .send(
                Method::Post,
                path,
                headers,
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

/// A storage error for an unexpected answer, with the cluster's reason.
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
    Error::Storage(format!("{path}: {} {reason}", answer.status))
}
