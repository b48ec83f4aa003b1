//! The pod network: a private network and mount namespace for the whole test binary, in which
//! every pod gets its own IP and the DNS names etcd members use resolve through `/etc/hosts`.
//!
//! # Design
//!
//! [`enter`] moves the *whole process* into new network and mount namespaces with
//! `unshare(2)` (plus a user namespace mapping the caller to root when not running as root).
//! Namespaces belong to threads and are inherited by the threads and children created
//! afterwards, so this must happen while the process still has a single thread: at the top of
//! the test binary's `main`, before the tokio runtime or libtest start theirs (`Suite::run`
//! does it when the suite asks for the pod network). Then, inside:
//!
//! - `lo` is brought up, so the control plane on 127.0.0.1 keeps working;
//! - an interface `pods0` carries the node IP (10.244.0.1) and one `/32` per pod
//!   (10.244.0.2 upwards). It is a `dummy` device where the kernel has one, else a `bridge`
//!   without ports (gVisor and minimal kernels have no dummy driver), else `lo` itself. Any
//!   address on any local interface is local: the control plane, the in-process controller,
//!   the member processes and the test all reach every pod IP directly, and the Endpoints and
//!   EndpointSlice validation accepts them (it refuses 127.0.0.0/8);
//! - every mount is made private (so nothing propagates back to the host), and a file owned by
//!   the harness is bind-mounted over `/etc/hosts`. The harness rewrites it *in place* as pods
//!   come and go (a rename would leave the old inode under the bind mount). glibc (the test
//!   binary, kubectl is Go) and Go's pure resolver (etcd, kube-*: built with `CGO_ENABLED=0`)
//!   both read `/etc/hosts` before DNS. Go caches the file for up to 5 s, keyed on its mtime
//!   and size, so a name added after a Go process last read the file may take that long to
//!   appear; the kubelet writes a pod's entry before starting its containers.
//!
//! The namespaces disappear with the process; no cleanup is needed on the host (the bind
//! mount's source file is unlinked right after mounting).
//!
//! Partitions ([`PodNetwork::partition`], [`PodNetwork::isolate`]) are firewall rules in this
//! namespace matching the pods' cgroups (see [`super::partition`]): the network tells pods
//! apart by their IPs, the rules by the cgroup the kubelet records for each IP.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};

use super::cgroup;
use super::partition::{self, Partition};

/// Name of the interface that carries the node and pod IPs (when it can be created).
pub const POD_INTERFACE: &str = "pods0";
/// The node's IP (the pods' `hostIP`).
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
/// The pod CIDR: pod IPs are allocated from it, after [`NODE_IP`].
pub const POD_CIDR: &str = "10.244.0.0/16";

const HOSTS: &str = "/etc/hosts";
const HOSTS_MARKER: &str = "# --- etcd-tests kubelet: pod names (rewritten in place) ---";

/// Errors while entering or using the pod network.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NetworkError {
    /// The process already runs more than one thread, so `unshare(2)` would only move the
    /// calling thread.
    #[error(
        "cannot enter the pod network: the process already has {threads} threads (call \
         etcd_tests::kubelet::netns::enter, or Suite::run with the pod network, at the top of \
         main, before any thread or runtime starts)"
    )]
    NotSingleThreaded {
        /// Threads counted in /proc/self/status.
        threads: usize,
    },
    /// A system call failed.
    #[error("{what}: {errno}")]
    Sys {
        /// What was being done.
        what: String,
        /// The error.
        errno: nix::errno::Errno,
    },
    /// A file operation failed.
    #[error("{what}: {message}")]
    Io {
        /// What was being done.
        what: String,
        /// The I/O error, as text (so the error is `Clone` and can be kept in a static).
        message: String,
    },
    /// An `ip` command failed.
    #[error("`ip {args}` failed: {output}")]
    Ip {
        /// The arguments.
        args: String,
        /// Exit status and stderr.
        output: String,
    },
    /// [`enter`] was not called (or failed) in this process.
    #[error("the pod network was not set up in this process: {0}")]
    NotEntered(String),
    /// Every address of the pod CIDR is in use.
    #[error("no free pod IP left in {POD_CIDR}")]
    Exhausted,
    /// A firewall command failed, or there is no working `iptables`.
    #[error("partition: {0}")]
    Firewall(String),
    /// The address is not a running pod's, or its pod runs without a cgroup (see
    /// [`super::cgroup`]), so no rule can tell its packets apart.
    #[error("partition: {ip} is not the IP of a pod running in a pod cgroup ({reason})")]
    NoPodCgroup {
        /// The address.
        ip: Ipv4Addr,
        /// Why pods have no cgroup, when that is the cause.
        reason: String,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> NetworkError {
    let what = what.into();
    move |e| NetworkError::Io {
        what,
        message: e.to_string(),
    }
}

fn sys_err(what: impl Into<String>) -> impl FnOnce(nix::errno::Errno) -> NetworkError {
    let what = what.into();
    move |errno| NetworkError::Sys { what, errno }
}

/// Which kind of device carries the pod IPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterfaceKind {
    /// A `dummy` device named [`POD_INTERFACE`].
    Dummy,
    /// A port-less `bridge` named [`POD_INTERFACE`] (no dummy driver in this kernel).
    Bridge,
    /// The loopback device (neither dummy nor bridge could be created).
    Loopback,
}

