//! The images `hack/build-images.sh` builds (issue 25, item 1): what each one holds and
//! declares, that a rebuild gives the same digests, and that the operator's images run under
//! runc as a real node runs them: as 65532, on a read-only root filesystem, in a memory
//! cgroup with a limit.
//!
//! Run: `hack/build-images.sh && cargo test -p etcd-tests --test images` (as root: runc). CI
//! builds the images before the tests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use serde_json::{Value, json};

use etcd_tests::real_node::{memory_cgroup, proc_status};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn images_dir() -> PathBuf {
    std::env::var_os("IMAGES_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/images"))
}

/// An image's OCI layout, read.
struct Image {
    layout: PathBuf,
    manifest_digest: String,
    tag: String,
    config: Value,
    layers: Vec<String>,
}

fn blob(layout: &Path, digest: &str) -> PathBuf {
    layout
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"))
}

fn read_json(path: &Path) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "reading {} (build the images first: hack/build-images.sh)",
            path.display()
        )
    })?;
    Ok(serde_json::from_str(&text)?)
}

fn image(name: &str) -> anyhow::Result<Image> {
    let layout = images_dir().join("oci").join(name);
    let index = read_json(&layout.join("index.json"))?;
    let entry = &index["manifests"][0];
    let manifest_digest = entry["digest"].as_str().context("no manifest")?.to_string();
    let tag = entry["annotations"]["org.opencontainers.image.ref.name"]
        .as_str()
        .context("no tag")?
        .to_string();
    let manifest = read_json(&blob(&layout, &manifest_digest))?;
    let config = read_json(&blob(
        &layout,
        manifest["config"]["digest"].as_str().context("no config")?,
    ))?;
    let layers = manifest["layers"]
        .as_array()
        .context("no layers")?
        .iter()
        .filter_map(|l| l["digest"].as_str().map(str::to_string))
        .collect();
    Ok(Image {
        layout,
        manifest_digest,
        tag,
        config,
        layers,
    })
}

/// Every entry of the image's layers: path to (mode string, owner).
fn entries(image: &Image) -> anyhow::Result<BTreeMap<String, (String, String)>> {
    let mut all = BTreeMap::new();
    for layer in &image.layers {
        let out = Command::new("tar")
            .arg("-tvzf")
            .arg(blob(&image.layout, layer))
            .output()?;
        ensure!(out.status.success(), "tar -t of {layer}");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() >= 6 {
                let path = fields[5].trim_start_matches("./").trim_end_matches('/');
                all.insert(
                    path.to_string(),
                    (fields[0].to_string(), fields[1].to_string()),
                );
            }
        }
    }
    Ok(all)
}

/// The pinned etcd versions (every line), from hack/versions.env.
fn etcd_versions() -> anyhow::Result<Vec<String>> {
    Ok(etcd_tests::Versions::pinned()?.every_etcd())
}

/// The workspace's version, which every crate (the controller's and this one) inherits and the
/// images are tagged with.
fn version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

/// What every image holds: the glibc base, CA certificates, `nonroot` 65532, `/tmp` 1777, no
/// shell, every file owned by root but `nonroot`'s home.
fn check_base(name: &str, files: &BTreeMap<String, (String, String)>) -> anyhow::Result<()> {
    for needed in [
        "lib/x86_64-linux-gnu/libc.so.6",
        "lib/x86_64-linux-gnu/libgcc_s.so.1",
        "lib64/ld-linux-x86-64.so.2",
        "etc/ssl/certs/ca-certificates.crt",
        "etc/passwd",
        "etc/group",
        "usr/share/zoneinfo/UTC",
    ] {
        ensure!(files.contains_key(needed), "{name}: no {needed}");
    }
    for shell in [
        "bin/sh",
        "bin/bash",
        "bin/dash",
        "usr/bin/sh",
        "usr/bin/bash",
    ] {
        ensure!(!files.contains_key(shell), "{name}: has a shell at {shell}");
    }
    ensure!(
        files
            .get("tmp")
            .is_some_and(|(mode, _)| mode == "drwxrwxrwt"),
        "{name}: /tmp {:?}",
        files.get("tmp")
    );
    for (path, (_, owner)) in files {
        let want = if path == "home/nonroot" {
            "65532/65532"
        } else {
            "0/0"
        };
        ensure!(owner == want, "{name}: {path} owned by {owner}");
    }
    Ok(())
}

