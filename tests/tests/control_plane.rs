//! Integration tests of the local control plane itself: one control plane for the whole binary,
//! one namespace per test (see `etcd_tests::suite`).
//!
//! Run: `cargo test -p etcd-tests --test control_plane` (needs `hack/build-tools.sh` first).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::wait::conditions;
use kube::{Api, Resource, ResourceExt};
use serde::Deserialize;

use etcd_tests::suite::{TestContext, run_suite};
use etcd_tests::{await_condition, poll_until};

/// Deadline for each wait on a controller.
const WAIT: Duration = Duration::from_secs(60);

/// Overrides the directory the CRD test reads `*.yaml` from.
const CRD_DIR_ENV: &str = "ETCD_TESTS_CRD_DIR";
const CRD_NAME: &str = "etcdclusters.etcd.database.coreos.com";

fn main() -> std::process::ExitCode {
    run_suite(etcd_tests::tests![
        configmap_round_trip,
        crd_is_established_and_visible_to_kubectl,
        deployment_gets_replicaset_and_pods,
        deleting_an_owner_collects_its_dependents,
        deleting_a_deployment_collects_replicaset_and_pods,
        service_account_tokens_authenticate,
    ])
}

fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        ..ConfigMap::default()
    }
}

/// (a) create, get, patch, delete a ConfigMap in the test namespace.
async fn configmap_round_trip(ctx: TestContext) -> anyhow::Result<()> {
    let api: Api<ConfigMap> = ctx.api();
    let created = api
        .create(
            &PostParams::default(),
            &config_map("round-trip", &[("a", "1")]),
        )
        .await
        .context("create")?;
    ensure!(created.namespace().as_deref() == Some(ctx.ns()));

    let fetched = api.get("round-trip").await.context("get")?;
    ensure!(
        fetched.data == created.data,
        "get returned {:?}",
        fetched.data
    );

    let patch = serde_json::json!({ "data": { "b": "2" } });
    let patched = api
        .patch("round-trip", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .context("patch")?;
    let expected: BTreeMap<String, String> = [("a", "1"), ("b", "2")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    ensure!(
        patched.data == Some(expected),
        "patched data {:?}",
        patched.data
    );

    let uid = patched.uid().context("uid")?;
    api.delete("round-trip", &DeleteParams::default())
        .await
        .context("delete")?;
    await_condition(
        api.clone(),
        "round-trip",
        conditions::is_deleted(&uid),
        WAIT,
    )
    .await?;
    ensure!(api.get_opt("round-trip").await?.is_none());
    Ok(())
}

fn crd_dir() -> PathBuf {
    match std::env::var_os(CRD_DIR_ENV) {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/etcd-operator/crds"),
    }
}

/// Every CustomResourceDefinition in the `*.yaml` files of `dir` (multi-document files allowed).
fn read_crds(dir: &Path) -> anyhow::Result<Vec<CustomResourceDefinition>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    let mut crds = Vec::new();
    for file in &files {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_yaml::Value::deserialize(document)
                .with_context(|| format!("parsing {}", file.display()))?;
            if value.is_null() {
                continue;
            }
            let crd: CustomResourceDefinition = serde_yaml::from_value(value)
                .with_context(|| format!("{} is not a CustomResourceDefinition", file.display()))?;
            crds.push(crd);
        }
    }
    ensure!(
        !crds.is_empty(),
        "no CRD manifests (*.yaml) in {}: generate them with `cargo run -p etcd-shared --bin crdgen -- --write`",
        dir.display()
    );
    Ok(crds)
}

