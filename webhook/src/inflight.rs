//! The memory budget of the admission requests in flight, in two pools (a quarter for bodies
//! up to 64 KiB, the rest for larger ones, so small requests never queue behind large ones).
//! A request reserves the size of its body before reading it (the declared length, or the body limit when none is declared), then,
//! once the body is in and its JSON values counted (which allocates nothing), what decoding and
//! answering it can cost; it holds the reservation until its answer is built. A request that
//! cannot get its share within the wait is answered 429 (with `Retry-After`) instead of
//! queueing without bound, so no burst can take the process past its memory limit.

use std::sync::Arc;
use std::time::Duration;

use prometheus::IntGauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::admission::MAX_VALUES;

/// Peak memory of one request per byte of its body (the body itself, the typed copies of its
/// strings, the answer): `benches/memory.rs` measured 3.0 for a 4 MiB string on `/mutate`.
pub const MEMORY_PER_BODY_BYTE: usize = 4;

/// Peak memory of one request per JSON value of its body (the typed copies of the objects):
/// `benches/memory.rs` measured about 290 bytes for the densest spec on `/mutate`.
pub const MEMORY_PER_JSON_VALUE: usize = 300;

/// The most JSON values a review's typed copies can hold: the envelope, and the metadata and
/// spec of the object and the old object, each bounded by [`MAX_VALUES`]. Values beyond it
/// are refused or skipped unread.
pub const MAX_DECODED_VALUES: usize = 5 * MAX_VALUES;

/// Memory every request reserves whatever its size (buffers, the answer).
pub const MEMORY_PER_REQUEST: usize = 64 * 1024;

/// Bodies up to this size are small: they draw on a pool of their own (a quarter of the
/// budget), so they never queue behind large ones.
pub const SMALL_BODY_BYTES: usize = 64 * 1024;

/// The budget shared by every admission request of the process, in two pools: one for small
/// bodies and one for the rest.
#[derive(Clone, Debug)]
pub struct InflightBudget {
    small: Pool,
    large: Pool,
    wait: Duration,
    gauge: IntGauge,
}

#[derive(Clone, Debug)]
struct Pool {
    semaphore: Arc<Semaphore>,
    total: usize,
}

impl Pool {
    fn new(total: usize) -> Self {
        let total = total.clamp(1, u32::MAX as usize);
        Pool {
            semaphore: Arc::new(Semaphore::new(total)),
            total,
        }
    }

    fn reserved(&self) -> usize {
        self.total - self.semaphore.available_permits()
    }
}

/// A share of the budget, returned when dropped.
#[derive(Debug)]
pub struct Reservation {
    permit: OwnedSemaphorePermit,
    gauge: IntGauge,
}

impl Reservation {
    /// Bytes reserved.
    pub fn bytes(&self) -> usize {
        self.permit.num_permits()
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.gauge.sub(gauge_bytes(self.bytes()));
    }
}

fn gauge_bytes(bytes: usize) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// The budget is exhausted and stayed so for the whole wait.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the webhook is answering {reserved_mib:.1} MiB of requests (its limit); retry shortly")]
pub struct Exhausted {
    /// What was in use, MiB.
    pub reserved_mib: f64,
}

impl InflightBudget {
    /// A budget of `total` bytes (a quarter for small bodies); a request waits at most `wait`
    /// for its share. `gauge` shows the bytes reserved.
    pub fn new(total: usize, wait: Duration, gauge: IntGauge) -> Self {
        let small = (total / 4).max(1);
        InflightBudget {
            small: Pool::new(small),
            large: Pool::new(total.saturating_sub(small).max(1)),
            wait,
            gauge,
        }
    }

    /// What answering a body of `body_bytes` holding `values` JSON values costs, before the
    /// cap at a pool's size.
    pub fn cost(body_bytes: usize, values: usize) -> usize {
        body_bytes
            .saturating_mul(MEMORY_PER_BODY_BYTE)
            .saturating_add(values.min(MAX_DECODED_VALUES) * MEMORY_PER_JSON_VALUE)
            .saturating_add(MEMORY_PER_REQUEST)
    }

    /// Bytes reserved now, both pools.
    pub fn reserved(&self) -> usize {
        self.small.reserved() + self.large.reserved()
    }

    /// The most answering a body of `body_bytes` can cost: every two bytes of JSON text can be
    /// a value (`1,`), up to what can be decoded.
    pub fn upper_bound(body_bytes: usize) -> usize {
        Self::cost(body_bytes, body_bytes / 2)
    }

