//! The objects that register this webhook with the API server: a
//! `ValidatingWebhookConfiguration` for `/validate` and a `MutatingWebhookConfiguration` for
//! `/mutate`, both for CREATE and UPDATE of `etcd.database.coreos.com/v1beta2` `etcdclusters`
//! (validation also of `etcdbackups` and `etcdrestores`, which nothing defaults),
//! with `sideEffects: None`, `failurePolicy: Fail`, `timeoutSeconds: 5` and
//! `admissionReviewVersions: [v1]`. The test suites register these; the Helm chart keeps its
//! own template, which `etcd_tests::chart::check_webhook` compares with these field by field.

use etcd_shared::EtcdCluster;
use etcd_shared::types::{EtcdBackup, EtcdRestore};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;

/// Name of the validating webhook, shown in refusals: `admission webhook "NAME" denied the
/// request: ...`.
pub const VALIDATING_WEBHOOK_NAME: &str = "validate.etcdclusters.etcd.database.coreos.com";

/// Name of the mutating (defaulting) webhook.
pub const MUTATING_WEBHOOK_NAME: &str = "default.etcdclusters.etcd.database.coreos.com";

/// Seconds the API server waits for an answer before applying the failure policy.
pub const TIMEOUT_SECONDS: i32 = 5;

/// Where the API server reaches the webhook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WebhookTarget {
    /// A URL base such as `https://127.0.0.1:9443` (the paths are appended).
    Url(String),
    /// A Service in the cluster.
    Service {
        /// Namespace of the Service.
        namespace: String,
        /// Name of the Service.
        name: String,
        /// Port of the Service (the API server's default is 443).
        port: Option<i32>,
    },
}

impl WebhookTarget {
    fn client_config(&self, path: &str, ca_bundle_pem: &[u8]) -> WebhookClientConfig {
        let ca_bundle = Some(ByteString(ca_bundle_pem.to_vec()));
        match self {
            WebhookTarget::Url(base) => WebhookClientConfig {
                ca_bundle,
                service: None,
                url: Some(format!("{}{path}", base.trim_end_matches('/'))),
            },
            WebhookTarget::Service {
                namespace,
                name,
                port,
            } => WebhookClientConfig {
                ca_bundle,
                service: Some(ServiceReference {
                    name: name.clone(),
                    namespace: namespace.clone(),
                    path: Some(path.to_string()),
                    port: *port,
                }),
                url: None,
            },
        }
    }
}

/// CREATE and UPDATE of the given resources of our group and version.
fn rules(resources: Vec<String>) -> Vec<RuleWithOperations> {
    vec![RuleWithOperations {
        api_groups: Some(vec![EtcdCluster::group(&()).into_owned()]),
        api_versions: Some(vec![EtcdCluster::version(&()).into_owned()]),
        operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
        resources: Some(resources),
        scope: Some("Namespaced".into()),
    }]
}

/// What `/validate` judges: every kind of ours, and a cluster's scale subresource
/// (`kubectl scale`).
fn validated_resources() -> Vec<String> {
    vec![
        EtcdCluster::plural(&()).into_owned(),
        format!("{}/scale", EtcdCluster::plural(&())),
        EtcdBackup::plural(&()).into_owned(),
        EtcdRestore::plural(&()).into_owned(),
    ]
}

/// What `/mutate` defaults: clusters only.
fn defaulted_resources() -> Vec<String> {
    vec![EtcdCluster::plural(&()).into_owned()]
}

fn metadata(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        ..ObjectMeta::default()
    }
}

/// The `ValidatingWebhookConfiguration` named `name` that sends EtcdCluster, EtcdBackup and
/// EtcdRestore creates and updates to `target`'s `/validate`, trusting `ca_bundle_pem` for its certificate.
pub fn validating_webhook_configuration(
    name: &str,
    target: &WebhookTarget,
    ca_bundle_pem: &[u8],
) -> ValidatingWebhookConfiguration {
    ValidatingWebhookConfiguration {
        metadata: metadata(name),
        webhooks: Some(vec![ValidatingWebhook {
            name: VALIDATING_WEBHOOK_NAME.into(),
            admission_review_versions: vec!["v1".into()],
            client_config: target.client_config("/validate", ca_bundle_pem),
            failure_policy: Some("Fail".into()),
            match_policy: Some("Equivalent".into()),
            rules: Some(rules(validated_resources())),
            side_effects: "None".into(),
            timeout_seconds: Some(TIMEOUT_SECONDS),
            ..ValidatingWebhook::default()
        }]),
    }
}

/// The `MutatingWebhookConfiguration` named `name` that sends EtcdCluster creates and updates
/// to `target`'s `/mutate`, trusting `ca_bundle_pem` for its certificate.
pub fn mutating_webhook_configuration(
    name: &str,
    target: &WebhookTarget,
    ca_bundle_pem: &[u8],
) -> MutatingWebhookConfiguration {
    MutatingWebhookConfiguration {
        metadata: metadata(name),
        webhooks: Some(vec![MutatingWebhook {
            name: MUTATING_WEBHOOK_NAME.into(),
            admission_review_versions: vec!["v1".into()],
            client_config: target.client_config("/mutate", ca_bundle_pem),
            failure_policy: Some("Fail".into()),
            match_policy: Some("Equivalent".into()),
            // Defaulting only fills what is missing, so another webhook's later change never
            // needs this one again.
            reinvocation_policy: Some("Never".into()),
            rules: Some(rules(defaulted_resources())),
            side_effects: "None".into(),
            timeout_seconds: Some(TIMEOUT_SECONDS),
            ..MutatingWebhook::default()
        }]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_both_configurations() {
        let target = WebhookTarget::Url("https://127.0.0.1:9443/".into());
        let v = serde_json::to_value(validating_webhook_configuration(
            "etcd-operator",
            &target,
            b"PEM",
        ))
        .unwrap();
        let hook = &v["webhooks"][0];
        assert_eq!(v["metadata"]["name"], "etcd-operator");
        assert_eq!(
            hook["clientConfig"]["url"],
            "https://127.0.0.1:9443/validate"
        );
        assert_eq!(hook["clientConfig"]["caBundle"], "UEVN");
        assert_eq!(hook["sideEffects"], "None");
        assert_eq!(hook["failurePolicy"], "Fail");
        assert_eq!(hook["timeoutSeconds"], 5);
        assert_eq!(hook["admissionReviewVersions"], json!(["v1"]));
        assert_eq!(
            hook["rules"],
            json!([{
                "apiGroups": ["etcd.database.coreos.com"],
                "apiVersions": ["v1beta2"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["etcdclusters", "etcdclusters/scale", "etcdbackups", "etcdrestores"],
                "scope": "Namespaced"
            }])
        );
        let service = WebhookTarget::Service {
            namespace: "etcd".into(),
            name: "etcd-webhook".into(),
            port: Some(443),
        };
        let m =
            serde_json::to_value(mutating_webhook_configuration("x", &service, b"PEM")).unwrap();
        assert_eq!(
            m["webhooks"][0]["clientConfig"]["service"],
            json!({"name": "etcd-webhook", "namespace": "etcd", "path": "/mutate", "port": 443})
        );
        assert_eq!(m["webhooks"][0]["name"], MUTATING_WEBHOOK_NAME);
        assert_eq!(
            m["webhooks"][0]["rules"][0]["resources"],
            json!(["etcdclusters"])
        );
    }
}
