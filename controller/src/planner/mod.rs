//! The membership planner: from the desired cluster and what is observed, the single next
//! step. A pure function, so every case (failures included) is a table-driven test.
//!
//! Safety rules it never breaks:
//! - one membership change at a time, and none while a majority of voters is unhealthy;
//! - a member is only replaced when its data is provably gone (its pod vanished and it had
//!   no claim, or its pod ended) or it never started, or when its pod is stuck terminating
//!   past its grace period; a slow or crashing member that still has its data is waited for,
//!   not replaced; a member whose pod ended but whose data is on a claim gets its pod back,
//!   with or without quorum;
//! - a pod that is still Pending (unscheduled, pulling its image, restoring a snapshot in its
//!   init containers) is never taken for a failed member;
//! - an alarm is not quorum loss: NOSPACE is healed (compaction, one defragmentation at a
//!   time, disarm), CORRUPT is reported and left to a human;
//! - scale-up only when every member is healthy; new members join as learners where the
//!   line supports it and are promoted once they have caught up;
//! - upgrades move one member at a time, followers first, only while every member is
//!   healthy, and only along a path etcd supports.

pub mod adoption;
/// Test fixtures: pods and members as the planner sees them.
#[cfg(test)]
pub(crate) mod fixtures;
pub mod liveness;
pub mod maintenance;
pub mod model;
pub mod recovery;
pub mod rollout;
pub mod safety;
pub mod serving;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_adoption;
#[cfg(test)]
mod tests_rollout;
#[cfg(test)]
mod tests_safety;

use std::time::Duration;

use etcd_shared::names;
use etcd_shared::version::{DEFAULT_SNAPSHOT_COUNT, EtcdVersion, LineCapabilities, check_upgrade};

use crate::view::ClusterView;
use crate::view::transport::MemberTransport;
pub use liveness::{Liveness, Unconfirmed};
pub use maintenance::{DefragReason, DefragmentationPolicy};
pub use model::{
    AbsentPod, Alarm, AlarmKind, DbSize, Health, Maintenance, MemberState, MembersUnread,
    NodeState, Observed, PodPhase, PodState, Recovering, ReplacedPod, SafetyBackups, TlsFiles,
    TlsStamp,
};
pub use recovery::{PermanentLoss, RecoverFrom};

/// Whether a member founds a new cluster or joins an existing one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitialState {
    /// The first member of a new cluster.
    New,
    /// A member added to a running cluster through the member API.
    Existing,
}

/// What a member pod is started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberPlan {
    /// Member (and pod) name.
    pub name: String,
    /// `--initial-cluster`: every voter and this member, as (name, peer URL).
    pub initial_cluster: Vec<(String, String)>,
    /// New cluster or joining.
    pub state: InitialState,
    /// Version the member starts with.
    pub version: EtcdVersion,
    /// `--initial-cluster-token`: the cluster's token, with the seed's index appended when a
    /// bootstrap started over under a new name (so nothing of the first attempt can join).
    pub token: String,
    /// The snapshot a new cluster's first member restores before etcd starts (an EtcdRestore's,
    /// or a recovery's); `None` for every other member.
    pub seed: Option<SeedPlan>,
}

/// The snapshot a first member is seeded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedPlan {
    /// Where its init containers fetch it.
    pub from: SeedFrom,
    /// SHA-256 of its database, hex, as checked before: the fetch checks it again.
    pub sha256: String,
    /// Restore with `--bump-revision` and `--mark-compacted` where the line's tool has them
    /// (3.5+): a recovery or a restore may lose writes some clients saw, and a watcher resuming
    /// from a revision past the snapshot's must get `compacted`, not silence.
    pub bump_revision: bool,
}

/// Where a seed's snapshot is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeedFrom {
    /// In an object store or a claim, as an EtcdRestore names it.
    Store(Box<etcd_shared::types::RestoreSeed>),
    /// Streamed from a surviving member (its client URL) over etcd's Snapshot RPC.
    Member(String),
}

/// How long the planner waits before it gives up on a member, and its maintenance policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlannerSettings {
    /// A new member (or the seed) whose etcd container has run this long without becoming
    /// healthy is removed and added anew (the seed: started over). Time spent Pending
    /// (scheduling, image pulls, a restore's download) does not count.
    pub member_start: Duration,
    /// A learner that has not caught up this long after its pod was created is removed.
    pub learner_catch_up: Duration,
    /// A member pod still terminating this long after its deletion deadline (the delete's
    /// time plus its grace period) is taken as gone: its member is removed when quorum allows
    /// and replaced under a new name.
    pub stuck_terminating: Duration,
    /// When members are defragmented without an alarm.
    pub defragmentation: DefragmentationPolicy,
    /// Test-only: start a recovery even while a member answers with a leader or a majority
    /// answers (the rule of issue 32 broken on purpose, for the proof suite's control
    /// experiment; see `crate::failpoints::Broken`).
    pub broken_recover_beside_a_quorum: bool,
}

impl Default for PlannerSettings {
    fn default() -> Self {
        PlannerSettings {
            member_start: Duration::from_secs(300),
            learner_catch_up: Duration::from_secs(600),
            stuck_terminating: Duration::from_secs(60),
            defragmentation: DefragmentationPolicy::default(),
            broken_recover_beside_a_quorum: false,
        }
    }
}

