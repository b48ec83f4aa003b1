//! The kubelet's own log: one timestamped line per event (pod started, container exited,
//! probe verdicts, API errors), in `<kubelet dir>/kubelet.log`, shown in failure reports.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use k8s_openapi::jiff::Timestamp;

/// A shared, append-only log file. Cheap to clone; write errors are ignored (a log must not
/// fail the kubelet).
#[derive(Debug, Clone)]
pub struct KubeletLog {
    file: Arc<Mutex<File>>,
    path: PathBuf,
}

impl KubeletLog {
    /// Creates (truncates) the log at `path`.
    pub fn create(path: &Path) -> std::io::Result<Self> {
        Ok(Self {
            file: Arc::new(Mutex::new(File::create(path)?)),
            path: path.to_owned(),
        })
    }

    /// Appends one line.
    pub fn line(&self, args: std::fmt::Arguments<'_>) {
        let mut file = self
            .file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = writeln!(file, "{} {args}", Timestamp::now());
    }

    /// The log file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
