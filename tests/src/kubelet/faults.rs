//! Node faults on a running kubelet: a silence (a paused or partitioned kubelet), frozen pods
//! (SIGSTOP), and commands run as a pod on the network (to check what a partition cuts).

use std::sync::atomic::Ordering;

use nix::sys::signal::Signal;

use super::{Kubelet, KubeletError, cgroup, lock};

impl Kubelet {
    /// Silences the kubelet, as a kubelet that is paused or partitioned from the API server:
    /// no Lease renewals, no node status, no pod status writes, no reaction to pods deleted or
    /// bound meanwhile, while its containers keep running, serving and restarting. The node
    /// lifecycle controller then marks the Node `Unknown` (after `--node-monitor-grace-period`)
    /// and taints it; once the pods' tolerations run out they are evicted and stay
    /// `Terminating`, as no kubelet confirms. Idempotent.
    pub fn silence(&self) {
        self.shared.silence_epoch.fetch_add(1, Ordering::SeqCst);
        if !self.shared.silenced.send_replace(true) {
            self.shared.log.line(format_args!(
                "fault injection: node {} silenced",
                self.node_name()
            ));
        }
    }

    /// Ends a silence ([`Self::silence`]): the Lease is renewed and the node status posted at
    /// once (the Node is `Ready` again within seconds), and the kubelet catches up with the
    /// API: pods deleted meanwhile are stopped (SIGTERM, grace, SIGKILL) and, when deleted
    /// gracefully, removed; pods bound meanwhile start. Idempotent.
    pub fn resume(&self) {
        if self.shared.silenced.send_replace(false) {
            self.shared.log.line(format_args!(
                "fault injection: node {} resumed",
                self.node_name()
            ));
        }
    }

    /// Whether the kubelet is silenced.
    pub fn is_silenced(&self) -> bool {
        self.shared.is_silenced()
    }

    /// The pids of pod `namespace/pod`'s processes: every process of its cgroup (children of
    /// the containers too), else its container processes.
    pub fn pod_pids(&self, namespace: &str, pod: &str) -> Result<Vec<u32>, KubeletError> {
        let info = self.shared.pod_info(namespace, pod)?;
        let mut info = lock(&info);
        let mut pids: Vec<u32> = info
            .processes
            .values_mut()
            .filter_map(|p| p.exit_status().is_none().then(|| p.pid()))
            .collect();
        if let Some(cgroup) = &info.cgroup {
            pids.extend(cgroup.pids());
        }
        pids.sort_unstable();
        pids.dedup();
        Ok(pids)
    }

    fn signal_pod(
        &self,
        namespace: &str,
        pod: &str,
        signal: Signal,
    ) -> Result<Vec<u32>, KubeletError> {
        let pids = self.pod_pids(namespace, pod)?;
        for pid in &pids {
            if let Ok(pid) = i32::try_from(*pid) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
            }
        }
        self.shared.log.line(format_args!(
            "fault injection: {signal} to {namespace}/{pod} (pids {pids:?})"
        ));
        Ok(pids)
    }

    /// Stops every process of pod `namespace/pod` with SIGSTOP (a frozen member: its sockets
    /// stay open, connections to it hang, its probes fail). [`Self::continue_pod`] undoes it.
    /// Returns the pids.
    pub fn pause_pod(&self, namespace: &str, pod: &str) -> Result<Vec<u32>, KubeletError> {
        self.signal_pod(namespace, pod, Signal::SIGSTOP)
    }

    /// Continues the processes of pod `namespace/pod` (SIGCONT) after [`Self::pause_pod`].
    pub fn continue_pod(&self, namespace: &str, pod: &str) -> Result<Vec<u32>, KubeletError> {
        self.signal_pod(namespace, pod, Signal::SIGCONT)
    }

    /// A command running `program` inside pod `namespace/pod`'s cgroup, so it is that pod on
    /// the network (partitions apply to it), e.g. to check what the pod can reach. Not in the
    /// pod's volumes or environment; it does not die with the test binary, so bound it (e.g.
    /// with `timeout`). Fails when the pod has no cgroup.
    pub fn pod_command(
        &self,
        namespace: &str,
        pod: &str,
        program: impl AsRef<std::ffi::OsStr>,
    ) -> Result<std::process::Command, KubeletError> {
        let info = self.shared.pod_info(namespace, pod)?;
        let cgroup = lock(&info).cgroup.clone();
        let cgroup = cgroup.ok_or_else(|| KubeletError::NoCgroup {
            namespace: namespace.into(),
            pod: pod.into(),
            reason: match cgroup::root() {
                Ok(_) => "not set up yet".into(),
                Err(e) => e.to_string(),
            },
        })?;
        let mut command = std::process::Command::new(program);
        cgroup.join_on_exec(&mut command);
        Ok(command)
    }
}
