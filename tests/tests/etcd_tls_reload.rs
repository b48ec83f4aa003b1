//! What a running etcd member re-reads when its certificate files are replaced on disk the way
//! the kubelet updates a Secret volume (`NAME -> ..data/NAME`, `..data` swapped atomically to a
//! new timestamped directory), for every supported etcd line, so that a change of behaviour in
//! a new etcd version is noticed (`hack/measure-tls-reload.sh` measures the same and the peer
//! port too, with openssl):
//!
//! - (a) `--cert-file/--key-file`: does a new client handshake get the new server certificate?
//!   Without SNI (a client dialing an IP address, as the operator does when it verifies an IP)
//!   3.3 and later re-read the files on every handshake; 3.2.13 only when the client sends a
//!   server name (its `tls.Config.Certificates` holds the first pair, and Go calls
//!   `GetCertificate` only when that is empty or SNI is present; fixed in 3.3).
//! - (c) `--trusted-ca-file` with `--client-cert-auth`: no line re-reads it: a client
//!   certificate of a CA added to the file is refused until a restart, one of a CA removed from
//!   it is still accepted (the pool is built once, `ServerConfig().ClientCAs`).
//!
//! Each test starts one member over TLS on loopback, swaps its server certificate to one of a
//! second CA and its CA file to the bundle of both, then to the second CA only, and tells which
//! certificate a handshake got by which CA the client trusts. Expected-false outcomes are
//! observed for [`RELOAD_WAIT`] after the files changed (an expected-true one of the same step
//! shows the member had read the new files by then).
//!
//! Run: `cargo test -p etcd-tests --test etcd_tls_reload` (needs `hack/build-tools.sh`).

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use etcd_controller::etcd_tls::{MemberTls, connect};
use etcd_tests::ports::free_ports;
use etcd_tests::process::ManagedProcess;
use etcd_tests::{CertificateAuthority, IssuedCert, Tools, poll_until};

/// One call (connect, handshake, member list).
const CALL: Duration = Duration::from_secs(3);
/// The member answering after its start.
const READY: Duration = Duration::from_secs(60);
/// How long a swap is given to take effect.
const RELOAD_WAIT: Duration = Duration::from_secs(3);

/// What a line does when the files are swapped under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reload {
    /// (a) a new handshake without SNI gets the new server certificate.
    server_leaf_without_sni: bool,
    /// (a) a new handshake with SNI (`localhost`) gets the new server certificate.
    server_leaf_with_sni: bool,
    /// (c) a client certificate of the CA added to `--trusted-ca-file` is accepted.
    client_ca_added: bool,
    /// (c) a client certificate of the CA removed from `--trusted-ca-file` is refused.
    client_ca_removed: bool,
}

/// 3.3 and later: the server certificate on every handshake, the CA file never.
const LEAF_ONLY: Reload = Reload {
    server_leaf_without_sni: true,
    server_leaf_with_sni: true,
    client_ca_added: false,
    client_ca_removed: false,
};

/// 3.2.13: the server certificate only for handshakes that carry SNI, the CA file never.
const LEAF_WITH_SNI_ONLY: Reload = Reload {
    server_leaf_without_sni: false,
    ..LEAF_ONLY
};

/// A directory written as the kubelet writes a Secret volume (its `AtomicWriter`): each
/// generation in its own `..N` directory, `..data` pointing at the current one (replaced by a
/// rename), every file a symlink `NAME -> ..data/NAME`; the previous generation is removed.
struct SecretVolume {
    dir: PathBuf,
    generation: u32,
}