#[test]
fn the_operators_images_declare_what_the_chart_runs() -> anyhow::Result<()> {
    let version = version();
    for (name, binary, ports, env) in [
        (
            "controller",
            "etcd-controller",
            vec!["8080/tcp", "8081/tcp"],
            None,
        ),
        (
            "webhook",
            "etcd-webhook",
            vec!["9443/tcp", "8080/tcp", "8081/tcp"],
            Some("GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072:glibc.malloc.arena_max=2"),
        ),
    ] {
        let image = image(name)?;
        ensure!(image.tag == version, "{name}: tag {}", image.tag);
        let config = &image.config["config"];
        ensure!(
            config["User"] == "65532:65532",
            "{name}: user {}",
            config["User"]
        );
        ensure!(
            config["Entrypoint"] == json!([format!("/usr/local/bin/{binary}")]),
            "{name}: entrypoint {}",
            config["Entrypoint"]
        );
        let labels = &config["Labels"];
        ensure!(labels["org.opencontainers.image.title"] == binary);
        ensure!(labels["org.opencontainers.image.version"] == version.as_str());
        ensure!(labels["org.opencontainers.image.licenses"] == "Apache-2.0");
        for port in &ports {
            ensure!(
                config["ExposedPorts"].get(port).is_some(),
                "{name}: port {port} not exposed"
            );
        }
        if let Some(env) = env {
            ensure!(
                config["Env"]
                    .as_array()
                    .is_some_and(|e| e.iter().any(|v| v == env)),
                "{name}: env {}",
                config["Env"]
            );
        }
        ensure!(image.config["os"] == "linux" && image.config["architecture"] == "amd64");
        let files = entries(&image)?;
        check_base(name, &files)?;
        let path = format!("usr/local/bin/{binary}");
        ensure!(
            files
                .get(&path)
                .is_some_and(|(mode, _)| mode == "-rwxr-xr-x"),
            "{name}: {path} {:?}",
            files.get(&path)
        );
        // The docker-archive names the image as the chart's default repository does, in the
        // fully qualified form a container runtime resolves it to (`docker.io/` added).
        let listed = Command::new("tar")
            .args(["-xOf"])
            .arg(images_dir().join(format!("{name}.tar")))
            .arg("manifest.json")
            .output()?;
        let archive: Value = serde_json::from_slice(&listed.stdout)?;
        ensure!(
            archive[0]["RepoTags"]
                == json!([format!("docker.io/etcd-operator/{binary}:{version}")]),
            "{name}: docker-archive tags {}",
            archive[0]["RepoTags"]
        );
    }
    Ok(())
}

#[test]
fn every_pinned_etcd_has_its_image_under_the_name_members_run() -> anyhow::Result<()> {
    for v in etcd_versions()? {
        let name = format!("etcd-{v}");
        let image = image(&name)?;
        ensure!(image.tag == format!("v{v}"), "{name}: tag {}", image.tag);
        let config = &image.config["config"];
        ensure!(config["Entrypoint"] == json!(["/usr/local/bin/etcd"]));
        let files = entries(&image)?;
        check_base(&name, &files)?;
        for tool in ["etcd", "etcdctl"] {
            ensure!(
                files.contains_key(&format!("usr/local/bin/{tool}")),
                "{name}: no {tool}"
            );
        }
        // etcdutl ships from 3.5 on (the restore of 3.5+ runs it).
        let minor: u32 = v
            .split('.')
            .nth(1)
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        ensure!(
            files.contains_key("usr/local/bin/etcdutl") == (minor >= 5),
            "{name}: etcdutl presence"
        );
        let listed = Command::new("tar")
            .args(["-xOf"])
            .arg(images_dir().join(format!("{name}.tar")))
            .arg("manifest.json")
            .output()?;
        let archive: Value = serde_json::from_slice(&listed.stdout)?;
        ensure!(archive[0]["RepoTags"] == json!([format!("quay.io/coreos/etcd:v{v}")]));
    }
    Ok(())
}