/// Why a member is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemovalReason {
    /// The spec asks for fewer members.
    ScaleDown,
    /// The member lost its data or never started; it is added anew afterwards.
    Replace,
    /// Its pod is stuck terminating past its grace period (its node is gone, or a finalizer
    /// holds it); it is replaced under a new name.
    StuckTerminating,
    /// A member of CoreOS' operator, whose data this operator's members now hold (adoption).
    Adopted,
    /// Its pod was made with TLS files it must no longer use (a CA rotation, a certificate a
    /// line does not reload): a member made with the current ones took its place.
    Rollout,
}

/// Why leadership is handed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// The leader is restarted on a new version next.
    Upgrade,
    /// The leader is removed from the cluster next (the last member of CoreOS' operator).
    Removal,
    /// The leader is removed next: it was made with TLS files it must no longer use, and a
    /// member made with the current ones replaced it ([`rollout`]).
    Rollout,
}

/// Why the planner makes no change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocked {
    /// `spec.paused` is set.
    Paused,
    /// CoreOS' operator still runs and manages this cluster too: it made these member pods
    /// after this operator took over. Nothing is changed until they are gone.
    AnotherOperator {
        /// The pods it made.
        pods: Vec<String>,
    },
    /// Fewer than a majority of voters are healthy.
    QuorumLost {
        /// Voters that are not healthy.
        missing: Vec<String>,
        /// Number of voters.
        voters: usize,
        /// Missing voters whose pods are terminating or gone while their processes may still
        /// run (their node is silent): they may hold the quorum elsewhere, so nothing is
        /// recovered or replaced until that is known.
        unconfirmed: Vec<Unconfirmed>,
    },
    /// Every member and its data is gone: only a new cluster (or a restore) can follow.
    AllMembersLost,
    /// The members run a version from which etcd cannot move to the spec's.
    UpgradeNotSupported(String),
    /// The snapshot `spec.safetyBackup` asks for before a minor upgrade or a scale-down could
    /// not be written, so the change waits (planned by `safety::guard` while the failed
    /// snapshot's retry is not due).
    SafetyBackupFailed {
        /// The change, e.g. `upgrade to 3.7`.
        change: safety::RiskyChange,
        /// Why the snapshot failed.
        reason: String,
    },
    /// etcd raised CORRUPT: a member's data differs from the others'. Nothing is changed or
    /// disarmed; a human decides which data is right.
    DataCorrupted {
        /// The members the alarm names.
        members: Vec<String>,
    },
    /// Quorum is lost for good (the data of a majority of voters is gone) and the recovery
    /// waits for its approval (`spec.recovery.policy: Manual`) or for a member that may hold
    /// data to answer.
    QuorumLostForGood {
        /// What was lost, and where a recovery would start from.
        loss: PermanentLoss,
        /// The exact command that approves the recovery (`kubectl annotate ...`).
        approve: String,
    },
    /// NOSPACE is raised and, compacted, the data in use still fills the quota: defragmenting
    /// cannot make room; the quota must be raised (or data deleted).
    SpaceExhausted {
        /// Bytes in use on the fullest member after the compaction.
        in_use: u64,
        /// The quota, bytes.
        quota: u64,
    },
}

/// What the planner is waiting for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiting {
    /// A member's pod is being created or started.
    MemberStarting(String),
    /// A member's pod is Pending: not scheduled yet, pulling its image, or running its init
    /// containers (a restore's download). Never a reason to give up on it.
    MemberPending(String),
    /// A member's pod is terminating (within its grace period).
    PodTerminating(String),
    /// Members are unhealthy but still have their data; the kubelet restarts them.
    Unhealthy(Vec<String>),
    /// A learner is catching up with the leader.
    LearnerCatchingUp(String),
    /// An upgraded member has not reported its new version yet.
    MemberUpgrading(String),
    /// The member is to be taken down (restarted, defragmented), but the disruption budget
    /// allows no disruption now (a drain is evicting, a member is not Ready).
    DisruptionBudget(String),
    /// The member is out of service (its serving gate False) and the client Service's
    /// EndpointSlices still list it: it is taken down once they no longer do.
    LeavingService(String),
    /// Members must take a raft snapshot past the cluster's v2-format entries before the
    /// first one moves to a line that cannot replay them (3.7).
    SnapshotBeforeUpgrade {
        /// Members that have not applied enough entries past the barrier yet.
        members: Vec<String>,
        /// Entries the furthest-behind of them still has to apply.
        entries_left: u64,
    },
}

