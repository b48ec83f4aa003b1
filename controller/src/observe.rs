//! Observation: the member pods, data claims and etcd members of one cluster, turned into
//! the planner's model.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::Api;

use etcd_shared::names::{self, CLIENT_PORT};
use etcd_shared::version::EtcdVersion;

use crate::cache::{self, CachedPod, Caches};
use crate::error::Error;
use crate::etcd::{AlarmName, EtcdAccess, EtcdPool, ListedMember, MemberStatus, RaisedAlarm};
use crate::etcd_tls::MemberTls;
use crate::planner::{
    AbsentPod, Alarm, AlarmKind, DbSize, Health, MemberState, MembersUnread, NodeState, Observed,
    PodPhase, PodState, ReplacedPod,
};
use crate::view::ClusterView;
use crate::view::transport::MemberTransport;
use etcd_shared::types::MemberPlacement;

/// Everything observed, with the pods as read (the executor needs their IPs).
pub struct Observation {
    /// The planner's model.
    pub model: Observed,
    /// Client endpoints of the member pods that run with an IP, by member name.
    pub member_endpoints: Vec<(String, String)>,
    /// Where member API calls go: the leader's endpoint first, then the other voters that
    /// answered (see [`member_api_endpoints`]).
    pub member_api: Vec<String>,
    /// How to reach etcd.
    pub access: EtcdAccess,
    /// Members whose health check failed, with the reason.
    pub health_failures: Vec<(String, String)>,
    /// Member pods of a cluster a recovery replaces, still there (not in the model).
    pub replaced_pods: Vec<ReplacedPod>,
    /// A member of the cluster a recovery replaces that answers with a leader, in words: that
    /// cluster is not lost.
    pub lost_cluster_serves: Option<String>,
    /// Client endpoints of the pods of the cluster a recovery replaces whose containers may
    /// run, by member name: asked again right before the seed is created and the survivor
    /// deleted.
    pub replaced_endpoints: Vec<(String, String)>,
    /// The UIDs of the member data claims, by member name (deletes carry them).
    pub claim_uids: BTreeMap<String, String>,
    /// Data claims of a cluster a recovery replaces, still there (not in the model).
    pub replaced_claims: Vec<String>,
}

impl Observation {
    /// The client endpoint of one member's running pod.
    pub fn endpoint_of(&self, member: &str) -> Option<&str> {
        self.member_endpoints
            .iter()
            .find(|(name, _)| name == member)
            .map(|(_, endpoint)| endpoint.as_str())
    }

    /// The endpoint a membership change (add, remove, promote) is sent to: the leader's when
    /// known, else a voter's. One endpoint, so a call that timed out is never sent twice.
    pub fn member_change_endpoint(&self) -> Result<&str, Error> {
        self.member_api
            .first()
            .map(String::as_str)
            .ok_or_else(|| Error::NoEndpoint("any voting member".into()))
    }
}

/// What the etcd behind one running member pod said of itself.
#[derive(Debug, Clone)]
pub struct PodStatus {
    /// The pod (member) name.
    pub pod: String,
    /// Its client endpoint.
    pub endpoint: String,
    /// Its status, or why it could not be read.
    pub status: Result<MemberStatus, String>,
}

/// Where member API calls go: the endpoint of the member the others name as leader first,
/// then every other member that answered and is not a learner (a learner answers "rpc not
/// supported for learner"). Falls back to every endpoint when none answered, so the call
/// fails with etcd's own error.
pub fn member_api_endpoints(statuses: &[PodStatus]) -> Vec<String> {
    let answered: Vec<(&PodStatus, &MemberStatus)> = statuses
        .iter()
        .filter_map(|p| p.status.as_ref().ok().map(|s| (p, s)))
        .filter(|(_, s)| !s.is_learner)
        .collect();
    if answered.is_empty() {
        return statuses.iter().map(|p| p.endpoint.clone()).collect();
    }
    let mut leader_votes: BTreeMap<u64, usize> = BTreeMap::new();
    for (_, s) in &answered {
        if s.leader != 0 {
            *leader_votes.entry(s.leader).or_default() += 1;
        }
    }
    let leader = leader_votes
        .into_iter()
        .max_by_key(|(_, votes)| *votes)
        .map(|(id, _)| id);
    let mut ordered = answered;
    ordered.sort_by_key(|(p, s)| (Some(s.member_id) != leader, p.pod.clone()));
    ordered
        .into_iter()
        .map(|(p, _)| p.endpoint.clone())
        .collect()
}

/// The health of member `name` from its pod's status.
fn health_of(name: &str, statuses: &[PodStatus]) -> Health {
    match statuses.iter().find(|p| p.pod == name).map(|p| &p.status) {
        None => Health::Unhealthy("no running pod".into()),
        Some(Err(e)) => Health::Unhealthy(e.clone()),
        Some(Ok(s)) if s.leader == 0 => Health::Unhealthy("no leader".into()),
        Some(Ok(s)) if !s.errors.is_empty() => Health::Unhealthy(s.errors.join("; ")),
        Some(Ok(s)) => Health::Healthy {
            version: s.version.parse().ok(),
            leader: s.leader == s.member_id,
        },
    }
}

