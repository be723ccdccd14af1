//! Moving every stored vector to the configured embedding model (`cairn reembed`).

use crate::Cairn;
use cairn_core::{Error, Reembedded, Reembedding, Result};

/// How far a re-embedding has come, for a progress line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReembedProgress {
    /// Records with a vector built in the target space, this run and earlier ones.
    pub built: u64,
    /// Records with a vector to build when this run started.
    pub total: u64,
    /// Records this run embedded.
    pub this_run: u64,
}

impl Cairn {
    /// Builds a vector of the configured model for every stored record that holds one,
    /// beside the current vectors, `batch` records at a time, then switches the store to
    /// them in one step. Resumable: what an interrupted run built is kept. Records
    /// written while it runs are built too before the switch. Answers where the move
    /// stands once switched (`current` is the model's space).
    pub async fn reembed(
        &self,
        batch: usize,
        mut progress: impl FnMut(&ReembedProgress),
    ) -> Result<Reembedding> {
        let embedder = self
            .embedder
            .as_ref()
            .ok_or_else(|| Error::invalid("CAIRN_EMBEDDING_MODEL", "no embedding model is configured"))?;
        if batch == 0 {
            return Err(Error::invalid("batch", "must be at least 1"));
        }
        let target = format!("{}/{}", embedder.model_id(), embedder.dimension());
        let started = self.store.start_reembedding(&target).await?;
        if started.current.as_deref() == Some(target.as_str()) {
            return Ok(started);
        }
        let mut state = ReembedProgress {
            built: started.built,
            total: started.built + started.remaining,
            this_run: 0,
        };
        progress(&state);
        let mut empty_passes = 0;
        loop {
            let records = self.store.pending_reembedding(batch).await?;
            if records.is_empty() {
                let finished = self.store.finish_reembedding().await?;
                if finished.remaining == 0 {
                    return Ok(finished);
                }
                // Written meanwhile and not yet read: another pass, but not forever.
                empty_passes += 1;
                if empty_passes > 3 {
                    return Err(Error::Storage(format!(
                        "{} records are left to re-embed but none can be read",
                        finished.remaining
                    )));
                }
                state.total = state.total.max(finished.built + finished.remaining);
                continue;
            }
            empty_passes = 0;
            let texts: Vec<String> = records.iter().map(|record| record.text.clone()).collect();
            let vectors = embedder.embed(texts).await?;
            if vectors.len() != records.len() {
                return Err(Error::Provider(format!(
                    "the embedding model answered {} vectors for {} texts",
                    vectors.len(),
                    records.len()
                )));
            }
            let count = records.len() as u64;
            let built: Vec<Reembedded> = records
                .into_iter()
                .zip(vectors)
                .map(|(record, vector)| Reembedded {
                    tier: record.tier,
                    id: record.id,
                    text: record.text,
                    vector,
                })
                .collect();
            self.store.store_reembedded(built).await?;
            state.built += count;
            state.this_run += count;
            state.total = state.total.max(state.built);
            progress(&state);
        }
    }
}
