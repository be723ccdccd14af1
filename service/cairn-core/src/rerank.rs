//! The reranking port: scores (query, document) pairs after fusion.

use crate::error::Result;
use async_trait::async_trait;

#[async_trait]
pub trait Reranker: Send + Sync + 'static {
    /// A short name for logs and explanations.
    fn name(&self) -> &str;

    /// One relevance score per document, in the documents' order (higher is better).
    async fn rerank(&self, query: &str, documents: Vec<String>) -> Result<Vec<f64>>;
}