/// A second build of the same tree gives the same digests, OCI and docker-archive alike.
#[test]
fn a_rebuild_gives_the_same_digests() -> anyhow::Result<()> {
    let again = tempfile::tempdir()?;
    let first_etcd = etcd_versions()?
        .into_iter()
        .next()
        .context("no pinned etcd")?;
    let names = [
        "controller".to_string(),
        format!("etcd-{first_etcd}"),
        "pause".to_string(),
    ];
    let out = Command::new("bash")
        .arg(repo().join("hack/build-images.sh"))
        .arg("--no-build")
        .env("IMAGES", names.join(" "))
        .env("IMAGES_OUT", again.path())
        .output()?;
    ensure!(
        out.status.success(),
        "rebuild: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in &names {
        let first = image(name)?;
        let index = read_json(&again.path().join("oci").join(name).join("index.json"))?;
        ensure!(
            index["manifests"][0]["digest"] == first.manifest_digest.as_str(),
            "{name}: {} then {}",
            first.manifest_digest,
            index["manifests"][0]["digest"]
        );
        let sum = |p: &Path| -> anyhow::Result<String> {
            use sha2::Digest as _;
            Ok(format!("{:x}", sha2::Sha256::digest(std::fs::read(p)?)))
        };
        ensure!(
            sum(&images_dir().join(format!("{name}.tar")))?
                == sum(&again.path().join(format!("{name}.tar")))?,
            "{name}: the docker-archives differ"
        );
    }
    Ok(())
}

/// A runc bundle of `image`, unpacked by umoci (its runtime config carries the image's user),
/// with `args`, a read-only root filesystem, a memory limit and `mounts` (source, destination).
fn bundle(
    image: &Image,
    dir: &Path,
    args: &[&str],
    mounts: &[(&Path, &str)],
    memory_limit: u64,
) -> anyhow::Result<PathBuf> {
    let bundle = dir.join("bundle");
    let out = Command::new("umoci")
        .arg("unpack")
        .arg("--image")
        .arg(format!("{}:{}", image.layout.display(), image.tag))
        .arg(&bundle)
        .output()?;
    ensure!(
        out.status.success(),
        "umoci unpack: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = bundle.join("config.json");
    let mut config = read_json(&path)?;
    config["process"]["args"] = json!(args);
    config["process"]["terminal"] = json!(false);
    config["root"]["readonly"] = json!(true);
    config["linux"]["resources"]["memory"] = json!({ "limit": memory_limit });
    let extra: Vec<Value> = mounts
        .iter()
        .map(|(source, destination)| {
            json!({"destination": destination, "type": "bind", "source": source,
                "options": ["rbind", "ro"]})
        })
        .collect();
    if let Some(list) = config["mounts"].as_array_mut() {
        list.extend(extra);
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&config)?)?;
    Ok(bundle)
}

/// The webhook image under runc, as a node runs its pod: it serves (with a certificate
/// mounted read-only), as 65532, on a read-only root filesystem, inside a 64 MiB memory limit;
/// its real memory is read from the cgroup. The controller image starts and explains itself.
#[test]
fn the_operators_images_run_under_runc_as_65532_read_only() -> anyhow::Result<()> {
    if Command::new("runc").arg("--version").output().is_err() {
        bail!("runc is not installed (Debian: apt-get install -y runc)");
    }
    let limit: u64 = 64 * 1024 * 1024;
    // The controller: --help, and exit 0 (its glibc, its binary, nothing else).
    let controller = image("controller")?;
    let dir = tempfile::tempdir()?;
    let b = bundle(
        &controller,
        dir.path(),
        &["/usr/local/bin/etcd-controller", "--help"],
        &[],
        limit,
    )?;
    let id = format!("etcd-images-controller-{}", std::process::id());
    let out = Command::new("runc")
        .args(["run", "--bundle"])
        .arg(&b)
        .arg(&id)
        .output()?;
    let said = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && said.contains("--kubeconfig"),
        "controller --help under runc: {:?} {said} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );

    // The webhook: runs and serves; as 65532, read-only, limited.
    let webhook = image("webhook")?;
    let dir = tempfile::tempdir()?;
    let certs = dir.path().join("certs");
    std::fs::create_dir_all(&certs)?;
    let ca = etcd_tests::CertificateAuthority::new("images test CA")?;
    ca.issue_serving_cert(&["localhost"])?
        .write_to(&certs, "tls")?;
    // The files must be readable by 65532, as a kubelet's projected secret is (fsGroup).
    for f in ["tls.crt", "tls.key"] {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(certs.join(f), std::fs::Permissions::from_mode(0o644))?;
    }
    let b = bundle(
        &webhook,
        dir.path(),
        &[
            "/usr/local/bin/etcd-webhook",
            "--tls-cert-file=/certs/tls.crt",
            "--tls-private-key-file=/certs/tls.key",
            "--bind-address=127.0.0.1:9443",
            "--metrics-bind-address=127.0.0.1:8080",
            "--health-probe-bind-address=127.0.0.1:8081",
        ],
        &[(&certs, "/certs")],
        limit,
    )?;
    let id = format!("etcd-images-webhook-{}", std::process::id());
    let log = dir.path().join("webhook.log");
    let started = Command::new("runc")
        .args(["run", "--detach", "--bundle"])
        .arg(&b)
        .arg(&id)
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::create(dir.path().join("webhook.err"))?)
        .status()?;
    ensure!(started.success(), "runc run --detach of the webhook");
    let result = (|| -> anyhow::Result<()> {
        let state = Command::new("runc").args(["state", &id]).output()?;
        let state: Value = serde_json::from_slice(&state.stdout)?;
        let pid = u32::try_from(state["pid"].as_u64().context("no pid")?)?;
        // It serves: the log says so (it listens inside the container's own network).
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default()
                + &std::fs::read_to_string(dir.path().join("webhook.err")).unwrap_or_default();
            if text.contains("etcd-webhook serving") {
                break;
            }
            ensure!(
                std::time::Instant::now() < deadline,
                "the webhook did not start under runc: {text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let uid = proc_status(pid, "Uid")?;
        ensure!(
            uid.split_whitespace().all(|u| u == "65532"),
            "runs as {uid}"
        );
        let mounts = std::fs::read_to_string(format!("/proc/{pid}/mounts"))?;
        let root = mounts
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some("/"))
            .context("no root mount")?;
        ensure!(
            root.split_whitespace()
                .nth(3)
                .is_some_and(|o| o.split(',').any(|o| o == "ro")),
            "root is not read-only: {root}"
        );
        let cgroup = memory_cgroup(pid)?;
        let limit_set: u64 = std::fs::read_to_string(cgroup.join("memory.limit_in_bytes"))?
            .trim()
            .parse()?;
        ensure!(limit_set == limit, "memory limit {limit_set}");
        let usage: u64 = std::fs::read_to_string(cgroup.join("memory.usage_in_bytes"))?
            .trim()
            .parse()?;
        println!(
            "figures: webhook image under runc: uid {uid}, memory cgroup usage {:.1} MiB of a {} MiB limit, VmRSS {}",
            usage as f64 / 1048576.0,
            limit / 1048576,
            proc_status(pid, "VmRSS")?
        );
        Ok(())
    })();
    let _ = Command::new("runc").args(["kill", &id, "KILL"]).status();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if Command::new("runc")
            .args(["delete", "--force", &id])
            .status()
            .is_ok_and(|s| s.success())
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    result
}