/// The single next step for one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Create the first member of a new cluster.
    Bootstrap(MemberPlan),
    /// Add a member through the member API; its pod follows in a later step.
    AddMember {
        /// Member name.
        name: String,
        /// Its peer URL.
        peer_url: String,
        /// Added as a learner.
        learner: bool,
    },
    /// Create the pod of a member that is in the member list (or has a claim) but no pod.
    CreatePod(MemberPlan),
    /// Promote a learner that has caught up.
    PromoteLearner {
        /// Member ID.
        id: u64,
        /// Member name.
        name: String,
    },
    /// Remove a member from the member list; its pod and claim go in later steps.
    RemoveMember {
        /// Member ID.
        id: u64,
        /// Member name.
        name: String,
        /// Why.
        reason: RemovalReason,
    },
    /// Delete the pod of a member that is no longer in the member list, or that ended.
    DeletePod(String),
    /// Delete the claim of a member that is no longer in the member list.
    DeleteClaim(String),
    /// Move a member's pod to the desired image (the kubelet restarts the container).
    UpgradeMember {
        /// Member name.
        name: String,
        /// Image the pod gets.
        image: String,
        /// Version it moves to.
        version: EtcdVersion,
    },
    /// Hand raft leadership to another voter before the leader is restarted for an upgrade
    /// or removed, so clients see a planned handover instead of an election timeout.
    TransferLeadership {
        /// The leader.
        from: String,
        /// The voter that takes over.
        to: String,
        /// Its member ID.
        to_id: u64,
        /// What happens to the leader next.
        before: Handover,
    },
    /// Record a raft index after every v2-format entry of the cluster (on every member pod),
    /// from which the members' next raft snapshot is counted.
    RecordSnapshotBarrier {
        /// The highest index any member has applied.
        index: u64,
    },
    /// The first member of a cluster that never formed did not come up: delete its pod and
    /// its claim together, so the bootstrap starts over clean under a new name and token.
    RestartBootstrap(String),
    /// Compact the key-value history to `revision` (to heal NOSPACE).
    Compact {
        /// The revision compacted to.
        revision: i64,
    },
    /// Defragment one member's backend (it blocks that member while it runs).
    Defragment {
        /// The member.
        name: String,
        /// Why.
        reason: DefragReason,
    },
    /// Disarm NOSPACE alarms, once the members have room again.
    DisarmAlarm(Vec<Alarm>),
    /// Take the snapshot `spec.safetyBackup` asks for before `change` (a minor upgrade or a
    /// scale-down); `guarded` is the step that starts the change, planned again on a fresh
    /// observation once the snapshot is recorded.
    TakeSafetyBackup {
        /// The change (its words are the key the status records).
        change: safety::RiskyChange,
        /// The step the snapshot comes before.
        guarded: Box<Step>,
    },
    /// Start recovering from permanent quorum loss: take the snapshot (from the best
    /// surviving member, or the newest backup that checks) and verify it; nothing of the cluster
    /// is touched before.
    StartRecovery {
        /// Where the data comes from.
        from: RecoverFrom,
        /// The voting members whose data is gone.
        lost: Vec<String>,
    },
    /// The recovered cluster runs and the lost one is removed: the recovery is over.
    FinishRecovery,
    /// A member of the cluster being recovered answered with a leader: it was not lost after
    /// all. The recovery stops (its record is dropped) and the cluster is operated as before.
    AbortRecovery {
        /// What showed the lost cluster serving.
        why: String,
    },
    /// Set a member pod's serving gate ([`etcd_shared::names::CONDITION_SERVING`]): False takes
    /// it out of the client Service before it is taken down on purpose, True puts it back.
    SetServing {
        /// The member.
        name: String,
        /// In the Service or not.
        serving: bool,
    },
    /// Nothing to change now; check again soon.
    Wait(Waiting),
    /// Nothing the operator may safely change.
    Blocked(Blocked),
    /// The cluster matches its spec.
    Done,
}

impl Step {
    /// Whether this step changes the cluster.
    pub fn is_change(&self) -> bool {
        !matches!(self, Step::Wait(_) | Step::Blocked(_) | Step::Done)
    }
}

/// The next free member index: above every index a pod, claim or member still uses, so a
/// new member never finds a stale claim or pod. A replaced member that had the highest
/// index gives its name to its replacement, which joins under a new member ID.
fn next_index(view: &ClusterView, obs: &Observed) -> u32 {
    let members = obs.members.as_ref().map(|m| m.as_slice()).unwrap_or(&[]);
    obs.pods
        .iter()
        .map(|p| p.name.as_str())
        .chain(obs.claims.iter().map(String::as_str))
        .chain(obs.deleting_claims.iter().map(String::as_str))
        .chain(members.iter().map(|m| m.name.as_str()))
        .chain(
            obs.recovery
                .iter()
                .flat_map(|r| r.lost_names.iter().map(String::as_str)),
        )
        .filter_map(|n| names::member_index(&view.name, n))
        .max()
        .map_or(0, |i| i + 1)
}

/// The peer URL a member added now registers: TLS once every member can dial a TLS peer, a
/// plain one (a bridge) while a member cannot ([`MemberTransport::for_new_member`]).
pub(crate) fn new_member_peer_url(
    view: &ClusterView,
    obs: &Observed,
    members: &[MemberState],
    name: &str,
) -> String {
    let peers = members
        .iter()
        .map(|m| obs.pod(&m.name).and_then(|p| p.transport.as_ref()));
    MemberTransport::for_new_member(view, peers).peer_url(view, name)
}

fn is_durable(view: &ClusterView) -> bool {
    view.pod.persistent_volume_claim_spec.is_some()
}

/// The plan of a pod for `name`, joining the members listed (or founding the cluster).
fn member_plan(
    view: &ClusterView,
    name: &str,
    peers: &[&str],
    state: InitialState,
    version: EtcdVersion,
) -> MemberPlan {
    let mut initial: Vec<(String, String)> = peers
        .iter()
        .map(|p| (p.to_string(), view.peer_url(p)))
        .collect();
    if !peers.contains(&name) {
        initial.push((name.to_string(), view.peer_url(name)));
    }
    // The first member of a cluster an EtcdRestore created restores its snapshot.
    let seed = match (state, &view.seed) {
        // Revisions bumped past the replaced cluster's (where the line's tool can): a watcher
        // resuming from a revision the old cluster gave it is told `compacted`, not silently
        // moved back in time (issue 33's robustness suite saw a restore answer from revision
        // 61 to clients that had seen 196).
        (InitialState::New, Some(restore)) => Some(SeedPlan {
            sha256: restore.sha256.clone(),
            from: SeedFrom::Store(Box::new(restore.clone())),
            bump_revision: true,
        }),
        _ => None,
    };
    MemberPlan {
        name: name.to_string(),
        initial_cluster: initial,
        token: cluster_token(view, name, state),
        state,
        version,
        seed,
    }
}

