//! Network partitions between pods: firewall rules in the suite's private network namespace
//! that drop packets both ways, so connections hang (as across a real partition) instead of
//! being refused.
//!
//! Pods share one network namespace and their traffic is local, so a rule cannot tell senders
//! apart by source address (see [`super::cgroup`]); it matches the sending socket's pod cgroup
//! (`-m cgroup --path`) and the destination address, in the `OUTPUT` chain every local packet
//! crosses. A cut between pods A and B is two rules: "from A's cgroup to B's IP" and "from B's
//! cgroup to A's IP". Cutting a pod from the API server (a local process on 127.0.0.1) drops
//! the pod's packets to the API server's port on `OUTPUT` and the API server's answers to the
//! pod's sockets on `INPUT`.
//!
//! Each partition owns chains of its own (`ETCD-TESTS-P<n>-OUT`, `-IN`) jumped to from the
//! built-in chains, removed by [`Partition::heal`] or when the handle is dropped, and by
//! [`heal_all`] when the suite ends: nothing outlives the handle, and nothing reaches the host
//! (the namespace is the test binary's own). The `iptables` of the machine is used
//! (`iptables`, else `iptables-nft`, else `iptables-legacy`: whichever works here).

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use super::netns::{NetworkError, POD_CIDR};

/// Prefix of every chain a partition creates (what [`rules`] lists).
pub const CHAIN_PREFIX: &str = "ETCD-TESTS-P";

static NEXT: AtomicU64 = AtomicU64::new(1);
/// Chains of the partitions in place, by name (for [`heal_all`]).
static LIVE: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

fn lock_live() -> std::sync::MutexGuard<'static, BTreeSet<String>> {
    LIVE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The `iptables` program that works in this network namespace.
fn iptables() -> Result<&'static str, NetworkError> {
    static FOUND: OnceLock<Result<&'static str, String>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let mut tried = Vec::new();
            for program in ["iptables", "iptables-nft", "iptables-legacy"] {
                match Command::new(program).args(["-w", "-S", "OUTPUT"]).output() {
                    Ok(out) if out.status.success() => return Ok(program),
                    Ok(out) => tried.push(format!(
                        "{program}: {}: {}",
                        out.status,
                        String::from_utf8_lossy(&out.stderr).trim()
                    )),
                    Err(e) => tried.push(format!("{program}: {e}")),
                }
            }
            Err(format!(
                "no working iptables (install Debian's iptables): {}",
                tried.join("; ")
            ))
        })
        .as_ref()
        .map(|p| *p)
        .map_err(|e| NetworkError::Firewall(e.clone()))
}

