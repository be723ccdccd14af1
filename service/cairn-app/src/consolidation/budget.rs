//! The per-tenant LLM token budget: tokens (input and output) that a tenant's
//! consolidation may spend per UTC day. A run checks it before each batch: a
//! background run that finds it spent defers the rest of its work to a job due when the
//! day turns, and an explicit run that finds it spent before its first batch is
//! refused with 429. A store that keeps limits for every process (a search cluster)
//! counts it for all of them and across restarts; otherwise each process counts its
//! own, from zero when it starts (the embedded store).

use crate::Cairn;
use cairn_core::{Result, Scope, Usage};
use chrono::{DateTime, Duration, NaiveDate, Utc};
use std::collections::HashMap;
use std::sync::Mutex;

/// Tokens spent per tenant on one day.
#[derive(Default)]
pub(crate) struct Ledger {
    spent: Mutex<HashMap<String, (NaiveDate, u64)>>,
}

/// A tenant's budget as reported with a consolidation outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenBudget {
    pub tokens_per_day: u64,
    pub used_today: u64,
    pub resets_at: DateTime<Utc>,
}

/// When the UTC day of `at` ends.
fn day_end(at: DateTime<Utc>) -> DateTime<Utc> {
    let next = at.date_naive() + Duration::days(1);
    next.and_hms_opt(0, 0, 0)
        .map_or(at, |midnight| midnight.and_utc())
}

impl Ledger {
    fn used(&self, tenant: &str, at: DateTime<Utc>) -> u64 {
        let spent = self.spent.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match spent.get(tenant) {
            Some((day, tokens)) if *day == at.date_naive() => *tokens,
            _ => 0,
        }
    }

    fn charge(&self, tenant: &str, at: DateTime<Utc>, tokens: u64) {
        if tokens == 0 {
            return;
        }
        let mut spent = self.spent.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let entry = spent.entry(tenant.to_owned()).or_insert((at.date_naive(), 0));
        if entry.0 != at.date_naive() {
            *entry = (at.date_naive(), 0);
        }
        entry.1 = entry.1.saturating_add(tokens);
    }
}

impl Cairn {
    /// Tokens the tenant spent today, after adding `tokens`: the store's count when it
    /// keeps one, else this process's. A store that fails to answer leaves the process's
    /// count to decide (logged), so a run is never stopped by the ledger alone.
    async fn spend(&self, scope: &Scope, tokens: u64) -> u64 {
        let at = crate::now();
        let tenant = scope.tenant().as_str();
        match self
            .store
            .spend_tokens(&scope.limits(), at.date_naive(), tokens)
            .await
        {
            Ok(Some(total)) => return total,
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(tenant, error = %error, "the shared token budget did not answer; counting in this process")
            }
        }
        self.consolidator.ledger.charge(tenant, at, tokens);
        self.consolidator.ledger.used(tenant, at)
    }

    /// The tenant's token budget today; `None` when no budget is configured.
    pub async fn token_budget(&self, scope: &Scope) -> Option<TokenBudget> {
        let tokens_per_day = self.settings.consolidation.tenant_token_budget;
        if tokens_per_day == 0 {
            return None;
        }
        Some(TokenBudget {
            tokens_per_day,
            used_today: self.spend(scope, 0).await,
            resets_at: day_end(crate::now()),
        })
    }

    /// When the tenant's budget is spent: the time it resets.
    pub(crate) async fn budget_spent(&self, scope: &Scope) -> Option<DateTime<Utc>> {
        self.token_budget(scope)
            .await
            .filter(|budget| budget.used_today >= budget.tokens_per_day)
            .map(|budget| budget.resets_at)
    }

    /// Counts tokens a run spent against its tenant's budget.
    pub(crate) async fn charge_tokens(&self, scope: &Scope, usage: &Usage) {
        let tokens = usage.input_tokens.saturating_add(usage.output_tokens);
        if tokens > 0 && self.settings.consolidation.tenant_token_budget > 0 {
            self.spend(scope, tokens).await;
        }
    }

    /// Refuses an explicit run while the tenant's budget is spent.
    pub(crate) async fn require_budget(&self, scope: &Scope) -> Result<()> {
        match self.budget_spent(scope).await {
            Some(resets_at) => Err(cairn_core::Error::QuotaExhausted {
                code: cairn_core::ErrorCode::TokenBudgetExhausted,
                message: format!(
                    "the tenant's LLM token budget for today is spent; consolidation resumes at {}",
                    resets_at.to_rfc3339()
                ),
                retry_after_seconds: u64::try_from((resets_at - crate::now()).num_seconds().max(1))
                    .unwrap_or(1),
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spending_is_counted_per_tenant_and_day() {
        let ledger = Ledger::default();
        let monday = DateTime::parse_from_rfc3339("2026-11-30T23:59:00Z")
            .expect("time")
            .with_timezone(&Utc);
        ledger.charge("acme", monday, 700);
        ledger.charge("acme", monday, 300);
        ledger.charge("globex", monday, 5);
        assert_eq!(ledger.used("acme", monday), 1_000);
        assert_eq!(ledger.used("globex", monday), 5);
        let tuesday = monday + Duration::minutes(2);
        assert_eq!(ledger.used("acme", tuesday), 0, "a new day starts from zero");
        ledger.charge("acme", tuesday, 10);
        assert_eq!(ledger.used("acme", tuesday), 10);
        assert_eq!(day_end(monday).to_rfc3339(), "2026-12-01T00:00:00+00:00");
    }
}