/// `plan` with the peer URL etcd lists for each member of `members` in its `--initial-cluster`:
/// a joining member must name every member exactly as the cluster knows it, and members made
/// by CoreOS' operator (or under another cluster domain) may advertise another form than this
/// operator's.
fn with_listed_peer_urls(mut plan: MemberPlan, members: &[MemberState]) -> MemberPlan {
    for (name, url) in &mut plan.initial_cluster {
        if let Some(listed) = members
            .iter()
            .find(|m| &m.name == name)
            .and_then(|m| m.peer_url.as_ref())
        {
            url.clone_from(listed);
        }
    }
    plan
}

/// The `--initial-cluster-token` of a member: the cluster's, except for a seed that is not
/// the cluster's first member (a bootstrap that started over), whose index is appended.
fn cluster_token(view: &ClusterView, name: &str, state: InitialState) -> String {
    match (state, names::member_index(&view.name, name)) {
        (InitialState::New, Some(index)) if index > 0 => format!("{}-{index}", view.token()),
        _ => view.token(),
    }
}

/// The lowest version the members run (reported by etcd, else their pods' labels).
fn running_version(obs: &Observed, members: &[MemberState]) -> Option<EtcdVersion> {
    members
        .iter()
        .filter_map(|m| match &m.health {
            Health::Healthy {
                version: Some(v), ..
            } => Some(*v),
            _ => obs.pod(&m.name).and_then(|p| p.version),
        })
        .min()
}

/// The version a member (re)created on existing data starts on: the oldest the members run
/// (from etcd, else their pods), else the oldest they were last seen running (the status), else
/// the spec's. Never the spec's while an older one is known: an upgrade moves one running
/// member at a time, through its checks (the snapshot barrier before 3.7), never by recreation.
fn restart_version(
    view: &ClusterView,
    obs: &Observed,
    members: Option<&[MemberState]>,
) -> EtcdVersion {
    let running = match members {
        Some(members) => running_version(obs, members),
        None => obs.pods.iter().filter_map(|p| p.version).min(),
    };
    running.or(obs.last_version).unwrap_or(view.version)
}

/// What every member can serve: the capabilities of the oldest line among the versions the
/// members run and the spec's. A call one member's line lacks (learners before 3.4,
/// MoveLeader before 3.3) is never planned, also while an upgrade is half done.
fn member_capabilities(
    view: &ClusterView,
    obs: &Observed,
    members: &[MemberState],
) -> &'static LineCapabilities {
    running_version(obs, members)
        .and_then(|v| v.capabilities())
        .filter(|running| running.minor < view.capabilities.minor)
        .unwrap_or(view.capabilities)
}

/// Whether the planner gives up on a member pod that is not healthy: it is past Pending and
/// its etcd has run for `member_start` (time spent Pending, pulling or restoring, does not
/// count), or it keeps crashing and is older than that.
fn gave_up(pod: &PodState, settings: &PlannerSettings) -> bool {
    pod.phase != PodPhase::Pending
        && (pod.running_for.is_some_and(|t| t > settings.member_start)
            || (pod.restarts > 0 && pod.age > settings.member_start))
}

/// Whether a pod is stuck terminating: past its deletion deadline by more than
/// `settings.stuck_terminating` (its kubelet is gone, or a finalizer holds it).
fn is_stuck(pod: &PodState, settings: &PlannerSettings) -> bool {
    pod.terminating && pod.overdue > settings.stuck_terminating
}

/// The single next step for a cluster.
pub fn plan(view: &ClusterView, obs: &Observed, settings: &PlannerSettings) -> Step {
    let step = safety::guard(view, obs, plan_change(view, obs, settings));
    if matches!(step, Step::Blocked(Blocked::Paused)) {
        return step;
    }
    serving::gate(obs, respect_budget(obs, step), view.clients_held)
}

/// The operator's own disruptions (a member restarted on a new image, a member blocked by a
/// defragmentation) go through the disruption budget the same way a drain's evictions do:
/// none while it allows none.
fn respect_budget(obs: &Observed, step: Step) -> Step {
    let member = match &step {
        Step::UpgradeMember { name, .. }
        | Step::Defragment { name, .. }
        | Step::RemoveMember {
            name,
            reason: RemovalReason::Rollout,
            ..
        } => name,
        _ => return step,
    };
    // A member already out of service (its gate False, its pod not Ready) took its part of
    // the budget when it left: taking it down costs nothing more.
    let already_out = obs
        .pod(member)
        .is_some_and(|p| !p.ready || p.serving == Some(false));
    // A single voter's budget never allows a disruption (it would be an outage): moving it is
    // the outage the spec asked for (a one-member cluster's upgrade), not one beside a drain.
    let single_voter = obs
        .members
        .as_ref()
        .is_ok_and(|m| m.iter().filter(|m| !m.learner).count() <= 1);
    if obs.disruptions_allowed == Some(0) && !already_out && !single_voter {
        return Step::Wait(Waiting::DisruptionBudget(member.clone()));
    }
    step
}

