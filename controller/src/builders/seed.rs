//! The init containers of a restored cluster's first member: the operator's image downloads
//! and checks the snapshot into the data volume, etcd's own tool of the member's line restores
//! it (`etcdutl snapshot restore` on 3.5+, `ETCDCTL_API=3 etcdctl snapshot restore` before), and
//! the operator's image moves the result into the data directory (see
//! [`crate::in_pod::seed`] for the steps and why a rerun is safe). For storage type PVC the
//! first step copies the snapshot from the claim, mounted read-only, instead of downloading it.

use k8s_openapi::api::core::v1::{
    Container, EnvVar, PersistentVolumeClaimVolumeSource, Pod, Volume, VolumeMount,
};

use super::OperatorImage;
use super::pod::{DATA_DIR, container_security_context, read_only_mount, secret_volume};
use crate::planner::{MemberPlan, SeedFrom, SeedPlan};
use crate::view::ClusterView;

/// Name of the downloaded snapshot in the restore's work directory.
pub const SNAPSHOT_FILE: &str = "snapshot.db";
/// Name of the directory etcd's tool restores into, in the work directory.
pub const RESTORED_DIR: &str = "data";
/// The operator's binary in its image.
pub const CONTROLLER_BINARY: &str = "/usr/local/bin/etcd-controller";
/// etcdutl in the official etcd images (3.5+).
pub const ETCDUTL_BINARY: &str = "/usr/local/bin/etcdutl";
/// etcdctl in the official etcd images.
pub const ETCDCTL_BINARY: &str = "/usr/local/bin/etcdctl";
/// Where the store's secret (awsSecret, absSecret or gcpSecret) is mounted in the download
/// step.
pub const CREDENTIALS_DIR: &str = "/etc/etcd-restore/credentials";
const CREDENTIALS_VOLUME: &str = "restore-credentials";
/// Where the identitySecret of an encrypted snapshot is mounted in the download step.
pub const IDENTITY_DIR: &str = "/etc/etcd-restore/identity";
const IDENTITY_VOLUME: &str = "restore-identity";
/// Where the claim holding the snapshot is mounted (read-only) in the copy step (PVC).
pub const SOURCE_CLAIM_DIR: &str = "/var/lib/etcd-restore/claim";
const SOURCE_CLAIM_VOLUME: &str = "restore-source";
/// Where the operator's client certificate is mounted when the snapshot streams from a member
/// that serves clients over TLS (a recovery).
pub const MEMBER_TLS_DIR: &str = "/etc/etcd-restore/tls";
const MEMBER_TLS_VOLUME: &str = "restore-member-tls";
/// How far a recovered cluster's revisions jump (`--bump-revision`): past any revision a
/// client may have seen from a member whose writes were lost, so none is reused.
pub const RECOVERY_REVISION_BUMP: u64 = 1_000_000_000;

fn work_dir() -> String {
    format!("{DATA_DIR}/restore")
}

fn data_dir() -> String {
    format!("{DATA_DIR}/data")
}

fn data_mount() -> VolumeMount {
    VolumeMount {
        name: "data".into(),
        mount_path: DATA_DIR.into(),
        ..VolumeMount::default()
    }
}

/// Adds the restore's init containers (and the source's volume) to the first member's pod.
/// The download step gets the seed's one storage source as arguments (`--storage-type`,
/// `--path`, `--endpoint`, `--force-path-style`) and its secret as files; for a `pvc` source
/// the copy step gets `--file` in the claim, mounted read-only, instead.
pub fn seed_member(
    pod: &mut Pod,
    view: &ClusterView,
    plan: &MemberPlan,
    seed: &SeedPlan,
    restore_image: &OperatorImage,
) {
    let caps = plan.version.capabilities().unwrap_or(view.capabilities);
    let (fetch, source_volumes) = fetch_container(view, seed, restore_image);
    let restore = restore_container(view, plan, seed, caps);
    let place = place_container(restore_image);
    if let Some(spec) = pod.spec.as_mut() {
        spec.init_containers = Some(vec![fetch, restore, place]);
        // The operator's image may come from another registry than etcd's.
        spec.image_pull_secrets = super::with_pull_secrets(
            spec.image_pull_secrets.take(),
            restore_image.pull_secrets.iter().map(String::as_str),
        );
        if !source_volumes.is_empty() {
            spec.volumes
                .get_or_insert_with(Vec::new)
                .extend(source_volumes);
        }
    }
}

