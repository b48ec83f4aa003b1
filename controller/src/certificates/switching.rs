//! The switch from one source of certificates to another ([`super::switch`]'s phases),
//! carried out: the switch Secret read and written, what the members mount and serve looked
//! at, the new source's certificates read. The new source's own upkeep (cert-manager's
//! Certificates, the operator's CA) is the pipeline's, once [`SwitchState::detached`].

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DeleteParams, DynamicObject};

use etcd_shared::names;
use etcd_shared::tls::{CertKind, SecretLayout};
use etcd_shared::types::TlsInUse;

use super::rotation::{ders, fingerprint};
use super::served::every_member_serves;
use super::switch::{
    self, FROM_ANNOTATION, Leaf, Material, PHASE_ANNOTATION, SwitchFacts, SwitchPhase,
    TO_ANNOTATION,
};
use crate::error::Error;
use crate::planner::{TlsFiles, TlsStamp};
use crate::view::{ClusterView, TlsMode};

/// `status.tls.source` of cert-manager's certificates.
const CERT_MANAGER: &str = "certManager";
/// `status.tls.source` of the operator's own certificates.
const OPERATOR_MANAGED: &str = "operatorManaged";

/// A member pod as the switch needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwitchPod {
    /// Its name, IP and the trust bundle it was made with, as every TLS step reads them.
    pub files: super::PodFiles,
    /// The Secrets its TLS volumes mount.
    pub secrets: Vec<String>,
}

/// What a switch in progress starts a reconcile with.
#[derive(Debug, Clone)]
pub struct SwitchState {
    /// The Secrets switched from.
    pub from: TlsInUse,
    /// The switch Secret's phase.
    pub phase: SwitchPhase,
    /// The switch Secret's data.
    data: BTreeMap<String, String>,
    /// Every member pod (and one of every member listed) mounts the switch Secret and was
    /// made with its current bundle.
    members_on_switch: bool,
    /// The certificate kinds the cluster's traffic needs.
    kinds: Vec<CertKind>,
    /// A phase was entered by this reconcile (the switch Secret was made).
    pub started: bool,
}

impl SwitchState {
    /// Whether the members left the old source's Secrets: the new source may now write its
    /// own (which may have the same names).
    pub fn detached(&self) -> bool {
        self.phase > SwitchPhase::Hold || self.members_on_switch
    }
}

/// What a reconcile of a switching cluster goes on with.
#[derive(Debug, Clone)]
pub struct SwitchOutcome {
    /// The Secrets the members' new pods mount and the operator dials with.
    pub mode: TlsMode,
    /// The files they hold, for the rollout.
    pub files: Option<TlsFiles>,
    /// A phase entered, in words (an Event).
    pub moved: Option<String>,
    /// Every member uses the new source's own Secrets: the switch is over.
    pub done: bool,
    /// Where the switch is and what it waits for, in words (the Progressing condition).
    pub note: String,
}

/// The kinds of certificate both sources give (peer; server and the operator's client).
pub fn kinds(from: &TlsInUse, to: &TlsInUse) -> Vec<CertKind> {
    let mut kinds = Vec::new();
    if from.peer_secret.is_some() && to.peer_secret.is_some() {
        kinds.push(CertKind::Peer);
    }
    if from.server_secret.is_some() && to.server_secret.is_some() {
        kinds.push(CertKind::Server);
    }
    if from.operator_secret.is_some() && to.operator_secret.is_some() {
        kinds.push(CertKind::Operator);
    }
    kinds
}

/// The TLS mode of Secrets in use.
pub fn mode_of(in_use: &TlsInUse) -> TlsMode {
    TlsMode {
        peer_secret: in_use.peer_secret.clone(),
        server_secret: in_use.server_secret.clone(),
        operator_secret: in_use.operator_secret.clone(),
        layout: in_use.layout(),
        ..TlsMode::default()
    }
}

/// The Secrets to dial the members of `cluster` with from outside its reconcile (a backup):
/// while its certificates' source is switched (`status.tls` differs from the spec's, for the
/// same traffic), the switch Secret, whose client certificate and bundle every member takes in
/// every phase; else `None` (the spec's).
pub fn dialling_mode(view: &ClusterView, cluster: &etcd_shared::EtcdCluster) -> Option<TlsMode> {
    let to = cluster.spec.tls.as_ref()?.in_use(&view.name)?;
    let from = cluster.status.as_ref()?.tls.as_ref()?;
    (from != &to && from.modes() == to.modes()).then(|| switch_mode(view, &to))
}