/// Who made a member pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodOrigin {
    /// This operator: the member labels of the cluster (`app.kubernetes.io/component=member`).
    Operator,
    /// CoreOS' operator: `app=etcd`, `etcd_cluster=NAME` and `etcd_node=MEMBER`, none of this
    /// operator's labels, and a controller reference to this very EtcdCluster (its uid), so a
    /// pod of an unrelated etcd that happens to carry CoreOS' labels is never taken.
    CoreOS,
}

/// Who made `meta`'s pod, if it is a member pod of `view`'s cluster.
pub fn member_pod_origin(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    view: &ClusterView,
) -> Option<PodOrigin> {
    let labels = meta.labels.as_ref()?;
    let has = |key: &str, value: &str| labels.get(key).is_some_and(|v| v == value);
    let ours = names::selector_labels(&view.name)
        .iter()
        .all(|(k, v)| has(k, v))
        && has(names::LABEL_COMPONENT, "member");
    if ours {
        return Some(PodOrigin::Operator);
    }
    let coreos_labels = names::coreos_selector(&view.name)
        .iter()
        .all(|(k, v)| has(k, v))
        && labels.contains_key(names::COREOS_LABEL_NODE)
        && !labels.contains_key(names::LABEL_MANAGED_BY);
    let owned = meta
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == view.uid && o.kind == "EtcdCluster" && o.controller == Some(true));
    (coreos_labels && owned).then_some(PodOrigin::CoreOS)
}

/// The member pods of a cluster in the caches (this operator's, and those CoreOS' operator
/// left running), with who made each.
pub fn member_pods(caches: &Caches, view: &ClusterView) -> Vec<(Arc<CachedPod>, PodOrigin)> {
    let mut ours = names::selector_labels(&view.name);
    ours.insert(names::LABEL_COMPONENT.into(), "member".into());
    cache::select(&caches.pods, &view.namespace, &ours)
        .into_iter()
        .chain(cache::select(
            &caches.coreos_pods,
            &view.namespace,
            &names::coreos_selector(&view.name),
        ))
        .filter_map(|p| member_pod_origin(&p.metadata, view).map(|origin| (p, origin)))
        .collect()
}

/// Whether CoreOS' operator's member pods of `view`'s cluster are still there (not being
/// deleted): the Services then keep CoreOS' selector, which selects them and this operator's
/// members alike.
pub fn coreos_members_present(caches: &Caches, view: &ClusterView) -> bool {
    member_pods(caches, view)
        .iter()
        .any(|(p, origin)| *origin == PodOrigin::CoreOS && p.metadata.deletion_timestamp.is_none())
}

/// The version in an image's tag (`quay.io/coreos/etcd:v3.2.13` is 3.2.13), for pods that do
/// not say it in this operator's version label.
fn version_of_image(image: &str) -> Option<EtcdVersion> {
    let without_digest = image.split('@').next()?;
    let (_, tag) = without_digest.rsplit_once(':')?;
    if tag.contains('/') {
        return None;
    }
    tag.strip_prefix('v').unwrap_or(tag).parse().ok()
}

/// The version a member pod runs: its version label, else its image's tag.
fn pod_version(pod: &CachedPod, image: &str) -> Option<EtcdVersion> {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(names::LABEL_VERSION))
        .and_then(|v| v.parse::<EtcdVersion>().ok())
        .or_else(|| version_of_image(image))
}

/// Whether a member pod is Ready as its containers are, and whether it has the serving gate:
/// the gate is the operator's own word, read apart (`serving`), or a member it took out of
/// the Service would look unready to it.
fn containers_ready(pod: &CachedPod) -> (bool, bool) {
    let gated = pod
        .spec
        .readiness_gates
        .iter()
        .any(|g| g.condition_type == names::CONDITION_SERVING);
    let ready = if gated {
        pod.condition_is_true("ContainersReady")
    } else {
        pod.condition_is_true("Ready")
    };
    (ready, gated)
}

/// The version a pod's data began under: its own, or its claim's when the claim is older.
fn data_created_on(own: Option<EtcdVersion>, claim: Option<&EtcdVersion>) -> Option<EtcdVersion> {
    match (own, claim) {
        (Some(own), Some(claim)) => Some(own.min(*claim)),
        (own, None) => own,
        (None, Some(_)) => None,
    }
}

