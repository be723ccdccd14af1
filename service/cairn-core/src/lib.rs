//! Cairn's domain: scopes, memory records, decisions, audit events, and the store port.
//!
//! Nothing in this crate knows about HTTP, JSON wire formats, JWTs or a particular
//! storage engine. The one way to obtain a [`Scope`] is through an authenticated
//! [`Principal`], so every store query is tied to a tenant by construction.

pub mod bm25;
pub mod consolidate;
pub mod embed;
pub mod error;
pub mod ids;
pub mod limits;
pub mod model;
pub mod porter;
pub mod rerank;
pub mod scope;
pub mod store;
pub mod text;

pub use consolidate::{
    Answerer, CandidateFact, CandidatePlaybook, ComposedAnswer, Extraction, ExtractionInput, Extractor,
    Judge, Judgement, ShownFact, ShownMemory, Usage, Verdict,
};
pub use embed::{CosineLine, Embedder, SimilarityScale, cosine};
pub use error::{Error, ErrorCode, Result};
pub use ids::new_id;
pub use limits::{RateGrant, RateQuota, TenantLimits};
pub use model::*;
pub use rerank::Reranker;
pub use scope::{Permission, Principal, Scope, TenantId, TenantScope, UserId};
pub use store::*;