/// The TLS mode of the switch Secret, for the traffic `to` encrypts.
fn switch_mode(view: &ClusterView, to: &TlsInUse) -> TlsMode {
    let name = names::tls_switch_secret_name(&view.name);
    TlsMode {
        peer_secret: to.peer_secret.as_ref().map(|_| name.clone()),
        server_secret: to.server_secret.as_ref().map(|_| name.clone()),
        operator_secret: to.operator_secret.as_ref().map(|_| name.clone()),
        layout: SecretLayout::Switch,
        ..TlsMode::default()
    }
}

fn text(secret: &Secret) -> BTreeMap<String, String> {
    secret
        .data
        .iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), String::from_utf8(v.0.clone()).ok()?)))
        .collect()
}

async fn get(api: &Api<Secret>, name: &str) -> Result<Option<Secret>, Error> {
    api.get_opt(name)
        .await
        .map_err(Error::kube(format!("get secret {name}")))
}

/// The certificates of the Secrets `in_use` names, `None` when one of `kinds` is missing or
/// incomplete.
pub async fn read_material(
    api: &Api<Secret>,
    in_use: &TlsInUse,
    kinds: &[CertKind],
) -> Result<Option<Material>, Error> {
    let layout = in_use.layout();
    let mut material = Material::default();
    let mut cas = Vec::new();
    for kind in kinds {
        let name = match kind {
            CertKind::Peer => &in_use.peer_secret,
            CertKind::Server => &in_use.server_secret,
            CertKind::Operator => &in_use.operator_secret,
        };
        let Some(name) = name else {
            return Ok(None);
        };
        let Some(secret) = get(api, name).await? else {
            return Ok(None);
        };
        if let Some(issuer) = &in_use.issuer
            && !issued_by(&secret, issuer)
        {
            return Ok(None);
        }
        let data = text(&secret);
        let [cert, key, ca] = layout.keys(*kind);
        let (Some(cert), Some(key), Some(ca)) = (data.get(cert), data.get(key), data.get(ca))
        else {
            return Ok(None);
        };
        if ders(cert).is_empty() || ders(ca).is_empty() || key.trim().is_empty() {
            return Ok(None);
        }
        material.leaves.insert(
            *kind,
            Leaf {
                cert: cert.clone(),
                key: key.clone(),
            },
        );
        cas.push(ca.clone());
    }
    material.cas = switch::certificate_blocks(cas.iter().map(String::as_str));
    Ok(Some(material))
}

async fn write_switch(
    api: &Api<Secret>,
    view: &ClusterView,
    data: &BTreeMap<String, String>,
    phase: SwitchPhase,
    (from, to): (&TlsInUse, &TlsInUse),
) -> Result<(), Error> {
    let data = data
        .iter()
        .map(|(k, v)| (k.clone(), ByteString(v.as_bytes().to_vec())))
        .collect();
    let annotations = BTreeMap::from([
        (PHASE_ANNOTATION.to_string(), phase.as_str().to_string()),
        (FROM_ANNOTATION.to_string(), describe(from)),
        (TO_ANNOTATION.to_string(), describe(to)),
    ]);
    super::apply::write(
        api,
        view,
        &names::tls_switch_secret_name(&view.name),
        data,
        annotations,
    )
    .await
}

/// A source in words: `certManager (Issuer.cert-manager.io/ca)`, `static`.
pub fn describe(in_use: &TlsInUse) -> String {
    match &in_use.issuer {
        Some(issuer) => format!("{} ({issuer})", in_use.source),
        None => in_use.source.clone(),
    }
}

/// The trust bundle the switch Secret's data gives its members.
fn bundle_of<'a>(data: &'a BTreeMap<String, String>, kinds: &[CertKind]) -> Option<&'a String> {
    kinds.first().and_then(|k| data.get(k.coreos_keys()[2]))
}

fn every_listed_has_a_pod(pods: &[SwitchPod], listed: &[String]) -> bool {
    listed
        .iter()
        .all(|name| pods.iter().any(|p| &p.files.name == name))
}