/// The fetch's flags and mounts for a snapshot in an object store (S3, ABS, GCS); the
/// credentials' Secret volume, if the store has one.
pub(super) fn store_source(
    source: &etcd_shared::types::StorageSource,
    fetch_args: &mut Vec<String>,
    fetch_mounts: &mut Vec<VolumeMount>,
) -> Option<Volume> {
    let (storage_type, path, endpoint, force_path_style, secret) =
        match (&source.s3, &source.abs, &source.gcs) {
            (Some(s3), _, _) => (
                "S3",
                s3.path.as_str(),
                s3.endpoint.as_str(),
                s3.force_path_style,
                s3.aws_secret.as_str(),
            ),
            (None, Some(abs), _) => (
                "ABS",
                abs.path.as_str(),
                abs.endpoint.as_str(),
                false,
                abs.abs_secret.as_str(),
            ),
            (None, None, Some(gcs)) => {
                ("GCS", gcs.path.as_str(), "", false, gcs.gcp_secret.as_str())
            }
            // The webhook refuses a seed without one of them; the fetch then fails clearly.
            (None, None, None) => ("", "", "", false, ""),
        };
    fetch_args.push(format!("--storage-type={storage_type}"));
    fetch_args.push(format!("--path={path}"));
    if !endpoint.is_empty() {
        fetch_args.push(format!("--endpoint={endpoint}"));
    }
    if force_path_style {
        fetch_args.push("--force-path-style".into());
    }
    if secret.is_empty() {
        return None;
    }
    fetch_args.push(format!("--credentials-dir={CREDENTIALS_DIR}"));
    fetch_mounts.push(read_only_mount(CREDENTIALS_VOLUME, CREDENTIALS_DIR));
    Some(secret_volume(CREDENTIALS_VOLUME, secret, 0o440))
}

/// The init container that fetches the snapshot (from a store, a claim or a member) and
/// checks its SHA-256 (decrypting it with the seed's identitySecret, when it names one); the
/// volumes of its source and identity, if it needs them.
fn fetch_container(
    view: &ClusterView,
    seed: &SeedPlan,
    restore_image: &OperatorImage,
) -> (Container, Vec<Volume>) {
    let mut fetch_args = vec![
        "restore".to_string(),
        "fetch".into(),
        format!("--sha256={}", seed.sha256),
        format!("--work-dir={}", work_dir()),
        format!("--data-dir={}", data_dir()),
    ];
    let mut fetch_mounts = vec![data_mount()];
    // The source's volume: the claim (read-only) for PVC, the store's secret otherwise (none
    // for GCS with the default credentials), the operator's client certificate for a member
    // that serves clients over TLS.
    let mut source_volume = None;
    let restore_seed = match &seed.from {
        SeedFrom::Store(restore_seed) => Some(restore_seed.as_ref()),
        SeedFrom::Member(endpoint) => {
            fetch_args.push(format!("--member={endpoint}"));
            if let Some(secret) = &view.tls.operator_secret {
                fetch_args.push(format!("--tls-dir={MEMBER_TLS_DIR}"));
                fetch_args.push(format!("--server-name={}", view.tls_server_name()));
                fetch_mounts.push(read_only_mount(MEMBER_TLS_VOLUME, MEMBER_TLS_DIR));
                source_volume = Some(secret_volume(MEMBER_TLS_VOLUME, secret, 0o440));
            }
            None
        }
    };
    let source = restore_seed.map(|s| s.source.clone()).unwrap_or_default();
    let source = &source;
    if restore_seed.is_none() {
        // Streamed from a member: nothing more to mount.
    } else if let (None, None, None, Some(pvc)) =
        (&source.s3, &source.abs, &source.gcs, &source.pvc)
    {
        fetch_args.push(format!("--file={SOURCE_CLAIM_DIR}/{}", pvc.path));
        fetch_mounts.push(read_only_mount(SOURCE_CLAIM_VOLUME, SOURCE_CLAIM_DIR));
        source_volume = Some(Volume {
            name: SOURCE_CLAIM_VOLUME.into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: pvc.claim_name.clone(),
                read_only: Some(true),
            }),
            ..Volume::default()
        });
    } else {
        source_volume = store_source(source, &mut fetch_args, &mut fetch_mounts).or(source_volume);
    }
    let mut volumes: Vec<Volume> = source_volume.into_iter().collect();
    let identity_secret = restore_seed.map_or("", |s| s.identity_secret.as_str());
    if !identity_secret.is_empty() && source.pvc.is_none() {
        fetch_args.push(format!(
            "--identity-file={IDENTITY_DIR}/{}",
            etcd_shared::names::IDENTITY_KEY
        ));
        fetch_mounts.push(read_only_mount(IDENTITY_VOLUME, IDENTITY_DIR));
        volumes.push(secret_volume(IDENTITY_VOLUME, identity_secret, 0o440));
    }
    let fetch = Container {
        name: "restore-fetch".into(),
        image: Some(restore_image.reference.clone()),
        command: Some(vec![CONTROLLER_BINARY.into()]),
        args: Some(fetch_args),
        volume_mounts: Some(fetch_mounts),
        security_context: Some(container_security_context()),
        ..Container::default()
    };
    (fetch, volumes)
}

