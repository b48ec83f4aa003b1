//! A client that keeps writing to a cluster through its client Service's endpoints, as an
//! application would, and remembers every write etcd acknowledged.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::bail;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{Access, ETCD_TIMEOUT, client_service_urls_with, connect_with};

/// Pause between two writes: a steady load that leaves the two CPUs to the members.
const WRITE_INTERVAL: Duration = Duration::from_millis(25);

/// Pause before reconnecting after a failed write.
const RECONNECT_DELAY: Duration = Duration::from_millis(200);

/// What a [`Writer`] did.
#[derive(Debug, Default)]
pub struct WriteReport {
    /// Acknowledged writes: key to value.
    pub acked: BTreeMap<String, String>,
    /// Writes that failed or timed out (their outcome is unknown).
    pub failed: usize,
}

/// A background writer; [`Writer::stop`] ends it and returns its report.
pub struct Writer {
    stop: CancellationToken,
    acked: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
    task: JoinHandle<WriteReport>,
}

impl Writer {
    /// Starts writing `PREFIX<n>` = `value-<n>` for n = 0, 1, 2, ... to `cluster`.
    pub fn start(slices: Api<EndpointSlice>, cluster: &str, prefix: &str) -> Self {
        Self::start_with(slices, cluster, prefix, Access::Plain)
    }

    /// [`Writer::start`], reaching the members with `access`.
    pub fn start_with(
        slices: Api<EndpointSlice>,
        cluster: &str,
        prefix: &str,
        access: Access,
    ) -> Self {
        let stop = CancellationToken::new();
        let acked = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicUsize::new(0));
        let counters = Counters {
            acked: acked.clone(),
            failed: failed.clone(),
        };
        let task = tokio::spawn(write_loop(
            slices,
            cluster.to_string(),
            prefix.to_string(),
            access,
            stop.clone(),
            counters,
        ));
        Self {
            stop,
            acked,
            failed,
            task,
        }
    }

    /// Acknowledged writes so far.
    pub fn acked(&self) -> usize {
        self.acked.load(Ordering::Relaxed)
    }

    /// Writes that failed or timed out so far.
    pub fn failed(&self) -> usize {
        self.failed.load(Ordering::Relaxed)
    }

    /// Waits until `more` writes beyond the current count are acknowledged: the cluster
    /// takes writes now.
    pub async fn wait_for_writes(&self, more: usize) -> anyhow::Result<()> {
        let target = self.acked() + more;
        etcd_tests::poll_until("writes to be acknowledged", super::WAIT, || async {
            anyhow::Ok((self.acked() >= target).then_some(()))
        })
        .await?;
        Ok(())
    }

    /// Stops writing and returns what was written.
    pub async fn stop(self) -> anyhow::Result<WriteReport> {
        self.stop.cancel();
        let report = self.task.await?;
        if report.acked.is_empty() {
            bail!("no write was acknowledged ({} failed)", report.failed);
        }
        Ok(report)
    }
}

/// The live counts a [`Writer`] shares with its task.
struct Counters {
    acked: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
}

async fn write_loop(
    slices: Api<EndpointSlice>,
    cluster: String,
    prefix: String,
    access: Access,
    stop: CancellationToken,
    counters: Counters,
) -> WriteReport {
    let mut report = WriteReport::default();
    let mut client = None;
    let mut n: u64 = 0;
    let mut ticker = tokio::time::interval(WRITE_INTERVAL);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return report,
            _ = ticker.tick() => {}
        }
        if client.is_none() {
            client = match client_service_urls_with(&slices, &cluster, &access).await {
                Ok(urls) if !urls.is_empty() => connect_with(&urls, &access).await.ok(),
                _ => None,
            };
        }
        let Some(c) = client.as_mut() else {
            tokio::time::sleep(RECONNECT_DELAY).await;
            continue;
        };
        let key = format!("{prefix}{n:08}");
        let value = format!("value-{n}");
        n += 1;
        match tokio::time::timeout(ETCD_TIMEOUT, c.put(key.clone(), value.clone(), None)).await {
            Ok(Ok(_)) => {
                report.acked.insert(key, value);
                counters.acked.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                report.failed += 1;
                counters.failed.fetch_add(1, Ordering::Relaxed);
                client = None;
                tokio::time::sleep(RECONNECT_DELAY).await;
            }
        }
    }
}