/// Reads (or, at the start, makes) the switch Secret and what the members use: the state a
/// reconcile of a cluster moving `from` its Secrets to `to` starts with. An error when the
/// Secrets switched from cannot be read (the members keep running as they are).
pub async fn start(
    client: &kube::Client,
    view: &ClusterView,
    from: &TlsInUse,
    to: &TlsInUse,
    pods: &[SwitchPod],
    listed: &[String],
) -> Result<SwitchState, Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &view.namespace);
    let kinds = kinds(from, to);
    let name = names::tls_switch_secret_name(&view.name);
    let held = get(&api, &name).await?;
    // A Secret left by an earlier switch (its deletion failed) is not this switch's.
    let held_phase = held.as_ref().and_then(|s| {
        let a = s.metadata.annotations.as_ref()?;
        let ours = a.get(FROM_ANNOTATION) == Some(&describe(from))
            && a.get(TO_ANNOTATION) == Some(&describe(to));
        ours.then(|| SwitchPhase::parse(a.get(PHASE_ANNOTATION)?))?
    });
    let (phase, data, started) = match (held, held_phase) {
        (Some(secret), Some(phase)) => (phase, text(&secret), false),
        _ => {
            let material = read_material(&api, from, &kinds).await?.ok_or_else(|| {
                Error::Certificates(format!(
                    "cannot move the members off their {} certificates: the Secrets they use ({}) are missing or incomplete",
                    describe(from),
                    [&from.peer_secret, &from.server_secret, &from.operator_secret]
                        .into_iter()
                        .flatten()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
            let data = switch::contents(SwitchPhase::Hold, &material, None, &kinds)
                .ok_or_else(|| Error::Certificates("incomplete certificates".into()))?;
            write_switch(&api, view, &data, SwitchPhase::Hold, (from, to)).await?;
            (SwitchPhase::Hold, data, true)
        }
    };
    let trust = bundle_of(&data, &kinds).map(|b| fingerprint([b.as_str()]));
    let members_on_switch = !pods.is_empty()
        && every_listed_has_a_pod(pods, listed)
        && pods.iter().all(|p| {
            !p.secrets.is_empty()
                && p.secrets.iter().all(|s| s == &name)
                && p.files.trust.is_some()
                && p.files.trust == trust
        });
    Ok(SwitchState {
        from: from.clone(),
        phase,
        data,
        members_on_switch,
        kinds,
        started,
    })
}

/// Takes the switch's next move on what the members run and what the new source holds now,
/// and says what the members and the operator use from here.
pub async fn advance(
    client: &kube::Client,
    view: &ClusterView,
    state: &SwitchState,
    to: &TlsInUse,
    pods: &[SwitchPod],
    listed: &[String],
) -> Result<SwitchOutcome, Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &view.namespace);
    let kinds = &state.kinds;
    let target = if state.detached() {
        read_material(&api, to, kinds).await?
    } else {
        None
    };
    let mut members_serve_leaves = false;
    if state.phase == SwitchPhase::NewLeaves && state.members_on_switch {
        members_serve_leaves = serve_leaves(&state.data, kinds, pods).await;
    }
    let facts = SwitchFacts {
        phase: state.phase,
        members_on_switch: state.members_on_switch,
        members_serve_leaves,
        target_ready: target.is_some(),
    };
    let from = switch::from_material(&state.data, kinds);
    let mut phase = state.phase;
    let mut data = state.data.clone();
    let mut moved = state.started.then(|| {
        format!(
            "moving the members from {} to {} certificates: first onto {} (what they use now)",
            describe(&state.from),
            describe(to),
            names::tls_switch_secret_name(&view.name)
        )
    });
    if let Some(next) = switch::next_phase(facts)
        && let Some(new) = switch::contents(next, &from, target.as_ref(), kinds)
    {
        write_switch(&api, view, &new, next, (&state.from, to)).await?;
        moved = Some(match next {
            SwitchPhase::TrustBoth => format!(
                "certificate switch to {}: every member runs on {}; they are replaced to trust both CAs",
                describe(to),
                names::tls_switch_secret_name(&view.name)
            ),
            SwitchPhase::NewLeaves => format!(
                "certificate switch to {}: every member trusts both CAs; the new source's certificates are served from now on",
                describe(to)
            ),
            _ => format!(
                "certificate switch to {}: every member serves the new certificates; they are replaced onto the new source's own Secrets (its CA alone)",
                describe(to)
            ),
        });
        phase = next;
        data = new;
    }
    let on_target = |p: &SwitchPod| {
        let names = [&to.peer_secret, &to.server_secret];
        !p.secrets.is_empty()
            && p.secrets
                .iter()
                .all(|s| names.iter().any(|n| n.as_deref() == Some(s.as_str())))
    };
    let done = phase == SwitchPhase::Settle
        && !pods.is_empty()
        && every_listed_has_a_pod(pods, listed)
        && pods.iter().all(on_target);
    let note = note(
        phase,
        (&state.from, to),
        phase == state.phase && state.detached() && target.is_none(),
        &names::tls_switch_secret_name(&view.name),
    );
    let (mode, files) = if phase.members_on_switch() {
        let files = bundle_of(&data, kinds).map(|bundle| TlsFiles {
            current: TlsStamp {
                trust: Some(fingerprint([bundle.as_str()])),
                leaves: Some(fingerprint(leaves_of(&data, kinds))),
            },
            rotating: true,
        });
        (switch_mode(view, to), files)
    } else {
        let files = target.as_ref().map(|t| TlsFiles {
            current: TlsStamp {
                trust: Some(fingerprint(t.cas.iter().map(String::as_str))),
                leaves: Some(fingerprint(
                    kinds
                        .iter()
                        .filter(|k| **k != CertKind::Operator)
                        .filter_map(|k| t.leaves.get(k))
                        .map(|l| l.cert.as_str()),
                )),
            },
            rotating: true,
        });
        (view.tls.clone(), files)
    };
    Ok(SwitchOutcome {
        mode,
        files,
        moved,
        done,
        note,
    })
}

/// Where a switch is and what it waits for, in words.
fn note(
    phase: SwitchPhase,
    (from, to): (&TlsInUse, &TlsInUse),
    target_missing: bool,
    switch_secret: &str,
) -> String {
    let what = match phase {
        SwitchPhase::Hold if target_missing => format!(
            "every member runs on {switch_secret}; waiting for the new source's certificates ({}: missing, incomplete{})",
            [&to.peer_secret, &to.server_secret, &to.operator_secret]
                .into_iter()
                .flatten()
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
            if to.issuer.is_some() {
                ", or not issued by the new issuer yet"
            } else {
                ""
            }
        ),
        SwitchPhase::Hold => format!("members moving onto {switch_secret} (what they use now)"),
        SwitchPhase::TrustBoth => "members replaced to trust both CAs".to_string(),
        SwitchPhase::NewLeaves => {
            "the new source's certificates are served: waiting for every member to serve them"
                .to_string()
        }
        SwitchPhase::Settle => {
            "members replaced onto the new source's own Secrets (its CA alone)".to_string()
        }
    };
    format!(
        "certificates moving from {} to {} (phase {}): {what}",
        describe(from),
        describe(to),
        phase.as_str()
    )
}

/// The peer and server certificates of the switch Secret's data.
fn leaves_of<'a>(
    data: &'a BTreeMap<String, String>,
    kinds: &'a [CertKind],
) -> impl Iterator<Item = &'a str> {
    kinds
        .iter()
        .filter(|k| **k != CertKind::Operator)
        .filter_map(|k| data.get(k.coreos_keys()[0]))
        .map(String::as_str)
}

