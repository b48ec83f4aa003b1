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

use super::inspect::{
    self, CA_CERT, CA_GENERATION, CA_KEY, CA_ROTATED_FOR, HeldCa, NEXT_CERT, NEXT_KEY,
    PREVIOUS_CERT,
};
use super::issue::{self, CaName, Pem};
use super::plan::{self, Decision, Held, Reason};
use super::rotation::{self, CaMove, CaPhase, RotationFacts};
use super::served::every_member_serves;
use crate::error::{Error, FIELD_MANAGER};
use crate::planner::{TlsFiles, TlsStamp};
use crate::view::ClusterView;

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
    /// A step of a CA rotation taken: its Event reason and what happened, in words.
    pub rotation: Option<(&'static str, String)>,
    /// The TLS files the Secrets now hold, for the member pods made from now on.
    pub files: Option<TlsFiles>,
}

fn secret_data(pairs: &[(&str, &str)]) -> BTreeMap<String, ByteString> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect()
}

/// Applies (server-side, forced) the cluster's TLS Secret `name` with `data` and
/// `annotations`, labelled and owned as every Secret of the operator's.
pub(super) async fn write(
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

/// A member pod as the CA rotation needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFiles {
    /// Pod (member) name.
    pub name: String,
    /// Its IP, where the served certificates are read.
    pub ip: Option<String>,
    /// The trust bundle's fingerprint it was made with
    /// ([`etcd_shared::names::ANNOTATION_TLS_TRUST`]).
    pub trust: Option<String>,
}

/// What [`ensure`] needs of the cluster's members and its metadata.
#[derive(Debug, Clone, Default)]
pub struct MemberFiles<'a> {
    /// The member pods (terminating ones too: their etcd may still run).
    pub pods: Vec<PodFiles>,
    /// The members the status lists: each must have a pod made with the current bundle
    /// before the CA moves on (a member whose pod is gone from the API may still run).
    pub listed: &'a [String],
    /// The value of the cluster's [`etcd_shared::names::ANNOTATION_ROTATE_CA`].
    pub rotate: Option<&'a str>,
}

/// Makes sure the cluster's CA and its peer, server and operator certificates exist, are
/// signed by the CA and carry the names the members need, and are renewed `renewBefore` ahead
/// of their end (also when they expired while the operator was down). A CA that is missing or
/// expired is replaced only when no certificate it signed is still valid (a new CA beside valid
/// old certificates would cut members that trust only the old one from their peers); a CA due
/// for replacement, or one a rotation is asked for, is rotated ([`super::rotation`]), one move
/// per call, on what `members` run with.
pub async fn ensure(
    client: &kube::Client,
    view: &ClusterView,
    settings: &IssuingSettings,
    members: &MemberFiles<'_>,
) -> Result<Outcome, Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &view.namespace);
    let now = OffsetDateTime::now_utc();
    let mut out = Outcome::default();
    let held = Secrets::read(&api, view).await?;
    let Some((ca, rotation, due)) =
        settle_ca(&api, view, settings, members, &held, now, &mut out).await?
    else {
        return Ok(out);
    };
    let (ca, rotation) = rotate(
        &api,
        view,
        settings,
        members,
        &held,
        (ca, rotation, due),
        now,
        &mut out,
    )
    .await?;
    let bundle = rotation.bundle(&ca);
    let ca_end = inspect::not_after(&ca.held)
        .unwrap_or_else(|| now.unix_timestamp() + secs(settings.ca_duration));
    out.expiries.push(Expiry {
        what: "ca",
        not_after: ca_end,
        renew_at: ca_end - secs(settings.ca_renew_before()),
    });
    let served = keep_leaves(
        &api,
        view,
        settings,
        &held.leaves,
        &ca,
        &bundle,
        now,
        &mut out,
    )
    .await?;
    out.files = Some(TlsFiles {
        current: TlsStamp {
            trust: Some(rotation::fingerprint([bundle.as_str()])),
            leaves: Some(rotation::fingerprint(
                served
                    .iter()
                    .filter(|(k, _)| matches!(k, CertKind::Peer | CertKind::Server))
                    .map(|(_, c)| c.as_str()),
            )),
        },
        rotating: rotation.phase() != CaPhase::Steady,
    });
    Ok(out)
}