/// The process-wide pod network: address allocation and the shared hosts file.
#[derive(Debug)]
pub struct PodNetwork {
    interface: String,
    kind: InterfaceKind,
    user_namespace: bool,
    pool: Mutex<IpPool>,
    hosts: Mutex<HostsFile>,
    /// The cgroup (relative path) of the pod holding each pod IP, for partitions.
    cgroups: Mutex<BTreeMap<Ipv4Addr, String>>,
}

static NETWORK: OnceLock<Result<PodNetwork, NetworkError>> = OnceLock::new();

/// Moves this process into a private network and mount namespace and sets up the pod network
/// (see the module docs). Idempotent: later calls return the first call's result. The first
/// call must happen while the process is single-threaded.
pub fn enter() -> Result<&'static PodNetwork, NetworkError> {
    NETWORK
        .get_or_init(PodNetwork::set_up)
        .as_ref()
        .map_err(Clone::clone)
}

/// The pod network, if [`enter`] succeeded in this process.
pub fn current() -> Result<&'static PodNetwork, NetworkError> {
    match NETWORK.get() {
        Some(Ok(network)) => Ok(network),
        Some(Err(e)) => Err(NetworkError::NotEntered(e.to_string())),
        None => Err(NetworkError::NotEntered(
            "enable it with Suite::with_kubelet / Suite::with_pod_network, or call \
             etcd_tests::kubelet::netns::enter() first thing in main"
                .into(),
        )),
    }
}

fn thread_count() -> Result<usize, NetworkError> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(io_err("reading /proc/self/status"))?;
    Ok(status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0))
}

/// Runs `ip ARGS`; the error carries its stderr.
fn ip(args: &[&str]) -> Result<(), NetworkError> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .map_err(io_err("running `ip` (install iproute2)"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(NetworkError::Ip {
            args: args.join(" "),
            output: format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        })
    }
}

impl PodNetwork {
    fn set_up() -> Result<Self, NetworkError> {
        let threads = thread_count()?;
        if threads != 1 {
            return Err(NetworkError::NotSingleThreaded { threads });
        }
        let uid = nix::unistd::geteuid();
        let gid = nix::unistd::getegid();
        let flags = CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWNS;
        // Root without CAP_SYS_ADMIN (an unprivileged container) may still create a user
        // namespace, in which it has every capability over the new namespaces.
        let user_namespace = if uid.is_root() && unshare(flags).is_ok() {
            false
        } else {
            let flags = flags | CloneFlags::CLONE_NEWUSER;
            unshare(flags).map_err(sys_err(format!("unshare({flags:?})")))?;
            true
        };
        if user_namespace {
            // Map the caller to root inside the new user namespace (what
            // `unshare --map-root-user` does); setgroups must be denied first.
            let write = |path: &str, text: String| {
                std::fs::write(path, text).map_err(io_err(format!("writing {path}")))
            };
            write("/proc/self/setgroups", "deny".into())?;
            write("/proc/self/uid_map", format!("0 {uid} 1"))?;
            write("/proc/self/gid_map", format!("0 {gid} 1"))?;
        }
        // A new mount namespace shares propagation with the old one: make every mount private
        // before bind-mounting, or /etc/hosts would change on the host too.
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&str>,
        )
        .map_err(sys_err("making / rprivate"))?;