/// Whether every member pod serves the switch Secret's peer and server certificates.
async fn serve_leaves(
    data: &BTreeMap<String, String>,
    kinds: &[CertKind],
    pods: &[SwitchPod],
) -> bool {
    let mut wanted = Vec::new();
    for (kind, port) in [
        (CertKind::Peer, names::PEER_PORT),
        (CertKind::Server, names::CLIENT_PORT),
    ] {
        if !kinds.contains(&kind) {
            continue;
        }
        match data
            .get(kind.coreos_keys()[0])
            .and_then(|pem| ders(pem).into_iter().next())
        {
            Some(der) => wanted.push((port, der)),
            None => return false,
        }
    }
    every_member_serves(pods.iter().map(|p| p.files.ip.clone()).collect(), &wanted).await
}

/// cert-manager's Secret type.
const TLS_SECRET_TYPE: &str = "kubernetes.io/tls";

/// Clears what of the old source would stand in the new one's way, once the members left the
/// old Secrets: cert-manager's Certificates when the new source is not cert-manager (they
/// would go on writing the Secrets), and Secrets of the names the new source writes but of the
/// other's type (a Secret's type cannot change: cert-manager writes `kubernetes.io/tls`, the
/// operator `Opaque`). Idempotent: only the old source's objects go.
pub async fn clear_old(
    client: &kube::Client,
    view: &ClusterView,
    from: &TlsInUse,
    to: &TlsInUse,
) -> Result<(), Error> {
    let (from_cm, to_cm) = (from.source == CERT_MANAGER, to.source == CERT_MANAGER);
    if from_cm && !to_cm {
        let api: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            &view.namespace,
            &super::cert_manager::certificate_resource(),
        );
        for kind in CertKind::ALL {
            let name = kind.secret_name(&view.name);
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(Error::kube(format!("delete certificate {name}"))(e)),
            }
        }
    }
    let managed = |u: &TlsInUse| u.source == CERT_MANAGER || u.source == OPERATOR_MANAGED;
    if from_cm == to_cm || !managed(from) || !managed(to) {
        return Ok(());
    }
    let api: Api<Secret> = Api::namespaced(client.clone(), &view.namespace);
    for kind in CertKind::ALL {
        let name = kind.secret_name(&view.name);
        let Some(secret) = get(&api, &name).await? else {
            continue;
        };
        let is_tls = secret.type_.as_deref() == Some(TLS_SECRET_TYPE);
        if is_tls != to_cm {
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(Error::kube(format!("delete secret {name}"))(e)),
            }
        }
    }
    Ok(())
}

