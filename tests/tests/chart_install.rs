//! The Helm chart installed, upgraded and uninstalled on the local control plane by each pinned
//! Helm major (3 and 4): the self-signed certificate and the caBundles, pods admitted by Pod
//! Security `restricted`, upgrades that keep or replace the certificate, and an uninstall that
//! leaves only the CRD.
//!
//! There is no kubelet, so the chart's pods stay Pending: nothing here waits for them to run
//! (the `installed` suite does).
//!
//! Run: `cargo test -p etcd-tests --test chart_install` (needs `hack/build-tools.sh` first).

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::ListParams;

use etcd_tests::chart::*;
use etcd_tests::helm::{Helm, HelmMajor, run_ok};
use etcd_tests::poll_until;
use etcd_tests::suite::{TestContext, run_suite};

fn main() -> ExitCode {
    run_suite(
        [per_major(
            "install_upgrade_uninstall",
            install_upgrade_uninstall,
        )]
        .into_iter()
        .flatten()
        .collect(),
    )
}

// ---------------------------------------------------------------------------------------------
// 3. install, upgrade, uninstall
// ---------------------------------------------------------------------------------------------

async fn tls_secret(ctx: &TestContext, name: &str) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let secrets: Api<Secret> = ctx.api();
    let secret = secrets
        .get(name)
        .await
        .with_context(|| format!("get Secret {name}"))?;
    ensure!(
        secret.type_.as_deref() == Some("kubernetes.io/tls"),
        "Secret {name} type {:?}",
        secret.type_
    );
    let data: BTreeMap<String, Vec<u8>> = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    for key in ["ca.crt", "tls.crt", "tls.key"] {
        ensure!(
            data.get(key).is_some_and(|v| !v.is_empty()),
            "Secret {name} has no {key}"
        );
    }
    Ok(data)
}

/// The caBundle of both webhook configurations of `name`.
async fn ca_bundles(client: &kube::Client, name: &str) -> anyhow::Result<[Vec<u8>; 2]> {
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let m = mutating
        .get(name)
        .await
        .with_context(|| format!("get MutatingWebhookConfiguration {name}"))?;
    let v = validating
        .get(name)
        .await
        .with_context(|| format!("get ValidatingWebhookConfiguration {name}"))?;
    let m = m
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .next()
        .and_then(|w| w.client_config.ca_bundle)
        .context("mutating webhook without caBundle")?;
    let v = v
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .next()
        .and_then(|w| w.client_config.ca_bundle)
        .context("validating webhook without caBundle")?;
    Ok([m.0, v.0])
}

/// Waits until the Deployments' ReplicaSets created their pods: proof that Pod Security
/// `restricted` admits them. On timeout the ReplicaSets' failure conditions are shown.
async fn wait_for_pods(
    ctx: &TestContext,
    release: &str,
    counts: &[(&str, usize)],
) -> anyhow::Result<()> {
    let pods: Api<Pod> = ctx.api();
    let replica_sets: Api<ReplicaSet> = ctx.api();
    for (component, count) in counts {
        let selector =
            format!("app.kubernetes.io/instance={release},app.kubernetes.io/component={component}");
        poll_until(
            &format!("{count} {component} pod(s) of release {release}"),
            WAIT,
            || async {
                let found = pods
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .into_iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .count();
                if found >= *count {
                    return Ok(Some(()));
                }
                let failures: Vec<String> = replica_sets
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .into_iter()
                    .flat_map(|rs| rs.status.and_then(|s| s.conditions).unwrap_or_default())
                    .filter(|c| c.type_ == "ReplicaFailure")
                    .map(|c| c.message.unwrap_or_default())
                    .collect();
                if failures.is_empty() {
                    Ok(None)
                } else {
                    Err(format!("{found} pods; ReplicaSet failures: {failures:?}"))
                }
            },
        )
        .await?;
    }
    Ok(())
}