/// What the cluster's certificate Secrets hold when a call of [`ensure`] begins.
struct Secrets {
    ca_secret: Option<Secret>,
    leaves: Vec<(CertKind, Option<Secret>)>,
}

impl Secrets {
    async fn read(api: &Api<Secret>, view: &ClusterView) -> Result<Self, Error> {
        let ca_secret = get(api, &names::ca_secret_name(&view.name)).await?;
        let mut leaves = Vec::new();
        for kind in CertKind::ALL {
            leaves.push((kind, get(api, &kind.secret_name(&view.name)).await?));
        }
        Ok(Secrets { ca_secret, leaves })
    }
}

/// The CA that signs, the rotation the CA Secret holds, and whether the CA is due; a new CA
/// when there is none usable and no certificate of the old one is still valid. `None` (with
/// `out.attention` said) when the CA Secret is unusable beside valid certificates.
async fn settle_ca(
    api: &Api<Secret>,
    view: &ClusterView,
    settings: &IssuingSettings,
    members: &MemberFiles<'_>,
    held: &Secrets,
    now: OffsetDateTime,
    out: &mut Outcome,
) -> Result<Option<(HeldCa, inspect::HeldRotation, bool)>, Error> {
    let now_s = now.unix_timestamp();
    let (ca_held, held_ca) = inspect::ca(held.ca_secret.as_ref(), &view.name, &view.namespace);
    let generation = held_ca.as_ref().map_or(0, |c| c.name.generation);
    let rotation = inspect::rotation(
        held.ca_secret.as_ref(),
        &view.name,
        &view.namespace,
        generation,
    );
    match (plan::decide_ca(&ca_held, now_s, settings), held_ca) {
        (Decision::Keep(after), Some(ca)) => {
            out.next_check = Some(after);
            return Ok(Some((ca, rotation, false)));
        }
        (Decision::Issue(Reason::Due), Some(ca)) => {
            out.next_check = Some(CA_RECHECK);
            return Ok(Some((ca, rotation, true)));
        }
        _ => {}
    }
    let still_valid = held
        .leaves
        .iter()
        .any(|(kind, s)| inspect::leaf_not_after(*kind, s.as_ref()).is_some_and(|end| end > now_s));
    if still_valid && generation > 0 {
        out.attention = Some(format!(
            "the CA Secret {} is unusable ({}) while certificates it signed are still valid: not replacing it (members trusting only the old CA would refuse peers with new certificates); restore the Secret, or delete the {}-*-tls Secrets to start over",
            names::ca_secret_name(&view.name),
            describe(&ca_held),
            view.name
        ));
        return Ok(None);
    }
    let reason = match ca_held {
        Held::Missing => Reason::Missing,
        Held::Unreadable(_) => Reason::Unreadable,
        Held::Present(_) => Reason::Expired,
    };
    let ca = new_ca(view, generation + 1, now, settings)?;
    let rotation = inspect::HeldRotation {
        rotated_for: members.rotate.map(str::to_string),
        ..Default::default()
    };
    write_ca(api, view, &ca, &rotation).await?;
    out.issued.push(Issued {
        what: "ca",
        reason,
        not_after: now_s + secs(settings.ca_duration),
    });
    Ok(Some((ca, rotation, false)))
}

/// What the rotation's next move depends on: its phase, whether a rotation is `wanted`,
/// whether every member pod (and a pod of every member the status lists) was made with the
/// current bundle, and, once the new CA signs, whether every member serves its certificates.
async fn rotation_facts(
    view: &ClusterView,
    members: &MemberFiles<'_>,
    held: &Secrets,
    ca: &HeldCa,
    rotation: &inspect::HeldRotation,
    wanted: bool,
) -> RotationFacts {
    let bundle = rotation.bundle(ca);
    let trust = rotation::fingerprint([bundle.as_str()]);
    let members_trust_bundle = !members.pods.is_empty()
        && members
            .pods
            .iter()
            .all(|p| p.trust.as_deref() == Some(trust.as_str()))
        && members
            .listed
            .iter()
            .all(|name| members.pods.iter().any(|p| &p.name == name));
    let phase = rotation.phase();
    let members_serve_leaves = phase == CaPhase::LeavesMoved
        && members_trust_bundle
        && serve_current_leaves(view, &held.leaves, ca, &bundle, members).await;
    RotationFacts {
        phase,
        wanted,
        members_trust_bundle,
        members_serve_leaves,
    }
}

