//! What the planner sees: the observed pods, claims and etcd members of one cluster.

use std::time::Duration;

use etcd_shared::version::EtcdVersion;

/// A member pod as observed in the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodState {
    /// Pod (and member) name.
    pub name: String,
    /// The pod's UID (deletes carry it as a precondition: names are reused).
    pub uid: Option<String>,
    /// Version the pod's image runs (from its version label).
    pub version: Option<EtcdVersion>,
    /// The pod's etcd image.
    pub image: String,
    /// The etcd container's restart count (`containerStatuses`; 0 before the kubelet
    /// reports it).
    pub restarts: i32,
    /// The restart count recorded when the operator last changed the image, if it did.
    pub restarts_at_upgrade: Option<i32>,
    /// `status.phase`.
    pub phase: PodPhase,
    /// The pod is Ready as far as its containers go (its `ContainersReady` condition when it has
    /// the serving gate, else its `Ready` condition): the serving gate is read apart.
    pub ready: bool,
    /// The pod's own Ready condition, as the kubelet reports it (its containers and, where it
    /// has one, the serving gate): clients of the client Service reach it.
    pub in_service: bool,
    /// `status.podIP`.
    pub ip: Option<String>,
    /// The pod has a deletion timestamp.
    pub terminating: bool,
    /// Time since the pod was created.
    pub age: Duration,
    /// The version the pod was created with (`None`: made by an earlier operator).
    pub created_on: Option<EtcdVersion>,
    /// The version its data began under: the pod's, or its claim's when the claim is older
    /// (a pod recreated on a claim after an upgrade). `None`: unknown (an earlier operator).
    pub data_created_on: Option<EtcdVersion>,
    /// The raft index recorded as the cluster's snapshot barrier, if one was.
    pub snapshot_barrier: Option<u64>,
    /// How long the pod has been past its deletion deadline (its `deletionTimestamp`, which
    /// the API server sets to the time of the delete plus the grace period): zero unless it is
    /// terminating and the kubelet has not removed it in time (a node that died, a
    /// finalizer).
    pub overdue: Duration,
    /// How long the etcd container has been running since it last started (`None` while it
    /// has not run: the pod is unscheduled, pulling its image or running init containers).
    pub running_for: Option<Duration>,
    /// Why the pod is in its phase, as the kubelet says (`Terminated` after a graceful node
    /// shutdown, `Evicted`, ...).
    pub reason: Option<String>,
    /// The pod was made by CoreOS' operator (its member is adopted: replaced by a member of
    /// this operator, never upgraded, restarted or recreated).
    pub coreos: bool,
    /// The node the pod is bound to (`spec.nodeName`); `None` while it is not scheduled.
    pub node: Option<String>,
    /// What the API says of that node (read only for pods whose liveness matters: terminating
    /// or ended ones; [`NodeState::Unknown`] otherwise).
    pub node_state: NodeState,
    /// The kubelet reported the etcd container terminated (and not running again).
    pub container_stopped: bool,
    /// The pod's serving gate ([`etcd_shared::names::CONDITION_SERVING`]): `None` when the pod
    /// has none (made by an earlier operator, or by CoreOS'), else whether it is True.
    pub serving: Option<bool>,
    /// How long ago the serving gate last changed (`None`: never set, or unknown).
    pub serving_changed: Option<Duration>,
    /// The TLS files it was made with (its annotations; empty: made before they were
    /// recorded, or without operator-managed TLS).
    pub tls: TlsStamp,
    /// How its member speaks, read from its flags (`None`: they name no peer URL).
    pub transport: Option<crate::view::transport::MemberTransport>,
    /// The Secrets its TLS volumes mount (peer, server).
    pub tls_secrets: Vec<String>,
}