fn pod_state(
    pod: &CachedPod,
    origin: PodOrigin,
    claim_created_on: &BTreeMap<String, EtcdVersion>,
    now: Timestamp,
) -> Option<PodState> {
    let name = pod.metadata.name.clone()?;
    let status = &pod.status;
    let age = pod
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| (now.as_second() - t.0.as_second()).max(0));
    let image = pod.image_of("etcd").unwrap_or_default().to_string();
    let version = pod_version(pod, &image);
    let etcd_status = pod.container_status("etcd");
    let annotation = |key: &str| pod.annotation(key);
    let (ready, gated) = containers_ready(pod);
    let own_created_on: Option<EtcdVersion> =
        annotation(names::ANNOTATION_CREATED_ON).and_then(|v| v.parse().ok());
    let data_created_on = data_created_on(own_created_on, claim_created_on.get(&name));
    let since = |t: Timestamp| {
        Duration::from_secs(u64::try_from((now.as_second() - t.as_second()).max(0)).unwrap_or(0))
    };
    let overdue = pod
        .metadata
        .deletion_timestamp
        .as_ref()
        .map_or(Duration::ZERO, |deadline| since(deadline.0));
    let running_for = etcd_status.and_then(|c| c.earliest_start()).map(since);
    let container_stopped =
        etcd_status.is_some_and(|c| c.state.terminated.is_some() && c.state.running.is_none());
    Some(PodState {
        name,
        uid: pod.metadata.uid.clone(),
        version,
        image,
        restarts: etcd_status.map_or(0, |c| c.restart_count),
        restarts_at_upgrade: annotation(names::ANNOTATION_RESTARTS_AT_UPGRADE)
            .and_then(|n| n.parse().ok()),
        phase: PodPhase::parse(status.phase.as_deref()),
        ready,
        in_service: pod.condition_is_true("Ready"),
        ip: status.pod_ip.clone().filter(|ip| !ip.is_empty()),
        terminating: pod.metadata.deletion_timestamp.is_some(),
        age: Duration::from_secs(u64::try_from(age).unwrap_or(0)),
        created_on: own_created_on,
        data_created_on,
        snapshot_barrier: annotation(names::ANNOTATION_SNAPSHOT_BARRIER)
            .and_then(|v| v.parse().ok()),
        overdue,
        running_for,
        reason: status.reason.clone(),
        coreos: origin == PodOrigin::CoreOS,
        node: pod.spec.node_name.clone().filter(|n| !n.is_empty()),
        node_state: NodeState::Unknown,
        container_stopped,
        serving: gated.then(|| pod.condition_is_true(names::CONDITION_SERVING)),
        serving_changed: status
            .conditions
            .iter()
            .find(|c| c.type_ == names::CONDITION_SERVING)
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| since(t.0)),
        tls: crate::planner::TlsStamp {
            trust: annotation(names::ANNOTATION_TLS_TRUST).map(str::to_string),
            leaves: annotation(names::ANNOTATION_TLS_LEAVES).map(str::to_string),
        },
        transport: pod.transport_of("etcd"),
        tls_secrets: pod.tls_secrets(),
    })
}

/// The members' backend quota: what a member reports (3.6+), else `ETCD_QUOTA_BACKEND_BYTES`
/// from `etcdEnv`, else etcd's default.
fn quota_bytes(view: &ClusterView, statuses: &[PodStatus]) -> u64 {
    let reported = statuses
        .iter()
        .filter_map(|p| p.status.as_ref().ok())
        .filter_map(|s| u64::try_from(s.db_size_quota).ok())
        .max()
        .filter(|q| *q > 0);
    reported
        .or_else(|| {
            view.pod
                .etcd_env
                .iter()
                .find(|e| e.name == "ETCD_QUOTA_BACKEND_BYTES")
                .and_then(|e| e.value.as_deref()?.trim().parse::<u64>().ok())
                .filter(|q| *q > 0)
        })
        .unwrap_or(etcd_shared::version::DEFAULT_QUOTA_BACKEND_BYTES)
}

/// The alarms raised, named by member.
fn named_alarms(raised: &[RaisedAlarm], members: &[MemberState]) -> Vec<Alarm> {
    let mut alarms: Vec<Alarm> = raised
        .iter()
        .map(|a| Alarm {
            member_id: a.member_id,
            member: members
                .iter()
                .find(|m| m.id == a.member_id)
                .map_or_else(|| format!("unknown-{:x}", a.member_id), |m| m.name.clone()),
            kind: match a.kind {
                AlarmName::NoSpace => AlarmKind::NoSpace,
                AlarmName::Corrupt => AlarmKind::Corrupt,
            },
        })
        .collect();
    alarms.sort();
    alarms.dedup();
    alarms
}

/// The client URL the operator dials a member pod at `ip` with: by how the pod speaks
/// (`transport`, read from its flags), else by what the cluster asks.
pub fn endpoint(view: &ClusterView, transport: Option<&MemberTransport>, ip: &str) -> String {
    let scheme = transport.map_or_else(
        || MemberTransport::target(view).dial_scheme(),
        MemberTransport::dial_scheme,
    );
    if ip.contains(':') {
        format!("{scheme}://[{ip}]:{CLIENT_PORT}")
    } else {
        format!("{scheme}://{ip}:{CLIENT_PORT}")
    }
}

/// The operator's client TLS from its Secret (etcd-client.crt, etcd-client.key, etcd-client-ca.crt).
/// With it, a hash of the material, so pooled connections are reused only with the same.
async fn operator_tls(
    client: &kube::Client,
    view: &ClusterView,
) -> Result<Option<(Arc<MemberTls>, u64)>, Error> {
    let Some(secret_name) = &view.tls.operator_secret else {
        return Ok(None);
    };
    secret_tls(
        client,
        &view.namespace,
        secret_name,
        &view.tls_server_name(),
        view.tls.layout,
    )
    .await
    .map(Some)
}