        ip(&["link", "set", "lo", "up"])?;
        let (interface, kind) = create_interface()?;
        ip(&["addr", "add", &format!("{NODE_IP}/32"), "dev", &interface])?;
        let hosts = HostsFile::bind_mount(Path::new(HOSTS))?;
        Ok(Self {
            interface,
            kind,
            user_namespace,
            pool: Mutex::new(IpPool::new()),
            hosts: Mutex::new(hosts),
            cgroups: Mutex::new(BTreeMap::new()),
        })
    }

    /// The interface carrying the pod IPs (`pods0`, or `lo`).
    pub fn interface(&self) -> &str {
        &self.interface
    }

    /// Which kind of device that is.
    pub fn interface_kind(&self) -> InterfaceKind {
        self.kind
    }

    /// Whether a user namespace was needed (the test binary does not run as root).
    pub fn in_user_namespace(&self) -> bool {
        self.user_namespace
    }

    /// The node's IP.
    pub fn node_ip(&self) -> Ipv4Addr {
        NODE_IP
    }

    /// Allocates a free pod IP and adds it to the interface. Blocking (runs `ip`).
    pub fn allocate(&self) -> Result<Ipv4Addr, NetworkError> {
        let address = lock(&self.pool).allocate()?;
        if let Err(e) = ip(&[
            "addr",
            "add",
            &format!("{address}/32"),
            "dev",
            &self.interface,
        ]) {
            lock(&self.pool).release(address);
            return Err(e);
        }
        Ok(address)
    }

    /// Removes a pod IP from the interface and returns it to the pool. Blocking (runs `ip`).
    pub fn release(&self, address: Ipv4Addr) -> Result<(), NetworkError> {
        let result = ip(&[
            "addr",
            "del",
            &format!("{address}/32"),
            "dev",
            &self.interface,
        ]);
        lock(&self.pool).release(address);
        lock(&self.cgroups).remove(&address);
        result
    }

    /// Records that the pod holding `address` runs in cgroup `cgroup` (a path relative to the
    /// cgroup2 root), so partitions can name its packets. Released with the address.
    pub(crate) fn set_pod_cgroup(&self, address: Ipv4Addr, cgroup: &str) {
        lock(&self.cgroups).insert(address, cgroup.to_owned());
    }

    fn pod_cgroup(&self, address: Ipv4Addr) -> Result<(Ipv4Addr, String), NetworkError> {
        lock(&self.cgroups)
            .get(&address)
            .map(|cgroup| (address, cgroup.clone()))
            .ok_or_else(|| NetworkError::NoPodCgroup {
                ip: address,
                reason: match cgroup::root() {
                    Ok(_) => "no pod holds it".to_owned(),
                    Err(e) => e.to_string(),
                },
            })
    }

    /// Partitions the pods of `side_a` from the pods of `side_b` (pod IPs): packets between
    /// the two sides are dropped both ways, so connections hang (see [`partition`]); each
    /// side still reaches everything else, and the test process (not a pod) reaches every pod.
    /// Healed by [`Partition::heal`] or by dropping it. Blocking (runs `iptables`).
    pub fn partition(
        &self,
        side_a: &[Ipv4Addr],
        side_b: &[Ipv4Addr],
    ) -> Result<Partition, NetworkError> {
        let resolve = |ips: &[Ipv4Addr]| -> Result<Vec<(Ipv4Addr, String)>, NetworkError> {
            ips.iter().map(|ip| self.pod_cgroup(*ip)).collect()
        };
        partition::install(partition::Plan::between(
            &resolve(side_a)?,
            &resolve(side_b)?,
        ))
    }

    /// Cuts pod `pod` (its IP) from every other pod, and from the API server when `apiserver`
    /// (see [`crate::ControlPlane::apiserver_addr`]) is given: its packets to them and theirs
    /// to it are dropped. The test process and the kubelet's probes still reach it. Healed by
    /// [`Partition::heal`] or by dropping it. Blocking (runs `iptables`).
    pub fn isolate(
        &self,
        pod: Ipv4Addr,
        apiserver: Option<SocketAddr>,
    ) -> Result<Partition, NetworkError> {
        let (ip, cgroup) = self.pod_cgroup(pod)?;
        let all_pods = cgroup::root().map_err(|e| NetworkError::NoPodCgroup {
            ip,
            reason: e.to_string(),
        })?;
        partition::install(partition::Plan::isolating(
            (ip, &cgroup),
            all_pods.relative_path(),
            apiserver,
        ))
    }

    /// The firewall rules of the partitions in place (`iptables -S` lines); empty when every
    /// partition healed.
    pub fn partition_rules(&self) -> Result<Vec<String>, NetworkError> {
        partition::rules()
    }

    /// Sets the hosts line `ADDRESS NAMES...` kept under `key` (one per pod, keyed by UID) and
    /// rewrites `/etc/hosts` in place.
    pub fn set_hosts_entry(
        &self,
        key: &str,
        address: Ipv4Addr,
        names: &[String],
    ) -> Result<(), NetworkError> {
        let mut hosts = lock(&self.hosts);
        hosts
            .entries
            .insert(key.to_owned(), format!("{address}\t{}", names.join(" ")));
        hosts.write()
    }

    /// Removes the hosts line kept under `key`.
    pub fn remove_hosts_entry(&self, key: &str) -> Result<(), NetworkError> {
        let mut hosts = lock(&self.hosts);
        if hosts.entries.remove(key).is_some() {
            hosts.write()
        } else {
            Ok(())
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn create_interface() -> Result<(String, InterfaceKind), NetworkError> {
    for (kind, device) in [
        (InterfaceKind::Dummy, "dummy"),
        (InterfaceKind::Bridge, "bridge"),
    ] {
        if ip(&["link", "add", POD_INTERFACE, "type", device]).is_ok() {
            ip(&["link", "set", POD_INTERFACE, "up"])?;
            return Ok((POD_INTERFACE.to_owned(), kind));
        }
    }
    Ok(("lo".to_owned(), InterfaceKind::Loopback))
}

/// Next-fit allocation over 10.244.0.2 ..= 10.244.255.254, so a released IP is not handed out
/// again right away (a client may still hold connections to the old pod).
#[derive(Debug)]
struct IpPool {
    next: u32,
    used: std::collections::BTreeSet<u32>,
}

const POOL_FIRST: u32 = u32::from_be_bytes([10, 244, 0, 2]);
const POOL_LAST: u32 = u32::from_be_bytes([10, 244, 255, 254]);

impl IpPool {
    fn new() -> Self {
        Self {
            next: POOL_FIRST,
            used: Default::default(),
        }
    }

    fn allocate(&mut self) -> Result<Ipv4Addr, NetworkError> {
        let size = POOL_LAST - POOL_FIRST + 1;
        for step in 0..size {
            let candidate = POOL_FIRST + (self.next - POOL_FIRST + step) % size;
            // Skip .0 and .255 of every /24: harmless on a /32, but confusing to read.
            let last_octet = candidate & 0xff;
            if last_octet == 0 || last_octet == 255 || self.used.contains(&candidate) {
                continue;
            }
            self.used.insert(candidate);
            self.next = if candidate == POOL_LAST {
                POOL_FIRST
            } else {
                candidate + 1
            };
            return Ok(Ipv4Addr::from(candidate));
        }
        Err(NetworkError::Exhausted)
    }

    fn release(&mut self, address: Ipv4Addr) {
        self.used.remove(&u32::from(address));
    }
}

/// The harness's `/etc/hosts`: the original content, then one line per pod.
#[derive(Debug)]
struct HostsFile {
    path: PathBuf,
    header: String,
    entries: BTreeMap<String, String>,
    /// Current length of the file: it never shrinks (see [`HostsFile::render`]).
    len: usize,
}

impl HostsFile {
    /// Copies `target` into a new file, bind-mounts that over `target` and unlinks it (the
    /// mount keeps the inode alive; from now on it is only reachable as `target`).
    fn bind_mount(target: &Path) -> Result<Self, NetworkError> {
        let header = std::fs::read_to_string(target).unwrap_or_default();
        let source = std::env::temp_dir().join(format!(
            "etcd-tests-hosts-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        let mut file = std::fs::File::create(&source)
            .map_err(io_err(format!("creating {}", source.display())))?;
        file.write_all(header.as_bytes())
            .map_err(io_err(format!("writing {}", source.display())))?;
        drop(file);
        let mounted = mount(
            Some(&source),
            target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(sys_err(format!(
            "bind-mounting {} over {}",
            source.display(),
            target.display()
        )));
        let _ = std::fs::remove_file(&source);
        mounted?;
        let mut hosts = Self {
            path: target.to_owned(),
            len: header.len(),
            header,
            entries: BTreeMap::new(),
        };
        hosts.write()?;
        Ok(hosts)
    }

    /// The file's new content. A reader (Go re-reads the file when its mtime or size changed)
    /// must never see a half-written file, and writes overwrite in place: so the content is
    /// written in one `pwrite` from offset 0 and the file never shrinks. When the new content
    /// is shorter, it is padded with a comment line of spaces to the old length.
    fn render(&self) -> String {
        let mut text = self.header.clone();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(HOSTS_MARKER);
        text.push('\n');
        for line in self.entries.values() {
            text.push_str(line);
            text.push('\n');
        }
        pad(text, self.len)
    }

    fn write(&mut self) -> Result<(), NetworkError> {
        let text = self.render();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.path)
            .map_err(io_err(format!("opening {}", self.path.display())))?;
        file.write_all_at(text.as_bytes(), 0)
            .map_err(io_err(format!("writing {}", self.path.display())))?;
        self.len = text.len();
        Ok(())
    }
}

/// Pads `text` (which ends with a newline) with a comment line to at least `len` bytes.
fn pad(mut text: String, len: usize) -> String {
    match len.saturating_sub(text.len()) {
        0 => {}
        1 => text.push('\n'),
        missing => {
            text.push('#');
            text.extend(std::iter::repeat_n(' ', missing - 2));
            text.push('\n');
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_is_next_fit_and_skips_network_and_broadcast_octets() {
        let mut pool = IpPool::new();
        let a = pool.allocate().unwrap();
        let b = pool.allocate().unwrap();
        assert_eq!(a, Ipv4Addr::new(10, 244, 0, 2));
        assert_eq!(b, Ipv4Addr::new(10, 244, 0, 3));
        pool.release(a);
        assert_eq!(pool.allocate().unwrap(), Ipv4Addr::new(10, 244, 0, 4));
        pool.next = u32::from(Ipv4Addr::new(10, 244, 0, 254));
        assert_eq!(pool.allocate().unwrap(), Ipv4Addr::new(10, 244, 0, 254));
        assert_eq!(pool.allocate().unwrap(), Ipv4Addr::new(10, 244, 1, 1));
    }

    #[test]
    fn hosts_content_never_shrinks() {
        let mut hosts = HostsFile {
            path: PathBuf::new(),
            header: "127.0.0.1 localhost".into(),
            entries: BTreeMap::new(),
            len: 0,
        };
        hosts.entries.insert(
            "uid-a".into(),
            "10.244.0.2\ta.b.ns.svc.cluster.local".into(),
        );
        let long = hosts.render();
        assert!(long.starts_with("127.0.0.1 localhost\n# ---"), "{long}");
        assert!(
            long.ends_with("10.244.0.2\ta.b.ns.svc.cluster.local\n"),
            "{long}"
        );
        hosts.len = long.len();
        hosts.entries.clear();
        let short = hosts.render();
        assert_eq!(short.len(), long.len());
        assert!(!short.contains("10.244.0.2"));
        assert!(short.ends_with(" \n"));
        assert_eq!(pad("x\n".into(), 3), "x\n\n");
    }
}
