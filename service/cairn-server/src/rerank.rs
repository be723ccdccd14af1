//! A remote reranking service in the common `{query, documents}` → scores shape
//! (Cohere, Jina and compatible servers; TEI's `/rerank` answer shape is read too).

use async_trait::async_trait;
use cairn_core::{Error, Reranker, Result};
use serde::Deserialize;
use serde_json::json;
use std::time::Duration;

pub struct RemoteReranker {
    client: reqwest::Client,
    url: String,
    model: Option<String>,
    api_key: Option<String>,
}

impl RemoteReranker {
    pub fn new(
        url: String,
        model: Option<String>,
        api_key: Option<String>,
        timeout: Duration,
    ) -> Result<Self> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|error| Error::Unavailable(format!("rerank client: {error}")))?;
        Ok(RemoteReranker {
            client,
            url,
            model,
            api_key,
        })
    }
}

#[derive(Deserialize)]
struct Scored {
    index: usize,
    #[serde(alias = "score")]
    relevance_score: f64,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Answer {
    Results { results: Vec<Scored> },
    List(Vec<Scored>),
}

#[async_trait]
impl Reranker for RemoteReranker {
    fn name(&self) -> &str {
        "remote"
    }

    async fn rerank(&self, query: &str, documents: Vec<String>) -> Result<Vec<f64>> {
        let count = documents.len();
        let mut body = json!({ "query": query, "documents": documents, "top_n": count });
        if let Some(model) = &self.model {
            body["model"] = json!(model);
        }
        let mut request = self.client.post(&self.url).json(&body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let failure = |error: reqwest::Error| Error::Unavailable(format!("reranker: {error}"));
        let response = request
            .send()
            .await
            .map_err(failure)?
            .error_for_status()
            .map_err(failure)?;
        let scored = match response.json::<Answer>().await.map_err(failure)? {
            Answer::Results { results } => results,
            Answer::List(list) => list,
        };
        let mut scores = vec![f64::NAN; count];
        for item in scored {
            if let Some(slot) = scores.get_mut(item.index) {
                *slot = item.relevance_score;
            }
        }
        if scores.iter().any(|score| score.is_nan()) {
            return Err(Error::Unavailable(
                "reranker: not every document was scored".into(),
            ));
        }
        Ok(scores)
    }
}
