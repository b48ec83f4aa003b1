//! Keeping an operator-managed cluster's CA and certificates in their Secrets: read, decide
//! ([`super::plan`]), issue ([`super::issue`]) and write with server-side apply, owned by the
//! cluster.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams};
use time::OffsetDateTime;

use etcd_shared::names;
use etcd_shared::tls::{CertKind, IssuingSettings};

use super::inspect::{self, CA_CERT, CA_GENERATION, CA_KEY, HeldCa};
use super::issue::{self, CaName, Pem};
use super::plan::{self, Decision, Held, Reason};
use crate::error::{Error, FIELD_MANAGER};
use crate::view::ClusterView;

/// How often a cluster whose CA is due for replacement is reminded of it.
const CA_REMINDER: Duration = Duration::from_secs(3600);

/// One certificate issued by a call of [`ensure`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    /// `ca`, `peer`, `server` or `operator`.
    pub what: &'static str,
    /// Why.
    pub reason: Reason,
    /// Its end of validity, Unix seconds.
    pub not_after: i64,
}

/// When one certificate ends and is due for renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expiry {
    /// `ca`, `peer`, `server` or `operator`.
    pub what: &'static str,
    /// End of validity, Unix seconds.
    pub not_after: i64,
    /// Due for renewal from, Unix seconds.
    pub renew_at: i64,
}

/// What [`ensure`] found and did.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// The certificates issued.
    pub issued: Vec<Issued>,
    /// Each certificate now in its Secret (`ca`, `peer`, ...): its end of validity and the
    /// time it is due for renewal, Unix seconds.
    pub expiries: Vec<Expiry>,
    /// When to look again at the latest (the next renewal).
    pub next_check: Option<Duration>,
    /// Something a person must do, in words (the CA cannot be replaced safely by itself).
    pub attention: Option<String>,
}

fn secret_data(pairs: &[(&str, &str)]) -> BTreeMap<String, ByteString> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect()
}

async fn write(
    api: &Api<Secret>,
    view: &ClusterView,
    name: &str,
    data: BTreeMap<String, ByteString>,
    annotations: BTreeMap<String, String>,
) -> Result<(), Error> {
    let secret = Secret {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(view.namespace.clone()),
            labels: Some(names::object_labels(&view.name, "tls")),
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references: Some(vec![view.owner.clone()]),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Default::default()
    };
    let mut value = serde_json::to_value(&secret).map_err(|source| Error::Serialize {
        what: "secret",
        source,
    })?;
    value["apiVersion"] = "v1".into();
    value["kind"] = "Secret".into();
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&value),
    )
    .await
    .map_err(Error::kube(format!("apply secret {name}")))?;
    Ok(())
}

async fn get(api: &Api<Secret>, name: &str) -> Result<Option<Secret>, Error> {
    api.get_opt(name)
        .await
        .map_err(Error::kube(format!("get secret {name}")))
}