/// The pause image a real node's pod sandboxes run: one static program alone in its image,
/// as 65535; under runc it holds (sleeps) as that user and leaves on SIGTERM.
#[test]
fn the_pause_image_holds_a_sandbox_and_leaves_on_sigterm() -> anyhow::Result<()> {
    let pause = image("pause")?;
    ensure!(pause.tag == "3.10", "pause: tag {}", pause.tag);
    let config = &pause.config["config"];
    ensure!(
        config["User"] == "65535:65535" && config["Entrypoint"] == json!(["/pause"]),
        "pause: config {config}"
    );
    let files = entries(&pause)?;
    let regular: Vec<&String> = files
        .iter()
        .filter(|(_, (mode, _))| mode.starts_with('-'))
        .map(|(path, _)| path)
        .collect();
    ensure!(regular == ["pause"], "pause: files {regular:?}");

    let dir = tempfile::tempdir()?;
    let b = bundle(&pause, dir.path(), &["/pause"], &[], 8 * 1024 * 1024)?;
    let id = format!("etcd-images-pause-{}", std::process::id());
    let started = Command::new("runc")
        .args(["run", "--detach", "--bundle"])
        .arg(&b)
        .arg(&id)
        .status()?;
    ensure!(started.success(), "runc run --detach of pause");
    let result = (|| -> anyhow::Result<()> {
        let state = |id: &str| -> anyhow::Result<Value> {
            let out = Command::new("runc").args(["state", id]).output()?;
            Ok(serde_json::from_slice(&out.stdout)?)
        };
        let pid = u32::try_from(state(&id)?["pid"].as_u64().context("no pid")?)?;
        let uid = proc_status(pid, "Uid")?;
        ensure!(uid.starts_with("65535\t"), "pause runs as {uid}");
        ensure!(state(&id)?["status"] == "running", "pause does not hold");
        let killed = Command::new("runc").args(["kill", &id, "TERM"]).status()?;
        ensure!(killed.success(), "runc kill TERM");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while state(&id)?["status"] != "stopped" {
            ensure!(
                std::time::Instant::now() < deadline,
                "pause still runs 10 s after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    })();
    let _ = Command::new("runc")
        .args(["delete", "--force", &id])
        .status();
    result
}