impl SecretVolume {
    fn new(dir: PathBuf) -> anyhow::Result<Self> {
        fs::create_dir_all(&dir)?;
        Ok(Self { dir, generation: 0 })
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn publish(&mut self, files: &[(&str, &str)]) -> anyhow::Result<()> {
        self.generation += 1;
        let generation = format!("..2026_01_01_00_00_00.{}", self.generation);
        let new = self.dir.join(&generation);
        fs::create_dir(&new)?;
        for (name, contents) in files {
            fs::write(new.join(name), contents)?;
        }
        let data = self.dir.join("..data");
        let previous = fs::read_link(&data).ok();
        let tmp = self.dir.join("..data_tmp");
        symlink(&generation, &tmp)?;
        fs::rename(&tmp, &data).context("swapping ..data")?;
        for (name, _) in files {
            let link = self.dir.join(name);
            if fs::symlink_metadata(&link).is_err() {
                symlink(Path::new("..data").join(name), &link)?;
            }
        }
        if let Some(previous) = previous {
            fs::remove_dir_all(self.dir.join(previous))?;
        }
        Ok(())
    }
}

/// One member on loopback, its certificates in a [`SecretVolume`]; killed on drop, before its
/// directory goes.
struct Member {
    process: ManagedProcess,
    endpoint: String,
    volume: SecretVolume,
    _dir: tempfile::TempDir,
}

fn start_member(version: &str, files: &[(&str, &str)]) -> anyhow::Result<Member> {
    let etcd = Tools::from_env()?.etcd(version)?;
    let dir = tempfile::tempdir()?;
    let mut volume = SecretVolume::new(dir.path().join("tls"))?;
    volume.publish(files)?;
    let [client_port, peer_port] = free_ports()?;
    let endpoint = format!("https://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let args = vec![
        "--name=m0".to_owned(),
        format!("--data-dir={}", dir.path().join("data").display()),
        format!("--listen-client-urls={endpoint}"),
        format!("--advertise-client-urls={endpoint}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster=m0={peer}"),
        format!("--cert-file={}", volume.path("server.crt")),
        format!("--key-file={}", volume.path("server.key")),
        format!("--trusted-ca-file={}", volume.path("ca.crt")),
        "--client-cert-auth".to_owned(),
    ];
    let process = ManagedProcess::start("etcd", &etcd, &args, dir.path().join("etcd.log"))?;
    Ok(Member {
        process,
        endpoint,
        volume,
        _dir: dir,
    })
}

/// A client trusting `ca_pem`, presenting `client`, verifying `server_name` (an IP address:
/// no SNI is sent; a DNS name: it is).
fn client(ca_pem: &str, client: &IssuedCert, server_name: &str) -> anyhow::Result<MemberTls> {
    Ok(MemberTls::new(
        ca_pem.as_bytes(),
        client.cert_pem.as_bytes(),
        client.key_pem.as_bytes(),
        server_name,
    )?)
}

/// Whether a member list through a new connection with `tls` succeeds (etcd refuses a client
/// certificate after the handshake completed on the client's side, so a call is made).
async fn works(member: &Member, tls: &MemberTls) -> bool {
    match connect(&member.endpoint, tls, CALL).await {
        Ok(mut client) => client.member_list().await.is_ok(),
        Err(_) => false,
    }
}

/// Whether `works` gives `want` within [`RELOAD_WAIT`].
async fn becomes(member: &Member, tls: &MemberTls, want: bool) -> bool {
    let deadline = Instant::now() + RELOAD_WAIT;
    loop {
        if works(member, tls).await == want {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn measure(version: &str) -> anyhow::Result<Reload> {
    let ca1 = CertificateAuthority::new("tls-reload-ca1")?;
    let ca2 = CertificateAuthority::new("tls-reload-ca2")?;
    let sans = ["localhost", "127.0.0.1"];
    let (old_leaf, new_leaf) = (ca1.issue_peer_cert(&sans)?, ca2.issue_peer_cert(&sans)?);
    let (client1, client2) = (
        ca1.issue_client_cert("client-ca1", &[])?,
        ca2.issue_client_cert("client-ca2", &[])?,
    );
    let (ca1_pem, ca2_pem) = (ca1.cert_pem(), ca2.cert_pem());
    let both = format!("{ca1_pem}{ca2_pem}");

    let mut member = start_member(
        version,
        &[
            ("server.crt", &old_leaf.cert_pem),
            ("server.key", &old_leaf.key_pem),
            ("ca.crt", ca1_pem),
        ],
    )?;
    let old = client(ca1_pem, &client1, "127.0.0.1")?;
    let ready = poll_until(
        &format!("etcd {version} at {}", member.endpoint),
        READY,
        || async { Ok::<_, String>(works(&member, &old).await.then_some(())) },
    )
    .await;
    if let Err(e) = ready {
        bail!("{e}\netcd log:\n{}", member.process.log_tail(30));
    }
    // What it was started with is what it serves and enforces.
    let new_leaf_no_sni = client(ca2_pem, &client1, "127.0.0.1")?;
    let new_leaf_sni = new_leaf_no_sni.with_server_name("localhost")?;
    let second_ca_client = client(&both, &client2, "localhost")?;
    let first_ca_client = client(&both, &client1, "localhost")?;
    let old_sni = old.with_server_name("localhost")?;
    for (what, tls, want) in [
        ("the first leaf, no SNI", &old, true),
        ("the first leaf, SNI", &old_sni, true),
        ("the second leaf, SNI", &new_leaf_sni, false),
        ("a client of the second CA", &second_ca_client, false),
        ("a client of the first CA", &first_ca_client, true),
    ] {
        if works(&member, tls).await != want {
            bail!("etcd {version} before any swap: {what} works: {}", !want);
        }
    }

    // 1: a leaf of the second CA; the CA file the bundle of both.
    member.volume.publish(&[
        ("server.crt", &new_leaf.cert_pem),
        ("server.key", &new_leaf.key_pem),
        ("ca.crt", &both),
    ])?;
    let server_leaf_with_sni = becomes(&member, &new_leaf_sni, true).await;
    let server_leaf_without_sni = becomes(&member, &new_leaf_no_sni, true).await;
    let client_ca_added = becomes(&member, &second_ca_client, true).await;
    // 2: the CA file holds the second CA only.
    member.volume.publish(&[
        ("server.crt", &new_leaf.cert_pem),
        ("server.key", &new_leaf.key_pem),
        ("ca.crt", ca2_pem),
    ])?;
    let client_ca_removed = becomes(&member, &first_ca_client, false).await;
    Ok(Reload {
        server_leaf_without_sni,
        server_leaf_with_sni,
        client_ca_added,
        client_ca_removed,
    })
}

async fn check(version: &str, expected: Reload) -> anyhow::Result<()> {
    let measured = measure(version).await?;
    println!("etcd {version}: {measured:?}");
    if measured != expected {
        bail!(
            "etcd {version} reloads its TLS files differently than it did when this test was \
             written (hack/measure-tls-reload.sh shows the whole picture):\n  measured \
             {measured:?}\n  expected {expected:?}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn etcd_3_2_reloads_its_server_certificate_for_sni_only() -> anyhow::Result<()> {
    check("3.2.13", LEAF_WITH_SNI_ONLY).await
}

#[tokio::test]
async fn etcd_3_3_reloads_its_server_certificate_not_its_ca() -> anyhow::Result<()> {
    check("3.3.27", LEAF_ONLY).await
}

#[tokio::test]
async fn etcd_3_4_reloads_its_server_certificate_not_its_ca() -> anyhow::Result<()> {
    check("3.4.45", LEAF_ONLY).await
}

#[tokio::test]
async fn etcd_3_5_reloads_its_server_certificate_not_its_ca() -> anyhow::Result<()> {
    check("3.5.35", LEAF_ONLY).await
}

#[tokio::test]
async fn etcd_3_6_reloads_its_server_certificate_not_its_ca() -> anyhow::Result<()> {
    check("3.6.16", LEAF_ONLY).await
}

#[tokio::test]
async fn etcd_3_7_reloads_its_server_certificate_not_its_ca() -> anyhow::Result<()> {
    check("3.7.3", LEAF_ONLY).await
}
