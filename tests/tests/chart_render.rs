//! The Helm chart (`charts/etcd-operator`) rendered by each pinned Helm major (3 and 4): lint
//! (also `--strict`), rendering in every mode, values.schema.json refusals, and server-side dry
//! runs of the rendered manifests on the local control plane.
//!
//! Run: `cargo test -p etcd-tests --test chart_render` (needs `hack/build-tools.sh` first).

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;

use anyhow::{Context as _, ensure};
use serde_json::{Value, json};

use etcd_tests::chart::*;
use etcd_tests::helm::{Helm, HelmMajor, output, run_ok};
use etcd_tests::suite::{TestContext, run_suite};

fn main() -> ExitCode {
    run_suite(
        [
            per_major("chart_lints_strictly", chart_lints_strictly),
            per_major("chart_renders_with_defaults", chart_renders_with_defaults),
            per_major(
                "chart_renders_cert_manager_mode",
                chart_renders_cert_manager_mode,
            ),
            per_major("chart_renders_namespace_mode", chart_renders_namespace_mode),
            per_major(
                "chart_renders_optional_features",
                chart_renders_optional_features,
            ),
            per_major("chart_renders_monitoring", chart_renders_monitoring),
            per_major(
                "bad_values_are_refused_by_the_schema",
                bad_values_are_refused_by_the_schema,
            ),
            per_major(
                "rendered_manifests_pass_server_side_dry_run",
                rendered_manifests_pass_server_side_dry_run,
            ),
        ]
        .into_iter()
        .flatten()
        .collect(),
    )
}

// ---------------------------------------------------------------------------------------------
// 1. lint and template
// ---------------------------------------------------------------------------------------------

/// `helm lint` and `helm lint --strict` pass for the default values and the other modes that
/// need nothing from the cluster.
async fn chart_lints_strictly(ctx: TestContext, major: HelmMajor) -> anyhow::Result<()> {
    let helm = Helm::new(ctx.control_plane(), major)?;
    let kube_version = kube_version()?;
    let chart = chart_dir();
    let variants: [&[&str]; 4] = [
        &[],
        &["--set", "controller.watchNamespace=apps"],
        &["--set", "metrics.grafanaDashboard.enabled=true"],
        &[
            "--set",
            "webhook.clientConfig.url=https://127.0.0.1:9443",
            "--set",
            "webhook.replicas=1",
            "--set",
            "controller.replicas=2",
        ],
    ];
    for strict in [false, true] {
        for extra in variants {
            let mut args: Vec<&std::ffi::OsStr> = vec![
                "lint".as_ref(),
                chart.as_os_str(),
                "--kube-version".as_ref(),
                kube_version.as_ref(),
            ];
            if strict {
                args.push("--strict".as_ref());
            }
            args.extend(extra.iter().map(std::ffi::OsStr::new));
            let out = run_ok(helm.command(args), None).await?;
            ensure!(
                out.contains("1 chart(s) linted, 0 chart(s) failed"),
                "helm lint (strict: {strict}, {extra:?}):\n{out}"
            );
            ensure!(
                !out.contains("[WARNING]") && !out.contains("[ERROR]"),
                "helm lint reported problems (strict: {strict}, {extra:?}):\n{out}"
            );
        }
    }
    Ok(())
}