/// Kubectl resource names (`kind.group`) and object names of a release's manifest.
fn manifest_objects(manifest: &Manifests) -> Vec<(String, String, Option<String>)> {
    manifest
        .0
        .iter()
        .map(|doc| {
            let api_version = str_at(doc, "/apiVersion");
            let kind = str_at(doc, "/kind").to_lowercase();
            let resource = match api_version.split_once('/') {
                Some((group, _)) => format!("{kind}.{group}"),
                None => kind,
            };
            let namespace = doc["metadata"]["namespace"].as_str().map(str::to_owned);
            (
                resource,
                str_at(doc, "/metadata/name").to_owned(),
                namespace,
            )
        })
        .collect()
}

/// Which of `objects` (kubectl resource, name, namespace) exist, as `kind/name`. All are in
/// the release namespace or cluster-scoped.
async fn named_objects(
    ctx: &TestContext,
    ns: &str,
    objects: &[(String, String, Option<String>)],
) -> anyhow::Result<Vec<String>> {
    ensure!(
        objects
            .iter()
            .all(|(_, _, namespace)| namespace.as_deref().is_none_or(|n| n == ns)),
        "objects outside the release namespace: {objects:?}"
    );
    let mut get = kubectl(ctx);
    get.args(["get", "--namespace", ns, "--ignore-not-found", "-o", "name"]);
    get.args(
        objects
            .iter()
            .map(|(resource, name, _)| format!("{resource}/{name}")),
    );
    Ok(run_ok(get, None)
        .await?
        .lines()
        .map(str::to_owned)
        .collect())
}