/// Makes sure the cluster's CA and its peer, server and operator certificates exist, are
/// signed by the CA and carry the names the members need, and are renewed `renewBefore` ahead
/// of their end (also when they expired while the operator was down). A CA that is missing or
/// expired is replaced only when no certificate it signed is still valid (a new CA beside valid
/// old certificates would cut members that trust only the old one from their peers); a CA due
/// for replacement is reported, not replaced.
pub async fn ensure(
    client: &kube::Client,
    view: &ClusterView,
    settings: &IssuingSettings,
) -> Result<Outcome, Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &view.namespace);
    let now = OffsetDateTime::now_utc();
    let now_s = now.unix_timestamp();
    let mut out = Outcome::default();
    let ca_secret_name = names::ca_secret_name(&view.name);
    let ca_secret = get(&api, &ca_secret_name).await?;
    let (ca_held, held_ca) = inspect::ca(ca_secret.as_ref(), &view.name, &view.namespace);
    let mut leaves = Vec::new();
    for kind in CertKind::ALL {
        leaves.push((kind, get(&api, &kind.secret_name(&view.name)).await?));
    }
    let generation = held_ca.as_ref().map_or(0, |c| c.name.generation);
    let ca = match (plan::decide_ca(&ca_held, now_s, settings), held_ca) {
        (Decision::Keep(after), Some(ca)) => {
            out.next_check = Some(after);
            ca
        }
        (Decision::Issue(Reason::Due), Some(ca)) => {
            out.attention = Some(format!(
                "the cluster's CA ({}) is in the last third of its life; replacing it with members trusting both is not automated yet: delete the Secret {ca_secret_name} and every {}-*-tls Secret to start over from a new CA (members restart to trust it)",
                ca.name.common_name(),
                view.name
            ));
            out.next_check = Some(CA_REMINDER);
            ca
        }
        _ => {
            let still_valid = leaves.iter().any(|(kind, s)| {
                inspect::leaf_not_after(*kind, s.as_ref()).is_some_and(|end| end > now_s)
            });
            if still_valid && generation > 0 {
                out.attention = Some(format!(
                    "the CA Secret {ca_secret_name} is unusable ({}) while certificates it signed are still valid: not replacing it (members trusting only the old CA would refuse peers with new certificates); restore the Secret, or delete the {}-*-tls Secrets to start over",
                    describe(&ca_held),
                    view.name
                ));
                return Ok(out);
            }
            let name = CaName {
                cluster: view.name.clone(),
                namespace: view.namespace.clone(),
                generation: generation + 1,
            };
            let pem = issue::new_ca(&name, now, settings.ca_duration).map_err(issue_error)?;
            let reason = match ca_held {
                Held::Missing => Reason::Missing,
                Held::Unreadable(_) => Reason::Unreadable,
                Held::Present(_) => Reason::Expired,
            };
            write(
                &api,
                view,
                &ca_secret_name,
                secret_data(&[(CA_CERT, &pem.cert), (CA_KEY, &pem.key)]),
                BTreeMap::from([(CA_GENERATION.to_string(), name.generation.to_string())]),
            )
            .await?;
            let end = now_s + secs(settings.ca_duration);
            out.issued.push(Issued {
                what: "ca",
                reason,
                not_after: end,
            });
            HeldCa {
                subject: format!("O=etcd-operator, CN={}", name.common_name()),
                name,
                pem,
                held: Held::Missing,
            }
        }
    };
    let ca_end = inspect::not_after(&ca.held).unwrap_or_else(|| now_s + secs(settings.ca_duration));
    out.expiries.push(Expiry {
        what: "ca",
        not_after: ca_end,
        renew_at: ca_end - secs(settings.ca_renew_before()),
    });
    for (kind, secret) in &leaves {
        let wanted = kind.dns_names(&view.name, &view.namespace, view.domain.as_deref());
        let held = inspect::leaf(*kind, secret.as_ref(), &ca, &wanted);
        match plan::decide(&held, now_s, settings.renew_before) {
            Decision::Keep(after) => {
                out.next_check = Some(out.next_check.map_or(after, |n| n.min(after)));
                let end = inspect::not_after(&held).unwrap_or(now_s);
                out.expiries.push(Expiry {
                    what: kind.as_str(),
                    not_after: end,
                    renew_at: end - secs(settings.renew_before),
                });
            }
            Decision::Issue(reason) => {
                let pem = issue::issue_leaf(
                    *kind,
                    &view.name,
                    &view.namespace,
                    view.domain.as_deref(),
                    &ca.name,
                    &ca.pem,
                    now,
                    settings.duration,
                )
                .map_err(issue_error)?;
                write_leaf(&api, view, *kind, &pem, &ca).await?;
                let end = now_s + secs(settings.duration);
                out.issued.push(Issued {
                    what: kind.as_str(),
                    reason,
                    not_after: end,
                });
                out.expiries.push(Expiry {
                    what: kind.as_str(),
                    not_after: end,
                    renew_at: end - secs(settings.renew_before),
                });
                let after = settings.duration.saturating_sub(settings.renew_before);
                out.next_check = Some(out.next_check.map_or(after, |n| n.min(after)));
            }
        }
    }
    Ok(out)
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 2)
}

fn describe(held: &Held) -> String {
    match held {
        Held::Missing => "missing".into(),
        Held::Unreadable(why) => format!("unreadable: {why}"),
        Held::Present(_) => "expired".into(),
    }
}

fn issue_error(e: issue::IssueError) -> Error {
    Error::Certificates(e.to_string())
}

/// Writes a leaf in CoreOS' layout, with the CA as its trust bundle.
async fn write_leaf(
    api: &Api<Secret>,
    view: &ClusterView,
    kind: CertKind,
    pem: &Pem,
    ca: &HeldCa,
) -> Result<(), Error> {
    let [cert, key, bundle] = kind.coreos_keys();
    write(
        api,
        view,
        &kind.secret_name(&view.name),
        secret_data(&[(cert, &pem.cert), (key, &pem.key), (bundle, &ca.pem.cert)]),
        BTreeMap::new(),
    )
    .await
}
