//! The webhook behind a real kube-apiserver: Validating and Mutating WebhookConfigurations
//! with a `url` and `caBundle` pointing at the webhook running in this process, then
//! `kubectl apply` of good and bad EtcdClusters.
//!
//! Run: `cargo test -p etcd-webhook --test on_apiserver` (needs `hack/build-tools.sh` first).

#[path = "support/apiserver.rs"]
mod apiserver;

use anyhow::ensure;
use kube::Api;

use apiserver::{install, kubectl, text};
use etcd_shared::EtcdCluster;
use etcd_tests::suite::{TestContext, run_suite};

fn main() -> std::process::ExitCode {
    run_suite(etcd_tests::tests![
        the_users_example_applies_and_is_defaulted,
        a_bad_spec_is_refused_with_the_webhooks_message,
        an_update_that_skips_a_minor_line_is_refused,
        a_schema_bound_is_enforced_by_the_api_server_itself,
        kubectl_scale_meets_the_size_rules_of_kubectl_apply,
    ])
}

fn example_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/example-etcd-cluster.yaml")
}

async fn the_users_example_applies_and_is_defaulted(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    let path = example_path();
    let out = kubectl(&ctx, &["apply", "-f", &path.display().to_string()], None).await?;
    let said = text(&out);
    println!("kubectl apply -f examples/example-etcd-cluster.yaml:\n{said}");
    ensure!(out.status.success(), "apply failed: {said}");
    ensure!(
        said.contains("etcdcluster.etcd.database.coreos.com/example-etcd-cluster created"),
        "{said}"
    );
    ensure!(
        said.contains("Warning: spec.version: etcd 3.2 is end of life"),
        "no EOL warning: {said}"
    );
    let api: Api<EtcdCluster> = ctx.api();
    let stored = api.get("example-etcd-cluster").await?;
    ensure!(stored.spec.size == Some(3) && stored.spec.version.as_deref() == Some("3.2.13"));
    ensure!(
        stored.spec.repository.as_deref() == Some("quay.io/coreos/etcd"),
        "the default repository was not filled in: {:?}",
        stored.spec
    );
    // A spec with nothing gets every default.
    let bare = "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: bare\nspec: {}\n";
    let out = kubectl(&ctx, &["apply", "-f", "-"], Some(bare)).await?;
    ensure!(out.status.success(), "{}", text(&out));
    let bare = api.get("bare").await?;
    ensure!(bare.spec.size == Some(3), "{:?}", bare.spec);
    ensure!(bare.spec.version.as_deref() == Some(etcd_shared::version::DEFAULT_VERSION));
    Ok(())
}

async fn a_bad_spec_is_refused_with_the_webhooks_message(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    let bad = "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: bad\nspec:\n  size: 3\n  version: \"3.1.20\"\n  pod:\n    etcdEnv:\n    - name: ETCD_NAME\n      value: x\n";
    let out = kubectl(&ctx, &["apply", "-f", "-"], Some(bad)).await?;
    let said = text(&out);
    println!("kubectl apply of a bad spec:\n{said}");
    ensure!(!out.status.success(), "a bad spec was accepted: {said}");
    // kubectl renders the webhook's 422 Invalid status with one line per violation.
    ensure!(
        said.contains("The EtcdCluster \"bad\" is invalid"),
        "{said}"
    );
    ensure!(said.contains("spec.version: 3.1.20 is older than the operator supports; supported versions are 3.2.0 to 3.7.x"), "{said}");
    ensure!(
        said.contains("spec.pod.etcdEnv[0].name: ETCD_NAME is set by the operator"),
        "{said}"
    );
    let api: Api<EtcdCluster> = ctx.api();
    ensure!(
        api.get_opt("bad").await?.is_none(),
        "the refused object was stored"
    );
    Ok(())
}

async fn an_update_that_skips_a_minor_line_is_refused(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    let at = |v: &str| {
        format!(
            "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: old\nspec:\n  size: 3\n  version: \"{v}\"\n"
        )
    };
    let out = kubectl(&ctx, &["apply", "-f", "-"], Some(&at("3.5.35"))).await?;
    ensure!(out.status.success(), "{}", text(&out));
    let out = kubectl(&ctx, &["apply", "-f", "-"], Some(&at("3.7.3"))).await?;
    let said = text(&out);
    println!("kubectl apply of a skip from 3.5.35 to 3.7.3:\n{said}");
    ensure!(!out.status.success(), "a skip was accepted: {said}");
    ensure!(said.contains("spec.version: cannot move from 3.5.35 to 3.7.3: etcd upgrades one minor line at a time; move to 3.6.x first"), "{said}");
    // The supported next step is accepted.
    let out = kubectl(&ctx, &["apply", "-f", "-"], Some(&at("3.6.16"))).await?;
    ensure!(out.status.success(), "{}", text(&out));
    Ok(())
}

