//! A real Azure Blob Storage server for the backup and restore tests: Azurite (Microsoft's
//! emulator, installed from the npm registry by `hack/build-tools.sh`), its Blob service alone,
//! on a free loopback port, its data in a fresh directory, with the emulator's well-known
//! account `devstoreaccount1` addressed path-style (`http://HOST:PORT/devstoreaccount1`).
//! Shared Key signatures and user metadata are Azurite's own checks.
//!
//! Containers are made with the Blob API's `Create Container` (`PUT
//! /ACCOUNT/CONTAINER?restype=container`), signed with the account's Shared Key as
//! `az storage container create` would.

use std::path::PathBuf;

use base64::Engine as _;
use sha2::{Digest as _, Sha256};

use crate::gcs::{StoreServerError, raw_http, wait_listening};
use crate::ports::free_ports;
use crate::process::ManagedProcess;
use crate::tools::Tools;

/// The emulator's well-known account (Azurite's documentation).
pub const ACCOUNT: &str = "devstoreaccount1";
/// The well-known account's key (base64; Azurite's documentation).
pub const ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// A running Azurite Blob service.
pub struct AzuriteServer {
    process: ManagedProcess,
    addr: String,
    location: PathBuf,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for AzuriteServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzuriteServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// HMAC-SHA-256 (RFC 2104), what a Shared Key signature is.
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > block.len() {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    inner.update(message);
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

impl AzuriteServer {
    /// Starts `azurite-blob` on a free port of `bind` (an IP of this host), its data in a fresh
    /// directory, telemetry off.
    pub async fn start(tools: &Tools, bind: &str) -> Result<Self, StoreServerError> {
        let binary = tools.azurite_blob()?;
        let dir = tempfile::Builder::new()
            .prefix("etcd-operator-abs-")
            .tempdir()?;
        let location = dir.path().join("data");
        std::fs::create_dir_all(&location)?;
        let [port] = free_ports::<1>()?;
        let args: Vec<String> = [
            "--blobHost",
            bind,
            "--blobPort",
            &port.to_string(),
            "--location",
            &location.display().to_string(),
            "--disableTelemetry",
            // object_store speaks a newer Blob API version than Azurite declares.
            "--skipApiVersionCheck",
            "--silent",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut process =
            ManagedProcess::start("azurite", &binary, &args, dir.path().join("azurite.log"))?;
        let addr = format!("{bind}:{port}");
        wait_listening("azurite", &mut process, &addr).await?;
        Ok(AzuriteServer {
            process,
            addr,
            location,
            _dir: dir,
        })
    }

    /// The Blob service of the well-known account, path-style:
    /// `http://HOST:PORT/devstoreaccount1` (the `abs.endpoint` of a source).
    pub fn endpoint(&self) -> String {
        format!("http://{}/{ACCOUNT}", self.addr)
    }

    /// Where Azurite keeps its data.
    pub fn location(&self) -> &std::path::Path {
        &self.location
    }

    /// The end of the server's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// Makes a container with `Create Container`, signed with the account's Shared Key.
    pub async fn create_container(&self, container: &str) -> Result<(), StoreServerError> {
        let fail = |message: String| StoreServerError::Bucket {
            bucket: container.to_string(),
            message,
        };
        // RFC 1123, as HTTP dates are written: `Sat, 05 Dec 2026 05:19:25 GMT`.
        let now = time::OffsetDateTime::now_utc();
        let date = format!(
            "{:.3}, {:02} {:.3} {} {:02}:{:02}:{:02} GMT",
            now.weekday().to_string(),
            now.day(),
            now.month().to_string(),
            now.year(),
            now.hour(),
            now.minute(),
            now.second()
        );
        let version = "2021-08-06";
        // VERB, 11 standard headers (all empty here), canonicalized x-ms-* headers, resource.
        let to_sign = format!(
            "PUT\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{version}\n/{ACCOUNT}/{ACCOUNT}/{container}\nrestype:container"
        );
        let key = base64::engine::general_purpose::STANDARD
            .decode(ACCOUNT_KEY)
            .map_err(|e| fail(e.to_string()))?;
        let signature =
            base64::engine::general_purpose::STANDARD.encode(hmac_sha256(&key, to_sign.as_bytes()));
        let request = format!(
            "PUT /{ACCOUNT}/{container}?restype=container HTTP/1.1\r\nHost: {}\r\nx-ms-date: {date}\r\nx-ms-version: {version}\r\nAuthorization: SharedKey {ACCOUNT}:{signature}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.addr
        );
        let answer = raw_http(&self.addr, &request).await.map_err(fail)?;
        if answer.starts_with("HTTP/1.1 201") {
            Ok(())
        } else {
            Err(fail(answer.chars().take(800).collect()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4231, test case 2.
    #[test]
    fn hmac_matches_the_rfc_vector() {
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