/// The next step, before [`safety::guard`] puts a safety backup in front of a risky one.
fn plan_change(view: &ClusterView, obs: &Observed, settings: &PlannerSettings) -> Step {
    if view.paused {
        return Step::Blocked(Blocked::Paused);
    }
    if !obs.another_operator.is_empty() {
        return Step::Blocked(Blocked::AnotherOperator {
            pods: obs.another_operator.clone(),
        });
    }
    if let Some(step) = recovery::plan_recovery(view, obs, settings) {
        return step;
    }
    if !obs.bootstrapped
        && let Some(step) = plan_bootstrap(view, obs, settings)
    {
        return step;
    }
    // A durable member whose pod ended (a graceful node shutdown, an eviction) keeps its data
    // on its claim: its pod is deleted, then created again on the claim. Safe with or without
    // quorum, and the only way back when every member's pod ended.
    if is_durable(view)
        && let Some(p) = obs
            .pods
            .iter()
            .find(|p| p.phase == PodPhase::Ended && !p.terminating && obs.has_claim(&p.name))
    {
        return Step::DeletePod(p.name.clone());
    }
    if let Some(p) = obs
        .pods
        .iter()
        .find(|p| p.terminating && !is_stuck(p, settings))
    {
        return Step::Wait(Waiting::PodTerminating(p.name.clone()));
    }
    match &obs.members {
        Err(_) => plan_without_member_list(view, obs, settings),
        Ok(members) => plan_with_members(view, obs, members, settings),
    }
}

/// A cluster whose member list was never read (it has not formed yet): its first member is
/// created, waited for while Pending or starting, and started over clean (pod and claim
/// together, a new name and token) only when it ended or its etcd ran for
/// `member_start` without becoming ready. A Ready seed the operator cannot reach is left
/// running (the status says it is unreachable). `None` once there is more than one member.
fn plan_bootstrap(view: &ClusterView, obs: &Observed, settings: &PlannerSettings) -> Option<Step> {
    // A cluster CoreOS' operator made is running (or was): never a new one beside it.
    if obs.members.is_ok() || obs.pods.iter().any(|p| p.coreos) {
        return None;
    }
    let live: Vec<&PodState> = obs.pods.iter().filter(|p| !is_stuck(p, settings)).collect();
    match (live.as_slice(), obs.claims.as_slice()) {
        // A seed's claim without its pod (the pod was deleted): the seed again, on it. Its data
        // (if it ever ran) makes etcd ignore the new-cluster flags; without data it founds the
        // cluster as it would have.
        ([], [claim]) => Some(Step::Bootstrap(member_plan(
            view,
            claim,
            &[],
            InitialState::New,
            view.version,
        ))),
        ([], []) => {
            let name = names::member_name(&view.name, next_index(view, obs));
            Some(Step::Bootstrap(member_plan(
                view,
                &name,
                &[],
                InitialState::New,
                view.version,
            )))
        }
        ([seed], _) => {
            let on_claim = is_durable(view) && obs.has_claim(&seed.name);
            Some(if seed.terminating {
                if on_claim {
                    // Its data may be on the claim: it comes back on it once the pod is gone.
                    Step::Wait(Waiting::PodTerminating(seed.name.clone()))
                } else {
                    // Its data goes with the pod: a new seed under a new name, now.
                    let name = names::member_name(&view.name, next_index(view, obs));
                    Step::Bootstrap(member_plan(
                        view,
                        &name,
                        &[],
                        InitialState::New,
                        view.version,
                    ))
                }
            } else if seed.phase == PodPhase::Ended {
                // A pod with restartPolicy Always ends only when the node stops it (a graceful
                // shutdown, an eviction): its claim keeps what it wrote.
                if on_claim {
                    Step::DeletePod(seed.name.clone())
                } else {
                    Step::RestartBootstrap(seed.name.clone())
                }
            } else if seed.phase == PodPhase::Pending {
                Step::Wait(Waiting::MemberPending(seed.name.clone()))
            } else if !seed.ready && gave_up(seed, settings) {
                // etcd ran all that time and never became ready: it never served a write.
                Step::RestartBootstrap(seed.name.clone())
            } else {
                Step::Wait(Waiting::MemberStarting(seed.name.clone()))
            })
        }
        _ => None,
    }
}

/// The member list cannot be read: restart durable members, or wait.
fn plan_without_member_list(
    view: &ClusterView,
    obs: &Observed,
    settings: &PlannerSettings,
) -> Step {
    // Durable members whose pods are gone (a whole-cluster restart): bring them back first,
    // they hold the data.
    let claims_without_pods: Vec<&str> = obs
        .claims
        .iter()
        .map(String::as_str)
        .filter(|c| obs.pod(c).is_none())
        .collect();
    if let Some(first) = claims_without_pods.first() {
        let peers: Vec<&str> = obs.claims.iter().map(String::as_str).collect();
        return Step::CreatePod(member_plan(
            view,
            first,
            &peers,
            InitialState::Existing,
            restart_version(view, obs, None),
        ));
    }
    if let Some(loss) = recovery::permanent_loss(view, obs, settings) {
        return recovery::on_permanent_loss(view, loss);
    }
    let live: Vec<&PodState> = obs.pods.iter().filter(|p| !is_stuck(p, settings)).collect();
    if live.is_empty() {
        return Step::Blocked(Blocked::AllMembersLost);
    }
    if let Some(pending) = live.iter().find(|p| p.phase == PodPhase::Pending) {
        return Step::Wait(Waiting::MemberPending(pending.name.clone()));
    }
    if let Some(young) = live
        .iter()
        .find(|p| !p.ready && p.age < settings.member_start)
    {
        return Step::Wait(Waiting::MemberStarting(young.name.clone()));
    }
    let missing: Vec<String> = live.iter().map(|p| p.name.clone()).collect();
    Step::Blocked(Blocked::QuorumLost {
        voters: missing.len(),
        missing,
        unconfirmed: obs
            .pods
            .iter()
            .filter_map(|p| match liveness::of_pod(p) {
                Liveness::Unconfirmed(u) => Some(u),
                _ => None,
            })
            .collect(),
    })
}