/// Fingerprints of TLS files: those a member pod was made with, or those the cluster's
/// Secrets hold now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsStamp {
    /// The trusted CA certificates ([`etcd_shared::names::ANNOTATION_TLS_TRUST`]).
    pub trust: Option<String>,
    /// The peer and server certificates ([`etcd_shared::names::ANNOTATION_TLS_LEAVES`]).
    pub leaves: Option<String>,
}

/// The operator-managed TLS files of a cluster as its Secrets hold them now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// Their fingerprints: a pod made now gets these.
    pub current: TlsStamp,
    /// A CA rotation is in progress: a pod whose trust is not recorded is not assumed to
    /// trust the current bundle.
    pub rotating: bool,
}

impl PodState {
    /// The operator changed the image and the kubelet has not yet reported the container
    /// restarted on it: the pod's Ready condition still describes the old container.
    pub fn restart_pending(&self) -> bool {
        self.restarts_at_upgrade
            .is_some_and(|before| self.restarts <= before)
    }
}

/// What the API says of the node a member pod runs on, or last ran on: how much the kubelet's
/// word about the pod's containers is worth.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NodeState {
    /// Its kubelet reports the node Ready: what it says of the pod's containers is current,
    /// and it stops the containers of pods no longer in the API.
    Ready,
    /// The node is not Ready (NotReady or Unknown: a silent kubelet, a partition, a paused
    /// machine): its containers may still run, whatever the API says of its pods.
    NotReady,
    /// The Node object is gone: its pods cannot run (the node controller deletes the Node of a
    /// machine that is gone, or an administrator did).
    Gone,
    /// The node carries `node.kubernetes.io/out-of-service`: an administrator said it is down
    /// (Kubernetes' non-graceful node shutdown).
    OutOfService,
    /// Not known: the node was not read, could not be read, or no node is recorded.
    #[default]
    Unknown,
}

/// A member whose pod is gone from the API, with the node its pod last ran on (the status's
/// placement record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbsentPod {
    /// The member (and pod) name.
    pub member: String,
    /// The node its pod last ran on.
    pub node: String,
    /// What the API says of that node now.
    pub node_state: NodeState,
}

/// `status.phase` of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodPhase {
    /// Not running yet.
    Pending,
    /// Running (containers may still restart).
    Running,
    /// Ended: the pod will not run again (an evicted pod, say).
    Ended,
    /// Unknown (node lost).
    Unknown,
}

impl PodPhase {
    /// Parses a pod's phase.
    pub fn parse(phase: Option<&str>) -> Self {
        match phase {
            Some("Running") => PodPhase::Running,
            Some("Succeeded" | "Failed") => PodPhase::Ended,
            Some("Unknown") => PodPhase::Unknown,
            _ => PodPhase::Pending,
        }
    }
}

/// Health of one member, as its own endpoint reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// The member answers and has a leader.
    Healthy {
        /// Version the member reports.
        version: Option<EtcdVersion>,
        /// The member is the raft leader.
        leader: bool,
    },
    /// The member did not answer or has no leader.
    Unhealthy(String),
}

impl Health {
    /// Whether the member is healthy.
    pub fn is_healthy(&self) -> bool {
        matches!(self, Health::Healthy { .. })
    }
}

/// A member of the etcd member list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberState {
    /// etcd's member ID.
    pub id: u64,
    /// Member name, derived from its peer URL (unstarted members have no name in etcd).
    pub name: String,
    /// The member is a learner (non-voting).
    pub learner: bool,
    /// The member has started at least once (etcd knows its name).
    pub started: bool,
    /// Its health.
    pub health: Health,
    /// The raft index it has applied (0 when unknown: etcd 3.2/3.3 do not report it).
    pub applied_index: u64,
    /// Its backend database: file size, and the part in use (what a defragmentation would
    /// leave). Zero when unknown (the member did not answer; 3.2/3.3 do not report the part in
    /// use).
    pub db: DbSize,
    /// The key-value store's revision as this member has applied it (0 when unknown).
    pub revision: i64,
    /// The member answered its Status (with or without a leader): its data is there to read.
    pub answered: bool,
    /// The raft index it has (every line reports it; 0 when it did not answer).
    pub raft_index: u64,
    /// The peer URL etcd lists for it (`None` when it lists none): what a joining member's
    /// `--initial-cluster` must name for it.
    pub peer_url: Option<String>,
}