/// Whether a Secret cert-manager wrote was issued by `issuer` (`KIND.GROUP/NAME`): after a
/// change of issuer it holds the old issuer's certificate until cert-manager reissues.
fn issued_by(secret: &Secret, issuer: &str) -> bool {
    let Some((kind_group, name)) = issuer.split_once('/') else {
        return false;
    };
    let kind = kind_group.split('.').next().unwrap_or_default();
    let annotations = secret.metadata.annotations.as_ref();
    let get = |key: &str| annotations.and_then(|a| a.get(key)).map(String::as_str);
    get("cert-manager.io/issuer-name") == Some(name)
        && get("cert-manager.io/issuer-kind").is_none_or(|k| k == kind)
}

/// Deletes the switch Secret after a switch, once no member pod mounts it.
pub async fn clean_up(
    client: &kube::Client,
    view: &ClusterView,
    pods: &[SwitchPod],
) -> Result<(), Error> {
    let name = names::tls_switch_secret_name(&view.name);
    if pods.iter().any(|p| p.secrets.contains(&name)) {
        return Ok(());
    }
    let api: Api<Secret> = Api::namespaced(client.clone(), &view.namespace);
    match api.delete(&name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!("delete secret {name}"))(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::fixtures::{cluster_of, view_of};

    #[test]
    fn a_backup_dials_a_switching_cluster_with_the_switch_secret() {
        let spec = "size: 3\nTLS:\n  operatorManaged: {}";
        let view = view_of(spec);
        let mut cluster = cluster_of(spec);
        let target = cluster
            .spec
            .tls
            .as_ref()
            .and_then(|t| t.in_use(&view.name))
            .expect("in use");
        // Settled: the spec's Secrets.
        cluster.status = Some(etcd_shared::EtcdClusterStatus {
            tls: Some(target.clone()),
            ..Default::default()
        });
        assert_eq!(dialling_mode(&view, &cluster), None);
        // Switching from static: the switch Secret, in its layout.
        let from = TlsInUse {
            source: "static".into(),
            peer_secret: Some("p".into()),
            server_secret: Some("s".into()),
            operator_secret: Some("o".into()),
            ..Default::default()
        };
        if let Some(status) = cluster.status.as_mut() {
            status.tls = Some(from);
        }
        let mode = dialling_mode(&view, &cluster).expect("switch mode");
        let name = names::tls_switch_secret_name(&view.name);
        assert_eq!(mode.operator_secret.as_deref(), Some(name.as_str()));
        assert_eq!(mode.layout, SecretLayout::Switch);
        assert_eq!(
            kinds(&target, &target),
            [CertKind::Peer, CertKind::Server, CertKind::Operator]
        );
    }
}