/// Client TLS for the members from a Secret in CoreOS' client layout (etcd-client.crt,
/// etcd-client.key, etcd-client-ca.crt) or `kubernetes.io/tls` (cert-manager's), verifying the members' certificates against
/// `server_name`, and a hash identifying the material (pooled connections are reused only
/// with the material they were made with). A Secret cert-manager writes (`layout`) is read in
/// its keys alone: after a switch from the operator's own certificates it may still hold the
/// operator's keys of the same names.
pub async fn secret_tls(
    client: &kube::Client,
    namespace: &str,
    secret_name: &str,
    server_name: &str,
    layout: etcd_shared::tls::SecretLayout,
) -> Result<(Arc<MemberTls>, u64), Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = secrets
        .get_opt(secret_name)
        .await
        .map_err(Error::kube(format!("get secret {secret_name}")))?
        .ok_or_else(|| Error::OperatorTls {
            secret: secret_name.to_string(),
            reason: "not found".into(),
        })?;
    let data = secret.data.unwrap_or_default();
    let get = |key: &str| {
        data.get(key)
            .map(|b| b.0.clone())
            .ok_or_else(|| Error::OperatorTls {
                secret: secret_name.to_string(),
                reason: format!("has no key {key}"),
            })
    };
    let [cert_key, key_key, ca_key] = match layout {
        etcd_shared::tls::SecretLayout::KubernetesTls => etcd_shared::tls::KUBERNETES_TLS_KEYS,
        _ => crate::etcd_tls::client_keys(|k| data.contains_key(k)),
    };
    let (cert, key, ca) = (get(cert_key)?, get(key_key)?, get(ca_key)?);
    // Members are dialled by IP; their certificates name the member DNS names.
    let tls = MemberTls::new(&ca, &cert, &key, server_name).map_err(|e| Error::OperatorTls {
        secret: secret_name.to_string(),
        reason: e.to_string(),
    })?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (&cert, &key, &ca, server_name).hash(&mut hasher);
    Ok((Arc::new(tls), hasher.finish()))
}

fn member_name(view: &ClusterView, m: &ListedMember) -> String {
    m.peer_urls
        .iter()
        .find_map(|u| view.member_of_peer_url(u))
        .or_else(|| (!m.name.is_empty()).then(|| m.name.clone()))
        .unwrap_or_else(|| format!("unknown-{:x}", m.id))
}

/// What the observation needs from before it: the cluster's status's records, and the TLS
/// files the certificates stage left in the Secrets.
#[derive(Debug, Clone, Default)]
pub struct Recorded<'a> {
    /// The status records a member list read before: the cluster exists (or existed).
    pub bootstrapped: bool,
    /// Member names of the cluster a recovery replaces (its pods and claims are not this
    /// cluster's).
    pub replaced: &'a [String],
    /// The node each member's pod runs or last ran on.
    pub placement: &'a [MemberPlacement],
    /// The status was written by this operator (it has the scale subresource's selector).
    pub ours: bool,
    /// The members CoreOS' operator made, as the status listed them.
    pub coreos_members: &'a [String],
    /// The pods CoreOS' operator made after this operator took over, as the status listed.
    pub another_operator_pods: &'a [String],
    /// The operator-managed TLS files as the certificates stage left them.
    pub tls: Option<&'a crate::planner::TlsFiles>,
    /// The operator's compactions and defragmentations, as the status recorded them.
    pub maintenance: Option<&'a etcd_shared::types::MaintenanceStatus>,
    /// The oldest version the members were last seen running (`status.currentVersion`).
    pub current_version: Option<&'a str>,
    /// A recovery in progress, as the stored status records it.
    pub recovering: Option<&'a etcd_shared::types::RecoveryStatus>,
    /// The safety backups as the planner needs them (the stored record, the retry gate).
    pub safety: crate::planner::SafetyBackups,
}

/// The member pods and data claims in the caches, as the planner sees them: this cluster's,
/// those of a cluster a recovery replaces (not this cluster's), members whose pod is gone
/// (with the node it last ran on), and what the API says of their nodes.
struct PodsSeen {
    pods: Vec<PodState>,
    replaced_pods: Vec<PodState>,
    absent: Vec<AbsentPod>,
    claims: ClaimsSeen,
}

async fn pods_seen(
    client: &kube::Client,
    caches: &Caches,
    view: &ClusterView,
    replaced: &[String],
    placement: &[MemberPlacement],
    now: Timestamp,
) -> PodsSeen {
    let mut claim_selector = names::selector_labels(&view.name);
    claim_selector.insert(names::LABEL_COMPONENT.into(), "data".into());
    let claims = cache::select(&caches.claims, &view.namespace, &claim_selector);
    let claim_created_on = claim_created_on(&claims);
    let pods: Vec<PodState> = member_pods(caches, view)
        .iter()
        .filter_map(|(p, origin)| pod_state(p, *origin, &claim_created_on, now))
        .collect();
    let (replaced_pods, mut pods): (Vec<PodState>, Vec<PodState>) =
        pods.into_iter().partition(|p| replaced.contains(&p.name));
    let mut absent = absent_pods(placement, &pods, replaced);
    read_nodes(client, &mut pods, &mut absent).await;
    PodsSeen {
        pods,
        replaced_pods,
        absent,
        claims: claims_seen(&claims, replaced),
    }
}