/// (b) the project's CRDs apply, become Established, and kubectl sees them.
async fn crd_is_established_and_visible_to_kubectl(ctx: TestContext) -> anyhow::Result<()> {
    let crds = read_crds(&crd_dir())?;
    let api: Api<CustomResourceDefinition> = Api::all(ctx.client());
    let params = PatchParams::apply("etcd-tests").force();
    for crd in &crds {
        let name = crd.metadata.name.clone().context("CRD without a name")?;
        api.patch(&name, &params, &Patch::Apply(crd))
            .await
            .with_context(|| format!("applying CRD {name}"))?;
    }
    for crd in &crds {
        let name = crd.name_any();
        await_condition(api.clone(), &name, conditions::is_crd_established(), WAIT).await?;
    }
    ensure!(
        crds.iter().any(|c| c.name_any() == CRD_NAME),
        "{CRD_NAME} is not among {:?}",
        crds.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
    );

    let output = ctx
        .control_plane()
        .kubectl()
        .args(["get", "crd", CRD_NAME])
        .output()
        .context("running kubectl")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("kubectl get crd {CRD_NAME}:\n{stdout}");
    ensure!(
        output.status.success(),
        "kubectl failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(
        stdout.contains(CRD_NAME),
        "unexpected kubectl output: {stdout}"
    );

    // The resource is served: list it in the test namespace.
    let listed = ctx
        .kubectl()
        .args(["get", "etcdclusters", "-o", "name"])
        .output()
        .context("running kubectl")?;
    ensure!(
        listed.status.success(),
        "kubectl get etcdclusters: {}",
        String::from_utf8_lossy(&listed.stderr)
    );
    Ok(())
}

fn deployment(name: &str, replicas: i32) -> anyhow::Result<Deployment> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                // No kubelet runs: the image is never pulled.
                "spec": { "containers": [{ "name": "main", "image": "registry.invalid/none:1" }] }
            }
        }
    }))?)
}

fn owned_by(owner_uid: &str) -> impl Fn(&Option<Vec<OwnerReference>>) -> bool + '_ {
    move |refs| {
        refs.iter()
            .flatten()
            .any(|r| r.uid == owner_uid && r.controller == Some(true))
    }
}

/// Waits for the ReplicaSet the deployment controller makes and its `replicas` Pods.
async fn replicaset_and_pods(
    ctx: &TestContext,
    deploy: &Deployment,
    replicas: usize,
) -> anyhow::Result<(ReplicaSet, Vec<Pod>)> {
    let deploy_uid = deploy.uid().context("deployment uid")?;
    let replica_sets: Api<ReplicaSet> = ctx.api();
    let pods: Api<Pod> = ctx.api();
    let rs = poll_until("the Deployment's ReplicaSet", WAIT, || async {
        let list = replica_sets.list(&ListParams::default()).await?;
        Ok::<_, kube::Error>(
            list.items
                .into_iter()
                .find(|rs| owned_by(&deploy_uid)(&rs.metadata.owner_references)),
        )
    })
    .await?;
    let rs_uid = rs.uid().context("replicaset uid")?;
    let owned = poll_until("the ReplicaSet's Pods", WAIT, || async {
        let list = pods.list(&ListParams::default()).await?;
        let owned: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| owned_by(&rs_uid)(&p.metadata.owner_references))
            .collect();
        Ok::<_, kube::Error>((owned.len() == replicas).then_some(owned))
    })
    .await?;
    Ok((rs, owned))
}

/// (c) the controller manager turns a Deployment into a ReplicaSet and Pods (which stay
/// Pending: no scheduler, no kubelet).
async fn deployment_gets_replicaset_and_pods(ctx: TestContext) -> anyhow::Result<()> {
    let deployments: Api<Deployment> = ctx.api();
    let deploy = deployments
        .create(&PostParams::default(), &deployment("web", 2)?)
        .await?;
    let (rs, pods) = replicaset_and_pods(&ctx, &deploy, 2).await?;
    ensure!(rs.spec.as_ref().and_then(|s| s.replicas) == Some(2));
    for pod in &pods {
        let status = pod.status.as_ref();
        let phase = status.and_then(|s| s.phase.as_deref());
        ensure!(
            phase == Some("Pending"),
            "pod {} phase {phase:?}",
            pod.name_any()
        );
        ensure!(
            pod.spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_none(),
            "pod {} was scheduled",
            pod.name_any()
        );
        let sa = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.as_deref());
        ensure!(
            sa == Some("default"),
            "pod {} service account {sa:?}",
            pod.name_any()
        );
    }
    Ok(())
}