fn plan_with_members(
    view: &ClusterView,
    obs: &Observed,
    members: &[MemberState],
    settings: &PlannerSettings,
) -> Step {
    let durable = is_durable(view);
    let voters: Vec<&MemberState> = members.iter().filter(|m| !m.learner).collect();
    let healthy_voters = voters.iter().filter(|m| m.health.is_healthy()).count();
    let has_quorum = healthy_voters >= ClusterView::quorum(voters.len());
    let member_names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();

    // 1. Members without pods that can (re)start: they never started, or their data is on
    //    a claim. Safe with or without quorum, and the only way back to quorum.
    for m in members {
        if obs.pod(&m.name).is_none() && (!m.started || (durable && obs.has_claim(&m.name))) {
            let version = restart_version(view, obs, Some(members));
            return Step::CreatePod(with_listed_peer_urls(
                member_plan(
                    view,
                    &m.name,
                    &member_names,
                    InitialState::Existing,
                    version,
                ),
                members,
            ));
        }
    }

    if !has_quorum {
        // A voter that is still starting (etcd < 3.4 adds voters, not learners) is waited for.
        let unhealthy: Vec<&&MemberState> =
            voters.iter().filter(|m| !m.health.is_healthy()).collect();
        if let Some(m) = unhealthy.iter().find(|m| {
            !m.started
                && obs
                    .pod(&m.name)
                    .is_some_and(|p| p.phase == PodPhase::Pending || p.age < settings.member_start)
        }) {
            return Step::Wait(Waiting::MemberStarting(m.name.clone()));
        }
        if let Some(loss) = recovery::permanent_loss(view, obs, settings) {
            return recovery::on_permanent_loss(view, loss);
        }
        let missing = voters
            .iter()
            .filter(|m| !m.health.is_healthy())
            .map(|m| m.name.clone())
            .collect();
        return Step::Blocked(Blocked::QuorumLost {
            missing,
            voters: voters.len(),
            unconfirmed: recovery::unconfirmed_losses(view, obs),
        });
    }

    // 2. Members whose data is gone, that never came up, or whose pod is stuck terminating:
    //    remove, to be added anew. Removing an unhealthy member never lowers the number of
    //    healthy voters; a healthy one goes only when quorum holds without it, the leader
    //    last (its removal costs an election).
    let mut leader_last: Vec<&MemberState> = members.iter().collect();
    leader_last.sort_by_key(|m| matches!(m.health, Health::Healthy { leader: true, .. }));
    for m in leader_last {
        let pod = obs.pod(&m.name);
        let data_gone = match pod {
            None => m.started, // (unstarted ones were handled above)
            Some(p) => p.phase == PodPhase::Ended && !(durable && obs.has_claim(&m.name)),
        };
        let never_started =
            !m.health.is_healthy() && pod.is_some_and(|p| gave_up(p, settings)) && !m.started;
        let learner_stalled = m.learner
            && !m.health.is_healthy()
            && pod.is_some_and(|p| p.age > settings.learner_catch_up);
        let stuck = pod.is_some_and(|p| is_stuck(p, settings));
        let reason = if stuck {
            RemovalReason::StuckTerminating
        } else {
            RemovalReason::Replace
        };
        let keeps_quorum = !m.health.is_healthy()
            || m.learner
            || healthy_voters > ClusterView::quorum(voters.len().saturating_sub(1));
        // A healthy member stuck terminating (its kubelet silent, its etcd serving) is
        // replaced one at a time: the next goes only once a replacement is a healthy voter.
        let one_at_a_time = !(stuck && m.health.is_healthy()) || healthy_voters >= view.size.max(2);
        // No removal while another member has joined the list but not started: its pod was
        // made with the member list of then (`--initial-cluster`), which a removal would make
        // wrong, and etcd refuses to start on it.
        let joining = members.iter().any(|o| o.id != m.id && !o.started);
        if (data_gone || never_started || learner_stalled || stuck)
            && keeps_quorum
            && one_at_a_time
            && !joining
        {
            return Step::RemoveMember {
                id: m.id,
                name: m.name.clone(),
                reason,
            };
        }
    }

    // 3. Leftovers of removed members: pods (not those already terminating), then claims.
    if let Some(p) = obs
        .pods
        .iter()
        .find(|p| !p.terminating && !member_names.contains(&p.name.as_str()))
    {
        return Step::DeletePod(p.name.clone());
    }
    if let Some(c) = obs
        .claims
        .iter()
        .find(|c| !member_names.contains(&c.as_str()))
    {
        return Step::DeleteClaim(c.clone());
    }

    // CORRUPT stops every change that moves data (adding, promoting, scaling, upgrading,
    //    healing); members are still brought back on their claims (1.), replaced when their
    //    data is gone (2.) and their leftovers removed (3.), so a node loss never freezes the
    //    cluster while a human decides which data is right.
    let corrupt: Vec<String> = obs
        .alarms
        .iter()
        .filter(|a| a.kind == AlarmKind::Corrupt)
        .map(|a| a.member.clone())
        .collect();
    if !corrupt.is_empty() {
        return Step::Blocked(Blocked::DataCorrupted { members: corrupt });
    }

    // 4. Learners that caught up are promoted; others are waited for.
    if let Some(l) = members.iter().find(|m| m.learner) {
        return if l.health.is_healthy() {
            Step::PromoteLearner {
                id: l.id,
                name: l.name.clone(),
            }
        } else {
            Step::Wait(Waiting::LearnerCatchingUp(l.name.clone()))
        };
    }

    // 5. Scale down: unhealthy members first, then followers, newest first. Not while members
    //    of CoreOS' operator are adopted: they are the ones that go (7.).
    let unhealthy: Vec<&MemberState> = members.iter().filter(|m| !m.health.is_healthy()).collect();
    let adopting = members.iter().any(|m| obs.is_coreos(&m.name));
    if members.len() > view.size && !adopting {
        if let Some(step) = rollout::removal(view, obs, members, settings) {
            return step;
        }
        let victim = unhealthy.first().copied().or_else(|| {
            members
                .iter()
                .filter(|m| !matches!(m.health, Health::Healthy { leader: true, .. }))
                .max_by_key(|m| names::member_index(&view.name, &m.name))
        });
        if let Some(v) = victim {
            let healthy_after = healthy_voters - usize::from(v.health.is_healthy() && !v.learner);
            if healthy_after >= ClusterView::quorum(voters.len().saturating_sub(1)) {
                return Step::RemoveMember {
                    id: v.id,
                    name: v.name.clone(),
                    reason: RemovalReason::ScaleDown,
                };
            }
        }
    }

    // Nothing below may run while a member is unhealthy.
    if !unhealthy.is_empty() {
        let names: Vec<String> = unhealthy.iter().map(|m| m.name.clone()).collect();
        if let Some(young) = unhealthy.iter().find(|m| {
            obs.pod(&m.name).is_some_and(|p| {
                p.phase == PodPhase::Pending
                    || p.age < settings.member_start
                    || (!m.started && !gave_up(p, settings))
            })
        }) {
            return Step::Wait(Waiting::MemberStarting(young.name.clone()));
        }
        return Step::Wait(Waiting::Unhealthy(names));
    }

    // 6. A full database is healed before anything else changes the cluster.
    if obs.has_alarm(AlarmKind::NoSpace) {
        return maintenance::heal_no_space(view, obs, members);
    }

    // 7. Adopt the members of CoreOS' operator: this operator's added one at a time, then
    //    CoreOS' removed one at a time.
    if let Some(step) = adoption::adopt(view, obs, members) {
        return step;
    }

    // 8. Scale up, one member at a time.
    if members.len() < view.size {
        let name = names::member_name(&view.name, next_index(view, obs));
        return Step::AddMember {
            peer_url: new_member_peer_url(view, obs, members, &name),
            name,
            learner: member_capabilities(view, obs, members).learners && !members.is_empty(),
        };
    }

    // 9. Upgrade, one member at a time, followers first; then, with nothing else to do,
    //    defragment members whose files hold much more than their data.
    //    Members made with TLS files they must no longer use (a CA rotation, a certificate
    //    their line does not reload) are replaced next, one at a time, surge first.
    match plan_upgrade(view, obs, members) {
        Step::Done => rollout::surge(view, obs, members)
            .or_else(|| maintenance::defragment_fragmented(obs, members, &settings.defragmentation))
            .unwrap_or(Step::Done),
        step => step,
    }
}

