//! Child processes of the harness: spawned with their output in a log file, tied to the life of
//! the test binary, and stopped with SIGTERM, a grace period, then SIGKILL.
//!
//! # Why children die with the test binary
//!
//! `Drop` stops every component, also when a test panics, but not when the test binary itself is
//! killed (SIGKILL from a CI timeout, `panic = "abort"`, a crash). For that case each child asks
//! the kernel for `PR_SET_PDEATHSIG(SIGKILL)` between `fork` and `exec` (a `pre_exec` hook).
//!
//! The catch with `PR_SET_PDEATHSIG` is that the "parent" is the *thread* that forked, not the
//! process: a child spawned from a libtest worker thread or a tokio blocking thread would be
//! killed as soon as that thread finishes. So every child is spawned from one dedicated thread
//! that lives as long as the process (it only ever waits for spawn requests). The hook also
//! re-checks `getppid()` after `prctl`, closing the race where the parent died before the death
//! signal was armed. The `unsafe` is confined to [`spawn`]: the hook only makes two
//! async-signal-safe syscalls and does not allocate, which is what `pre_exec` requires.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, getpid, getppid};

/// Errors while starting a child process.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// Creating the log file failed.
    #[error("creating log file {path}: {source}")]
    Log {
        /// The log file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// `fork`/`exec` failed.
    #[error("starting {name} ({program}): {source}")]
    Spawn {
        /// Component name.
        name: String,
        /// The binary.
        program: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The spawner thread could not be started or has gone away.
    #[error("the process spawner thread is unavailable: {0}")]
    Spawner(String),
}

struct SpawnRequest {
    command: Command,
    reply: mpsc::Sender<std::io::Result<Child>>,
}

/// The long-lived thread that forks every child (see the module docs for why).
fn spawner() -> Result<&'static Mutex<mpsc::Sender<SpawnRequest>>, ProcessError> {
    static SPAWNER: OnceLock<Result<Mutex<mpsc::Sender<SpawnRequest>>, String>> = OnceLock::new();
    SPAWNER
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<SpawnRequest>();
            std::thread::Builder::new()
                .name("etcd-tests-spawner".into())
                .spawn(move || {
                    // The sender lives in a static, so this loop runs until the process exits.
                    for mut request in rx {
                        let _ = request.reply.send(request.command.spawn());
                    }
                })
                .map(|_| Mutex::new(tx))
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| ProcessError::Spawner(e.clone()))
}

/// Spawns `command` from the spawner thread with `PR_SET_PDEATHSIG(SIGKILL)` armed.
fn spawn(mut command: Command) -> Result<std::io::Result<Child>, ProcessError> {
    let parent = getpid();
    // A process group of its own: Ctrl-C in the terminal signals only this process, which
    // then stops its children in order (the death signal still covers a crash).
    command.process_group(0);
    // SAFETY: the hook runs in the forked child before exec; it only calls prctl(2) and
    // getppid(2), both async-signal-safe, and builds its error from a raw errno (no allocation).
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
            if getppid() != parent {
                // The test binary died before the death signal was armed.
                return Err(std::io::Error::from(nix::errno::Errno::ESRCH));
            }
            Ok(())
        });
    }
    let (reply, response) = mpsc::channel();
    spawner()?
        .lock()
        .map_err(|e| ProcessError::Spawner(e.to_string()))?
        .send(SpawnRequest { command, reply })
        .map_err(|e| ProcessError::Spawner(e.to_string()))?;
    response
        .recv()
        .map_err(|e| ProcessError::Spawner(e.to_string()))
}

/// A running component whose stdout and stderr go to a log file.
#[derive(Debug)]
pub struct ManagedProcess {
    name: String,
    child: Child,
    log_path: PathBuf,
    exit: Option<ExitStatus>,
}

impl ManagedProcess {
    /// Starts `program args...` with stdin closed and stdout+stderr appended to `log_path`.
    pub fn start(
        name: &str,
        program: &Path,
        args: &[String],
        log_path: PathBuf,
    ) -> Result<Self, ProcessError> {
        let mut command = Command::new(program);
        command.args(args);
        Self::start_command(name, command, log_path, false)
    }

    /// Starts a prepared `command` (program, arguments, environment, working directory as the
    /// caller set them) with stdin closed and stdout+stderr going to `log_path`: appended to
    /// when `append` (a restarted container keeps one log), truncated otherwise. Like
    /// [`Self::start`], the child dies with the test binary.
    pub fn start_command(
        name: &str,
        mut command: Command,
        log_path: PathBuf,
        append: bool,
    ) -> Result<Self, ProcessError> {
        let log_err = |source| ProcessError::Log {
            path: log_path.clone(),
            source,
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(&log_path)
            .map_err(log_err)?;
        let log2 = log.try_clone().map_err(log_err)?;
        command
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2));
        let program = PathBuf::from(command.get_program());
        let child = spawn(command)?.map_err(|source| ProcessError::Spawn {
            name: name.to_owned(),
            program,
            source,
        })?;
        Ok(Self {
            name: name.to_owned(),
            child,
            log_path,
            exit: None,
        })
    }

    /// The component name (e.g. `kube-apiserver`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The OS process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Where stdout and stderr go.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// `Some(status)` once the process has exited (does not block).
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
        }
        self.exit
    }

    /// Sends SIGTERM (unless the process has already exited).
    pub fn signal_term(&mut self) {
        self.signal(Signal::SIGTERM);
    }

    /// Sends `signal` (unless the process has already exited).
    pub fn signal(&mut self, signal: Signal) {
        if self.exit_status().is_none()
            && let Ok(pid) = i32::try_from(self.child.id())
        {
            let _ = kill(Pid::from_raw(pid), signal);
        }
    }

    /// SIGKILLs the process (unless it has already exited) and reaps it.
    pub fn kill(&mut self) {
        if self.exit_status().is_none() {
            let _ = self.child.kill();
            self.exit = self.child.wait().ok();
        }
    }

    /// Waits until the process exits or `deadline` passes, then SIGKILLs and reaps it.
    pub fn wait_or_kill(&mut self, deadline: Instant) {
        while self.exit_status().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
    }

    /// SIGTERM, up to `grace` to exit, then SIGKILL.
    pub fn stop(&mut self, grace: Duration) {
        self.signal_term();
        self.wait_or_kill(Instant::now() + grace);
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log_path, lines)
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        if self.exit_status().is_none() {
            self.stop(Duration::from_secs(2));
        }
    }
}

/// The last `lines` lines of the file at `path` (reads at most the last 256 KiB).
pub fn log_tail(path: &Path, lines: usize) -> String {
    const MAX: u64 = 256 * 1024;
    let read = || -> std::io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(MAX)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}
