//! A tenant's limits as a store can keep them for every process that shares it: the
//! request rate (a generic cell rate algorithm, GCRA, whose whole state is one
//! timestamp) and the LLM tokens spent per UTC day.

use crate::scope::{Principal, Scope, TenantId};
use std::time::Duration;

/// The tenant whose limits are read or charged. Only an authenticated [`Principal`] or a
/// [`Scope`] (which descends from one) gives one, so limits are as tied to
/// authentication as every other store access.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantLimits {
    tenant: TenantId,
}

impl TenantLimits {
    pub fn tenant(&self) -> &TenantId {
        &self.tenant
    }
}

impl Principal {
    /// The limits of this principal's tenant.
    pub fn limits(&self) -> TenantLimits {
        TenantLimits {
            tenant: self.tenant().clone(),
        }
    }
}

impl Scope {
    /// The limits of this scope's tenant.
    pub fn limits(&self) -> TenantLimits {
        TenantLimits {
            tenant: self.tenant().clone(),
        }
    }
}

/// A request rate: `per_second` on average, at most `burst` at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateQuota {
    pub per_second: u32,
    pub burst: u32,
}

/// What a take from a rate quota gave: `granted` cells (0: none), and when none was
/// given, how long until one is free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateGrant {
    pub granted: u32,
    pub retry_after: Duration,
}

/// A take decided: the grant and the bucket's new theoretical arrival time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taken {
    pub grant: RateGrant,
    /// The state to store (microseconds since the epoch); unchanged when nothing was granted.
    pub tat: i64,
}

impl RateQuota {
    /// Microseconds between two cells at the average rate.
    fn interval(&self) -> i64 {
        1_000_000 / i64::from(self.per_second.max(1))
    }

    /// Takes between `least` and `want` cells at `now` (microseconds) from a bucket whose
    /// theoretical arrival time is `tat` (`None`: never used, full): as many as are free
    /// up to `want`, or none when fewer than `least` are.
    pub fn take(&self, tat: Option<i64>, now: i64, want: u32, least: u32) -> Taken {
        let interval = self.interval();
        let tolerance = interval.saturating_mul(i64::from(self.burst));
        let start = tat.unwrap_or(now).max(now);
        let free = (now.saturating_add(tolerance).saturating_sub(start) / interval).max(0);
        let granted = u32::try_from(free.min(i64::from(want))).unwrap_or(want);
        if granted == 0 || granted < least.max(1) {
            let needed = i64::from(least.max(1));
            let wait = start
                .saturating_add(interval.saturating_mul(needed))
                .saturating_sub(tolerance)
                .saturating_sub(now)
                .max(1);
            return Taken {
                grant: RateGrant {
                    granted: 0,
                    retry_after: Duration::from_micros(u64::try_from(wait).unwrap_or(1)),
                },
                tat: tat.unwrap_or(now),
            };
        }
        Taken {
            grant: RateGrant {
                granted,
                retry_after: Duration::ZERO,
            },
            tat: start.saturating_add(interval.saturating_mul(i64::from(granted))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: i64 = 1_000_000;

    #[test]
    fn a_bucket_gives_its_burst_then_its_rate() {
        let quota = RateQuota {
            per_second: 10,
            burst: 5,
        };
        let now = 1_000 * SECOND;
        let first = quota.take(None, now, 3, 1);
        assert_eq!(first.grant.granted, 3);
        let second = quota.take(Some(first.tat), now, 3, 1);
        assert_eq!(second.grant.granted, 2, "only what is left of the burst");
        let refused = quota.take(Some(second.tat), now, 3, 1);
        assert_eq!(refused.grant.granted, 0);
        assert_eq!(refused.tat, second.tat, "a refusal changes nothing");
        assert_eq!(refused.grant.retry_after, Duration::from_millis(100));
        // A tenth of a second later, one more cell.
        let later = quota.take(Some(second.tat), now + SECOND / 10, 3, 1);
        assert_eq!(later.grant.granted, 1);
        // All or nothing: five cells need the whole burst back.
        let run = quota.take(Some(later.tat), now + SECOND / 10, 5, 5);
        assert_eq!(run.grant.granted, 0);
        assert_eq!(run.grant.retry_after, Duration::from_millis(500));
        let idle = quota.take(Some(later.tat), now + 10 * SECOND, 5, 5);
        assert_eq!(idle.grant.granted, 5, "an idle bucket is full again, not more");
        assert_eq!(
            quota.take(Some(idle.tat), now + 10 * SECOND, 1, 1).grant.granted,
            0
        );
    }
}
