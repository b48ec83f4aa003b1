//! A real Google Cloud Storage server for the backup and restore tests: fake-gcs-server (built
//! by `hack/build-tools.sh` from the Go module proxy) over a directory, on a free loopback
//! port, plain HTTP. The operator reaches it as CoreOS' `gcpSecret` with a `credentials.json`
//! whose `gcs_base_url` names the server and whose `disable_oauth` skips Google's token
//! service (both read by `object_store`'s service-account key).
//!
//! Buckets are made with the JSON API's `buckets.insert` (`POST /storage/v1/b`), the way
//! `gcloud storage buckets create` would.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::ports::free_ports;
use crate::process::{ManagedProcess, ProcessError};
use crate::tools::{Tools, ToolsError};

/// Errors while starting or using an object store server (GCS or Azure Blob Storage).
#[derive(Debug, thiserror::Error)]
pub enum StoreServerError {
    /// The server is not built.
    #[error(transparent)]
    Tool(#[from] ToolsError),
    /// A directory or port could not be had.
    #[error("preparing the server: {0}")]
    Io(#[from] std::io::Error),
    /// The process did not start.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// The server did not answer in time or exited.
    #[error("{server} did not start: {reason}\n{log}")]
    NotReady {
        /// Which server.
        server: &'static str,
        /// What was seen last.
        reason: String,
        /// The end of its log.
        log: String,
    },
    /// A bucket or container could not be made.
    #[error("creating {bucket}: {message}")]
    Bucket {
        /// The bucket or container.
        bucket: String,
        /// The server's answer.
        message: String,
    },
}

/// Waits until `addr` accepts connections, or the process exits, for 30 s at most.
pub(crate) async fn wait_listening(
    server: &'static str,
    process: &mut ManagedProcess,
    addr: &str,
) -> Result<(), StoreServerError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = process.exit_status() {
            return Err(StoreServerError::NotReady {
                server,
                reason: format!("exited: {status}"),
                log: process.log_tail(30),
            });
        }
        match tokio::net::TcpStream::connect(addr).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                return Err(StoreServerError::NotReady {
                    server,
                    reason: format!("{addr}: {e}"),
                    log: process.log_tail(30),
                });
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Sends one HTTP/1.1 request (`Connection: close`) to `addr`; the whole answer as text.
pub(crate) async fn raw_http(addr: &str, request: &str) -> Result<String, String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .map_err(|_| "no answer in 10 s".to_string())?
        .map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// A running fake-gcs-server.
pub struct GcsServer {
    process: ManagedProcess,
    base_url: String,
    addr: String,
    root: PathBuf,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for GcsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GcsServer")
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

impl GcsServer {
    /// Starts fake-gcs-server on a free port of `bind` (an IP of this host), its objects in a
    /// fresh directory.
    pub async fn start(tools: &Tools, bind: &str) -> Result<Self, StoreServerError> {
        let binary = tools.fake_gcs_server()?;
        let dir = tempfile::Builder::new()
            .prefix("etcd-operator-gcs-")
            .tempdir()?;
        let root = dir.path().join("data");
        std::fs::create_dir_all(&root)?;
        let [port] = free_ports::<1>()?;
        let args: Vec<String> = [
            "-scheme",
            "http",
            "-host",
            bind,
            "-port",
            &port.to_string(),
            // Requests name the server by its IP: the XML API's routes match that host.
            "-public-host",
            bind,
            "-backend",
            "filesystem",
            "-filesystem-root",
            &root.display().to_string(),
            "-log-level",
            "warn",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut process = ManagedProcess::start(
            "fake-gcs-server",
            &binary,
            &args,
            dir.path().join("gcs.log"),
        )?;
        let addr = format!("{bind}:{port}");
        wait_listening("fake-gcs-server", &mut process, &addr).await?;
        Ok(GcsServer {
            process,
            base_url: format!("http://{addr}"),
            addr,
            root,
            _dir: dir,
        })
    }

    /// `http://HOST:PORT`.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// CoreOS' `gcpSecret` key `credentials.json` for this server: a service-account key whose
    /// `gcs_base_url` is the server and whose `disable_oauth` skips the token exchange.
    pub fn credentials_json(&self) -> String {
        format!(
            r#"{{"type": "service_account", "client_email": "backup@etcd-operator.test", "private_key": "", "private_key_id": "", "gcs_base_url": "{}", "disable_oauth": true}}"#,
            self.base_url
        )
    }

    /// The directory objects are stored in.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The end of the server's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// Makes a bucket through the JSON API (`POST /storage/v1/b`).
    pub async fn create_bucket(&self, bucket: &str) -> Result<(), StoreServerError> {
        let body = format!(r#"{{"name": "{bucket}"}}"#);
        let request = format!(
            "POST /storage/v1/b HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        let answer =
            raw_http(&self.addr, &request)
                .await
                .map_err(|message| StoreServerError::Bucket {
                    bucket: bucket.to_string(),
                    message,
                })?;
        if answer.starts_with("HTTP/1.1 200") {
            Ok(())
        } else {
            Err(StoreServerError::Bucket {
                bucket: bucket.to_string(),
                message: answer.chars().take(600).collect(),
            })
        }
    }
}