/// Runs `iptables -w ARGS`; the error carries its stderr.
fn run(args: &[String]) -> Result<String, NetworkError> {
    let program = iptables()?;
    let output = Command::new(program)
        .arg("-w")
        .args(args)
        .output()
        .map_err(|e| NetworkError::Firewall(format!("running {program}: {e}")))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(NetworkError::Firewall(format!(
            "`{program} -w {}` failed: {}: {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

/// One DROP rule: packets sent by the sockets of cgroup `from` (a path relative to the
/// cgroup2 root), to or from the given addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cut {
    /// Cgroup path of the sending (`OUTPUT`) or receiving (`INPUT`) socket.
    pub(crate) cgroup: String,
    /// `-d` on `OUTPUT` rules, `-s` on `INPUT` rules (an address or a CIDR).
    pub(crate) peer: String,
    /// A TCP port: `--dport` on `OUTPUT`, `--sport` on `INPUT`.
    pub(crate) port: Option<u16>,
    /// `RETURN` instead of `DROP` (an exception tried before the drops).
    pub(crate) allow: bool,
}

impl Cut {
    fn args(&self, chain: &str, input: bool) -> Vec<String> {
        let mut args = vec![
            "-A".to_owned(),
            chain.to_owned(),
            if input { "-s" } else { "-d" }.to_owned(),
            self.peer.clone(),
        ];
        if let Some(port) = self.port {
            args.extend([
                "-p".to_owned(),
                "tcp".to_owned(),
                if input { "--sport" } else { "--dport" }.to_owned(),
                port.to_string(),
            ]);
        }
        args.extend([
            "-m".to_owned(),
            "cgroup".to_owned(),
            "--path".to_owned(),
            self.cgroup.clone(),
            "-j".to_owned(),
            if self.allow { "RETURN" } else { "DROP" }.to_owned(),
        ]);
        args
    }
}

/// The rules of one partition, before they are installed.
#[derive(Debug, Default, Clone)]
pub(crate) struct Plan {
    /// What the partition cuts, for logs and errors.
    pub(crate) description: String,
    /// Rules on locally sent packets.
    pub(crate) output: Vec<Cut>,
    /// Rules on locally received packets.
    pub(crate) input: Vec<Cut>,
}

impl Plan {
    /// Cuts every pod of `a` from every pod of `b`, both ways (`(IP, cgroup)` pairs).
    pub(crate) fn between(a: &[(Ipv4Addr, String)], b: &[(Ipv4Addr, String)]) -> Self {
        let mut plan = Self {
            description: format!(
                "{} <-/-> {}",
                list(a.iter().map(|(ip, _)| ip)),
                list(b.iter().map(|(ip, _)| ip))
            ),
            ..Self::default()
        };
        for (ip_a, cg_a) in a {
            for (ip_b, cg_b) in b {
                plan.output.push(cut(cg_a, &format!("{ip_b}/32"), None));
                plan.output.push(cut(cg_b, &format!("{ip_a}/32"), None));
            }
        }
        plan
    }

    /// Cuts pod `(ip, cgroup)` from every pod IP (cgroups under `all_pods`), and from the API
    /// server at `apiserver` when given.
    pub(crate) fn isolating(
        (ip, cgroup): (Ipv4Addr, &str),
        all_pods: &str,
        apiserver: Option<SocketAddr>,
    ) -> Self {
        let own = format!("{ip}/32");
        let mut plan = Self {
            description: format!(
                "{ip} <-/-> every pod{}",
                apiserver
                    .map(|a| format!(" and the API server {a}"))
                    .unwrap_or_default()
            ),
            ..Self::default()
        };
        // The pod still talks to itself.
        plan.output.push(Cut {
            allow: true,
            ..cut(cgroup, &own, None)
        });
        plan.output.push(cut(cgroup, POD_CIDR, None));
        plan.output.push(cut(all_pods, &own, None));
        if let Some(apiserver) = apiserver {
            let address = format!("{}/32", apiserver.ip());
            plan.output
                .push(cut(cgroup, &address, Some(apiserver.port())));
            plan.input
                .push(cut(cgroup, &address, Some(apiserver.port())));
        }
        plan
    }
}

fn cut(cgroup: &str, peer: &str, port: Option<u16>) -> Cut {
    Cut {
        cgroup: cgroup.to_owned(),
        peer: peer.to_owned(),
        port,
        allow: false,
    }
}

fn list<'a>(ips: impl Iterator<Item = &'a Ipv4Addr>) -> String {
    format!(
        "[{}]",
        ips.map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )
}

/// A partition in place. [`Self::heal`] (or dropping it) removes its rules.
#[derive(Debug)]
#[must_use = "dropping a Partition heals it at once"]
pub struct Partition {
    chain: String,
    description: String,
    healed: bool,
}

/// The built-in chain and the partition's chain jumped to from it.
fn chains(chain: &str) -> [(&'static str, String); 2] {
    [
        ("OUTPUT", format!("{chain}-OUT")),
        ("INPUT", format!("{chain}-IN")),
    ]
}

/// Installs `plan` as a new partition.
pub(crate) fn install(plan: Plan) -> Result<Partition, NetworkError> {
    let chain = format!("{CHAIN_PREFIX}{}", NEXT.fetch_add(1, Ordering::SeqCst));
    lock_live().insert(chain.clone());
    let partition = Partition {
        chain,
        description: plan.description.clone(),
        healed: false,
    };
    // On an error, dropping `partition` removes whatever was installed.
    for ((builtin, own), (cuts, input)) in chains(&partition.chain)
        .into_iter()
        .zip([(&plan.output, false), (&plan.input, true)])
    {
        if cuts.is_empty() {
            continue;
        }
        run(&["-N".to_owned(), own.clone()])?;
        for cut in cuts {
            run(&cut.args(&own, input))?;
        }
        run(&[
            "-I".to_owned(),
            builtin.to_owned(),
            "1".to_owned(),
            "-j".to_owned(),
            own.clone(),
        ])?;
    }
    Ok(partition)
}

/// Removes the chains of partition `chain` (those that exist).
fn remove(chain: &str) -> Result<(), NetworkError> {
    let existing = rules()?;
    let mut first_error = None;
    for (builtin, own) in chains(chain) {
        let jump = format!("-A {builtin} -j {own}");
        let mut steps: Vec<Vec<String>> = Vec::new();
        if existing.iter().any(|r| r == &jump) {
            steps.push(vec!["-D".into(), builtin.into(), "-j".into(), own.clone()]);
        }
        if existing.iter().any(|r| r == &format!("-N {own}")) {
            steps.push(vec!["-F".into(), own.clone()]);
            steps.push(vec!["-X".into(), own.clone()]);
        }
        for step in steps {
            if let Err(e) = run(&step) {
                first_error.get_or_insert(e);
            }
        }
    }
    lock_live().remove(chain);
    first_error.map_or(Ok(()), Err)
}

impl Partition {
    /// Removes the partition's rules: packets flow again (connections that hung resume, as
    /// after a healed partition, unless they timed out meanwhile).
    pub fn heal(mut self) -> Result<(), NetworkError> {
        self.healed = true;
        remove(&self.chain)
    }

    /// The name prefix of its chains (`ETCD-TESTS-P<n>`).
    pub fn chain(&self) -> &str {
        &self.chain
    }

    /// What it cuts, e.g. `[10.244.0.5] <-/-> [10.244.0.6]`.
    pub fn description(&self) -> &str {
        &self.description
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        if !self.healed {
            let _ = remove(&self.chain);
        }
    }
}

/// Every rule of every partition in place, as `iptables -S` prints them (the jumps from the
/// built-in chains too). Empty once every partition healed.
pub fn rules() -> Result<Vec<String>, NetworkError> {
    Ok(run(&["-S".to_owned()])?
        .lines()
        .filter(|l| l.contains(CHAIN_PREFIX))
        .map(str::to_owned)
        .collect())
}

/// Heals every partition still in place (the suite calls it when it ends; a handle dropped
/// later finds nothing to remove).
pub fn heal_all() {
    let chains: Vec<String> = lock_live().iter().cloned().collect();
    for chain in chains {
        let _ = remove(&chain);
    }
}
