//! The embedding port: turns texts into unit-length vectors for the kNN legs.

use crate::error::Result;
use async_trait::async_trait;

#[async_trait]
pub trait Embedder: Send + Sync + 'static {
    /// A stable name of the model, recorded with stored vectors.
    fn model_id(&self) -> &str;

    /// The length of every vector this embedder returns.
    fn dimension(&self) -> usize;

    /// One L2-normalised vector per text, in order.
    async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>>;
}

/// Cosine similarity of two unit vectors (their dot product).
pub fn cosine(left: &[f32], right: &[f32]) -> f32 {
    left.iter().zip(right).map(|(a, b)| a * b).sum()
}
