//! The per-tenant request rate. A store that keeps limits for every process (a search
//! cluster) holds each tenant's bucket, so the configured rate holds across replicas and
//! restarts; this process takes cells from it in slices, to spend without asking the
//! store each time. Otherwise (the embedded store, or a store that fails to answer)
//! the process limits its own requests.
//!
//! A slice starts at one cell, doubles while slices are spent within their lifetime
//! and halves when one expires unspent, up to a sixteenth of the burst. Taken cells are
//! charged to the shared bucket when taken, so the average rate is never exceeded; a
//! process may hold at most one slice unspent, so with N replicas a burst can exceed
//! the configured one by N × burst / 16 at most (3 replicas: 1.19×).

use crate::error::ApiError;
use cairn_app::Cairn;
use cairn_core::{RateQuota, TenantLimits};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long cells taken from the shared bucket may wait to be spent.
const SLICE_LIFETIME: Duration = Duration::from_secs(1);
/// Tenants whose slices a process remembers before it starts over.
const TENANTS: usize = 10_000;

/// Cells of one tenant's shared bucket this process holds.
struct Slice {
    left: u32,
    size: u32,
    taken: Instant,
}

pub struct RateLimit {
    quota: RateQuota,
    local: DefaultKeyedRateLimiter<String>,
    /// Whether the store keeps the buckets, learnt from its first answer.
    shared: OnceLock<bool>,
    slices: Mutex<HashMap<String, Slice>>,
}

fn refused(wait: Duration) -> ApiError {
    ApiError::RateLimited {
        retry_after_seconds: wait.as_secs_f64().ceil().max(1.0) as u64,
    }
}

impl RateLimit {
    /// A limit of `per_second` requests on average and `burst` at once; none when
    /// either is 0.
    pub fn new(per_second: u32, burst: u32) -> Option<Self> {
        let (rate, most) = (NonZeroU32::new(per_second)?, NonZeroU32::new(burst)?);
        Some(RateLimit {
            quota: RateQuota { per_second, burst },
            local: RateLimiter::keyed(Quota::per_second(rate).allow_burst(most)),
            shared: OnceLock::new(),
            slices: Mutex::new(HashMap::new()),
        })
    }

    /// The most cells one take may ask for.
    pub fn burst(&self) -> u32 {
        self.quota.burst
    }

    fn largest_slice(&self) -> u32 {
        (self.quota.burst / 16).max(1)
    }

    /// Spends one cell of a slice this process holds, if it holds a live one.
    fn spend_held(&self, tenant: &str) -> bool {
        let mut slices = self
            .slices
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match slices.get_mut(tenant) {
            Some(slice) if slice.left > 0 && slice.taken.elapsed() < SLICE_LIFETIME => {
                slice.left -= 1;
                true
            }
            _ => false,
        }
    }

    /// How many cells the next slice of `tenant` asks for.
    fn next_size(&self, tenant: &str) -> u32 {
        let slices = self
            .slices
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match slices.get(tenant) {
            None => 1,
            Some(slice) if slice.taken.elapsed() >= SLICE_LIFETIME && slice.left > 0 => {
                (slice.size / 2).max(1)
            }
            Some(slice) if slice.taken.elapsed() < SLICE_LIFETIME => {
                (slice.size * 2).min(self.largest_slice())
            }
            Some(slice) => slice.size,
        }
    }

    fn keep_slice(&self, tenant: &str, left: u32, size: u32) {
        let mut slices = self
            .slices
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if slices.len() >= TENANTS && !slices.contains_key(tenant) {
            slices.clear();
        }
        slices.insert(
            tenant.to_owned(),
            Slice {
                left,
                size,
                taken: Instant::now(),
            },
        );
    }

    /// Admits `cells` requests' worth of `tenant`'s work (1 for a request, more for a
    /// consolidation run), or says how long to wait.
    pub async fn admit(&self, cairn: &Cairn, tenant: &TenantLimits, cells: u32) -> Result<(), ApiError> {
        let cells = cells.clamp(1, self.quota.burst);
        let name = tenant.tenant().as_str();
        if self.shared.get() != Some(&false) {
            if cells == 1 && self.spend_held(name) {
                return Ok(());
            }
            let want = if cells == 1 { self.next_size(name) } else { cells };
            match cairn.take_rate(tenant, self.quota, want, cells).await {
                Ok(Some(grant)) => {
                    let _ = self.shared.set(true);
                    if grant.granted < cells {
                        tracing::warn!(tenant = %name, "rate limited");
                        return Err(refused(grant.retry_after));
                    }
                    if cells == 1 {
                        self.keep_slice(name, grant.granted - 1, want);
                    }
                    return Ok(());
                }
                Ok(None) => {
                    let _ = self.shared.set(false);
                }
                Err(error) => {
                    tracing::warn!(tenant = %name, error = %error, "the shared rate limit did not answer; limiting in this process");
                }
            }
        }
        self.admit_here(name, cells)
    }

    /// [`RateLimit::admit`] by this process's own bucket.
    fn admit_here(&self, tenant: &str, cells: u32) -> Result<(), ApiError> {
        let Some(cells) = NonZeroU32::new(cells) else {
            return Ok(());
        };
        match self.local.check_key_n(&tenant.to_owned(), cells) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(not_until)) => {
                tracing::warn!(tenant = %tenant, "rate limited");
                Err(refused(not_until.wait_time_from(DefaultClock::default().now())))
            }
            // More cells than the burst: cannot happen, cells are capped at the burst.
            Err(_) => Err(refused(Duration::from_secs(1))),
        }
    }
}
