//! Per-cluster exponential backoff of failed reconciles: 1 s, 2 s, 4 s ... up to 5 minutes,
//! reset by the first success. Errors never turn into a hot retry loop.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// The delay after `failures` consecutive failures (1 for the first).
pub fn delay(failures: u32, base: Duration, max: Duration) -> Duration {
    let exp = failures.saturating_sub(1).min(20);
    base.saturating_mul(1u32 << exp).min(max)
}

/// Consecutive failures per cluster.
#[derive(Debug)]
pub struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
    base: Duration,
    max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(Duration::from_secs(1), Duration::from_secs(300))
    }
}

impl Backoff {
    /// A backoff from `base` doubling up to `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Backoff {
            failures: Mutex::new(HashMap::new()),
            base,
            max,
        }
    }

    /// Records a failure of `key`; returns how long to wait before the retry.
    pub fn failed(&self, key: &str) -> Duration {
        let mut map = self
            .failures
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let n = map.entry(key.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        delay(*n, self.base, self.max)
    }

    /// Records a success of `key`: the next failure starts from `base` again.
    pub fn succeeded(&self, key: &str) {
        let mut map = self
            .failures
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        map.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_resets() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
        let got: Vec<u64> = (0..6).map(|_| b.failed("a").as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 8, 10, 10]);
        assert_eq!(b.failed("other").as_secs(), 1);
        b.succeeded("a");
        assert_eq!(b.failed("a").as_secs(), 1);
        assert_eq!(
            delay(u32::MAX, Duration::from_secs(1), Duration::from_secs(300)).as_secs(),
            300
        );
    }
}
