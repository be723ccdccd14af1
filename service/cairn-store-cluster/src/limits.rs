//! Limits shared by every process on the cluster: each tenant's request-rate bucket
//! (`rate:<tenant>`) and LLM tokens spent per day (`budget:<tenant>`), one small
//! document each in the state index, changed by compare-and-set. Nothing else reads
//! them; an erasure of a user leaves them (they belong to the tenant).

use crate::{ClusterStore, docs};
use cairn_core::{Error, RateGrant, RateQuota, Result, TenantLimits};
use chrono::{DateTime, NaiveDate, Utc};
use serde_json::{Value, json};

/// Compare-and-set attempts before a change of a limit gives up as contended.
const ATTEMPTS: usize = 50;

impl ClusterStore {
    /// Changes the tenant's limit document `id` by compare-and-set: `edit` gets its
    /// `limits` object (empty when there is none yet) and answers with a new one to
    /// write, or `None` to leave it. Answers what `edit` answered with it.
    async fn edit_limits<T>(
        &self,
        tenant: &TenantLimits,
        id: &str,
        mut edit: impl FnMut(&Value) -> (Option<Value>, T),
    ) -> Result<T> {
        let routing = tenant.tenant().as_str();
        for _ in 0..ATTEMPTS {
            let current = self.get("state", id, routing).await?;
            let limits = current
                .as_ref()
                .map_or(Value::Null, |doc| doc.source["limits"].clone());
            let (changed, answer) = edit(&limits);
            let Some(changed) = changed else {
                return Ok(answer);
            };
            let body = json!({ "tenant": routing, "id": id, "limits": changed });
            let version = current.map(|doc| (doc.seq_no, doc.primary_term));
            if self.put("state", id, routing, body, version, false).await?.ok() {
                return Ok(answer);
            }
        }
        Err(Error::Unavailable(format!("{id}: too much contention")))
    }

    pub(crate) async fn take_rate_cells(
        &self,
        tenant: &TenantLimits,
        quota: RateQuota,
        want: u32,
        least: u32,
        now: DateTime<Utc>,
    ) -> Result<RateGrant> {
        let id = format!("rate:{}", tenant.tenant().as_str());
        let now = docs::micros(now);
        self.edit_limits(tenant, &id, |limits| {
            let taken = quota.take(limits["tat"].as_i64(), now, want, least);
            let changed = (taken.grant.granted > 0).then(|| json!({ "tat": taken.tat }));
            (changed, taken.grant)
        })
        .await
    }

    pub(crate) async fn spend_day_tokens(
        &self,
        tenant: &TenantLimits,
        day: NaiveDate,
        tokens: u64,
    ) -> Result<u64> {
        let id = format!("budget:{}", tenant.tenant().as_str());
        let day = day.to_string();
        self.edit_limits(tenant, &id, |limits| {
            let spent = if limits["day"].as_str() == Some(day.as_str()) {
                limits["used"].as_u64().unwrap_or(0)
            } else {
                0
            };
            let total = spent.saturating_add(tokens);
            let changed = (tokens > 0).then(|| json!({ "day": day, "used": total }));
            (changed, total)
        })
        .await
    }
}