/// The init container that restores the snapshot into a data directory with the member's
/// name, token and peer URL (etcdutl where the line has it, with `--bump-revision` and
/// `--mark-compacted` when the seed asks for them).
fn restore_container(
    view: &ClusterView,
    plan: &MemberPlan,
    seed: &SeedPlan,
    caps: &etcd_shared::version::LineCapabilities,
) -> Container {
    let peer_url = view.peer_url(&plan.name);
    let (tool, env) = if caps.etcdutl {
        (ETCDUTL_BINARY, None)
    } else {
        (
            ETCDCTL_BINARY,
            Some(vec![EnvVar {
                name: "ETCDCTL_API".into(),
                value: Some("3".into()),
                ..EnvVar::default()
            }]),
        )
    };
    Container {
        name: "restore".into(),
        image: Some(view.image(&plan.version)),
        command: Some(vec![tool.into()]),
        args: Some(
            vec![
                "snapshot".into(),
                "restore".into(),
                format!("{}/{}", work_dir(), SNAPSHOT_FILE),
                format!("--name={}", plan.name),
                format!("--data-dir={}/{}", work_dir(), RESTORED_DIR),
                format!("--initial-cluster={}={peer_url}", plan.name),
                format!("--initial-cluster-token={}", plan.token),
                format!("--initial-advertise-peer-urls={peer_url}"),
            ]
            .into_iter()
            .chain(
                // Where the line's tool has them (etcdutl, 3.5+): revisions move past any a client
                // may have seen, and watchers from before get `compacted` rather than silence.
                (seed.bump_revision && caps.etcdutl)
                    .then(|| {
                        [
                            format!("--bump-revision={RECOVERY_REVISION_BUMP}"),
                            "--mark-compacted".to_string(),
                        ]
                    })
                    .into_iter()
                    .flatten(),
            )
            .collect(),
        ),
        env,
        volume_mounts: Some(vec![data_mount()]),
        security_context: Some(container_security_context()),
        ..Container::default()
    }
}