/// The pods of a cluster a recovery replaces, their client endpoints, and whether that
/// cluster still serves (then it was not lost).
async fn replaced_cluster(
    view: &ClusterView,
    access: &EtcdAccess,
    pods: Vec<PodState>,
) -> (Vec<ReplacedPod>, Vec<(String, String)>, Option<String>) {
    let endpoints = running_endpoints(view, &pods);
    let serves = if endpoints.is_empty() {
        None
    } else {
        lost_cluster_serves(access, &endpoints).await
    };
    let pods = pods
        .into_iter()
        .map(|p| ReplacedPod {
            name: p.name,
            uid: p.uid,
            terminating: p.terminating,
        })
        .collect();
    (pods, endpoints, serves)
}

/// The version each member's claim was made under, from its annotation.
fn claim_created_on(claims: &[Arc<crate::cache::CachedClaim>]) -> BTreeMap<String, EtcdVersion> {
    claims
        .iter()
        .filter_map(|c| {
            let member = c.metadata.labels.as_ref()?.get(names::LABEL_MEMBER)?;
            let version = c
                .metadata
                .annotations
                .as_ref()?
                .get(names::ANNOTATION_CREATED_ON)?
                .parse()
                .ok()?;
            Some((member.clone(), version))
        })
        .collect()
}

/// The data claims of a cluster, by member: their UIDs, those of this cluster, those of a
/// cluster a recovery replaces, and those being deleted.
struct ClaimsSeen {
    uids: BTreeMap<String, String>,
    claims: Vec<String>,
    replaced: Vec<String>,
    deleting: Vec<String>,
}

fn claims_seen(claims: &[Arc<crate::cache::CachedClaim>], replaced: &[String]) -> ClaimsSeen {
    let member_of = |c: &crate::cache::CachedClaim| {
        c.metadata
            .labels
            .as_ref()?
            .get(names::LABEL_MEMBER)
            .cloned()
    };
    let uids: BTreeMap<String, String> = claims
        .iter()
        .filter_map(|c| Some((member_of(c)?, c.metadata.uid.clone()?)))
        .collect();
    let (deleting, claims): (Vec<_>, Vec<_>) = claims
        .iter()
        .partition(|c| c.metadata.deletion_timestamp.is_some());
    let (replaced, claims): (Vec<String>, Vec<String>) = claims
        .into_iter()
        .filter_map(|c| member_of(c))
        .partition(|c| replaced.contains(c));
    let deleting = deleting.into_iter().filter_map(|c| member_of(c)).collect();
    ClaimsSeen {
        uids,
        claims,
        replaced,
        deleting,
    }
}

/// The members etcd lists, each with what its own Status said (health, applied index, sizes);
/// started members that are unhealthy are added to `health_failures`.
fn member_states(
    view: &ClusterView,
    listed: &[ListedMember],
    statuses: &[PodStatus],
    health_failures: &mut Vec<(String, String)>,
) -> Vec<MemberState> {
    let mut states = Vec::new();
    for m in listed {
        let name = member_name(view, m);
        let health = health_of(&name, statuses);
        let own = statuses
            .iter()
            .find(|p| p.pod == name)
            .and_then(|p| p.status.as_ref().ok());
        if let Health::Unhealthy(why) = &health
            && !m.name.is_empty()
        {
            health_failures.push((name.clone(), why.clone()));
        }
        states.push(MemberState {
            id: m.id,
            name,
            learner: m.learner,
            started: !m.name.is_empty(),
            health,
            applied_index: own.map_or(0, |s| s.applied_index),
            db: own.map_or(DbSize::default(), |s| DbSize {
                total: u64::try_from(s.db_size).unwrap_or(0),
                in_use: u64::try_from(s.db_size_in_use).unwrap_or(0),
            }),
            revision: own.map_or(0, |s| s.revision),
            answered: own.is_some(),
            raft_index: own.map_or(0, |s| s.raft_index),
            peer_url: m.peer_urls.first().cloned(),
        });
    }
    states
}

/// The alarms raised: the members list them in their Status (3.4+); older lines are asked
/// through the Alarm API, which needs quorum (a raft request), when the member list was read.
async fn raised_alarms(
    view: &ClusterView,
    access: &EtcdAccess,
    statuses: &[PodStatus],
    member_api: &[String],
    members_read: bool,
) -> Vec<RaisedAlarm> {
    let mut raised: Vec<RaisedAlarm> = statuses
        .iter()
        .filter_map(|p| p.status.as_ref().ok())
        .flat_map(|s| s.alarms.iter().copied())
        .collect();
    let lists_alarms = statuses
        .iter()
        .filter_map(|p| p.status.as_ref().ok())
        .filter_map(|s| s.version.parse::<EtcdVersion>().ok())
        .min()
        .and_then(|v| v.capabilities())
        .is_some_and(|c| c.status_lists_alarms);
    if !lists_alarms && members_read {
        match access.alarms(member_api).await {
            Ok(listed) => raised.extend(listed),
            Err(e) => tracing::debug!(cluster = %view.name, error = %e, "alarm list failed"),
        }
    }
    raised
}