/// (d) deleting an owner ConfigMap garbage-collects the ConfigMap that it owns.
async fn deleting_an_owner_collects_its_dependents(ctx: TestContext) -> anyhow::Result<()> {
    let api: Api<ConfigMap> = ctx.api();
    let owner = api
        .create(
            &PostParams::default(),
            &config_map("owner", &[("role", "owner")]),
        )
        .await?;
    let mut dependent = config_map("dependent", &[("role", "dependent")]);
    dependent.metadata.owner_references = Some(vec![OwnerReference {
        api_version: ConfigMap::api_version(&()).into_owned(),
        kind: ConfigMap::kind(&()).into_owned(),
        name: owner.name_any(),
        uid: owner.uid().context("owner uid")?,
        ..OwnerReference::default()
    }]);
    let dependent = api.create(&PostParams::default(), &dependent).await?;
    let bystander = api
        .create(&PostParams::default(), &config_map("bystander", &[]))
        .await?;

    api.delete("owner", &DeleteParams::background()).await?;
    let dependent_uid = dependent.uid().context("dependent uid")?;
    await_condition(
        api.clone(),
        "dependent",
        conditions::is_deleted(&dependent_uid),
        WAIT,
    )
    .await?;
    ensure!(
        api.get_opt("bystander").await?.and_then(|b| b.uid()) == bystander.uid(),
        "an object without owner references was collected"
    );
    Ok(())
}

/// (d) foreground deletion of a Deployment removes its ReplicaSet and Pods first.
async fn deleting_a_deployment_collects_replicaset_and_pods(
    ctx: TestContext,
) -> anyhow::Result<()> {
    let deployments: Api<Deployment> = ctx.api();
    let deploy = deployments
        .create(&PostParams::default(), &deployment("doomed", 1)?)
        .await?;
    let (rs, pods) = replicaset_and_pods(&ctx, &deploy, 1).await?;

    deployments
        .delete("doomed", &DeleteParams::foreground())
        .await?;
    let deploy_uid = deploy.uid().context("deployment uid")?;
    await_condition(
        deployments,
        "doomed",
        conditions::is_deleted(&deploy_uid),
        WAIT,
    )
    .await?;
    // Foreground deletion removes the owner only after its dependents are gone.
    let replica_sets: Api<ReplicaSet> = ctx.api();
    if replica_sets.get_opt(&rs.name_any()).await?.is_some() {
        bail!("ReplicaSet {} survived its Deployment", rs.name_any());
    }
    let pod_api: Api<Pod> = ctx.api();
    for pod in pods {
        let uid = pod.uid().context("pod uid")?;
        await_condition(
            pod_api.clone(),
            &pod.name_any(),
            conditions::is_deleted(&uid),
            WAIT,
        )
        .await?;
    }
    Ok(())
}

/// Service-account tokens signed with the harness' ECDSA key authenticate against the apiserver
/// (checks the --service-account-* flags and the controller manager's token plumbing).
async fn service_account_tokens_authenticate(ctx: TestContext) -> anyhow::Result<()> {
    let service_accounts: Api<ServiceAccount> = ctx.api();
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let token = service_accounts
        .create_token_request("default", &PostParams::default(), &request)
        .await?
        .status
        .context("TokenRequest without status")?
        .token
        .context("TokenRequest without a token")?;

    let cp = ctx.control_plane();
    let mut config = kube::Config::new(cp.apiserver_url().parse()?);
    config.root_cert = Some(vec![cp.ca().cert().cert_der.clone()]);
    config.auth_info.token = Some(token.into());
    let client = kube::Client::try_from(config)?;
    let reviews: Api<SelfSubjectReview> = Api::all(client);
    let review = reviews
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    let username = review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .context("no user in SelfSubjectReview")?;
    ensure!(
        username == format!("system:serviceaccount:{}:default", ctx.ns()),
        "authenticated as {username}"
    );

    // The root CA publisher (--root-ca-file) put the CA in the namespace.
    let config_maps: Api<ConfigMap> = ctx.api();
    let root_ca = poll_until("ConfigMap kube-root-ca.crt", WAIT, || async {
        config_maps.get_opt("kube-root-ca.crt").await
    })
    .await?;
    let published = root_ca
        .data
        .and_then(|d| d.get("ca.crt").cloned())
        .context("kube-root-ca.crt without ca.crt")?;
    ensure!(
        published.trim() == cp.ca_pem().trim(),
        "published CA differs"
    );
    Ok(())
}
