//! Watching what a cluster's status goes through.

use etcd_shared::EtcdCluster;
use etcd_shared::types::ClusterPhase;
use futures::StreamExt as _;
use kube::Api;
use kube::runtime::watcher;

/// Records every phase a cluster's status goes through (with the next step it named) until
/// stopped.
pub struct PhaseWatch {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Vec<(ClusterPhase, String)>>,
}

impl PhaseWatch {
    /// Starts watching `cluster`.
    pub fn start(api: Api<EtcdCluster>, cluster: &str) -> Self {
        let stop = tokio_util::sync::CancellationToken::new();
        let token = stop.clone();
        let config = watcher::Config::default().fields(&format!("metadata.name={cluster}"));
        let task = tokio::spawn(async move {
            let mut seen: Vec<(ClusterPhase, String)> = Vec::new();
            let mut stream = std::pin::pin!(watcher(api, config));
            loop {
                let event = tokio::select! {
                    _ = token.cancelled() => return seen,
                    e = stream.next() => e,
                };
                if let Some(Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c))) = event {
                    let status = c.status.unwrap_or_default();
                    if let Some(phase) = status.phase
                        && seen.last().map(|(p, _)| p) != Some(&phase)
                    {
                        seen.push((phase, status.next_step.unwrap_or_default()));
                    }
                }
            }
        });
        Self { stop, task }
    }

    /// Stops and returns every phase seen, in order, with the next step each named.
    pub async fn stop(self) -> anyhow::Result<Vec<(ClusterPhase, String)>> {
        self.stop.cancel();
        Ok(self.task.await?)
    }
}