    /// Reserves the most a body of `body_bytes` can cost ([`InflightBudget::upper_bound`],
    /// at most its pool), from the pool of its size, before the body is read, waiting at most
    /// the budget's wait. Requests are served in arrival order within a pool. Reserving the
    /// bound first and shrinking later (never growing) means two requests can never each hold
    /// a part and wait for the rest.
    pub async fn reserve(&self, body_bytes: usize) -> Result<Reservation, Exhausted> {
        let small = body_bytes <= SMALL_BODY_BYTES;
        let permit = self.acquire(small, Self::upper_bound(body_bytes)).await?;
        self.gauge.add(gauge_bytes(permit.num_permits()));
        Ok(Reservation {
            permit,
            gauge: self.gauge.clone(),
        })
    }

    /// Shrinks `reservation` to what answering the body costs once it is in: its size and its
    /// JSON values (see [`InflightBudget::cost`]). The rest returns to the pool at once.
    pub fn shrink(&self, reservation: &mut Reservation, body_bytes: usize, values: usize) {
        let needed = Self::cost(body_bytes, values).max(1);
        let surplus = reservation.bytes().saturating_sub(needed);
        if let Some(released) = reservation.permit.split(surplus) {
            self.gauge.sub(gauge_bytes(released.num_permits()));
        }
    }

    fn pool(&self, small: bool) -> &Pool {
        if small { &self.small } else { &self.large }
    }

    async fn acquire(&self, small: bool, bytes: usize) -> Result<OwnedSemaphorePermit, Exhausted> {
        let pool = self.pool(small);
        let n = u32::try_from(bytes.clamp(1, pool.total)).unwrap_or(u32::MAX);
        let acquire = pool.semaphore.clone().acquire_many_owned(n);
        match tokio::time::timeout(self.wait, acquire).await {
            Ok(Ok(permit)) => Ok(permit),
            // The semaphore is never closed; a timeout and a closed one both mean "not now".
            _ => Err(Exhausted {
                reserved_mib: self.reserved() as f64 / (1024.0 * 1024.0),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1024 * 1024;

    fn budget(total: usize) -> InflightBudget {
        let gauge = IntGauge::new("reserved", "bytes").expect("a gauge");
        InflightBudget::new(total, Duration::from_secs(1), gauge)
    }

    #[tokio::test(start_paused = true)]
    async fn a_large_request_over_the_budget_waits_then_is_refused() {
        // 48 MiB: 12 for small bodies, 36 for large ones.
        let budget = budget(48 * MIB);
        let mut first = budget.reserve(4 * MIB).await.expect("fits");
        assert_eq!(first.bytes(), InflightBudget::upper_bound(4 * MIB));
        assert!(
            budget.reserve(MIB).await.is_err(),
            "the pool is taken while it is read"
        );
        // Once read and counted, it keeps only what it needs.
        budget.shrink(&mut first, 4 * MIB, 100);
        assert_eq!(first.bytes(), InflightBudget::cost(4 * MIB, 100));
        let second = budget.reserve(MIB).await.expect("now a second fits");
        // Small bodies have their own pool: they never wait behind large ones.
        let small = budget.reserve(1024).await.expect("a small one fits");
        assert_eq!(
            budget.gauge.get(),
            gauge_bytes(budget.reserved()),
            "the gauge follows"
        );
        drop((first, second, small));
        assert_eq!(budget.reserved(), 0);
        assert_eq!(budget.gauge.get(), 0);
    }

    #[test]
    fn dense_bodies_cost_by_their_values_up_to_what_can_be_decoded() {
        let plain = InflightBudget::cost(100 * 1024, 0);
        let dense = InflightBudget::cost(100 * 1024, 30_000);
        assert_eq!(dense - plain, 30_000 * MEMORY_PER_JSON_VALUE);
        assert_eq!(
            InflightBudget::cost(100 * 1024, 10 * MAX_DECODED_VALUES),
            InflightBudget::cost(100 * 1024, MAX_DECODED_VALUES)
        );
        assert!(InflightBudget::upper_bound(100 * 1024) >= dense);
    }

    #[tokio::test(start_paused = true)]
    async fn one_request_larger_than_its_pool_still_gets_all_of_it() {
        let budget = budget(4 * MIB);
        let whole = budget.reserve(2 * MIB).await.expect("alone it fits");
        assert_eq!(whole.bytes(), 3 * MIB, "the large pool, whole");
        drop(whole);
        assert_eq!(budget.reserved(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_request_gets_in_when_another_finishes() {
        let budget = budget(4 * MIB);
        let first = budget.reserve(2 * MIB).await.expect("fits");
        let b = budget.clone();
        let waiting = tokio::spawn(async move { b.reserve(MIB).await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(500)).await;
        drop(first);
        assert_eq!(waiting.await.expect("task"), Ok(()));
    }
}