/// The init container that moves the restored data directory into place.
fn place_container(restore_image: &OperatorImage) -> Container {
    Container {
        name: "restore-place".into(),
        image: Some(restore_image.reference.clone()),
        command: Some(vec![CONTROLLER_BINARY.into()]),
        args: Some(vec![
            "restore".into(),
            "place".into(),
            format!("--work-dir={}", work_dir()),
            format!("--data-dir={}", data_dir()),
        ]),
        volume_mounts: Some(vec![data_mount()]),
        security_context: Some(container_security_context()),
        ..Container::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builders::member_pod;
    use crate::planner::InitialState;
    use crate::view::fixtures::view_of;
    use clap::Parser as _;
    use etcd_shared::types::RestoreSeed;
    use etcd_shared::types::storage::{GcsSource, S3Source, StorageSource};

    fn from_store(seed: &RestoreSeed) -> SeedPlan {
        SeedPlan {
            from: SeedFrom::Store(Box::new(seed.clone())),
            sha256: seed.sha256.clone(),
            bump_revision: false,
        }
    }

    fn seed() -> RestoreSeed {
        RestoreSeed {
            restore: "r1".into(),
            source: StorageSource {
                s3: Some(S3Source {
                    path: "backups/demo/snap.db".into(),
                    aws_secret: "aws".into(),
                    endpoint: "http://s3.storage:9000".into(),
                    force_path_style: true,
                }),
                ..StorageSource::default()
            },
            sha256: "ab".repeat(32),
            revision: Some(42),
            etcd_version: Some("3.6.16".into()),
            identity_secret: String::new(),
        }
    }

    #[test]
    fn an_encrypted_seed_mounts_its_identity_secret_for_the_fetch() {
        let plain = seeded("3.6.16");
        let fetch = |pod: &Pod| {
            let init = pod.spec.as_ref().and_then(|s| s.init_containers.clone());
            init.unwrap_or_default()[0].clone()
        };
        let args = fetch(&plain).args.unwrap_or_default().join(" ");
        assert!(!args.contains("--identity-file"), "{args}");
        let encrypted = seeded_from(
            "3.6.16",
            &RestoreSeed {
                identity_secret: "backup-identity".into(),
                ..seed()
            },
        );
        let container = fetch(&encrypted);
        let args = container.args.clone().unwrap_or_default().join(" ");
        assert!(
            args.contains(&format!("--identity-file={IDENTITY_DIR}/identity")),
            "{args}"
        );
        let mounts = container.volume_mounts.unwrap_or_default();
        assert!(mounts.iter().any(|m| m.mount_path == IDENTITY_DIR
            && m.read_only == Some(true)
            && m.name == IDENTITY_VOLUME));
        let volumes = encrypted.spec.and_then(|s| s.volumes).unwrap_or_default();
        let secrets: Vec<_> = volumes
            .iter()
            .filter_map(|v| v.secret.as_ref()?.secret_name.clone())
            .collect();
        assert!(secrets.contains(&"aws".to_string()), "{secrets:?}");
        assert!(
            secrets.contains(&"backup-identity".to_string()),
            "{secrets:?}"
        );
    }

    fn seeded(version: &str) -> Pod {
        seeded_from(version, &seed())
    }

    fn seeded_from(version: &str, seed: &RestoreSeed) -> Pod {
        let view = view_of(&format!("size: 3\nversion: {version}"));
        let image = OperatorImage::new("registry.example/etcd-controller:1");
        seeded_in(&view, seed, &image)
    }

    /// The first member of `view`, seeded from `seed` with the operator's `image`.
    fn seeded_in(view: &ClusterView, seed: &RestoreSeed, image: &OperatorImage) -> Pod {
        let plan = MemberPlan {
            name: "demo-0".into(),
            initial_cluster: vec![("demo-0".into(), view.peer_url("demo-0"))],
            state: InitialState::New,
            version: view.version,
            token: view.token(),
            seed: None,
        };
        let mut pod = member_pod(view, &plan);
        seed_member(&mut pod, view, &plan, &from_store(seed), image);
        pod
    }

    #[test]
    fn the_seed_member_pulls_the_operators_image_with_its_secrets_too() {
        let view =
            view_of("size: 3\nversion: 3.6.16\npod:\n  imagePullSecrets:\n  - name: etcd-registry");
        let image = OperatorImage {
            reference: "registry.example/etcd-controller:1".into(),
            pull_secrets: vec!["operator-registry".into(), "etcd-registry".into()],
        };
        let pod = seeded_in(&view, &seed(), &image);
        let pull = crate::builders::pod::pull_secret_names(pod);
        assert_eq!(pull, ["etcd-registry", "operator-registry"]);
    }

    #[test]
    fn the_first_member_downloads_restores_and_places() {
        let pod = seeded("3.6.16");
        let spec = pod.spec.expect("spec");
        let init = spec.init_containers.expect("init containers");
        let names: Vec<&str> = init.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["restore-fetch", "restore", "restore-place"]);
        let fetch = init[0].args.clone().unwrap_or_default().join(" ");
        assert!(fetch.contains("--storage-type=S3"), "{fetch}");
        assert!(fetch.contains("--path=backups/demo/snap.db"), "{fetch}");
        assert!(fetch.contains(&format!("--credentials-dir={CREDENTIALS_DIR}")));
        assert!(fetch.contains("--endpoint=http://s3.storage:9000"));
        assert!(fetch.contains("--force-path-style"));
        assert!(fetch.contains(&format!("--sha256={}", "ab".repeat(32))));
        assert_eq!(
            init[0].image.as_deref(),
            Some("registry.example/etcd-controller:1")
        );
        assert_eq!(
            init[1].command.as_deref(),
            Some(&[ETCDUTL_BINARY.to_string()][..])
        );
        assert_eq!(
            init[1].image.as_deref(),
            Some("quay.io/coreos/etcd:v3.6.16")
        );
        let restore = init[1].args.clone().unwrap_or_default().join(" ");
        assert!(restore.contains("--name=demo-0"));
        assert!(
            restore.contains("--initial-cluster=demo-0=http://demo-0.demo.ns1.svc:2380"),
            "{restore}"
        );
        assert!(restore.contains("--data-dir=/var/lib/etcd/restore/data"));
        // The main container starts on the placed directory.
        let main = spec.containers[0]
            .args
            .clone()
            .unwrap_or_default()
            .join(" ");
        assert!(main.contains("--data-dir=/var/lib/etcd/data"), "{main}");
        let volumes = spec.volumes.unwrap_or_default();
        assert!(volumes.iter().any(|v| {
            v.secret
                .as_ref()
                .is_some_and(|s| s.secret_name.as_deref() == Some("aws"))
        }));
        // Every init container runs as the member does (restricted).
        assert!(
            init.iter()
                .all(|c| c.security_context == Some(container_security_context()))
        );
    }

    #[test]
    fn a_pvc_seed_copies_from_the_claim_mounted_read_only() {
        let pvc_seed = RestoreSeed {
            source: StorageSource {
                pvc: Some(etcd_shared::types::PvcSource {
                    claim_name: "backups".into(),
                    path: "demo/snap.db".into(),
                }),
                ..StorageSource::default()
            },
            ..seed()
        };
        let pod = seeded_from("3.6.16", &pvc_seed);
        let spec = pod.spec.expect("spec");
        let init = spec.init_containers.expect("init");
        let fetch = init[0].args.clone().unwrap_or_default().join(" ");
        assert!(
            fetch.contains("--file=/var/lib/etcd-restore/claim/demo/snap.db"),
            "{fetch}"
        );
        assert!(
            !fetch.contains("--path=") && !fetch.contains("--credentials-dir"),
            "{fetch}"
        );
        let mounts = init[0].volume_mounts.clone().unwrap_or_default();
        assert!(
            mounts
                .iter()
                .any(|m| m.mount_path == SOURCE_CLAIM_DIR && m.read_only == Some(true))
        );
        let volumes = spec.volumes.unwrap_or_default();
        assert!(volumes.iter().any(|v| {
            v.persistent_volume_claim
                .as_ref()
                .is_some_and(|c| c.claim_name == "backups" && c.read_only == Some(true))
        }));
        assert!(
            !volumes
                .iter()
                .any(|v| v.secret.is_some() && v.name == CREDENTIALS_VOLUME)
        );
        // The parsed command line takes it.
        let mut argv = vec!["restore".to_string()];
        argv.extend(init[0].args.clone().unwrap_or_default().into_iter().skip(1));
        crate::in_pod::seed::RestoreCommand::try_parse_from(argv).expect("parses");
    }

    #[test]
    fn an_abs_or_gcs_seed_passes_its_store_and_secret() {
        let abs: RestoreSeed = serde_json::from_str(&format!(
            r#"{{"restore": "r", "abs": {{"path": "etcd/snap.db", "absSecret": "azure", "endpoint": "http://azurite:10000/devstoreaccount1"}}, "sha256": "{}"}}"#,
            "ab".repeat(32)
        ))
        .expect("seed");
        let spec = seeded_from("3.6.16", &abs).spec.expect("spec");
        let init = spec.init_containers.expect("init");
        let fetch = init[0].args.clone().unwrap_or_default().join(" ");
        assert!(
            fetch.contains("--storage-type=ABS --path=etcd/snap.db"),
            "{fetch}"
        );
        assert!(fetch.contains("--endpoint=http://azurite:10000/devstoreaccount1"));
        assert!(!fetch.contains("--force-path-style"));
        let volumes = spec.volumes.unwrap_or_default();
        assert!(volumes.iter().any(|v| {
            v.secret
                .as_ref()
                .is_some_and(|s| s.secret_name.as_deref() == Some("azure"))
        }));
        // GCS with the default credentials: no secret to mount, no directory to read.
        let gcs = RestoreSeed {
            source: StorageSource {
                gcs: Some(GcsSource {
                    path: "bkt/snap.db".into(),
                    gcp_secret: String::new(),
                }),
                ..StorageSource::default()
            },
            ..seed()
        };
        let spec = seeded_from("3.6.16", &gcs).spec.expect("spec");
        let init = spec.init_containers.expect("init");
        let fetch = init[0].args.clone().unwrap_or_default().join(" ");
        assert!(
            fetch.contains("--storage-type=GCS --path=bkt/snap.db"),
            "{fetch}"
        );
        assert!(!fetch.contains("--credentials-dir"), "{fetch}");
        assert_eq!(init[0].volume_mounts.as_ref().map(Vec::len), Some(1));
        assert!(
            !spec
                .volumes
                .unwrap_or_default()
                .iter()
                .any(|v| v.name == CREDENTIALS_VOLUME)
        );
    }

    #[test]
    fn lines_before_3_5_restore_with_etcdctl() {
        let pod = seeded("3.4.45");
        let init = pod.spec.expect("spec").init_containers.expect("init");
        assert_eq!(
            init[1].command.as_deref(),
            Some(&[ETCDCTL_BINARY.to_string()][..])
        );
        let env = init[1].env.clone().unwrap_or_default();
        assert!(
            env.iter()
                .any(|e| e.name == "ETCDCTL_API" && e.value.as_deref() == Some("3"))
        );
    }

    /// Issue 24: a recovered cluster's first member streams its snapshot from the surviving
    /// member (with the operator's client certificate when clients use TLS) and restores it
    /// with revisions bumped and marked compacted where the line's tool can (etcdutl, 3.5+).
    #[test]
    fn a_recovery_seed_streams_from_the_survivor_and_bumps_revisions() {
        for (version, tls, bumps) in [
            ("3.6.16", false, true),
            ("3.6.16", true, true),
            ("3.4.45", false, false),
        ] {
            let tls_spec = if tls {
                "\nTLS:\n  static:\n    member:\n      peerSecret: p\n      serverSecret: s\n    operatorSecret: o"
            } else {
                ""
            };
            let view = view_of(&format!("size: 3\nversion: {version}{tls_spec}"));
            let plan = MemberPlan {
                name: "demo-3".into(),
                initial_cluster: vec![("demo-3".into(), view.peer_url("demo-3"))],
                state: InitialState::New,
                version: view.version,
                token: format!("{}-3", view.token()),
                seed: None,
            };
            let seed = SeedPlan {
                from: SeedFrom::Member("http://demo-0.demo.ns1.svc:2379".into()),
                sha256: "cd".repeat(32),
                bump_revision: true,
            };
            let mut pod = member_pod(&view, &plan);
            seed_member(
                &mut pod,
                &view,
                &plan,
                &seed,
                &OperatorImage::new("registry.example/etcd-controller:1"),
            );
            let spec = pod.spec.expect("spec");
            let init = spec.init_containers.expect("init");
            let fetch = init[0].args.clone().unwrap_or_default().join(" ");
            assert!(
                fetch.contains("--member=http://demo-0.demo.ns1.svc:2379")
                    && fetch.contains(&format!("--sha256={}", "cd".repeat(32))),
                "{fetch}"
            );
            assert_eq!(fetch.contains("--tls-dir="), tls, "{fetch}");
            let volumes = spec.volumes.unwrap_or_default();
            assert_eq!(
                volumes.iter().any(|v| v
                    .secret
                    .as_ref()
                    .is_some_and(|s| s.secret_name.as_deref() == Some("o"))),
                tls
            );
            let restore = init[1].args.clone().unwrap_or_default().join(" ");
            assert_eq!(
                restore.contains("--bump-revision=1000000000 --mark-compacted"),
                bumps,
                "{version}: {restore}"
            );
            assert!(restore.contains(&format!("--initial-cluster-token={}-3", view.token())));
            // The fetch step parses its arguments.
            let parsed = crate::in_pod::seed::RestoreCommand::try_parse_from(
                std::iter::once("restore".to_string())
                    .chain(init[0].args.clone().unwrap_or_default().into_iter().skip(1)),
            );
            assert!(parsed.is_ok(), "{parsed:?}");
        }
    }
}