/// The rotation's next move ([`rotation::next_move`]) on what the members run with, carried
/// out; the CA that signs and the rotation after it.
#[allow(
    clippy::too_many_arguments,
    reason = "the stages of one call of `ensure`"
)]
async fn rotate(
    api: &Api<Secret>,
    view: &ClusterView,
    settings: &IssuingSettings,
    members: &MemberFiles<'_>,
    held: &Secrets,
    (mut ca, mut rotation, due): (HeldCa, inspect::HeldRotation, bool),
    now: OffsetDateTime,
    out: &mut Outcome,
) -> Result<(HeldCa, inspect::HeldRotation), Error> {
    let requested = members.rotate.is_some() && members.rotate != rotation.rotated_for.as_deref();
    let facts = rotation_facts(view, members, held, &ca, &rotation, due || requested).await;
    let phase = facts.phase;
    let generation = ca.name.generation;
    match rotation::next_move(facts) {
        CaMove::Stay => {
            if phase != CaPhase::Steady {
                out.next_check = Some(CA_RECHECK);
            }
            return Ok((ca, rotation));
        }
        CaMove::Start => {
            rotation = inspect::HeldRotation {
                next: Some(new_ca(view, generation + 1, now, settings)?),
                previous: None,
                rotated_for: members.rotate.map(str::to_string).or(rotation.rotated_for),
            };
            out.issued.push(Issued {
                what: "ca",
                reason: Reason::Rotation,
                not_after: now.unix_timestamp() + secs(settings.ca_duration),
            });
            out.rotation = Some((
                "CARotationStarted",
                format!(
                    "CA rotation started ({}): {} is trusted beside {}; members are replaced one at a time to trust both",
                    if requested {
                        "asked for"
                    } else {
                        "the CA is due"
                    },
                    generation_name(generation + 1),
                    generation_name(generation)
                ),
            ));
            out.next_check = Some(CA_RECHECK);
        }
        CaMove::Promote => {
            let old = ca.pem.cert.clone();
            if let Some(next) = rotation.next.take() {
                ca = next;
            }
            rotation.previous = Some(old);
            out.rotation = Some((
                "CARotationSigning",
                format!(
                    "CA rotation: every member trusts both CAs; {} signs the certificates from now on",
                    generation_name(ca.name.generation)
                ),
            ));
            out.next_check = Some(CA_RECHECK);
        }
        CaMove::Retire => {
            rotation.previous = None;
            out.rotation = Some((
                "CARotationRetired",
                format!(
                    "CA rotation: every member serves certificates of {}; the previous CA is no longer trusted (members are replaced once more to forget it)",
                    generation_name(generation)
                ),
            ));
        }
    }
    write_ca(api, view, &ca, &rotation).await?;
    Ok((ca, rotation))
}

/// Each leaf kept until its renewal time, or issued from `ca` with `bundle`; the certificate
/// (PEM) of each now in its Secret.
#[allow(
    clippy::too_many_arguments,
    reason = "the stages of one call of `ensure`"
)]
async fn keep_leaves(
    api: &Api<Secret>,
    view: &ClusterView,
    settings: &IssuingSettings,
    leaves: &[(CertKind, Option<Secret>)],
    ca: &HeldCa,
    bundle: &str,
    now: OffsetDateTime,
    out: &mut Outcome,
) -> Result<Vec<(CertKind, String)>, Error> {
    let now_s = now.unix_timestamp();
    let mut served = Vec::new();
    for (kind, secret) in leaves {
        let wanted = kind.dns_names(&view.name, &view.namespace, view.domain.as_deref());
        let held = inspect::leaf(*kind, secret.as_ref(), ca, bundle, &wanted);
        let (end, cert) = match plan::decide(&held, now_s, settings.renew_before) {
            Decision::Keep(after) => {
                out.next_check = Some(out.next_check.map_or(after, |n| n.min(after)));
                let cert = inspect::leaf_cert(*kind, secret.as_ref());
                (inspect::not_after(&held).unwrap_or(now_s), cert)
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
                write_leaf(api, view, *kind, &pem, bundle).await?;
                let end = now_s + secs(settings.duration);
                out.issued.push(Issued {
                    what: kind.as_str(),
                    reason,
                    not_after: end,
                });
                let after = settings.duration.saturating_sub(settings.renew_before);
                out.next_check = Some(out.next_check.map_or(after, |n| n.min(after)));
                (end, Some(pem.cert))
            }
        };
        out.expiries.push(Expiry {
            what: kind.as_str(),
            not_after: end,
            renew_at: end - secs(settings.renew_before),
        });
        if let Some(cert) = cert {
            served.push((*kind, cert));
        }
    }
    Ok(served)
}