/// `helm install` (no `--wait`: there is no kubelet), then: the self-signed Secret and the
/// caBundles agree, pods pass Pod Security, `helm upgrade` keeps the certificate (and a change
/// of its names replaces it), `helm uninstall` removes every object of the release but the CRD.
async fn install_upgrade_uninstall(ctx: TestContext, major: HelmMajor) -> anyhow::Result<()> {
    enforce_restricted(&ctx).await?;
    let helm = Helm::new(ctx.control_plane(), major)?;
    let release = "lifecycle";
    let ns = ctx.ns().to_owned();
    let full = fullname(release);
    let chart = chart_dir();
    let chart = chart.to_string_lossy().into_owned();
    let secret_name = format!("{full}-webhook-tls");
    let configurations = cluster_name(release, &ns);

    let notes = run_ok(
        helm.command(["install", release, &chart, "--namespace", &ns]),
        None,
    )
    .await?;
    for hint in [
        "kubectl get etcdclusters",
        "example-etcd-cluster-client",
        "etcdctl",
    ] {
        ensure!(notes.contains(hint), "NOTES lack {hint:?}:\n{notes}");
    }
    // Helm installed the CRD from crds/ (or found it installed by another test).
    let crds: Api<CustomResourceDefinition> = Api::all(ctx.client());
    ensure!(
        crds.get_opt(CRD_NAME).await?.is_some(),
        "no CRD after install"
    );

    let first = tls_secret(&ctx, &secret_name).await?;
    for bundle in ca_bundles(&ctx.client(), &configurations).await? {
        ensure!(
            bundle == first["ca.crt"],
            "caBundle is not the Secret's ca.crt"
        );
    }
    check_serving_pair(
        &first["ca.crt"],
        &first["tls.crt"],
        &service_dns_names(release, &ns),
    )?;
    wait_for_pods(&ctx, release, &[("controller", 1), ("webhook", 2)]).await?;

    // An upgrade that changes the pods keeps the certificate bytes.
    run_ok(
        helm.command([
            "upgrade",
            release,
            &chart,
            "--namespace",
            &ns,
            "--set",
            "controller.logLevel=debug",
            "--set",
            "webhook.replicas=3",
        ]),
        None,
    )
    .await?;
    let deployments: Api<Deployment> = ctx.api();
    let controller = deployments.get(&format!("{full}-controller")).await?;
    let args = controller
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.args)
        .unwrap_or_default();
    ensure!(
        args.iter().any(|a| a == "--log-level=debug"),
        "the upgrade did not reach the controller: {args:?}"
    );
    let second = tls_secret(&ctx, &secret_name).await?;
    ensure!(
        second == first,
        "helm upgrade changed the webhook certificate"
    );
    for bundle in ca_bundles(&ctx.client(), &configurations).await? {
        ensure!(
            bundle == first["ca.crt"],
            "helm upgrade changed the caBundle"
        );
    }
    wait_for_pods(&ctx, release, &[("webhook", 3)]).await?;

    // New certificate names: a new pair, trusted by the caBundles.
    run_ok(
        helm.command([
            "upgrade",
            release,
            &chart,
            "--namespace",
            &ns,
            "--reuse-values",
            "--set",
            "webhook.certificates.extraDNSNames={webhook.example.test}",
        ]),
        None,
    )
    .await?;
    let third = tls_secret(&ctx, &secret_name).await?;
    ensure!(
        third["tls.crt"] != first["tls.crt"],
        "new names, same certificate"
    );
    let mut dns = service_dns_names(release, &ns);
    dns.insert("webhook.example.test".into());
    check_serving_pair(&third["ca.crt"], &third["tls.crt"], &dns)?;
    for bundle in ca_bundles(&ctx.client(), &configurations).await? {
        ensure!(bundle == third["ca.crt"], "caBundle is not the new ca.crt");
    }

    // What the release made, before it goes.
    let manifest = Manifests::parse(
        &run_ok(
            helm.command(["get", "manifest", release, "--namespace", &ns]),
            None,
        )
        .await?,
    )?;
    let objects = manifest_objects(&manifest);
    ensure!(objects.len() >= 15, "release manifest: {objects:?}");
    ensure!(
        objects.iter().any(|(r, ..)| r.starts_with("clusterrole."))
            && objects
                .iter()
                .any(|(r, ..)| r.starts_with("mutatingwebhookconfiguration.")),
        "cluster-scoped objects missing from {objects:?}"
    );

    let present = named_objects(&ctx, &ns, &objects).await?;
    ensure!(
        present.len() == objects.len(),
        "before uninstall, found {present:?} of {objects:?}"
    );

    run_ok(
        helm.command(["uninstall", release, "--namespace", &ns]),
        None,
    )
    .await?;

    // Nothing of the release remains: each object it listed, anything with its instance
    // label (ReplicaSets and pods too, once garbage-collected), and Helm's release Secrets.
    let mut types: BTreeSet<String> = objects.iter().map(|(r, ..)| r.clone()).collect();
    types.extend(["replicaset.apps".to_owned(), "pod".to_owned()]);
    let types = types.into_iter().collect::<Vec<_>>().join(",");
    let selector = format!("app.kubernetes.io/instance={release}");
    poll_until("the release's objects to be deleted", WAIT, || async {
        let mut list = kubectl(&ctx);
        list.args([
            "get",
            &types,
            "--all-namespaces",
            "-l",
            &selector,
            "-o",
            "name",
        ]);
        let left = run_ok(list, None).await.map_err(|e| format!("{e:#}"))?;
        let mut left: Vec<String> = left.lines().map(str::to_owned).collect();
        let mut release_secrets = kubectl(&ctx);
        release_secrets.args([
            "get",
            "secrets",
            "--namespace",
            &ns,
            "-l",
            &format!("owner=helm,name={release}"),
            "-o",
            "name",
        ]);
        let found = run_ok(release_secrets, None)
            .await
            .map_err(|e| format!("{e:#}"))?;
        left.extend(found.lines().map(str::to_owned));
        left.sort();
        left.dedup();
        if left.is_empty() {
            Ok(Some(()))
        } else {
            Err(format!("still there: {left:?}"))
        }
    })
    .await?;
    // And each object of the manifest by name, labelled or not.
    let left = named_objects(&ctx, &ns, &objects).await?;
    ensure!(
        left.is_empty(),
        "objects of the release left after uninstall: {left:?}"
    );
    ensure!(
        crds.get_opt(CRD_NAME).await?.is_some(),
        "helm uninstall must keep the CRD (crds/ semantics)"
    );
    Ok(())
}