impl EtcdAccess {
    /// How the members of `view`'s cluster are reached: over TLS with the operator's client
    /// certificate (and its identity, for the pool's connections) if it has one.
    fn new(
        tls: Option<(Arc<MemberTls>, u64)>,
        timeout: Duration,
        pool: Option<Arc<EtcdPool>>,
        view: &ClusterView,
    ) -> Self {
        let (tls, tls_id) = match tls {
            Some((tls, id)) => (Some(tls), id),
            None => (None, 0),
        };
        EtcdAccess {
            tls,
            tls_id,
            timeout,
            pool: pool.map(|p| (p, view.key())),
        }
    }
}

/// Every running member's own Status: who it is, who leads, whether it is a learner (asked
/// first, so the member API is only asked where it is served: learners refuse it).
async fn pod_statuses(access: &EtcdAccess, by_ip: &[(String, String)]) -> Vec<PodStatus> {
    join_all(by_ip.iter().map(|(pod, endpoint)| {
        let access = access.clone();
        async move {
            PodStatus {
                pod: pod.clone(),
                endpoint: endpoint.clone(),
                status: access.status(endpoint).await.map_err(|e| e.to_string()),
            }
        }
    }))
    .await
}

/// What the members say: the endpoints the member API is asked at, the member list (or why
/// it could not be read), the alarms raised, the members whose health check failed, and the
/// backend quota.
struct MembersSeen {
    member_api: Vec<String>,
    members: Result<Vec<MemberState>, MembersUnread>,
    alarms: Vec<Alarm>,
    health_failures: Vec<(String, String)>,
    quota_bytes: u64,
}

async fn members_seen(
    view: &ClusterView,
    access: &EtcdAccess,
    by_ip: &[(String, String)],
) -> MembersSeen {
    let statuses = pod_statuses(access, by_ip).await;
    let member_api = member_api_endpoints(&statuses);
    let mut health_failures = Vec::new();
    let members = members_of(
        view,
        access,
        by_ip,
        &statuses,
        &member_api,
        &mut health_failures,
    )
    .await;
    let raised = raised_alarms(view, access, &statuses, &member_api, members.is_ok()).await;
    let alarms = named_alarms(&raised, members.as_deref().unwrap_or(&[]));
    MembersSeen {
        quota_bytes: quota_bytes(view, &statuses),
        member_api,
        members,
        alarms,
        health_failures,
    }
}

/// The member list as the members answer it, with each member's own Status; why not, when no
/// member pod runs or none answers.
async fn members_of(
    view: &ClusterView,
    access: &EtcdAccess,
    by_ip: &[(String, String)],
    statuses: &[PodStatus],
    member_api: &[String],
    health_failures: &mut Vec<(String, String)>,
) -> Result<Vec<MemberState>, MembersUnread> {
    if by_ip.is_empty() {
        return Err(MembersUnread::NoPodRunning);
    }
    match access.member_list(member_api).await {
        Err(e) => Err(MembersUnread::Unanswered(e.to_string())),
        Ok(listed) => Ok(member_states(view, &listed, statuses, health_failures)),
    }
}

/// How many more member pods a voluntary disruption may take now, as the cluster's budget in
/// the cache says.
fn disruptions_allowed(caches: &Caches, view: &ClusterView) -> Option<i32> {
    caches
        .pdbs
        .get(
            &kube::runtime::reflector::ObjectRef::new(&names::pdb_name(&view.name))
                .within(&view.namespace),
        )
        .and_then(|pdb| pdb.disruptions_allowed())
}