/// How often a CA rotation in progress (or a CA due for one) is looked at.
const CA_RECHECK: Duration = Duration::from_secs(10);

fn generation_name(generation: u64) -> String {
    format!("CA #{generation}")
}

fn new_ca(
    view: &ClusterView,
    generation: u64,
    now: OffsetDateTime,
    settings: &IssuingSettings,
) -> Result<HeldCa, Error> {
    let name = CaName {
        cluster: view.name.clone(),
        namespace: view.namespace.clone(),
        generation,
    };
    let pem = issue::new_ca(&name, now, settings.ca_duration).map_err(issue_error)?;
    let now_s = now.unix_timestamp();
    Ok(HeldCa {
        subject: format!("O=etcd-operator, CN={}", name.common_name()),
        name,
        pem,
        held: Held::Present(plan::CertFacts {
            not_before: now_s,
            not_after: now_s + secs(settings.ca_duration),
            current: true,
            names_match: true,
        }),
    })
}

/// Writes the CA Secret: the CA that signs, and the rotation's next or previous CA.
async fn write_ca(
    api: &Api<Secret>,
    view: &ClusterView,
    ca: &HeldCa,
    rotation: &inspect::HeldRotation,
) -> Result<(), Error> {
    let mut pairs = vec![
        (CA_CERT, ca.pem.cert.as_str()),
        (CA_KEY, ca.pem.key.as_str()),
    ];
    if let Some(next) = &rotation.next {
        pairs.push((NEXT_CERT, next.pem.cert.as_str()));
        pairs.push((NEXT_KEY, next.pem.key.as_str()));
    }
    if let Some(previous) = &rotation.previous {
        pairs.push((PREVIOUS_CERT, previous.as_str()));
    }
    let mut annotations =
        BTreeMap::from([(CA_GENERATION.to_string(), ca.name.generation.to_string())]);
    if let Some(token) = &rotation.rotated_for {
        annotations.insert(CA_ROTATED_FOR.to_string(), token.clone());
    }
    write(
        api,
        view,
        &names::ca_secret_name(&view.name),
        secret_data(&pairs),
        annotations,
    )
    .await
}

/// Whether every member pod serves the peer and server certificates the Secrets hold, signed
/// by `ca` with `bundle`: the kubelet swapped every member's files and etcd loaded them (a
/// member of a line that does not reload them was replaced).
async fn serve_current_leaves(
    view: &ClusterView,
    leaves: &[(CertKind, Option<Secret>)],
    ca: &HeldCa,
    bundle: &str,
    members: &MemberFiles<'_>,
) -> bool {
    let mut wanted = Vec::new();
    for (kind, port) in [
        (CertKind::Peer, names::PEER_PORT),
        (CertKind::Server, names::CLIENT_PORT),
    ] {
        let secret = leaves
            .iter()
            .find(|(k, _)| *k == kind)
            .and_then(|(_, s)| s.as_ref());
        let dns = kind.dns_names(&view.name, &view.namespace, view.domain.as_deref());
        let current = matches!(
            inspect::leaf(kind, secret, ca, bundle, &dns),
            Held::Present(f) if f.current
        );
        let der = inspect::leaf_cert(kind, secret)
            .and_then(|pem| rotation::ders(&pem).into_iter().next());
        match (current, der) {
            (true, Some(der)) => wanted.push((port, der)),
            _ => return false,
        }
    }
    every_member_serves(members.pods.iter().map(|p| p.ip.clone()).collect(), &wanted).await
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

/// Writes a leaf in CoreOS' layout, with `bundle` as its trust bundle.
async fn write_leaf(
    api: &Api<Secret>,
    view: &ClusterView,
    kind: CertKind,
    pem: &Pem,
    bundle: &str,
) -> Result<(), Error> {
    let [cert, key, ca_key] = kind.coreos_keys();
    write(
        api,
        view,
        &kind.secret_name(&view.name),
        secret_data(&[(cert, &pem.cert), (key, &pem.key), (ca_key, bundle)]),
        BTreeMap::new(),
    )
    .await
}
