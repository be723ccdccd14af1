//! The embedding port: turns texts into unit-length vectors for the kNN legs.

use crate::error::Result;
use async_trait::async_trait;

#[async_trait]
pub trait Embedder: Send + Sync + 'static {
    /// A stable name of the model, recorded with stored vectors.
    fn model_id(&self) -> &str;

    /// The length of every vector this embedder returns.
    fn dimension(&self) -> usize;

    /// One L2-normalised vector per text to be stored and searched for, in order.
    async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>>;

    /// One vector per search query, in order: the same as [`Embedder::embed`] unless
    /// the model wants queries marked (an instruction or a `query: ` prefix).
    async fn embed_queries(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>> {
        self.embed(texts).await
    }

    /// How this model's cosines read on the reference scale the service's thresholds
    /// by meaning are written in (see [`SimilarityScale`]).
    fn similarity_scale(&self) -> SimilarityScale {
        SimilarityScale::REFERENCE
    }
}

/// A line `offset + slope × cosine` that carries one model's cosine onto the
/// reference scale, clamped to [-1, 1].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CosineLine {
    pub offset: f32,
    pub slope: f32,
}

impl CosineLine {
    pub const IDENTITY: CosineLine = CosineLine {
        offset: 0.0,
        slope: 1.0,
    };

    /// `cosine` on the reference scale.
    pub fn apply(self, cosine: f32) -> f32 {
        (self.offset + self.slope * cosine).clamp(-1.0, 1.0)
    }
}

/// The thresholds by meaning (the consolidation's tombstone and slot gates, the
/// offline judge, the answer's known-or-not) are cosines of all-MiniLM-L6-v2, the
/// reference scale. Models spread their cosines differently (e5-small-v2 puts
/// unrelated statements near 0.76, MiniLM near 0.2), so each model's cosines are
/// carried onto the reference scale by lines measured for it (`evals/src/cosines.rs`
/// fits them by matching quantiles): one for statements compared with statements,
/// one for a search query compared with what it searches.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimilarityScale {
    pub statements: CosineLine,
    pub queries: CosineLine,
}

impl SimilarityScale {
    pub const REFERENCE: SimilarityScale = SimilarityScale {
        statements: CosineLine::IDENTITY,
        queries: CosineLine::IDENTITY,
    };

    /// The cosine of two stored statements, on the reference scale.
    pub fn statements(&self, left: &[f32], right: &[f32]) -> f32 {
        self.statements.apply(cosine(left, right))
    }
}

/// Cosine similarity of two unit vectors (their dot product). Eight independent
/// accumulators let the compiler vectorise the loop.
pub fn cosine(left: &[f32], right: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let left_chunks = left.chunks_exact(8);
    let right_chunks = right.chunks_exact(8);
    let tail: f32 = left_chunks
        .remainder()
        .iter()
        .zip(right_chunks.remainder())
        .map(|(a, b)| a * b)
        .sum();
    for (a, b) in left_chunks.zip(right_chunks) {
        for lane in 0..8 {
            lanes[lane] += a[lane] * b[lane];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::cosine;

    #[test]
    fn cosine_matches_the_plain_dot_product() {
        let left: Vec<f32> = (0..387).map(|i| ((i * 7 % 13) as f32 - 6.0) / 10.0).collect();
        let right: Vec<f32> = (0..387).map(|i| ((i * 5 % 11) as f32 - 5.0) / 10.0).collect();
        let plain: f32 = left.iter().zip(&right).map(|(a, b)| a * b).sum();
        assert!((cosine(&left, &right) - plain).abs() < 1e-3);
        assert_eq!(cosine(&[1.0, 0.0], &[0.0, 1.0]), 0.0);
    }
}