/// Reads the pods, claims and etcd members of a cluster.
pub async fn observe(
    client: &kube::Client,
    caches: &Caches,
    view: &ClusterView,
    recorded: Recorded<'_>,
    timeout: Duration,
    pool: Option<Arc<EtcdPool>>,
) -> Result<Observation, Error> {
    let now = Timestamp::now();
    let tls = operator_tls(client, view).await?;
    let seen = pods_seen(
        client,
        caches,
        view,
        recorded.replaced,
        recorded.placement,
        now,
    )
    .await;
    let access = EtcdAccess::new(tls, timeout, pool, view);
    // Terminating pods are asked too: a pod evicted from a silent node may still run its
    // member, and a member that answers is alive, whatever the API says of its pod.
    let by_ip = running_endpoints(view, &seen.pods);
    let (replaced_pods, replaced_endpoints, lost_cluster_serves) =
        replaced_cluster(view, &access, seen.replaced_pods).await;
    let said = members_seen(view, &access, &by_ip).await;
    let claims = seen.claims;
    let recovery = recorded.recovering.map(|r| crate::planner::Recovering {
        seed: crate::planner::recovery::seed_plan(r),
        replaced_pods: replaced_pods.clone(),
        replaced_claims: claims.replaced.clone(),
        lost_names: r.replaced.clone(),
        lost_cluster_serves: lost_cluster_serves.clone(),
    });
    let in_service = if seen.pods.iter().any(|p| p.serving == Some(false)) {
        in_service(client, view).await
    } else {
        None
    };
    let mut model = Observed {
        // A cluster CoreOS' operator made exists, whatever our status says of it.
        bootstrapped: recorded.bootstrapped || seen.pods.iter().any(|p| p.coreos),
        pods: seen.pods,
        claims: claims.claims,
        members: said.members,
        deleting_claims: claims.deleting,
        alarms: said.alarms,
        quota_bytes: said.quota_bytes,
        maintenance: crate::planner::maintenance::observed(
            recorded.maintenance,
            &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
        ),
        recovery,
        last_version: recorded.current_version.and_then(|v| v.parse().ok()),
        safety: recorded.safety.clone(),
        absent: seen.absent,
        disruptions_allowed: disruptions_allowed(caches, view),
        another_operator: Vec::new(),
        in_service,
        tls: recorded.tls.cloned(),
    };
    model.another_operator = crate::planner::adoption::another_operator(
        &model,
        recorded.ours,
        recorded.coreos_members,
        recorded.another_operator_pods,
    );
    Ok(Observation {
        model,
        member_endpoints: by_ip,
        member_api: said.member_api,
        access,
        health_failures: said.health_failures,
        replaced_pods,
        lost_cluster_serves,
        replaced_endpoints,
        claim_uids: claims.uids,
        replaced_claims: claims.replaced,
    })
}

/// The member pods the client Service's EndpointSlices list as ready; `None` when they cannot
/// be read (the planner then waits).
async fn in_service(client: &kube::Client, view: &ClusterView) -> Option<Vec<String>> {
    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        Api::namespaced(client.clone(), &view.namespace);
    let selector = format!(
        "kubernetes.io/service-name={}",
        names::client_service_name(&view.name)
    );
    let listed = match slices
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
    {
        Ok(listed) => listed,
        Err(e) => {
            tracing::debug!(cluster = %view.name, error = %e, "cannot list EndpointSlices");
            return None;
        }
    };
    let mut ready: Vec<String> = listed
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .filter_map(|e| e.target_ref.as_ref()?.name.clone())
        .collect();
    ready.sort();
    ready.dedup();
    Some(ready)
}

/// The client endpoints of the pods whose containers may run (phase Running, with an IP),
/// terminating ones included, by member name.
fn running_endpoints(view: &ClusterView, pods: &[PodState]) -> Vec<(String, String)> {
    pods.iter()
        .filter(|p| p.phase == PodPhase::Running)
        .filter_map(|p| {
            Some((
                p.name.clone(),
                endpoint(view, p.transport.as_ref(), p.ip.as_deref()?),
            ))
        })
        .collect()
}

/// The members of the placement record whose pod is gone from the API (a recovery's lost
/// cluster aside), with the node it last ran on; node states are read afterwards.
fn absent_pods(
    placement: &[MemberPlacement],
    pods: &[PodState],
    replaced: &[String],
) -> Vec<AbsentPod> {
    placement
        .iter()
        .filter(|p| !replaced.contains(&p.member) && !pods.iter().any(|pod| pod.name == p.member))
        .map(|p| AbsentPod {
            member: p.member.clone(),
            node: p.node.clone(),
            node_state: NodeState::Unknown,
        })
        .collect()
}

/// Reads the nodes of terminating pods and of pods gone from the API (only those: their
/// liveness depends on what the node says) and records each one's state.
async fn read_nodes(client: &kube::Client, pods: &mut [PodState], absent: &mut [AbsentPod]) {
    let wanted: Vec<String> = pods
        .iter()
        .filter(|p| p.terminating)
        .filter_map(|p| p.node.clone())
        .chain(absent.iter().map(|a| a.node.clone()))
        .collect();
    if wanted.is_empty() {
        return;
    }
    let states = crate::nodes::states(client, &wanted).await;
    let state = |node: &str| states.get(node).copied().unwrap_or_default();
    for pod in pods.iter_mut().filter(|p| p.terminating) {
        if let Some(node) = &pod.node {
            pod.node_state = state(node);
        }
    }
    for a in absent.iter_mut() {
        a.node_state = state(&a.node);
    }
}