async fn a_schema_bound_is_enforced_by_the_api_server_itself(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    let zero = "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: zero\nspec:\n  size: 0\n";
    let out = kubectl(&ctx, &["apply", "-f", "-"], Some(zero)).await?;
    let said = text(&out);
    ensure!(!out.status.success(), "size 0 was accepted: {said}");
    ensure!(
        said.contains("spec.size") && said.contains("greater than or equal to 1"),
        "{said}"
    );
    Ok(())
}

/// Issue 27, item 4: `kubectl scale etcdcluster/NAME --replicas=N` works through the scale
/// subresource (`spec.size`, `status.size`, `status.selector`), warns like `kubectl apply` for an
/// even size (the webhook judges `etcdclusters/scale`) and is refused where `kubectl apply`
/// would be, with the same message.
async fn kubectl_scale_meets_the_size_rules_of_kubectl_apply(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    let sized = |name: &str, size: i32| {
        format!(
            "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: {name}\nspec:\n  size: {size}\n  version: \"3.6.16\"\n"
        )
    };
    let out = kubectl(&ctx, &["apply", "-f", "-"], Some(&sized("scaled", 3))).await?;
    ensure!(out.status.success(), "{}", text(&out));
    let api: Api<EtcdCluster> = ctx.api();
    let size = || async { anyhow::Ok(api.get("scaled").await?.spec.size) };

    let out = kubectl(&ctx, &["scale", "etcdcluster/scaled", "--replicas=5"], None).await?;
    let said = text(&out);
    println!("kubectl scale --replicas=5: {said}");
    ensure!(out.status.success(), "{said}");
    ensure!(size().await? == Some(5), "spec.size is not 5");
    // The subresource reads spec.size as its replicas.
    let raw = kubectl(
        &ctx,
        &[
            "get",
            "--raw",
            &format!(
                "/apis/etcd.database.coreos.com/v1beta2/namespaces/{}/etcdclusters/scaled/scale",
                ctx.ns()
            ),
        ],
        None,
    )
    .await?;
    let scale: serde_json::Value = serde_json::from_slice(&raw.stdout)?;
    ensure!(
        scale["kind"] == "Scale" && scale["spec"]["replicas"] == 5,
        "{scale}"
    );

    // An even size is taken with the warning `kubectl apply` gives.
    let out = kubectl(&ctx, &["scale", "etcdcluster/scaled", "--replicas=4"], None).await?;
    let said = text(&out);
    println!("kubectl scale --replicas=4: {said}");
    ensure!(out.status.success(), "{said}");
    ensure!(
        said.contains("Warning: spec.size: 4 members tolerate no more failures than 3"),
        "no even-size warning: {said}"
    );
    ensure!(size().await? == Some(4));

    // 0 and 8 are refused as `kubectl apply` refuses them, and nothing changes.
    for replicas in [0, 8] {
        let applied = kubectl(
            &ctx,
            &["apply", "-f", "-"],
            Some(&sized(&format!("applied-{replicas}"), replicas)),
        )
        .await?;
        let scaled = kubectl(
            &ctx,
            &[
                "scale",
                "etcdcluster/scaled",
                &format!("--replicas={replicas}"),
            ],
            None,
        )
        .await?;
        let (applied, scaled_said) = (text(&applied), text(&scaled));
        println!("kubectl scale --replicas={replicas}: {scaled_said}");
        ensure!(!scaled.status.success(), "scale to {replicas} accepted");
        let bound = if replicas == 0 {
            "spec.size in body should be greater than or equal to 1"
        } else {
            "spec.size in body should be less than or equal to 7"
        };
        ensure!(
            applied.contains(bound) && scaled_said.contains(bound),
            "apply said {applied:?}, scale said {scaled_said:?}"
        );
        ensure!(
            size().await? == Some(4),
            "a refused scale changed spec.size"
        );
    }
    Ok(())
}