/// The size of a member's backend database, bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DbSize {
    /// The file's size.
    pub total: u64,
    /// The part in use (pages holding data); 0 when the member does not report it.
    pub in_use: u64,
}

/// An alarm etcd raised; alarms are cluster-wide (every member refuses what the alarm stops).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AlarmKind {
    /// A member's database reached `--quota-backend-bytes`: writes are refused, reads and
    /// deletes served.
    NoSpace,
    /// A member's data differs from the others' (the corruption check found a different hash).
    Corrupt,
}

/// One raised alarm: which member it was raised for, and what.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Alarm {
    /// The member's ID.
    pub member_id: u64,
    /// The member's name (`unknown-<id>` when not in the member list).
    pub member: String,
    /// Which alarm.
    pub kind: AlarmKind,
}

/// What the operator recorded of its database maintenance, relative to now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Maintenance {
    /// The revision of the operator's last compaction, and how long ago it was made.
    pub compacted: Option<(i64, Duration)>,
    /// How long ago the operator last defragmented each member.
    pub defragmented: Vec<(String, Duration)>,
}

impl Maintenance {
    /// How long ago `member` was last defragmented by the operator.
    pub fn defragmented_ago(&self, member: &str) -> Option<Duration> {
        self.defragmented
            .iter()
            .find(|(m, _)| m == member)
            .map(|(_, ago)| *ago)
    }
}

/// Why the member list could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MembersUnread {
    /// Not asked (a model built without an observation).
    NotRead,
    /// No member pod runs with an IP yet.
    NoPodRunning,
    /// No member answered the member list; etcd's or the connection's words.
    Unanswered(String),
}

impl std::fmt::Display for MembersUnread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MembersUnread::NotRead => f.write_str("member list not read"),
            MembersUnread::NoPodRunning => f.write_str("no member pod is running with an IP yet"),
            MembersUnread::Unanswered(why) => f.write_str(why),
        }
    }
}

/// Everything observed of one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// Member pods.
    pub pods: Vec<PodState>,
    /// Members that have a data claim.
    pub claims: Vec<String>,
    /// The member list, or why it could not be read.
    pub members: Result<Vec<MemberState>, MembersUnread>,
    /// The status records a member list read before: the cluster exists (or existed).
    pub bootstrapped: bool,
    /// Members' data claims being deleted (their names stay taken until they are gone).
    pub deleting_claims: Vec<String>,
    /// Alarms raised in the cluster.
    pub alarms: Vec<Alarm>,
    /// The members' backend quota (`--quota-backend-bytes`), bytes.
    pub quota_bytes: u64,
    /// What the operator recorded of its compactions and defragmentations.
    pub maintenance: Maintenance,
    /// A recovery from permanent quorum loss in progress (the pods and claims of the lost
    /// cluster are then not in [`Self::pods`] and [`Self::claims`]).
    pub recovery: Option<Recovering>,
    /// The oldest version the members were last seen running (`status.currentVersion`): a
    /// durable member brought back on its claim while no member tells its version starts on
    /// it, not on a newer spec version its data may not be ready for (3.7 cannot replay the
    /// v2 entries of a 3.4-born log until the snapshot barrier is passed).
    pub last_version: Option<EtcdVersion>,
    /// The safety backups of `spec.safetyBackup`, as observed.
    pub safety: SafetyBackups,
    /// Members whose pod is gone from the API, with the node it last ran on (as the status
    /// recorded it): a pod deleted while its node is silent may still run there.
    pub absent: Vec<AbsentPod>,
    /// How many more member pods a voluntary disruption may take now, as the cluster's
    /// disruption budget says (`None`: not computed for its current spec yet).
    pub disruptions_allowed: Option<i32>,
    /// Member pods CoreOS' operator created after this operator took the cluster over: it
    /// still runs (see [`crate::planner::adoption::another_operator`]).
    pub another_operator: Vec<String>,
    /// The member pods the client Service's EndpointSlices list as ready (read only while a
    /// member is being taken out of service; `None`: not read).
    pub in_service: Option<Vec<String>>,
    /// The operator-managed TLS files (`None`: the cluster's TLS is not operator-managed).
    pub tls: Option<TlsFiles>,
}

