//! The one helm runner of the harness: the pinned Helm 3 or Helm 4 (see [`HelmMajor`]) with
//! its own config, cache and data directories (nothing in `$HOME`), talking to a control
//! plane. The chart suites, the `installed` suite and the demo all run helm through [`Helm`].

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use tokio::io::AsyncWriteExt as _;

use crate::control_plane::ControlPlane;
use crate::tools::{Tools, ToolsError};

/// A major version of Helm the chart supports; each has a pin in `hack/versions.env`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HelmMajor {
    /// Helm 3 (`HELM_VERSION`).
    V3,
    /// Helm 4 (`HELM4_VERSION`).
    V4,
}

impl HelmMajor {
    /// Every major the chart is tested with, oldest first.
    pub const ALL: [HelmMajor; 2] = [HelmMajor::V3, HelmMajor::V4];

    /// The major version number (3 or 4).
    pub fn number(self) -> u32 {
        match self {
            HelmMajor::V3 => 3,
            HelmMajor::V4 => 4,
        }
    }

    /// A suffix for test names: `with_helm_3`, `with_helm_4`.
    pub fn test_suffix(self) -> String {
        format!("with_helm_{}", self.number())
    }
}

impl std::fmt::Display for HelmMajor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Helm {}", self.number())
    }
}

/// Why a helm command failed.
#[derive(Debug, thiserror::Error)]
pub enum HelmError {
    /// helm is not in the tool cache.
    #[error(transparent)]
    Tools(#[from] ToolsError),
    /// helm's home directory could not be made, or a values file written.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// helm could not be started or waited for.
    #[error("running {command}: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// helm exited with an error.
    #[error("{command} failed ({status}):\n{stderr}\n{stdout}")]
    Failed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed on stderr.
        stderr: String,
        /// What it printed on stdout.
        stdout: String,
    },
    /// helm succeeded where it should have failed.
    #[error("{command} succeeded but should have failed:\n{stdout}")]
    Succeeded {
        /// The command line.
        command: String,
        /// What it printed on stdout.
        stdout: String,
    },
}

/// Where helm's config, cache and data directories live.
#[derive(Debug)]
enum Home {
    /// A directory of its own, removed on drop.
    Temp(tempfile::TempDir),
    /// A directory owned by someone else (the control plane's).
    Dir(PathBuf),
}

/// The pinned helm of one major, with its own home, optionally talking to a control plane.
#[derive(Debug)]
pub struct Helm {
    major: HelmMajor,
    bin: PathBuf,
    kubeconfig: Option<PathBuf>,
    home: Home,
}

impl Helm {
    /// The pinned helm of `major` against `cp`, with a fresh home directory.
    pub fn new(cp: &ControlPlane, major: HelmMajor) -> Result<Self, HelmError> {
        let mut helm = Self::offline(cp.tools(), major)?;
        helm.kubeconfig = Some(cp.kubeconfig_path().to_owned());
        Ok(helm)
    }

    /// The pinned helm of `major` against `cp`, its home under the control plane's directory
    /// (`helm/`), which lives as long as the control plane.
    pub fn in_control_plane_dir(cp: &ControlPlane, major: HelmMajor) -> Result<Self, HelmError> {
        Ok(Self {
            major,
            bin: cp.tools().helm_major(major)?,
            kubeconfig: Some(cp.kubeconfig_path().to_owned()),
            home: Home::Dir(cp.dir().join(format!("helm{}", major.number()))),
        })
    }

    /// The pinned helm of `major` with no cluster (for `lint`, `template`, `version`).
    pub fn offline(tools: &Tools, major: HelmMajor) -> Result<Self, HelmError> {
        let bin = tools.helm_major(major)?;
        let home = tempfile::Builder::new()
            .prefix("etcd-tests-helm-")
            .tempdir()
            .map_err(|source| HelmError::Io {
                what: "creating helm's home directory".into(),
                source,
            })?;
        Ok(Self {
            major,
            bin,
            kubeconfig: None,
            home: Home::Temp(home),
        })
    }

    /// Which major this is.
    pub fn major(&self) -> HelmMajor {
        self.major
    }

    /// The helm binary.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// helm's home directory (config, cache and data are below it).
    pub fn home(&self) -> &Path {
        match &self.home {
            Home::Temp(dir) => dir.path(),
            Home::Dir(dir) => dir,
        }
    }

    /// `helm [--kubeconfig K] ARGS...` with helm's directories in its home and no
    /// `HELM_NAMESPACE`/`HELM_KUBECONTEXT` from the environment; not started.
    pub fn command<I, S>(&self, args: I) -> tokio::process::Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = tokio::process::Command::new(&self.bin);
        let home = self.home();
        command
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .env_remove("HELM_NAMESPACE")
            .env_remove("HELM_KUBECONTEXT")
            .env_remove("KUBECONFIG");
        if let Some(kubeconfig) = &self.kubeconfig {
            command.arg("--kubeconfig").arg(kubeconfig);
        }
        command.args(args);
        command
    }

    /// Runs `helm ARGS...`: its stdout, or [`HelmError::Failed`] with its stderr.
    pub async fn run<I, S>(&self, args: I) -> Result<String, HelmError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        run_ok(self.command(args), None).await
    }

    /// Runs `helm ARGS...`, which must fail: its stderr, or [`HelmError::Succeeded`].
    pub async fn run_failing<I, S>(&self, args: I) -> Result<String, HelmError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        run_failing(self.command(args)).await
    }

    /// Writes `yaml` to a values file in helm's home and returns its path.
    pub fn values_file(&self, name: &str, yaml: &str) -> Result<PathBuf, HelmError> {
        let path = self.home().join(name);
        let io = |source| HelmError::Io {
            what: format!("writing {}", path.display()),
            source,
        };
        std::fs::create_dir_all(self.home()).map_err(io)?;
        std::fs::write(&path, yaml).map_err(io)?;
        Ok(path)
    }
}

/// `program arg...` of a command, for messages (the program's file name only).
pub fn describe(command: &tokio::process::Command) -> String {
    let std = command.as_std();
    let args: Vec<String> = std
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    format!(
        "{} {}",
        Path::new(std.get_program())
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        args.join(" ")
    )
}

/// Runs `command` (feeding `stdin` if given) and returns its output, whatever the exit status.
pub async fn output(
    mut command: tokio::process::Command,
    stdin: Option<&[u8]>,
) -> Result<Output, HelmError> {
    let what = describe(&command);
    let spawn = |source| HelmError::Spawn {
        command: what.clone(),
        source,
    };
    command
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(spawn)?;
    if let Some(input) = stdin
        && let Some(mut pipe) = child.stdin.take()
    {
        pipe.write_all(input).await.map_err(spawn)?;
        drop(pipe);
    }
    child.wait_with_output().await.map_err(spawn)
}

/// Runs `command` and returns its stdout; fails with its stderr unless it exits 0.
pub async fn run_ok(
    command: tokio::process::Command,
    stdin: Option<&[u8]>,
) -> Result<String, HelmError> {
    let what = describe(&command);
    let out = output(command, stdin).await?;
    if !out.status.success() {
        return Err(HelmError::Failed {
            command: what,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `command`, expects it to fail, and returns its stderr.
pub async fn run_failing(command: tokio::process::Command) -> Result<String, HelmError> {
    let what = describe(&command);
    let out = output(command, None).await?;
    if out.status.success() {
        return Err(HelmError::Succeeded {
            command: what,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stderr).into_owned())
}
