//! A real S3 server for the backup and restore tests: the Versity S3 Gateway (`versitygw`,
//! built by `hack/build-tools.sh` from the Go module proxy) over a POSIX directory, on a free
//! loopback port, with a fresh access key and secret. SigV4 signing, buckets, multipart uploads
//! and object metadata are the server's own; nothing is faked.
//!
//! Buckets are made with the S3 API's `CreateBucket` (a signed `PUT /BUCKET`), the way a user's
//! `aws s3 mb` would.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::ports::free_ports;
use crate::process::{ManagedProcess, ProcessError};
use crate::tools::{Tools, ToolsError};

/// Errors while starting or using the S3 server.
#[derive(Debug, thiserror::Error)]
pub enum S3Error {
    /// `versitygw` is not built.
    #[error(transparent)]
    Tool(#[from] ToolsError),
    /// A directory or port could not be had.
    #[error("preparing the S3 server: {0}")]
    Io(#[from] std::io::Error),
    /// The process did not start.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// The server did not answer in time or exited.
    #[error("the S3 server did not start: {reason}\n{log}")]
    NotReady {
        /// What was seen last.
        reason: String,
        /// The end of its log.
        log: String,
    },
    /// A bucket could not be made.
    #[error("creating bucket {bucket}: {message}")]
    Bucket {
        /// The bucket.
        bucket: String,
        /// The server's answer.
        message: String,
    },
}

/// A running S3 server.
pub struct S3Server {
    process: ManagedProcess,
    endpoint: String,
    port: u16,
    access_key: String,
    secret_key: String,
    root: PathBuf,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for S3Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Server")
            .field("endpoint", &self.endpoint)
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

/// The region the server and its clients use.
pub const REGION: &str = "us-east-1";

fn random_token(len: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id()).rotate_left(32);
    (0..len)
        .map(|_| {
            // xorshift: unpredictable enough for a test server's throwaway key.
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ALPHABET[(seed % ALPHABET.len() as u64) as usize] as char
        })
        .collect()
}

impl S3Server {
    /// Starts `versitygw posix` on a free port of `bind` (an IP of this host, e.g.
    /// `127.0.0.1` or the pod network's node IP) with a fresh key pair.
    pub async fn start(tools: &Tools, bind: &str) -> Result<Self, S3Error> {
        let binary = tools.versitygw()?;
        let dir = tempfile::Builder::new()
            .prefix("etcd-operator-s3-")
            .tempdir()?;
        let root = dir.path().join("data");
        std::fs::create_dir_all(&root)?;
        let [port] = free_ports::<1>()?;
        let access_key = format!("AK{}", random_token(18));
        let secret_key = random_token(40);
        let args = vec![
            "--access".to_string(),
            access_key.clone(),
            "--secret".to_string(),
            secret_key.clone(),
            "--region".to_string(),
            REGION.to_string(),
            "--port".to_string(),
            format!("{bind}:{port}"),
            "posix".to_string(),
            root.display().to_string(),
        ];
        let process =
            ManagedProcess::start("versitygw", &binary, &args, dir.path().join("s3.log"))?;
        let mut server = S3Server {
            process,
            endpoint: format!("http://{bind}:{port}"),
            port,
            access_key,
            secret_key,
            root,
            _dir: dir,
        };
        server.wait_ready(bind).await?;
        Ok(server)
    }

    async fn wait_ready(&mut self, bind: &str) -> Result<(), S3Error> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let addr = format!("{bind}:{}", self.port);
        loop {
            if let Some(status) = self.process.exit_status() {
                return Err(S3Error::NotReady {
                    reason: format!("versitygw exited: {status}"),
                    log: self.process.log_tail(30),
                });
            }
            match tokio::net::TcpStream::connect(&addr).await {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(S3Error::NotReady {
                        reason: format!("{addr}: {e}"),
                        log: self.process.log_tail(30),
                    });
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// `http://HOST:PORT`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The access key id.
    pub fn access_key(&self) -> &str {
        &self.access_key
    }

    /// The secret access key.
    pub fn secret_key(&self) -> &str {
        &self.secret_key
    }

    /// The AWS shared `credentials` file for this server's key pair (profile `default`), as a
    /// CoreOS `awsSecret` holds it.
    pub fn credentials_file(&self) -> String {
        format!(
            "[default]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
            self.access_key, self.secret_key
        )
    }

    /// The AWS shared `config` file (profile `default`, the server's region).
    pub fn config_file(&self) -> String {
        format!("[default]\nregion = {REGION}\n")
    }

    /// The directory objects are stored in (`ROOT/BUCKET/KEY`): where a test corrupts one.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file holding `bucket`/`key`.
    pub fn object_file(&self, bucket: &str, key: &str) -> PathBuf {
        self.root.join(bucket).join(key)
    }

    /// The end of the server's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// Makes a bucket through the S3 API (`CreateBucket`), the way `aws s3 mb` would: a
    /// request presigned with SigV4 by the `rusty-s3` crate (`object_store`, which signs every
    /// object call of the operator, has no bucket calls).
    pub async fn create_bucket(&self, bucket: &str) -> Result<(), S3Error> {
        use rusty_s3::{Bucket, Credentials, S3Action as _, UrlStyle};
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let fail = |message: String| S3Error::Bucket {
            bucket: bucket.to_string(),
            message,
        };
        let endpoint = self.endpoint.parse().map_err(|e| fail(format!("{e}")))?;
        let target = Bucket::new(endpoint, UrlStyle::Path, bucket.to_string(), REGION)
            .map_err(|e| fail(e.to_string()))?;
        let credentials = Credentials::new(self.access_key.clone(), self.secret_key.clone());
        let url = target
            .create_bucket(&credentials)
            .sign(Duration::from_secs(300));
        let host = format!("{}:{}", url.host_str().unwrap_or("127.0.0.1"), self.port);
        let path = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_string(),
        };
        let request = format!(
            "PUT {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let mut stream = tokio::net::TcpStream::connect(&host)
            .await
            .map_err(|e| fail(e.to_string()))?;
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| fail(e.to_string()))?;
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
            .await
            .map_err(|_| fail("no answer in 10 s".into()))?
            .map_err(|e| fail(e.to_string()))?;
        let text = String::from_utf8_lossy(&answer);
        if text.starts_with("HTTP/1.1 200") {
            Ok(())
        } else {
            Err(fail(text.chars().take(600).collect()))
        }
    }
}