fn plan_upgrade(view: &ClusterView, obs: &Observed, members: &[MemberState]) -> Step {
    let target_image = view.image(&view.version);
    // A member whose pod already has the new image but still reports the old version, or
    // whose pod is not Ready again yet, or whose kubelet has not reported the restart yet,
    // is restarting into it: wait for it before touching another. etcd answers before the
    // kubelet's readiness probe does, and the Ready condition read right after the image
    // patch is still the old container's; moving on at that point would take a second
    // endpoint out of the client Service.
    for m in members {
        if let (
            Some(pod),
            Health::Healthy {
                version: Some(v), ..
            },
        ) = (obs.pod(&m.name), &m.health)
            && pod.image == target_image
            && (*v != view.version || !pod.ready || pod.restart_pending())
        {
            // A pod created on the spec's version (a member just added or replaced) that is
            // not Ready yet is starting, not upgrading: the wait is the same, the phase not.
            let created_on_target = pod.created_on.as_ref() == Some(&view.version);
            if created_on_target && *v == view.version && !pod.restart_pending() {
                return Step::Wait(Waiting::MemberStarting(m.name.clone()));
            }
            return Step::Wait(Waiting::MemberUpgrading(m.name.clone()));
        }
    }
    let mut outdated: Vec<&MemberState> = members
        .iter()
        .filter(|m| obs.pod(&m.name).is_some_and(|p| p.image != target_image))
        .collect();
    if outdated.is_empty() {
        return Step::Done;
    }
    // Restarting a member while another member's pod is not Ready would leave the Service
    // (and the disruption budget) with two members out.
    let not_ready: Vec<String> = members
        .iter()
        .filter(|m| obs.pod(&m.name).is_some_and(|p| !p.ready))
        .map(|m| m.name.clone())
        .collect();
    if !not_ready.is_empty() {
        return Step::Wait(Waiting::Unhealthy(not_ready));
    }
    if let Some(running) = running_version(obs, members)
        && let Err(e) = check_upgrade(&running, &view.version)
    {
        let message = match e.first {
            Some(first) => format!(
                "{}; run: kubectl patch etcdcluster {} -n {} --type merge -p '{{\"spec\":{{\"version\":\"{first}\"}}}}'",
                e.message, view.name, view.namespace
            ),
            None => e.message,
        };
        return Step::Blocked(Blocked::UpgradeNotSupported(message));
    }
    if let Some(running) = running_version(obs, members)
        && (running.minor, view.version.minor) == (5, 6)
    {
        // etcd 3.6 takes its membership from the v3 store, where a 3.5 cluster may keep members
        // removed long ago ("zombie members"; etcd 3.5.26 syncs them away at start): a member
        // the list holds that no pod runs is one.
        let zombies: Vec<&str> = members
            .iter()
            .filter(|m| obs.pod(&m.name).is_none())
            .map(|m| m.name.as_str())
            .collect();
        if !zombies.is_empty() {
            return Step::Blocked(Blocked::UpgradeNotSupported(format!(
                "the member list holds members no pod runs ({}); etcd calls these zombie members and 3.6 would count them in its quorum: remove them first (etcdctl member remove ID), then the upgrade goes on",
                zombies.join(", ")
            )));
        }
    }
    if let Some(step) = snapshot_barrier(view, obs, members) {
        return step;
    }
    outdated.sort_by_key(|m| {
        (
            matches!(m.health, Health::Healthy { leader: true, .. }),
            names::member_index(&view.name, &m.name),
        )
    });
    let m = outdated[0];
    // MoveLeader is served by the leader, which still runs the old version.
    let leader_can_hand_over = match &m.health {
        Health::Healthy {
            version: Some(v), ..
        } => v.capabilities().is_some_and(|c| c.move_leader),
        _ => member_capabilities(view, obs, members).move_leader,
    };
    if matches!(m.health, Health::Healthy { leader: true, .. })
        && leader_can_hand_over
        && let Some(successor) = successor(obs, members, &m.name, &target_image)
    {
        return Step::TransferLeadership {
            from: m.name.clone(),
            to: successor.name.clone(),
            to_id: successor.id,
            before: Handover::Upgrade,
        };
    }
    Step::UpgradeMember {
        name: m.name.clone(),
        image: target_image,
        version: view.version,
    }
}