/// The safety backups of `spec.safetyBackup` as observed: which change the stored record still
/// covers, and why a failed snapshot is not tried again yet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SafetyBackups {
    /// The change (`upgrade to 3.7`, `scale down to 3 (generation 4)`) the stored record holds
    /// a snapshot for, while that record is fresh.
    pub covered: Option<String>,
    /// The last failure, while its next attempt is not due (`...; next attempt in N s`).
    pub retry_wait: Option<String>,
}

/// A recovery in progress, as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovering {
    /// What the new first member is seeded from.
    pub seed: super::SeedPlan,
    /// Member pods of the lost cluster still there (the survivor among them, until the new
    /// cluster holds a quorum of its own size).
    pub replaced_pods: Vec<ReplacedPod>,
    /// Data claims of the lost cluster still there.
    pub replaced_claims: Vec<String>,
    /// Every member name of the lost cluster (its pods, claims and members): none is reused.
    pub lost_names: Vec<String>,
    /// Why the lost cluster is not lost after all, when one of its members answers with a
    /// leader: a majority of it runs again (or never stopped), so the recovery must stop.
    pub lost_cluster_serves: Option<String>,
}

/// A member pod of the cluster a recovery replaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplacedPod {
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: Option<String>,
    /// It is already being deleted (deleting it again changes nothing).
    pub terminating: bool,
}

impl Default for Observed {
    fn default() -> Self {
        Observed {
            pods: Vec::new(),
            claims: Vec::new(),
            members: Err(MembersUnread::NotRead),
            bootstrapped: false,
            deleting_claims: Vec::new(),
            alarms: Vec::new(),
            quota_bytes: etcd_shared::version::DEFAULT_QUOTA_BACKEND_BYTES,
            maintenance: Maintenance::default(),
            recovery: None,
            last_version: None,
            safety: SafetyBackups::default(),
            absent: Vec::new(),
            disruptions_allowed: None,
            another_operator: Vec::new(),
            in_service: None,
            tls: None,
        }
    }
}

impl Observed {
    /// The pod of a member.
    pub fn pod(&self, name: &str) -> Option<&PodState> {
        self.pods.iter().find(|p| p.name == name)
    }

    /// Whether a member has a data claim.
    pub fn has_claim(&self, name: &str) -> bool {
        self.claims.iter().any(|c| c == name)
    }

    /// The members whose pods CoreOS' operator made, by name: adopted one at a time.
    pub fn coreos_members(&self) -> Vec<&str> {
        self.pods
            .iter()
            .filter(|p| p.coreos)
            .map(|p| p.name.as_str())
            .collect()
    }

    /// Whether `member`'s pod was made by CoreOS' operator.
    pub fn is_coreos(&self, member: &str) -> bool {
        self.pod(member).is_some_and(|p| p.coreos)
    }

    /// The record of member `name`'s pod that is gone from the API, if the status recorded
    /// its node.
    pub fn absent(&self, name: &str) -> Option<&AbsentPod> {
        self.absent.iter().find(|a| a.member == name)
    }

    /// Whether an alarm of `kind` is raised.
    pub fn has_alarm(&self, kind: AlarmKind) -> bool {
        self.alarms.iter().any(|a| a.kind == kind)
    }
}
