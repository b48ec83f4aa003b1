//! Per-cluster exponential backoff of failed reconciles: 1 s, 2 s, 4 s ... up to 5 minutes,
//! reset by the first success. Errors never turn into a hot retry loop. [`RetryGate`] spaces
//! one costly action per cluster (a safety backup) the same way, whatever triggers the
//! reconciles in between.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::object_key::ObjectKey;

/// The delay after `failures` consecutive failures (1 for the first).
pub fn delay(failures: u32, base: Duration, max: Duration) -> Duration {
    let exp = failures.saturating_sub(1).min(20);
    base.saturating_mul(1u32 << exp).min(max)
}

/// Consecutive failures per cluster.
#[derive(Debug)]
pub struct Backoff {
    failures: Mutex<HashMap<ObjectKey, u32>>,
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

    fn failures(&self) -> MutexGuard<'_, HashMap<ObjectKey, u32>> {
        self.failures.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a failure of `key`; returns how long to wait before the retry.
    pub fn failed(&self, key: &ObjectKey) -> Duration {
        let mut map = self.failures();
        let n = map.entry(key.clone()).or_insert(0);
        *n = n.saturating_add(1);
        delay(*n, self.base, self.max)
    }

    /// Records a success of `key`: the next failure starts from `base` again.
    pub fn succeeded(&self, key: &ObjectKey) {
        self.failures().remove(key);
    }
}

/// Why an action is not due yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotDue {
    /// How long until the next attempt.
    pub remaining: Duration,
    /// What the last attempt failed with.
    pub last_error: String,
}

#[derive(Debug)]
struct Failing {
    failures: u32,
    next: Instant,
    error: String,
}

/// Spaces the attempts of one costly action per key after failures: `base` doubling up to
/// `max`, forgotten on success (and when the key's object is gone). Keys are bounded by the
/// objects that failed.
#[derive(Debug)]
pub struct RetryGate {
    failing: Mutex<HashMap<ObjectKey, Failing>>,
    base: Duration,
    max: Duration,
}

impl Default for RetryGate {
    /// 10 s doubling up to 10 minutes.
    fn default() -> Self {
        RetryGate::new(Duration::from_secs(10), Duration::from_secs(600))
    }
}

impl RetryGate {
    /// A gate from `base` doubling up to `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        RetryGate {
            failing: Mutex::default(),
            base,
            max,
        }
    }

    fn failing(&self) -> MutexGuard<'_, HashMap<ObjectKey, Failing>> {
        self.failing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `Ok` when `key` may try now; else how long it waits and why.
    pub fn due(&self, key: &ObjectKey) -> Result<(), NotDue> {
        match self.failing().get(key) {
            Some(f) if Instant::now() < f.next => Err(NotDue {
                remaining: f.next.saturating_duration_since(Instant::now()),
                last_error: f.error.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Records a failed attempt of `key`; returns the delay before the next one.
    pub fn failed(&self, key: &ObjectKey, error: &str) -> Duration {
        let mut failing = self.failing();
        let entry = failing.entry(key.clone()).or_insert(Failing {
            failures: 0,
            next: Instant::now(),
            error: String::new(),
        });
        entry.failures = entry.failures.saturating_add(1);
        let wait = delay(entry.failures, self.base, self.max);
        entry.next = Instant::now() + wait;
        entry.error = error.chars().take(1024).collect();
        wait
    }

    /// Records a success of `key` (or that its object is gone): nothing is kept for it.
    pub fn succeeded(&self, key: &ObjectKey) {
        self.failing().remove(key);
    }

    /// Keys currently kept.
    pub fn len(&self) -> usize {
        self.failing().len()
    }

    /// Whether no key is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(name: &str) -> ObjectKey {
        ObjectKey::new("ns", name)
    }

    #[test]
    fn doubles_up_to_the_cap_and_resets() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
        let got: Vec<u64> = (0..6).map(|_| b.failed(&k("a")).as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 8, 10, 10]);
        assert_eq!(b.failed(&k("other")).as_secs(), 1);
        b.succeeded(&k("a"));
        assert_eq!(b.failed(&k("a")).as_secs(), 1);
        assert_eq!(
            delay(u32::MAX, Duration::from_secs(1), Duration::from_secs(300)).as_secs(),
            300
        );
    }

    #[test]
    fn a_gate_spaces_failed_attempts_and_forgets_on_success() {
        let gate = RetryGate::new(Duration::from_secs(10), Duration::from_secs(40));
        assert_eq!(gate.due(&k("a")), Ok(()));
        assert_eq!(gate.failed(&k("a"), "bucket full"), Duration::from_secs(10));
        let wait = gate
            .due(&k("a"))
            .expect_err("not due right after a failure");
        assert_eq!(wait.last_error, "bucket full");
        assert!(wait.remaining <= Duration::from_secs(10) && wait.remaining > Duration::ZERO);
        assert_eq!(gate.due(&k("b")), Ok(()), "keys are independent");
        assert_eq!(gate.failed(&k("a"), "x"), Duration::from_secs(20));
        assert_eq!(gate.failed(&k("a"), "x"), Duration::from_secs(40));
        assert_eq!(gate.failed(&k("a"), "x"), Duration::from_secs(40));
        gate.succeeded(&k("a"));
        assert!(gate.is_empty());
        assert_eq!(gate.due(&k("a")), Ok(()));
        let long = "e".repeat(5000);
        gate.failed(&k("c"), &long);
        assert_eq!(gate.due(&k("c")).expect_err("waits").last_error.len(), 1024);
    }
}
