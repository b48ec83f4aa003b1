//! Pod cgroups: the processes of each pod run in a cgroup v2 of their own,
//! `etcd-tests-<pid>/<pod uid>` under the cgroup2 mount, so the harness can tell pods apart
//! where addresses cannot.
//!
//! Every pod shares one network namespace, and a connection between two local addresses
//! carries the destination address as its source too (the kernel picks the source of a local
//! route from the destination): a packet from pod A to pod B reads `10.244.0.B -> 10.244.0.B`.
//! What still tells "sent by pod A" is the sending socket's cgroup, which the firewall matches
//! (`iptables -m cgroup --path`, see [`super::partition`]). The cgroup also lists every process
//! of the pod (forked children too), for pausing a pod.
//!
//! Best effort: without a writable cgroup2 hierarchy (an unprivileged user namespace, a
//! machine without cgroup v2) pods run without one and partitions are refused, naming the
//! reason. The root `etcd-tests-<pid>` is removed when the suite ends; roots left by killed test
//! binaries (their pid is gone) are removed by the next [`root`] call.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Prefix of the harness's cgroups under the cgroup2 root.
const ROOT_PREFIX: &str = "etcd-tests-";

/// Why a cgroup operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CgroupError {
    /// There is no usable cgroup2 hierarchy here.
    #[error("pod cgroups are unavailable: {0}")]
    Unavailable(String),
    /// A file operation in the cgroup hierarchy failed.
    #[error("{what}: {message}")]
    Io {
        /// What was being done.
        what: String,
        /// The I/O error, as text.
        message: String,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CgroupError {
    let what = what.into();
    move |e| CgroupError::Io {
        what,
        message: e.to_string(),
    }
}

/// The harness's cgroup `etcd-tests-<pid>` under the cgroup2 mount: the parent of every pod's
/// cgroup.
#[derive(Debug)]
pub struct CgroupRoot {
    /// Where cgroup2 is mounted (e.g. `/sys/fs/cgroup` or `/sys/fs/cgroup/unified`).
    mount: PathBuf,
    /// `etcd-tests-<pid>`.
    name: String,
}

static ROOT: OnceLock<Result<CgroupRoot, CgroupError>> = OnceLock::new();

/// The process-wide pod cgroup root, created on first use.
pub fn root() -> Result<&'static CgroupRoot, CgroupError> {
    ROOT.get_or_init(CgroupRoot::set_up)
        .as_ref()
        .map_err(Clone::clone)
}

/// Removes the root and every pod cgroup left in it, if [`root`] created one (the suite calls
/// it once every kubelet has stopped). Cgroups still holding processes stay.
pub fn remove_root() {
    if let Some(Ok(root)) = ROOT.get() {
        remove_tree(&root.dir());
    }
}

/// The cgroup2 mount point, from `/proc/self/mountinfo`.
fn cgroup2_mount() -> Result<PathBuf, CgroupError> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(io_err("reading /proc/self/mountinfo"))?;
    mountinfo
        .lines()
        .find_map(|line| {
            let (fields, rest) = line.split_once(" - ")?;
            let fstype = rest.split_whitespace().next()?;
            let mount_point = fields.split_whitespace().nth(4)?;
            (fstype == "cgroup2").then(|| PathBuf::from(mount_point))
        })
        .ok_or_else(|| CgroupError::Unavailable("no cgroup2 filesystem is mounted".into()))
}

/// Removes the child cgroups of `dir`, deepest first, then `dir` (best effort).
fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Removes the roots of test binaries that are gone.
fn sweep_stale(mount: &Path) {
    let Ok(entries) = std::fs::read_dir(mount) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(ROOT_PREFIX))
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let dead = matches!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
            Err(nix::errno::Errno::ESRCH)
        );
        if dead {
            remove_tree(&entry.path());
        }
    }
}

impl CgroupRoot {
    fn set_up() -> Result<Self, CgroupError> {
        let mount = cgroup2_mount()?;
        sweep_stale(&mount);
        let name = format!("{ROOT_PREFIX}{}", std::process::id());
        let root = Self { mount, name };
        let dir = root.dir();
        match std::fs::create_dir(&dir) {
            Ok(()) => Ok(root),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(root),
            Err(e) => Err(CgroupError::Unavailable(format!(
                "cannot create {}: {e}",
                dir.display()
            ))),
        }
    }

    fn dir(&self) -> PathBuf {
        self.mount.join(&self.name)
    }

    /// The root's path relative to the cgroup2 root (what `iptables -m cgroup --path` takes):
    /// a match on it matches every pod.
    pub fn relative_path(&self) -> &str {
        &self.name
    }

    /// Creates (or reuses) the cgroup `name` (a pod UID) under the root.
    pub fn create(&self, name: &str) -> Result<PodCgroup, CgroupError> {
        let dir = self.dir().join(name);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err(format!("creating {}", dir.display()))(e)),
        }
        let procs = CString::new(dir.join("cgroup.procs").as_os_str().as_bytes()).map_err(|e| {
            CgroupError::Io {
                what: format!("the path {}", dir.display()),
                message: e.to_string(),
            }
        })?;
        Ok(PodCgroup {
            relative: format!("{}/{name}", self.name),
            dir,
            procs,
        })
    }
}

/// The cgroup of one pod.
#[derive(Debug, Clone)]
pub struct PodCgroup {
    dir: PathBuf,
    relative: String,
    /// `<dir>/cgroup.procs`, built before any fork (the exec hook must not allocate).
    procs: CString,
}

impl PodCgroup {
    /// The path relative to the cgroup2 root (`etcd-tests-<pid>/<uid>`).
    pub fn relative_path(&self) -> &str {
        &self.relative
    }

    /// The directory in the cgroup2 hierarchy.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes `command` move into this cgroup between `fork` and `exec`, so the program runs
    /// in it from its first instruction (every socket it opens carries the cgroup). Spawning
    /// fails if the move fails.
    pub fn join_on_exec(&self, command: &mut Command) {
        let procs = self.procs.clone();
        // SAFETY: the hook runs in the forked child before exec. It only calls open(2),
        // write(2) and close(2), which are async-signal-safe, on a path built before the fork,
        // and it builds its error from a raw errno: nothing allocates. Writing "0" to
        // cgroup.procs moves the writing process.
        unsafe {
            command.pre_exec(move || {
                use nix::libc;
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                let error = std::io::Error::last_os_error();
                libc::close(fd);
                if written == 1 { Ok(()) } else { Err(error) }
            });
        }
    }

    /// The pids of every process in the cgroup.
    pub fn pids(&self) -> Vec<u32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// SIGKILLs every process left in the cgroup (children a container forked and left
    /// behind), as a container runtime does when it removes a container.
    pub fn kill_all(&self) {
        for pid in self.pids() {
            if let Ok(pid) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }

    /// Removes the cgroup (fails while processes remain in it; gone already is fine).
    pub fn remove(&self) -> Result<(), CgroupError> {
        match std::fs::remove_dir(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err(format!("removing {}", self.dir.display()))(e)),
        }
    }
}
