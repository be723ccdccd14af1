//! Claims on values while a commit checks and writes them. A cluster has no
//! transaction around a read and the write that depends on it, so two commits that
//! check "no active fact holds this value" (`Change::RequireNoActiveValue`) or "this
//! value is not tombstoned" (a fact's insert) and then write could both pass before
//! either wrote. A commit that requires, inserts or tombstones a value first claims it:
//! one small document per scope and value fingerprint in the state index, created with
//! `op_type=create` (one creator wins), held through the commit's check and writes
//! (which refresh) and deleted after. Claims are taken in sorted order, so two commits
//! claiming several values never wait on each other in a circle. A claim left by a
//! process that died expires after [`CLAIM_LIFETIME`] and is taken over.

use crate::{ClusterStore, docs, state_id};
use cairn_core::text::fingerprint;
use cairn_core::{Change, Error, FactStatus, Result, Scope};
use chrono::{Duration, Utc};
use serde_json::json;
use std::collections::BTreeSet;

/// How long a claim holds before another commit may take it over.
const CLAIM_LIFETIME: Duration = Duration::seconds(30);
/// How long a commit waits for a value another commit holds.
const CLAIM_PATIENCE: std::time::Duration = std::time::Duration::from_secs(20);

/// Values a commit holds, with the version of each claim document.
pub(crate) struct Claims {
    held: Vec<(String, (i64, i64))>,
}

/// The value fingerprints `changes` check or write.
fn values(changes: &[Change]) -> BTreeSet<String> {
    changes
        .iter()
        .filter_map(|change| match change {
            Change::RequireNoActiveValue { fingerprint } => Some(fingerprint.clone()),
            Change::InsertFact(fact) if fact.status == FactStatus::Active => Some(fingerprint(&fact.text)),
            Change::InsertTombstone(tombstone) => Some(tombstone.fingerprint.clone()),
            _ => None,
        })
        .collect()
}

impl ClusterStore {
    /// Claims every value `changes` check or write, waiting for commits that hold one.
    pub(crate) async fn claim_values(&self, scope: &Scope, changes: &[Change]) -> Result<Claims> {
        let mut claims = Claims { held: Vec::new() };
        for value in values(changes) {
            let id = format!("value:{}#{value}", state_id(scope));
            match self.claim_value(scope, &id).await {
                Ok(version) => claims.held.push((id, version)),
                Err(error) => {
                    self.release_values(scope, claims).await;
                    return Err(error);
                }
            }
        }
        Ok(claims)
    }

    async fn claim_value(&self, scope: &Scope, id: &str) -> Result<(i64, i64)> {
        let tenant = scope.tenant().as_str();
        let started = std::time::Instant::now();
        let mut pause = std::time::Duration::from_millis(5);
        loop {
            let now = Utc::now();
            let body = json!({ "tenant": tenant, "id": id, "until": docs::micros(now + CLAIM_LIFETIME) });
            let created = self.put("state", id, tenant, body.clone(), None, false).await?;
            if created.ok() {
                return crate::records::written_version(&created.body);
            }
            // Held: taken over once expired (compare-and-set), else waited for.
            if let Some(held) = self.get("state", id, tenant).await?
                && held.source["until"]
                    .as_i64()
                    .is_none_or(|until| until < docs::micros(now))
            {
                let version = Some((held.seq_no, held.primary_term));
                let taken = self.put("state", id, tenant, body, version, false).await?;
                if taken.ok() {
                    return crate::records::written_version(&taken.body);
                }
            }
            if started.elapsed() >= CLAIM_PATIENCE {
                return Err(Error::Unavailable(
                    "another write of the same value is still being committed; try again".into(),
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_millis(100));
        }
    }

    /// Gives the claims back (each only if still this commit's). A claim that could not
    /// be deleted expires on its own.
    pub(crate) async fn release_values(&self, scope: &Scope, claims: Claims) {
        let tenant = scope.tenant().as_str();
        for (id, version) in claims.held {
            if let Err(error) = self.delete_doc("state", &id, tenant, Some(version), false).await {
                tracing::warn!(error = %error, "a value claim was left to expire");
            }
        }
    }
}
