//! Use counting off the read path. A recall notes which facts and playbooks it
//! returned, in memory; the counts reach the store in batches, one write per scope per
//! flush ([`Cairn::flush_usage`], which the server runs every second and at shutdown).
//! Counts are ranking help, so a crash loses at most one interval of them.

use crate::Cairn;
use cairn_core::{Result, Scope, UseCount};
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::sync::Mutex;

/// Distinct records with uses waiting for a flush; past this (the store has been
/// unreachable for a while), further uses are not counted.
const MAX_PENDING: usize = 100_000;

/// The uses of one scope's records, by record id.
type ScopeUses = (Scope, HashMap<String, UseCount>);

/// Uses noted since the last flush, by scope (tenant and user) and record id.
#[derive(Default)]
pub struct UsageLog {
    pending: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    scopes: HashMap<(String, String), ScopeUses>,
    /// Records held across every scope, kept as they are added and removed (a recall
    /// must not count them all).
    records: usize,
}

fn key(scope: &Scope) -> (String, String) {
    (
        scope.tenant().as_str().to_owned(),
        scope.user().as_str().to_owned(),
    )
}

impl UsageLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds uses of `ids` at `at`.
    pub fn note(&self, scope: &Scope, ids: &[String], at: DateTime<Utc>) {
        let uses: Vec<UseCount> = ids
            .iter()
            .map(|id| UseCount {
                id: id.clone(),
                count: 1,
                last_used_at: at,
            })
            .collect();
        self.merge(scope, uses);
    }

    fn merge(&self, scope: &Scope, uses: Vec<UseCount>) {
        let mut pending = self.lock();
        let Pending { scopes, records } = &mut *pending;
        let (_, held) = scopes
            .entry(key(scope))
            .or_insert_with(|| (scope.clone(), HashMap::new()));
        for usage in uses {
            match held.get_mut(&usage.id) {
                Some(counted) => {
                    counted.count += usage.count;
                    counted.last_used_at = counted.last_used_at.max(usage.last_used_at);
                }
                None if *records < MAX_PENDING => {
                    *records += 1;
                    held.insert(usage.id.clone(), usage);
                }
                None => {}
            }
        }
    }

    fn take(&self) -> Vec<(Scope, Vec<UseCount>)> {
        let mut pending = self.lock();
        pending.records = 0;
        pending
            .scopes
            .drain()
            .map(|(_, (scope, records))| (scope, records.into_values().collect()))
            .collect()
    }

    /// Drops the uses noted for a scope (it is being erased).
    pub fn forget(&self, scope: &Scope) {
        let mut pending = self.lock();
        if let Some((_, held)) = pending.scopes.remove(&key(scope)) {
            pending.records -= held.len();
        }
    }

    /// Records with uses waiting for a flush.
    pub fn pending(&self) -> usize {
        self.lock().records
    }
}

impl Cairn {
    /// Writes the uses noted since the last flush; returns how many records got counts.
    /// A scope whose write fails keeps its counts for the next flush.
    pub async fn flush_usage(&self) -> Result<usize> {
        let mut flushed = 0;
        let mut failure = None;
        for (scope, uses) in self.usage.take() {
            match self.store.record_usage(&scope, &uses).await {
                Ok(()) => flushed += uses.len(),
                Err(error) => {
                    self.usage.merge(&scope, uses);
                    failure = Some(error);
                }
            }
        }
        match failure {
            Some(error) => Err(error),
            None => Ok(flushed),
        }
    }

    /// Finishes cluster commits that a failed process left half-applied (older than
    /// `patience`, so that commits still running are left alone); returns how many.
    pub async fn recover_commits(&self, patience: std::time::Duration) -> Result<u64> {
        self.store.recover_commits(patience).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::disallowed_methods)]
    fn scope(user: &str) -> Scope {
        let tenant = cairn_core::TenantId::parse("acme").expect("tenant");
        let user = cairn_core::UserId::parse(user).expect("user");
        Scope::of_stored_record(tenant, user, "test".into())
    }

    #[test]
    fn uses_add_up_per_scope_and_record_and_keep_the_latest_time() {
        let log = UsageLog::default();
        let early = Utc::now();
        let late = early + chrono::Duration::seconds(5);
        log.note(&scope("alice"), &["f1".into(), "f2".into()], late);
        log.note(&scope("alice"), &["f1".into()], early);
        log.note(&scope("bob"), &["f1".into()], early);
        assert_eq!(log.pending(), 3);
        let mut taken = log.take();
        taken.sort_by(|a, b| a.0.user().as_str().cmp(b.0.user().as_str()));
        let alice = &taken[0].1;
        let f1 = alice.iter().find(|usage| usage.id == "f1").expect("f1");
        assert_eq!((f1.count, f1.last_used_at), (2, late));
        assert_eq!(taken[1].1.len(), 1);
        assert_eq!(log.pending(), 0, "taken");
        log.note(&scope("bob"), &["f9".into()], early);
        log.forget(&scope("bob"));
        assert_eq!(log.pending(), 0, "forgotten with its scope");
    }
}