/// The default rendering: every object, the flags of both binaries, probes, Pod Security
/// `restricted`, the webhook configurations and the self-signed certificate they trust.
async fn chart_renders_with_defaults(ctx: TestContext, major: HelmMajor) -> anyhow::Result<()> {
    let helm = Helm::new(ctx.control_plane(), major)?;
    let (release, ns) = ("defaults", "operators");
    let m = template(&helm, release, ns, &[]).await?;
    let full = fullname(release);

    let expected: BTreeMap<String, usize> = [
        ("ClusterRole", 1),
        ("ClusterRoleBinding", 1),
        ("Deployment", 2),
        ("MutatingWebhookConfiguration", 1),
        ("NetworkPolicy", 2),
        ("PodDisruptionBudget", 1),
        ("Role", 1),
        ("RoleBinding", 1),
        ("Secret", 1),
        ("Service", 3),
        ("ServiceAccount", 2),
        ("ValidatingWebhookConfiguration", 1),
    ]
    .into_iter()
    .map(|(k, n)| (k.to_owned(), n))
    .collect();
    ensure!(m.kinds() == expected, "rendered kinds: {:?}", m.kinds());
    check_labels(&m, release)?;
    // The chart's own pods admit only what they serve: the webhook port from anywhere (the
    // API server), metrics (no monitoring namespace set: from anywhere); nothing else.
    let webhook_policy = m.get("NetworkPolicy", &format!("{full}-webhook"))?;
    ensure!(
        webhook_policy.pointer("/spec/ingress/0/ports/0/port") == Some(&json!(9443))
            && webhook_policy.pointer("/spec/ingress/0/from").is_none()
            && webhook_policy.pointer("/spec/ingress/1/ports/0/port") == Some(&json!(8080)),
        "webhook policy: {webhook_policy}"
    );
    ensure!(
        webhook_policy.pointer("/spec/ingress/2").is_none()
            && webhook_policy
                .pointer("/spec/policyTypes/0")
                .and_then(|v| v.as_str())
                == Some("Ingress"),
        "webhook policy: {webhook_policy}"
    );
    for doc in &m.0 {
        let cluster_scoped = matches!(
            str_at(doc, "/kind"),
            "ClusterRole"
                | "ClusterRoleBinding"
                | "MutatingWebhookConfiguration"
                | "ValidatingWebhookConfiguration"
        );
        if cluster_scoped {
            ensure!(
                str_at(doc, "/metadata/name") == cluster_name(release, ns),
                "{}: cluster-scoped objects are named per release and namespace",
                object_id(doc)
            );
        } else {
            ensure!(
                str_at(doc, "/metadata/namespace") == ns,
                "{}: namespace {:?}",
                object_id(doc),
                doc["metadata"]["namespace"]
            );
        }
    }

    // The controller.
    let controller = m.get("Deployment", &format!("{full}-controller"))?;
    ensure!(controller["spec"]["replicas"] == 1, "controller replicas");
    check_restricted(controller)?;
    let c = container(controller, "controller")?;
    let args = strings(&c["args"]);
    for flag in [
        "--leader-elect=true".to_owned(),
        format!("--leader-election-id={full}-controller"),
        "--metrics-bind-address=:8080".to_owned(),
        "--health-probe-bind-address=:8081".to_owned(),
        "--log-format=json".to_owned(),
        "--log-level=info".to_owned(),
    ] {
        ensure!(args.contains(&flag), "controller args {args:?} lack {flag}");
    }
    ensure!(
        !args.iter().any(|a| a.starts_with("--namespace")),
        "controller watches every namespace by default: {args:?}"
    );
    ensure!(
        c["image"] == "etcd-operator/etcd-controller:0.1.0",
        "controller image {}",
        c["image"]
    );
    for (var, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        let env = c["env"]
            .as_array()
            .and_then(|e| e.iter().find(|v| v["name"] == var))
            .with_context(|| format!("controller has no {var}"))?;
        ensure!(
            env["valueFrom"]["fieldRef"]["fieldPath"] == field,
            "{var}: {env}"
        );
    }
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        ensure!(
            c[probe]["httpGet"]["path"] == path && c[probe]["httpGet"]["port"] == "probes",
            "controller {probe}: {}",
            c[probe]
        );
    }
    let ports: Vec<(i64, String)> = c["ports"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    (
                        p["containerPort"].as_i64().unwrap_or(0),
                        str_at(p, "/name").to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    ensure!(
        ports == [(8080, "metrics".to_owned()), (8081, "probes".to_owned())],
        "controller ports {ports:?}"
    );
    ensure!(
        controller["spec"]["template"]["spec"]["serviceAccountName"]
            == format!("{full}-controller"),
        "controller ServiceAccount"
    );

    // The webhook.
    let webhook = m.get("Deployment", &format!("{full}-webhook"))?;
    ensure!(webhook["spec"]["replicas"] == 2, "webhook replicas");
    check_restricted(webhook)?;
    let pod = &webhook["spec"]["template"]["spec"];
    ensure!(
        pod["automountServiceAccountToken"] == false,
        "the webhook calls no API: no token"
    );
    ensure!(
        pod["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname",
        "webhook spread: {}",
        pod["topologySpreadConstraints"]
    );
    ensure!(
        pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
            ["topologyKey"]
            == "kubernetes.io/hostname",
        "webhook anti-affinity: {}",
        pod["affinity"]
    );
    let w = container(webhook, "webhook")?;
    let args = strings(&w["args"]);
    for flag in [
        "--tls-cert-file=/tls/tls.crt",
        "--tls-private-key-file=/tls/tls.key",
        "--bind-address=0.0.0.0:9443",
        "--metrics-bind-address=:8080",
        "--health-probe-bind-address=:8081",
    ] {
        ensure!(
            args.iter().any(|a| a == flag),
            "webhook args {args:?} lack {flag}"
        );
    }
    let mount = &w["volumeMounts"][0];
    ensure!(
        mount["mountPath"] == "/tls" && mount.get("subPath").is_none(),
        "the certificate Secret is mounted as a directory: {mount}"
    );
    ensure!(
        pod["volumes"][0]["secret"]["secretName"] == format!("{full}-webhook-tls"),
        "webhook volume {}",
        pod["volumes"]
    );
    let webhook_sa = m.get("ServiceAccount", &format!("{full}-webhook"))?;
    ensure!(webhook_sa["automountServiceAccountToken"] == false);
    let pdb = m.get("PodDisruptionBudget", &format!("{full}-webhook"))?;
    ensure!(pdb["spec"]["minAvailable"] == 1, "webhook PDB {pdb}");

    // Services.
    let svc = m.get("Service", &format!("{full}-webhook"))?;
    ensure!(
        svc["spec"]["ports"]
            == json!([{"name": "https", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]),
        "webhook Service ports {}",
        svc["spec"]["ports"]
    );
    for component in ["controller", "webhook"] {
        let metrics = m.get("Service", &format!("{full}-{component}-metrics"))?;
        ensure!(
            metrics["spec"]["ports"]
                == json!([{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}]),
            "{component} metrics Service {}",
            metrics["spec"]["ports"]
        );
        ensure!(
            metrics["spec"]["selector"]["app.kubernetes.io/component"] == component,
            "{component} metrics selector"
        );
    }

    // Webhook configurations and the certificate they trust.
    let secret = m.get("Secret", &format!("{full}-webhook-tls"))?;
    let ca = b64(&secret["data"]["ca.crt"], "ca.crt")?;
    let crt = b64(&secret["data"]["tls.crt"], "tls.crt")?;
    b64(&secret["data"]["tls.key"], "tls.key")?;
    check_serving_pair(&ca, &crt, &service_dns_names(release, ns))?;
    let name = cluster_name(release, ns);
    for (kind, hook, path) in [
        ("MutatingWebhookConfiguration", MUTATING_WEBHOOK, "/mutate"),
        (
            "ValidatingWebhookConfiguration",
            VALIDATING_WEBHOOK,
            "/validate",
        ),
    ] {
        let configuration = m.get(kind, &name)?;
        let mut without_bundle = configuration.clone();
        let bundle = without_bundle["webhooks"][0]["clientConfig"]
            .as_object_mut()
            .and_then(|c| c.remove("caBundle"))
            .with_context(|| format!("{kind} has no caBundle"))?;
        ensure!(
            b64(&bundle, "caBundle")? == ca,
            "{kind}: caBundle is not the Secret's ca.crt"
        );
        check_webhook(&without_bundle, hook, path, release, ns)?;
        ensure!(
            configuration["webhooks"][0]
                .get("namespaceSelector")
                .is_none(),
            "{kind}: all namespaces by default"
        );
    }
    Ok(())
}

/// cert-manager mode: refused without cert-manager's API; with it, an Issuer chain and a
/// Certificate, CA injection annotations and no chart-made Secret; a given issuerRef replaces
/// the chain.
async fn chart_renders_cert_manager_mode(ctx: TestContext, major: HelmMajor) -> anyhow::Result<()> {
    let helm = Helm::new(ctx.control_plane(), major)?;
    let (release, ns) = ("certmanager", "operators");
    let full = fullname(release);
    let mode = ["--set", "webhook.certificates.mode=cert-manager"];

    let refused = template_failing(&helm, &mode).await?;
    ensure!(
        refused.contains("webhook.certificates.mode=cert-manager needs cert-manager"),
        "unexpected refusal: {refused}"
    );

    let with_api = [mode[0], mode[1], "--api-versions", "cert-manager.io/v1"];
    let m = template(&helm, release, ns, &with_api).await?;
    check_labels(&m, release)?;
    ensure!(
        m.of_kind("Secret").next().is_none(),
        "cert-manager makes the Secret, not the chart"
    );
    let issuers: BTreeSet<&str> = m
        .of_kind("Issuer")
        .map(|d| str_at(d, "/metadata/name"))
        .collect();
    ensure!(
        issuers
            == [
                format!("{full}-webhook-ca").as_str(),
                format!("{full}-webhook-selfsigned").as_str()
            ]
            .into_iter()
            .collect::<BTreeSet<_>>(),
        "issuers {issuers:?}"
    );
    let ca_cert = m.get("Certificate", &format!("{full}-webhook-ca"))?;
    ensure!(ca_cert["spec"]["isCA"] == true, "CA Certificate {ca_cert}");
    let serving = m.get("Certificate", &format!("{full}-webhook"))?;
    ensure!(
        serving["spec"]["secretName"] == format!("{full}-webhook-tls"),
        "serving Certificate secretName"
    );
    let dns: BTreeSet<String> = strings(&serving["spec"]["dnsNames"]).into_iter().collect();
    ensure!(
        dns == service_dns_names(release, ns),
        "serving Certificate dnsNames {dns:?}"
    );
    ensure!(
        serving["spec"]["issuerRef"]["name"] == format!("{full}-webhook-ca"),
        "serving Certificate issuerRef {}",
        serving["spec"]["issuerRef"]
    );
    for (kind, hook, path) in [
        ("MutatingWebhookConfiguration", MUTATING_WEBHOOK, "/mutate"),
        (
            "ValidatingWebhookConfiguration",
            VALIDATING_WEBHOOK,
            "/validate",
        ),
    ] {
        let configuration = m.get(kind, &cluster_name(release, ns))?;
        ensure!(
            configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
                == format!("{ns}/{full}-webhook"),
            "{kind}: annotations {}",
            configuration["metadata"]["annotations"]
        );
        ensure!(
            configuration["webhooks"][0]["clientConfig"]
                .get("caBundle")
                .is_none(),
            "{kind}: the cainjector fills the caBundle"
        );
        check_webhook(configuration, hook, path, release, ns)?;
    }

    // A user-given ClusterIssuer: only the serving Certificate.
    let mut args = with_api.to_vec();
    args.extend([
        "--set",
        "webhook.certificates.certManager.issuerRef.name=corp-ca",
        "--set",
        "webhook.certificates.certManager.issuerRef.kind=ClusterIssuer",
    ]);
    let m = template(&helm, release, ns, &args).await?;
    ensure!(
        m.of_kind("Issuer").next().is_none(),
        "no Issuer of the chart"
    );
    let certificates: Vec<&Value> = m.of_kind("Certificate").collect();
    ensure!(certificates.len() == 1, "one Certificate");
    ensure!(
        certificates[0]["spec"]["issuerRef"]
            == json!({"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}),
        "issuerRef {}",
        certificates[0]["spec"]["issuerRef"]
    );
    Ok(())
}

/// Namespace-restricted RBAC: a Role and RoleBinding in the watched namespace, `--namespace`,
/// webhooks limited to that namespace, and no ClusterRole.
async fn chart_renders_namespace_mode(ctx: TestContext, major: HelmMajor) -> anyhow::Result<()> {
    let helm = Helm::new(ctx.control_plane(), major)?;
    let (release, ns, watched) = ("scoped", "operators", "apps");
    let full = fullname(release);
    let m = template(
        &helm,
        release,
        ns,
        &["--set", &format!("controller.watchNamespace={watched}")],
    )
    .await?;
    check_labels(&m, release)?;
    ensure!(
        m.of_kind("ClusterRole").next().is_none()
            && m.of_kind("ClusterRoleBinding").next().is_none(),
        "no cluster-wide RBAC in namespace mode: {:?}",
        m.kinds()
    );
    let role = m.get("Role", &format!("{full}-controller"))?;
    ensure!(role["metadata"]["namespace"] == watched, "Role namespace");
    let binding = m.get("RoleBinding", &format!("{full}-controller"))?;
    ensure!(
        binding["metadata"]["namespace"] == watched
            && binding["roleRef"]["kind"] == "Role"
            && binding["subjects"][0]["namespace"] == ns,
        "RoleBinding {binding}"
    );
    let lease_role = m.get("Role", &format!("{full}-controller-leader-election"))?;
    ensure!(
        lease_role["metadata"]["namespace"] == ns,
        "lease Role namespace"
    );
    let controller = m.get("Deployment", &format!("{full}-controller"))?;
    let args = strings(&container(controller, "controller")?["args"]);
    ensure!(
        args.contains(&format!("--namespace={watched}")),
        "controller args {args:?}"
    );
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        let configuration = m.get(kind, &cluster_name(release, ns))?;
        ensure!(
            configuration["webhooks"][0]["namespaceSelector"]
                == json!({"matchLabels": {"kubernetes.io/metadata.name": watched}}),
            "{kind}: namespaceSelector {}",
            configuration["webhooks"][0]["namespaceSelector"]
        );
    }
    Ok(())
}

/// `webhook.clientConfig.url`, the ServiceMonitor guard, and values that change the pods.
async fn chart_renders_optional_features(ctx: TestContext, major: HelmMajor) -> anyhow::Result<()> {
    let helm = Helm::new(ctx.control_plane(), major)?;
    let (release, ns) = ("options", "operators");
    let full = fullname(release);

    // A URL instead of the Service; its host goes into the certificate.
    let m = template(
        &helm,
        release,
        ns,
        &[
            "--set",
            "webhook.clientConfig.url=https://192.0.2.10:9443/",
            "--set",
            "webhook.certificates.extraDNSNames={webhook.example.test}",
        ],
    )
    .await?;
    for (kind, path) in [
        ("MutatingWebhookConfiguration", "/mutate"),
        ("ValidatingWebhookConfiguration", "/validate"),
    ] {
        let client = &m.get(kind, &cluster_name(release, ns))?["webhooks"][0]["clientConfig"];
        ensure!(
            client["url"] == format!("https://192.0.2.10:9443{path}")
                && client.get("service").is_none(),
            "{kind}: clientConfig {client}"
        );
    }
    let secret = m.get("Secret", &format!("{full}-webhook-tls"))?;
    let mut dns = service_dns_names(release, ns);
    dns.insert("webhook.example.test".into());
    let cert = check_serving_pair(
        &b64(&secret["data"]["ca.crt"], "ca.crt")?,
        &b64(&secret["data"]["tls.crt"], "tls.crt")?,
        &dns,
    )?;
    ensure!(
        cert.ip_addresses.contains("192.0.2.10"),
        "the URL's IP is in the certificate: {:?}",
        cert.ip_addresses
    );

    // The ServiceMonitor needs the Prometheus Operator's API.
    let refused =
        template_failing(&helm, &["--set", "metrics.serviceMonitor.enabled=true"]).await?;
    ensure!(
        refused.contains("metrics.serviceMonitor.enabled=true needs the Prometheus Operator"),
        "unexpected refusal: {refused}"
    );
    let m = template(
        &helm,
        release,
        ns,
        &[
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "metrics.serviceMonitor.labels.release=prometheus",
            "--api-versions",
            "monitoring.coreos.com/v1/ServiceMonitor",
        ],
    )
    .await?;
    for component in ["controller", "webhook"] {
        let sm = m.get("ServiceMonitor", &format!("{full}-{component}"))?;
        ensure!(
            sm["spec"]["endpoints"][0]["port"] == "metrics"
                && sm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
                    == component
                && sm["metadata"]["labels"]["release"] == "prometheus",
            "ServiceMonitor {sm}"
        );
    }

    // Scheduling and image values reach the pods; a single webhook replica has no PDB.
    let values = helm.values_file(
        "scheduling.yaml",
        r#"
controller:
  replicas: 2
  image: {repository: registry.example/etcd-controller, tag: "1.2.3", pullPolicy: Always}
  logFormat: text
  logLevel: debug
  nodeSelector: {kubernetes.io/os: linux}
  tolerations: [{key: dedicated, operator: Equal, value: operators, effect: NoSchedule}]
  podAnnotations: {example.test/scrape: "yes"}
  priorityClassName: system-cluster-critical
  extraArgs: ["--concurrent-reconciles=8"]
imagePullSecrets: [{name: registry-credentials}]
webhook:
  replicas: 1
  priorityClassName: system-cluster-critical
"#,
    )?;
    let values = values.to_string_lossy().into_owned();
    let m = template(&helm, release, ns, &["-f", &values]).await?;
    let controller = m.get("Deployment", &format!("{full}-controller"))?;
    let pod = &controller["spec"]["template"];
    ensure!(controller["spec"]["replicas"] == 2, "controller replicas");
    ensure!(
        pod["spec"]["nodeSelector"] == json!({"kubernetes.io/os": "linux"})
            && pod["spec"]["tolerations"][0]["key"] == "dedicated"
            && pod["spec"]["priorityClassName"] == "system-cluster-critical"
            && pod["metadata"]["annotations"]["example.test/scrape"] == "yes",
        "controller pod {pod}"
    );
    let c = container(controller, "controller")?;
    ensure!(
        c["image"] == "registry.example/etcd-controller:1.2.3" && c["imagePullPolicy"] == "Always",
        "controller image {}",
        c["image"]
    );
    let args = strings(&c["args"]);
    for flag in [
        "--log-format=text",
        "--log-level=debug",
        "--concurrent-reconciles=8",
        // The pods that run the controller's image elsewhere pull it with the same Secret.
        "--restore-image-pull-secret=registry-credentials",
    ] {
        ensure!(args.iter().any(|a| a == flag), "controller args {args:?}");
    }
    ensure!(
        pod["spec"]["imagePullSecrets"] == json!([{"name": "registry-credentials"}]),
        "controller pod pull secrets {}",
        pod["spec"]["imagePullSecrets"]
    );
    ensure!(
        m.of_kind("PodDisruptionBudget").next().is_none(),
        "no PDB for a single webhook replica"
    );

    // bindPodIP: every server binds the pod IP from the downward API (off by default).
    let m = template(&helm, release, ns, &["--set", "bindPodIP=true"]).await?;
    for (component, binds) in [
        (
            "controller",
            &[
                "--metrics-bind-address=$(POD_IP):8080",
                "--health-probe-bind-address=$(POD_IP):8081",
            ][..],
        ),
        (
            "webhook",
            &[
                "--bind-address=$(POD_IP):9443",
                "--metrics-bind-address=$(POD_IP):8080",
                "--health-probe-bind-address=$(POD_IP):8081",
            ][..],
        ),
    ] {
        let c = container(
            m.get("Deployment", &format!("{full}-{component}"))?,
            component,
        )?;
        let args = strings(&c["args"]);
        for flag in binds {
            ensure!(args.iter().any(|a| a == flag), "{component} args {args:?}");
        }
        let env = c["env"].as_array().cloned().unwrap_or_default();
        ensure!(
            env.iter().any(|e| e["name"] == "POD_IP"
                && e["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"),
            "{component} env {env:?}"
        );
    }
    Ok(())
}

/// values.schema.json refuses wrong types, unknown enum values, out-of-range numbers and
/// unknown keys, naming the value.
async fn bad_values_are_refused_by_the_schema(
    ctx: TestContext,
    major: HelmMajor,
) -> anyhow::Result<()> {
    let helm = Helm::new(ctx.control_plane(), major)?;
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "replicas-string.yaml",
            "webhook:\n  replicas: \"two\"\n",
            &["/webhook/replicas", "got string, want integer"],
        ),
        (
            "mode-bogus.yaml",
            "webhook:\n  certificates:\n    mode: bogus\n",
            &[
                "/webhook/certificates/mode",
                "'self-signed', 'cert-manager'",
            ],
        ),
        (
            "replicas-zero.yaml",
            "controller:\n  replicas: 0\n",
            &["/controller/replicas", "minimum"],
        ),
        (
            "log-format.yaml",
            "controller:\n  logFormat: xml\n",
            &["/controller/logFormat", "'text', 'json'"],
        ),
        (
            "typo.yaml",
            "webhook:\n  replica: 3\n",
            &["/webhook", "additional properties 'replica' not allowed"],
        ),
        (
            "url-http.yaml",
            "webhook:\n  clientConfig:\n    url: http://127.0.0.1:9443\n",
            &["/webhook/clientConfig/url", "does not match pattern"],
        ),
        (
            "timeout.yaml",
            "webhook:\n  timeoutSeconds: 60\n",
            &["/webhook/timeoutSeconds", "maximum"],
        ),
        (
            "watch-namespace.yaml",
            "controller:\n  watchNamespace: Not_A_Namespace\n",
            &["/controller/watchNamespace", "does not match pattern"],
        ),
        (
            "pod-monitor-interval.yaml",
            "metrics:\n  podMonitor:\n    interval: often\n",
            &["/metrics/podMonitor/interval", "does not match pattern"],
        ),
        (
            "rule-typo.yaml",
            "metrics:\n  prometheusRule:\n    enable: true\n",
            &[
                "/metrics/prometheusRule",
                "additional properties 'enable' not allowed",
            ],
        ),
    ];
    for (file, yaml, wanted) in cases {
        let path = helm.values_file(file, yaml)?;
        let path = path.to_string_lossy().into_owned();
        let stderr = template_failing(&helm, &["-f", &path]).await?;
        ensure!(
            stderr.contains("values don't meet the specifications of the schema"),
            "{file}: not a schema refusal:\n{stderr}"
        );
        for w in *wanted {
            ensure!(stderr.contains(w), "{file}: {w:?} not in:\n{stderr}");
        }
    }
    Ok(())
}

/// The Prometheus Operator objects and the dashboard: each refused without its API, and
/// rendered with it as the Prometheus tests expect: the PodMonitor selects member pods by the
/// labels the controller gives them (the `metrics` port, and the client port of pods the
/// controller annotates), the PrometheusRule is `files/alerts.yaml` unchanged, the ConfigMap
/// holds `files/dashboard.json` with the sidecar's label; the monitors pass the strict
/// rendering into scrape jobs (`etcd_tests::prometheus::monitors`).
async fn chart_renders_monitoring(ctx: TestContext, major: HelmMajor) -> anyhow::Result<()> {
    use etcd_shared::names;
    use etcd_tests::prometheus::monitors;
    let helm = Helm::new(ctx.control_plane(), major)?;
    let (release, ns) = ("mon", "operators");
    let full = fullname(release);
    for (value, kind) in [
        ("podMonitor", "PodMonitor"),
        ("prometheusRule", "PrometheusRule"),
    ] {
        let refused =
            template_failing(&helm, &["--set", &format!("metrics.{value}.enabled=true")]).await?;
        ensure!(
            refused.contains(&format!(
                "metrics.{value}.enabled=true needs the Prometheus Operator's CRDs (the cluster does not serve monitoring.coreos.com/v1 {kind})"
            )),
            "unexpected refusal: {refused}"
        );
    }
    let all_on = [
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.podMonitor.enabled=true",
        "--set",
        "metrics.podMonitor.labels.release=prometheus",
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--set",
        "metrics.prometheusRule.labels.role=alert-rules",
        "--set",
        "metrics.grafanaDashboard.enabled=true",
        "--set",
        "metrics.grafanaDashboard.namespace=grafana",
        "--api-versions",
        "monitoring.coreos.com/v1/ServiceMonitor",
        "--api-versions",
        "monitoring.coreos.com/v1/PodMonitor",
        "--api-versions",
        "monitoring.coreos.com/v1/PrometheusRule",
    ];
    let m = template(&helm, release, ns, &all_on).await?;
    check_labels(&m, release)?;
    let kinds = m.kinds();
    for (kind, n) in [
        ("ServiceMonitor", 2),
        ("PodMonitor", 1),
        ("PrometheusRule", 1),
        ("ConfigMap", 1),
    ] {
        ensure!(kinds.get(kind) == Some(&n), "{kind}: {kinds:?}");
    }

    let pm = m.get("PodMonitor", &format!("{full}-etcd-members"))?;
    let mut want_selector = names::selector_labels("x");
    want_selector.remove(names::LABEL_INSTANCE);
    want_selector.insert(names::LABEL_COMPONENT.into(), "member".into());
    ensure!(
        pm["spec"]["selector"]["matchLabels"] == json!(want_selector)
            && pm["spec"]["namespaceSelector"] == json!({"any": true})
            && pm["spec"]["podTargetLabels"] == json!([names::LEGACY_LABEL_CLUSTER])
            && pm["spec"]["jobLabel"] == names::LABEL_NAME
            && pm["metadata"]["labels"]["release"] == "prometheus",
        "PodMonitor {pm}"
    );
    let endpoints = pm["spec"]["podMetricsEndpoints"]
        .as_array()
        .context("endpoints")?;
    let annotation = format!(
        "__meta_kubernetes_pod_annotation_{}",
        monitors::sanitize_label_name(names::ANNOTATION_METRICS_ON_CLIENT_PORT)
    );
    ensure!(
        endpoints.len() == 2
            && endpoints[0]["port"] == "metrics"
            && endpoints[1]["port"] == "client"
            && endpoints[1]["relabelings"][0]["sourceLabels"] == json!([annotation])
            && endpoints[1]["relabelings"][0]["regex"] == "true",
        "PodMonitor endpoints {endpoints:?}"
    );
    let jobs = monitors::jobs_of(
        &m.0,
        monitors::ServiceDiscoveryRole::Endpoints,
        std::path::Path::new("/kubeconfig"),
    )?;
    ensure!(jobs.len() == 4, "scrape jobs: {jobs:#?}");
    for component in ["controller", "webhook"] {
        let sm = m.get("ServiceMonitor", &format!("{full}-{component}"))?;
        let endpoint = &sm["spec"]["endpoints"][0];
        ensure!(
            endpoint["honorLabels"] == (component == "controller")
                && endpoint["relabelings"]
                    == json!([{"targetLabel": "job", "replacement": format!("etcd-operator-{component}")}]),
            "ServiceMonitor {sm}"
        );
    }

    let rule = m.get("PrometheusRule", &format!("{full}-alerts"))?;
    let file: Value = serde_yaml::from_str(&std::fs::read_to_string(
        chart_dir().join("files/alerts.yaml"),
    )?)?;
    ensure!(
        rule["spec"] == file && rule["metadata"]["labels"]["role"] == "alert-rules",
        "the PrometheusRule is not files/alerts.yaml: {}",
        rule["spec"]
    );

    let cm = m.get("ConfigMap", &format!("{full}-dashboard"))?;
    let file: Value = serde_json::from_str(&std::fs::read_to_string(
        chart_dir().join("files/dashboard.json"),
    )?)?;
    let rendered: Value = serde_json::from_str(
        cm["data"]["etcd-operator.json"]
            .as_str()
            .context("the dashboard's key")?,
    )?;
    ensure!(
        rendered == file
            && cm["metadata"]["labels"]["grafana_dashboard"] == "1"
            && cm["metadata"]["namespace"] == "grafana",
        "dashboard ConfigMap {}",
        cm["metadata"]
    );

    // Namespace mode: the members are looked for in the watched namespace only.
    let mut scoped = all_on.to_vec();
    scoped.extend(["--set", "controller.watchNamespace=apps"]);
    let m = template(&helm, release, ns, &scoped).await?;
    let pm = m.get("PodMonitor", &format!("{full}-etcd-members"))?;
    ensure!(
        pm["spec"]["namespaceSelector"] == json!({"matchNames": ["apps"]}),
        "scoped PodMonitor {pm}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 2. server-side dry run
// ---------------------------------------------------------------------------------------------

/// The rendered manifests (defaults, and namespace mode) are accepted by the API server's
/// validation and admission (`kubectl apply --dry-run=server`), Pod Security `restricted`
/// included (it warns on workloads whose pods it would refuse).
async fn rendered_manifests_pass_server_side_dry_run(
    ctx: TestContext,
    major: HelmMajor,
) -> anyhow::Result<()> {
    ensure_crd(&ctx).await?;
    enforce_restricted(&ctx).await?;
    let helm = Helm::new(ctx.control_plane(), major)?;
    let watch = format!("controller.watchNamespace={}", ctx.ns());
    let variants: [(&str, Vec<&str>); 3] = [
        ("dry-defaults", vec![]),
        ("dry-scoped", vec!["--set", &watch]),
        (
            "dry-url",
            vec![
                "--set",
                "webhook.clientConfig.url=https://127.0.0.1:9443",
                "--set",
                "controller.replicas=2",
            ],
        ),
    ];
    for (release, extra) in variants {
        let text = template_text(&helm, release, ctx.ns(), &extra).await?;
        let mut apply = kubectl(&ctx);
        apply.args(["apply", "--dry-run=server", "-f", "-"]);
        let out = output(apply, Some(text.as_bytes())).await?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            out.status.success(),
            "{release}: kubectl apply --dry-run=server failed:\n{stderr}\n{stdout}"
        );
        ensure!(
            !stderr.contains("PodSecurity") && !stderr.to_lowercase().contains("warning"),
            "{release}: warnings from the API server:\n{stderr}"
        );
        let applied = stdout
            .lines()
            .filter(|l| l.contains("(server dry run)"))
            .count();
        let documents = Manifests::parse(&text)?.0.len();
        ensure!(
            applied == documents,
            "{release}: {applied} of {documents} objects dry-run applied:\n{stdout}"
        );
    }
    Ok(())
}