/// Asks the members of the cluster a recovery replaces whether they have a leader: the first
/// that does, in words (that cluster is not lost: it serves).
pub async fn lost_cluster_serves(
    access: &EtcdAccess,
    endpoints: &[(String, String)],
) -> Option<String> {
    let answers = join_all(endpoints.iter().map(|(pod, endpoint)| {
        let access = access.clone();
        async move { (pod.clone(), access.status(endpoint).await) }
    }))
    .await;
    answers.into_iter().find_map(|(pod, status)| {
        let status = status.ok()?;
        (status.leader != 0).then(|| {
            format!(
                "member {pod} of the lost cluster answers with leader {:x}",
                status.leader
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(pod: &str, id: u64, leader: u64, is_learner: bool) -> PodStatus {
        PodStatus {
            pod: pod.into(),
            endpoint: format!("http://{pod}:2379"),
            status: Ok(MemberStatus {
                member_id: id,
                leader,
                version: "3.6.16".into(),
                errors: vec![],
                alarms: vec![],
                is_learner,
                applied_index: 0,
                raft_index: 0,
                revision: 1,
                db_size: 0,
                db_size_in_use: 0,
                db_size_quota: 0,
            }),
        }
    }

    fn down(pod: &str) -> PodStatus {
        PodStatus {
            pod: pod.into(),
            endpoint: format!("http://{pod}:2379"),
            status: Err("connection refused".into()),
        }
    }

    fn meta(json: serde_json::Value) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        serde_json::from_value(json).unwrap_or_else(|e| panic!("fixture: {e}"))
    }

    /// Member pods are this operator's (its labels) or CoreOS' (CoreOS' labels with
    /// `etcd_node`, a controller reference to this very cluster, none of this operator's
    /// labels); anything else carrying `app=etcd` is left alone (issue 28).
    #[test]
    fn member_pods_are_ours_or_coreos_and_nothing_else() {
        let view = crate::view::fixtures::view_of("size: 3");
        let owner = |uid: &str, controller: bool| {
            serde_json::json!([{"apiVersion": "etcd.database.coreos.com/v1beta2",
                "kind": "EtcdCluster", "name": "demo", "uid": uid, "controller": controller}])
        };
        let coreos_labels = serde_json::json!({"app": "etcd", "etcd_cluster": "demo",
            "etcd_node": "demo-4bq7xk2m9z"});
        let ours = serde_json::to_value(names::member_labels("demo", "demo-0", "3.6.16"))
            .unwrap_or_default();
        for (what, m, want) in [
            (
                "this operator's member",
                serde_json::json!({"labels": ours, "ownerReferences": owner("uid-1", true)}),
                Some(PodOrigin::Operator),
            ),
            (
                "CoreOS' member of this cluster",
                serde_json::json!({"labels": coreos_labels, "ownerReferences": owner("uid-1", true)}),
                Some(PodOrigin::CoreOS),
            ),
            (
                "CoreOS' labels, owned by another object of the same name (an earlier uid)",
                serde_json::json!({"labels": coreos_labels, "ownerReferences": owner("uid-0", true)}),
                None,
            ),
            (
                "CoreOS' labels, no owner (a hand-made etcd)",
                serde_json::json!({"labels": coreos_labels}),
                None,
            ),
            (
                "CoreOS' labels, a reference that is not the controller",
                serde_json::json!({"labels": coreos_labels, "ownerReferences": owner("uid-1", false)}),
                None,
            ),
            (
                "no etcd_node: not a member pod of CoreOS' operator",
                serde_json::json!({"labels": {"app": "etcd", "etcd_cluster": "demo"},
                    "ownerReferences": owner("uid-1", true)}),
                None,
            ),
            (
                "another cluster's CoreOS member",
                serde_json::json!({"labels": {"app": "etcd", "etcd_cluster": "other",
                    "etcd_node": "other-1"}, "ownerReferences": owner("uid-1", true)}),
                None,
            ),
        ] {
            assert_eq!(member_pod_origin(&meta(m), &view), want, "{what}");
        }
    }

    #[test]
    fn versions_are_read_from_image_tags() {
        for (image, want) in [
            ("quay.io/coreos/etcd:v3.2.13", Some("3.2.13")),
            ("registry:5000/etcd:3.4.37", Some("3.4.37")),
            ("quay.io/coreos/etcd:v3.3.27@sha256:abcd", Some("3.3.27")),
            ("registry:5000/etcd", None),
            ("quay.io/coreos/etcd:latest", None),
        ] {
            assert_eq!(
                version_of_image(image).map(|v| v.to_string()).as_deref(),
                want,
                "{image}"
            );
        }
    }

    /// Member API calls go to the leader first, then other voters; never to a learner or a
    /// member that did not answer (issue 13, item 8).
    #[test]
    fn member_api_calls_go_to_the_leader_then_voters_never_learners() {
        for (statuses, want) in [
            (
                vec![
                    answered("a", 1, 2, false),
                    answered("b", 2, 2, false),
                    answered("c", 3, 2, true),
                ],
                vec!["http://b:2379", "http://a:2379"],
            ),
            // A learner listed first (newest pod) still comes last: it is left out.
            (
                vec![answered("z", 9, 1, true), answered("a", 1, 1, false)],
                vec!["http://a:2379"],
            ),
            // No leader known: voters in name order.
            (
                vec![answered("b", 2, 0, false), answered("a", 1, 0, false)],
                vec!["http://a:2379", "http://b:2379"],
            ),
            (
                vec![down("a"), answered("b", 2, 2, false)],
                vec!["http://b:2379"],
            ),
            // Nobody answered: every endpoint, so the error is etcd's own.
            (
                vec![down("a"), down("b")],
                vec!["http://a:2379", "http://b:2379"],
            ),
        ] {
            assert_eq!(member_api_endpoints(&statuses), want, "{statuses:?}");
        }
    }
}