/// etcd's `--snapshot-count` for the members: `ETCD_SNAPSHOT_COUNT` from `etcdEnv` when set,
/// else the 3.6+ default.
fn snapshot_count(view: &ClusterView) -> u64 {
    view.pod
        .etcd_env
        .iter()
        .find(|e| e.name == "ETCD_SNAPSHOT_COUNT")
        .and_then(|e| e.value.as_deref()?.trim().parse().ok())
        .unwrap_or(DEFAULT_SNAPSHOT_COUNT)
}

/// Before the first member moves to a line that cannot replay v2-format raft entries (3.7),
/// every member must have taken a raft snapshot after the cluster's last such entry, if any
/// member ever wrote them (one created on 3.4 or older, or by an earlier operator, which does
/// not say): otherwise the member would replay them on its next start and panic. A member
/// snapshots every `--snapshot-count` applied entries, so once all members run a line that
/// writes none, the highest applied index is recorded as the barrier and the move waits
/// until every member has applied `snapshot-count` entries past it.
fn snapshot_barrier(view: &ClusterView, obs: &Observed, members: &[MemberState]) -> Option<Step> {
    if view.capabilities.replays_v2_entries {
        return None;
    }
    let running = running_version(obs, members)?.capabilities()?;
    if !running.replays_v2_entries || running.writes_v2_entries {
        return None;
    }
    // Where the data began counts, not the pod: a durable member recreated on its claim (after
    // a node shutdown, say) runs a new pod over the old raft log.
    let wrote_v2 = obs.pods.iter().any(|p| {
        p.data_created_on
            .and_then(|v| v.capabilities())
            .is_none_or(|c| c.writes_v2_entries)
    });
    if !wrote_v2 {
        return None;
    }
    let recorded: Option<Vec<u64>> = obs.pods.iter().map(|p| p.snapshot_barrier).collect();
    let Some(barrier) = recorded.and_then(|b| b.into_iter().min()) else {
        let index = members.iter().map(|m| m.applied_index).max().unwrap_or(0);
        return Some(Step::RecordSnapshotBarrier { index });
    };
    let needed = barrier
        .saturating_add(snapshot_count(view))
        .saturating_add(1);
    let behind: Vec<&MemberState> = members
        .iter()
        .filter(|m| m.applied_index < needed)
        .collect();
    let slowest = behind.iter().map(|m| m.applied_index).min()?;
    Some(Step::Wait(Waiting::SnapshotBeforeUpgrade {
        members: behind.iter().map(|m| m.name.clone()).collect(),
        entries_left: needed - slowest,
    }))
}

/// The voter that should lead while `leader` restarts: a started, healthy voter with a Ready
/// pod, one already on `target_image` first, then the lowest name.
fn successor<'a>(
    obs: &Observed,
    members: &'a [MemberState],
    leader: &str,
    target_image: &str,
) -> Option<&'a MemberState> {
    members
        .iter()
        .filter(|m| m.name != leader && !m.learner && m.started && m.health.is_healthy())
        .filter_map(|m| obs.pod(&m.name).filter(|p| p.ready).map(|p| (m, p)))
        .min_by_key(|(m, p)| (p.image != target_image, m.name.clone()))
        .map(|(m, _)| m)
}
