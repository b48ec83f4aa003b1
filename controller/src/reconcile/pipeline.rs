//! One reconcile of one cluster, as a pipeline ([`reconcile`] lists its stages): validate and
//! default the spec, keep the certificates, keep the Services and the NetworkPolicy and observe
//! (a complete model), plan one step, keep the budget, carry the step out ([`super::steps`]),
//! compute the status once, announce what changed and write it. The decisions are pure
//! functions (the planner, [`status::after_step`], [`requeue_after`], [`transition_events`]);
//! this module sequences them with the API calls.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::Store;
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::warn;

use etcd_shared::types::{ClusterPhase, RecoveryRecord, RecoveryStatus, SafetyBackupRecord};
use etcd_shared::{EtcdCluster, EtcdClusterStatus};

use super::safety;
use super::steps::{Outcome, execute};
use crate::backoff::RetryGate;
use crate::builders;
use crate::cache::{self, Caches};
use crate::context::{Context, ControllerConfig};
use crate::error::{Error, FIELD_MANAGER};
use crate::etcd::EtcdPool;
use crate::events::Events;
use crate::failpoints::Broken;
use crate::observe::{Observation, Recorded, observe};
use crate::planner::recovery;
use crate::planner::{self, Blocked, SafetyBackups, Step, Waiting};
use crate::status;
use crate::status_writer::apply_status;
use crate::view::ClusterView;

/// What every reconcile works with: the controller's context, its caches, its Event recorder,
/// its connections to the members and the safety backups' retry gate.
pub struct Run<'a> {
    /// The controller's context.
    pub ctx: &'a Context,
    /// The caches the observation reads.
    pub caches: &'a Caches,
    /// Where Events go.
    pub recorder: &'a Recorder,
    /// Connections to the members, per cluster.
    pub pool: &'a Arc<EtcdPool>,
    /// When a failed safety backup may be tried again, per cluster.
    pub safety_retries: &'a RetryGate,
}

/// One reconcile of one cluster, as its stages: validate the spec, keep the certificates,
/// read the status's records, keep the Services and the NetworkPolicy and observe, plan one
/// step, keep the budget, carry the step out, compute the status once, announce and write it.
pub async fn reconcile(cluster: &EtcdCluster, run: &Run<'_>) -> Result<Action, Error> {
    if cluster.metadata.deletion_timestamp.is_some() {
        return Ok(forget(cluster, run));
    }
    let at = Target::of(cluster, run.ctx);
    let Some(view) = validate(cluster, run, &at).await? else {
        return Ok(Action::await_change());
    };
    let certificates = keep_certificates(cluster, run, &at, &view).await?;
    let view = certificates.effective(view);
    let records = Records::read(&at, cluster, &view).await;
    let now = Timestamp::now();
    let obs = observe_cluster(run, &at, &view, &records, certificates.files.as_ref(), now).await?;
    let settings = planner::PlannerSettings {
        broken_recover_beside_a_quorum: run.ctx.config.broken == Some(Broken::StuckIsLost),
        ..run.ctx.config.planner
    };
    let step = planner::plan(&view, &obs.model, &settings);
    before_step(cluster, run, &view, &obs, &step).await?;
    let outcome = execute(
        run.ctx,
        run.recorder,
        cluster,
        &view,
        &obs,
        &step,
        run.safety_retries,
    )
    .await;
    let recovered_from = records.recovering.as_ref().map(recovery::source_kind);
    let carried = records.after(outcome.as_ref().ok(), view.safety_backup.is_some());
    let mut new = status::after_step(&view, &obs.model, &step, carried, at.previous, now);
    new.tls = certificates.in_use.clone();
    if let Some(note) = &certificates.switching {
        status::note_certificate_switch(&mut new, note, now);
    }
    if view.clients_held {
        status::note_progress(
            &mut new,
            "ReplayingRestore",
            "no member is in the client Service while the point-in-time restore replays its changes (annotation etcd.database.coreos.com/hold-clients)",
            now,
        );
    }
    let finished = (outcome.is_ok() && step == Step::FinishRecovery).then_some(recovered_from);
    announce(cluster, run, &at, &new, finished.flatten()).await;
    write_status(&at.api, &at.name, &new, at.previous).await?;
    outcome?;
    Ok(requeue(&step, &run.ctx.config, certificates.next_check))
}

/// A deleted cluster: its per-cluster state is dropped (owner references garbage-collect its
/// pods, claims, Services and budget).
fn forget(cluster: &EtcdCluster, run: &Run<'_>) -> Action {
    let (name, namespace) = (cluster.name_any(), cluster.namespace().unwrap_or_default());
    run.ctx.metrics.forget_cluster(&namespace, &name);
    let key = crate::object_key::ObjectKey::new(namespace.clone(), name.clone());
    run.pool.forget(&key);
    run.safety_retries.succeeded(&key);
    Action::await_change()
}

/// The cluster a reconcile writes to: its API, name and namespace, and its cached status.
struct Target<'a> {
    api: Api<EtcdCluster>,
    name: String,
    namespace: String,
    previous: Option<&'a EtcdClusterStatus>,
}

impl<'a> Target<'a> {
    fn of(cluster: &'a EtcdCluster, ctx: &Context) -> Self {
        let namespace = cluster.namespace().unwrap_or_default();
        Target {
            api: Api::namespaced(ctx.client.clone(), &namespace),
            name: cluster.name_any(),
            namespace,
            previous: cluster.status.as_ref(),
        }
    }

    /// Writes `new` after a failure of a stage (the status must not keep saying what it said
    /// before); a failed write is logged, the stage's error is what the reconcile returns.
    async fn report(&self, new: &EtcdClusterStatus) {
        if let Err(write) = write_status(&self.api, &self.name, new, self.previous).await {
            warn!(name = %self.name, namespace = %self.namespace, error = %write, "cannot write the status either");
        }
    }
}

/// The spec validated and defaulted; `None` (the status and a Warning say why) when invalid.
async fn validate(
    cluster: &EtcdCluster,
    run: &Run<'_>,
    at: &Target<'_>,
) -> Result<Option<ClusterView>, Error> {
    match ClusterView::new(cluster, &run.ctx.config.policy()) {
        Ok(view) => Ok(Some(view)),
        Err(e) => {
            warn!(name = %at.name, namespace = %at.namespace, error = %e, "invalid EtcdCluster spec");
            let new = status::invalid(
                &e,
                cluster.metadata.generation,
                at.previous,
                Timestamp::now(),
            );
            write_status(&at.api, &at.name, &new, at.previous).await?;
            Events::of(run.recorder, cluster)
                .warning("InvalidSpec", e.to_string())
                .await;
            Ok(None)
        }
    }
}

/// What the certificates stage leaves for the rest of the reconcile.
struct Certificates {
    /// The TLS files the Secrets hold (operator-managed or cert-manager's, or a switch's).
    files: Option<crate::planner::TlsFiles>,
    /// When a certificate is due next, if the operator issues them.
    next_check: Option<Duration>,
    /// The Secrets the members and the operator use while the certificates' source is
    /// switched (else the spec's).
    mode: Option<crate::view::TlsMode>,
    /// What `status.tls` records: the Secrets every member uses.
    in_use: Option<etcd_shared::types::TlsInUse>,
    /// A switch of the certificates' source in progress, in words.
    switching: Option<String>,
}

impl Certificates {
    /// The view the rest of the reconcile works with: during a switch of the certificates'
    /// source, its Secrets instead of the spec's.
    fn effective(&self, view: ClusterView) -> ClusterView {
        match &self.mode {
            Some(mode) => ClusterView {
                tls: mode.clone(),
                ..view
            },
            None => view,
        }
    }
}

/// How often a switch of the certificates' source is looked at.
const SWITCH_RECHECK: Duration = Duration::from_secs(5);

/// The operator's own certificates first: the members' pods mount them and the operator dials
/// the members with its client certificate; a change of their source is switched to
/// ([`crate::certificates::switching`]). A failure is reported in the status (the members
/// cannot get their certificates), then retried with backoff.
async fn keep_certificates(
    cluster: &EtcdCluster,
    run: &Run<'_>,
    at: &Target<'_>,
    view: &ClusterView,
) -> Result<Certificates, Error> {
    let listed: Vec<String> = at
        .previous
        .and_then(|s| s.members.as_ref())
        .map(|m| m.ready.iter().chain(&m.unready).cloned().collect())
        .unwrap_or_default();
    let kept = async {
        let target = cluster.spec.tls.as_ref().and_then(|t| t.in_use(&view.name));
        let pods = switch_pods(run.caches, view);
        match switching_from(at, target.as_ref()).await {
            Some(from) if target.is_some() => {
                let to = target.as_ref().map_or_else(Default::default, Clone::clone);
                switch_certificates(cluster, run, view, &listed, (&from, &to), &pods).await
            }
            recorded => {
                let mut kept = upkeep(cluster, run, view, &listed).await?;
                // Recorded once every member speaks as the spec asks (a switch from plain
                // HTTP to TLS is over): a switch of the source starts from there.
                let settled =
                    crate::observe::member_pods(run.caches, view)
                        .iter()
                        .all(|(pod, _)| {
                            pod.transport_of("etcd").is_none_or(|t| {
                                t.stage(view) == crate::view::transport::TransportStage::Target
                            })
                        });
                kept.in_use = if settled { target } else { recorded };
                Ok(kept)
            }
        }
    }
    .await;
    if let Err(e) = &kept {
        warn!(name = %at.name, namespace = %at.namespace, error = %e, "cannot keep the cluster's certificates");
        at.report(&status::certificates_failed(
            e,
            view,
            at.previous,
            Timestamp::now(),
        ))
        .await;
    }
    kept
}

/// The upkeep of the spec's source: the operator's CA and certificates, or cert-manager's
/// Certificates.
async fn upkeep(
    cluster: &EtcdCluster,
    run: &Run<'_>,
    view: &ClusterView,
    listed: &[String],
) -> Result<Certificates, Error> {
    if let Some(settings) = view.tls.issuing {
        let members = member_files(run.caches, cluster, view, listed);
        let issued = ensure_certificates(run, cluster, view, &settings, &members).await?;
        return Ok(Certificates {
            files: issued.files,
            next_check: issued.next_check,
            mode: None,
            in_use: None,
            switching: None,
        });
    }
    let mut files = None;
    if let Some(tls) = &view.tls.cert_manager {
        let client = &run.ctx.client;
        crate::certificates::cert_manager::keep_certificates(client, view, tls).await?;
        files = crate::certificates::cert_manager::leaf_files(client, view).await?;
    }
    Ok(Certificates {
        files,
        next_check: None,
        mode: None,
        in_use: None,
        switching: None,
    })
}

/// The Secrets the members use, when they differ from those the spec names and the traffic
/// encrypted is the same (a switch of the certificates' source); else what the status
/// records. Read from the API server when the cached status differs from the spec (the
/// status that ended the last switch may not be cached yet).
async fn switching_from(
    at: &Target<'_>,
    target: Option<&etcd_shared::types::TlsInUse>,
) -> Option<etcd_shared::types::TlsInUse> {
    let cached = at.previous.and_then(|s| s.tls.clone());
    let recorded = if cached.as_ref() != target && target.is_some() {
        match at.api.get(&at.name).await {
            Ok(fresh) => fresh.status.and_then(|s| s.tls),
            Err(_) => cached,
        }
    } else {
        cached
    };
    recorded.filter(|r| target.is_some_and(|t| r != t && r.modes() == t.modes()))
}

/// A member pod's name, IP and the trust bundle it was made with, as the TLS steps read them.
fn pod_files(pod: &crate::cache::CachedPod) -> crate::certificates::PodFiles {
    crate::certificates::PodFiles {
        name: pod.metadata.name.clone().unwrap_or_default(),
        ip: pod.status.pod_ip.clone().filter(|ip| !ip.is_empty()),
        trust: pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(etcd_shared::names::ANNOTATION_TLS_TRUST))
            .cloned(),
    }
}

/// The member pods as a switch needs them.
fn switch_pods(
    caches: &Caches,
    view: &ClusterView,
) -> Vec<crate::certificates::switching::SwitchPod> {
    crate::observe::member_pods(caches, view)
        .into_iter()
        .map(|(pod, _)| crate::certificates::switching::SwitchPod {
            files: pod_files(&pod),
            secrets: pod.tls_secrets(),
        })
        .collect()
}

/// One reconcile's part of a switch of the certificates' source: the switch Secret made or
/// moved on, the new source set to work once the members left the old one's Secrets, Events
/// for each phase.
async fn switch_certificates(
    cluster: &EtcdCluster,
    run: &Run<'_>,
    view: &ClusterView,
    listed: &[String],
    (from, to): (&etcd_shared::types::TlsInUse, &etcd_shared::types::TlsInUse),
    pods: &[crate::certificates::switching::SwitchPod],
) -> Result<Certificates, Error> {
    use crate::certificates::switching;
    let client = &run.ctx.client;
    let state = switching::start(client, view, from, to, pods, listed).await?;
    let mut next_check = SWITCH_RECHECK;
    if state.detached() {
        switching::clear_old(client, view, from, to).await?;
        if let Some(after) = upkeep(cluster, run, view, listed).await?.next_check {
            next_check = next_check.min(after);
        }
    }
    let out = switching::advance(client, view, &state, to, pods, listed).await?;
    let events = Events::of(run.recorder, cluster);
    if let Some(moved) = &out.moved {
        tracing::info!(name = %view.name, namespace = %view.namespace, %moved, "certificate switch");
        events.normal("CertificateSwitch", moved.clone()).await;
    }
    let in_use = if out.done {
        switching::clean_up(client, view, pods).await?;
        events
            .normal(
                "CertificateSwitched",
                format!(
                    "every member uses {} certificates; the switch Secret is deleted",
                    switching::describe(to)
                ),
            )
            .await;
        to.clone()
    } else {
        from.clone()
    };
    Ok(Certificates {
        files: out.files,
        next_check: Some(next_check),
        mode: (!out.done).then_some(out.mode),
        in_use: Some(in_use),
        switching: (!out.done).then_some(out.note),
    })
}

/// The status's records a reconcile acts on: the stored status where acting on a stale cached
/// one would be harmful (the safety-backup record; a recovery in progress, whose record says
/// which pods belong to the cluster being replaced), else the cached one.
struct Records {
    recovering: Option<RecoveryStatus>,
    last_recovery: Option<RecoveryRecord>,
    last_safety_backup: Option<SafetyBackupRecord>,
}

impl Records {
    async fn read(at: &Target<'_>, cluster: &EtcdCluster, view: &ClusterView) -> Self {
        let stored = stored_status(&at.api, cluster, view).await;
        let status = stored.as_ref().or(at.previous);
        Records {
            recovering: status.and_then(|s| s.recovery.clone()),
            last_recovery: status.and_then(|s| s.last_recovery.clone()),
            last_safety_backup: status.and_then(|s| s.last_safety_backup.clone()),
        }
    }

    /// The records after the step: the safety backup just taken (else the stored one: the
    /// status written replaces the stored one), the recovery just started, whether the step
    /// was carried out.
    fn after(self, outcome: Option<&Outcome>, safety_backups: bool) -> status::StepRecords {
        status::StepRecords {
            carried_out: outcome.is_some(),
            safety_backup: safety_backups
                .then(|| {
                    outcome
                        .and_then(|o| o.safety_backup.clone())
                        .or(self.last_safety_backup)
                })
                .flatten(),
            recovering: self.recovering,
            started_recovery: outcome.and_then(|o| o.recovery.clone()),
            last_recovery: self.last_recovery,
        }
    }
}

/// Keeps the Services and the NetworkPolicy, then observes the cluster: the planner's model,
/// complete. A failure is reported in the status (why the operator cannot see the cluster),
/// then retried with backoff.
async fn observe_cluster(
    run: &Run<'_>,
    at: &Target<'_>,
    view: &ClusterView,
    records: &Records,
    tls: Option<&crate::planner::TlsFiles>,
    now: Timestamp,
) -> Result<Observation, Error> {
    let ctx = run.ctx;
    let previous = at.previous;
    // While member pods of CoreOS' operator run, the Services keep CoreOS' selector (read from
    // the cache, which has listed every member pod before the first reconcile).
    let coreos_members = crate::observe::coreos_members_present(run.caches, view);
    let (peer, client) = (
        builders::peer_service(view, coreos_members),
        builders::client_service(view, coreos_members),
    );
    let replaced = records
        .recovering
        .as_ref()
        .map(|r| r.replaced.clone())
        .unwrap_or_default();
    let recorded = Recorded {
        bootstrapped: previous.and_then(|s| s.size).is_some_and(|s| s > 0),
        replaced: &replaced,
        placement: previous.map_or(&[][..], |s| s.placement.as_slice()),
        ours: previous.is_some_and(|s| s.selector.is_some()),
        coreos_members: previous.map_or(&[][..], |s| s.coreos_members.as_slice()),
        another_operator_pods: previous.map_or(&[][..], |s| s.another_operator_pods.as_slice()),
        tls,
        maintenance: previous.and_then(|s| s.maintenance.as_ref()),
        current_version: previous.and_then(|s| s.current_version.as_deref()),
        recovering: records.recovering.as_ref(),
        safety: safety_backups(
            view,
            records.last_safety_backup.as_ref(),
            run.safety_retries,
            now,
        ),
    };
    let observed = async {
        futures::try_join!(
            apply(ctx, view, &peer, &run.caches.services),
            apply(ctx, view, &client, &run.caches.services),
            super::network::keep_network_policy(ctx, view),
        )?;
        observe(
            &ctx.client,
            run.caches,
            view,
            recorded,
            ctx.config.etcd_timeout,
            Some(run.pool.clone()),
        )
        .await
    }
    .await;
    let mut obs = match observed {
        Ok(obs) => obs,
        Err(e) => {
            warn!(name = %at.name, namespace = %at.namespace, error = %e, "cannot observe the cluster");
            at.report(&status::observation_failed(
                &e,
                view,
                previous,
                Timestamp::now(),
            ))
            .await;
            return Err(e);
        }
    };
    if ctx.config.broken == Some(Broken::StuckIsLost) {
        break_stuck_is_lost(&mut obs.model, &ctx.config.planner);
    }
    for (member, why) in &obs.health_failures {
        ctx.metrics.health_check_failed(&at.namespace, &at.name);
        tracing::debug!(name = %at.name, %member, %why, "member health check failed");
    }
    Ok(obs)
}

/// What must hold before `step` is carried out: the budget protects the voting members that
/// exist, whatever the spec asks for, and is raised before a step that raises the quorum; a
/// recovery approval the step makes stale is discarded.
async fn before_step(
    cluster: &EtcdCluster,
    run: &Run<'_>,
    view: &ClusterView,
    obs: &Observation,
    step: &Step,
) -> Result<(), Error> {
    let budget = builders::disruption_budget_for(view, &obs.model, step);
    apply(run.ctx, view, &budget, &run.caches.pdbs).await?;
    if recovery::approval_is_stale(view, &obs.model, step) {
        super::recovery::discard_stale_approval(run.ctx, run.recorder, cluster, view).await?;
    }
    Ok(())
}

/// The metrics and Events of the new status: the cluster's phase and ready members, a recovery
/// just finished (by where its data came from), and the condition changes that matter to a
/// person.
async fn announce(
    cluster: &EtcdCluster,
    run: &Run<'_>,
    at: &Target<'_>,
    new: &EtcdClusterStatus,
    recovered_from: Option<&'static str>,
) {
    let metrics = &run.ctx.metrics;
    if let Some(from) = recovered_from {
        metrics.recovered(from);
    }
    let phase = new.phase.unwrap_or(ClusterPhase::Creating);
    let ready = i64::from(new.ready_members.unwrap_or(0));
    metrics.observe_cluster(&at.namespace, &at.name, phase.as_str(), ready);
    if let Some(prev) = at.previous {
        let events = Events::of(run.recorder, cluster);
        for event in transition_events(new, prev) {
            events
                .publish(event.type_, &event.reason, event.note, None)
                .await;
        }
    }
}

/// When to reconcile again: after [`requeue_after`] the step, or at the next certificate
/// renewal if sooner (a second late: its time has then come).
fn requeue(step: &Step, config: &ControllerConfig, renewal: Option<Duration>) -> Action {
    let after = requeue_after(step, config);
    let renewal = renewal.map(|d| d + Duration::from_secs(1));
    Action::requeue(renewal.map_or(after, |r| r.min(after)))
}

/// The certificates of `spec.TLS.operatorManaged` made sure of, each issue announced (Event,
/// metric), their ends of validity exported.
async fn ensure_certificates(
    run: &Run<'_>,
    cluster: &EtcdCluster,
    view: &ClusterView,
    settings: &etcd_shared::tls::IssuingSettings,
    members: &crate::certificates::MemberFiles<'_>,
) -> Result<crate::certificates::Outcome, Error> {
    let ctx = run.ctx;
    let outcome = crate::certificates::ensure(&ctx.client, view, settings, members).await?;
    let events = Events::of(run.recorder, cluster);
    if let Some((reason, rotation)) = &outcome.rotation {
        tracing::info!(name = %view.name, namespace = %view.namespace, %rotation, "CA rotation");
        events.normal(reason, rotation.clone()).await;
    }
    for issued in &outcome.issued {
        ctx.metrics
            .certificate_issued(issued.what, issued.reason.as_str());
        let until = Timestamp::from_second(issued.not_after)
            .map(|t| t.to_string())
            .unwrap_or_default();
        events
            .normal(
                "CertificateIssued",
                format!(
                    "{} certificate issued ({}), valid until {until}",
                    issued.what,
                    issued.reason.as_str()
                ),
            )
            .await;
    }
    for e in &outcome.expiries {
        ctx.metrics.certificate_expires(
            &view.namespace,
            &view.name,
            e.what,
            e.not_after,
            e.renew_at,
        );
    }
    if let Some(attention) = &outcome.attention {
        warn!(name = %view.name, namespace = %view.namespace, %attention, "certificates need attention");
        events
            .warning("CertificateAttention", attention.clone())
            .await;
    }
    Ok(outcome)
}

/// The member pods as the CA rotation needs them (from the cache: a pod made since is made
/// with the current files), the members the status lists, and the rotation asked for.
fn member_files<'a>(
    caches: &Caches,
    cluster: &'a EtcdCluster,
    view: &ClusterView,
    listed: &'a [String],
) -> crate::certificates::MemberFiles<'a> {
    let pods = crate::observe::member_pods(caches, view)
        .into_iter()
        .map(|(pod, _)| pod_files(&pod))
        .collect();
    crate::certificates::MemberFiles {
        pods,
        listed,
        rotate: cluster
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(etcd_shared::names::ANNOTATION_ROTATE_CA))
            .map(String::as_str),
    }
}

/// The status as the API server holds it, when acting on a stale cached one would be harmful:
/// for a cluster with `spec.safetyBackup` (its record says which change has its snapshot) and
/// while a recovery may run (quorum lost, or a recovery record). The cached cluster may predate
/// the status the previous reconcile wrote (its watch event not in yet); reconciles of one
/// cluster never overlap, so the stored status is the last one written. `None` when no read is
/// needed or the read fails (the cached status stands).
async fn stored_status(
    api: &Api<EtcdCluster>,
    cluster: &EtcdCluster,
    view: &ClusterView,
) -> Option<EtcdClusterStatus> {
    let cached = cluster.status.as_ref();
    let recovery_may_run = cached.is_some_and(|s| {
        s.recovery.is_some()
            || matches!(
                s.phase,
                Some(ClusterPhase::QuorumLost | ClusterPhase::Recovering)
            )
    });
    if view.safety_backup.is_none() && !recovery_may_run {
        return None;
    }
    api.get(&view.name)
        .await
        .ok()
        .and_then(|fresh| fresh.status)
}

/// What the planner needs to know of the safety backups: the change the stored record still
/// covers (fresh, within [`safety::RECORD_VALIDITY`]), and the last failure while its next
/// attempt is not due (a failed snapshot is retried with a growing delay, `retries`: 10 s
/// doubling to 10 min, not on every reconcile: each try streams the whole database).
fn safety_backups(
    view: &ClusterView,
    stored: Option<&etcd_shared::types::SafetyBackupRecord>,
    retries: &RetryGate,
    now: Timestamp,
) -> SafetyBackups {
    if view.safety_backup.is_none() {
        return SafetyBackups::default();
    }
    SafetyBackups {
        covered: stored
            .filter(|r| !safety::missing(&r.before, Some(r), now))
            .map(|r| r.before.clone()),
        retry_wait: retries.due(&view.key()).err().map(|wait| {
            format!(
                "{}; next attempt in {} s",
                wait.last_error,
                wait.remaining.as_secs().max(1)
            )
        }),
    }
}

/// The deliberately broken operator of [`crate::failpoints::Broken::StuckIsLost`]: the members
/// of pods being deleted are taken as not asked (unhealthy, silent), and a pod stuck past the
/// timeout as one whose node is gone. Used only by the proof suite's control experiment.
fn break_stuck_is_lost(model: &mut crate::planner::Observed, settings: &planner::PlannerSettings) {
    let terminating: Vec<String> = model
        .pods
        .iter()
        .filter(|p| p.terminating)
        .map(|p| p.name.clone())
        .collect();
    for pod in &mut model.pods {
        if pod.terminating && pod.overdue > settings.stuck_terminating {
            pod.node_state = crate::planner::NodeState::Gone;
        }
    }
    if let Ok(members) = model.members.as_mut() {
        for m in members.iter_mut().filter(|m| terminating.contains(&m.name)) {
            m.health = crate::planner::Health::Unhealthy("not asked (broken operator)".into());
            m.answered = false;
        }
    }
}

/// How soon a cluster is reconciled again after a reconcile that planned `step` (sooner when
/// one is due without a watch event: a member added through etcd's API shows in no watch).
pub fn requeue_after(step: &Step, config: &ControllerConfig) -> Duration {
    match step {
        Step::Done | Step::Blocked(Blocked::Paused) => config.idle_requeue,
        // A starting member's pod changes wake the controller through the pod watch.
        Step::Wait(Waiting::MemberStarting(_)) => config.idle_requeue,
        Step::Blocked(_) | Step::Wait(_) => config.wait_requeue,
        _ => config.busy_requeue,
    }
}

/// An Event to publish about the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announcement {
    /// Normal or Warning.
    pub type_: EventType,
    /// The reason (also the action).
    pub reason: String,
    /// The text.
    pub note: String,
}

/// The Events for the condition changes that matter to a person, between the stored status
/// `old` and the `new` one: `Available` turning False and `Degraded` turning True are
/// Warnings with the condition's reason; `Available` turning True is a Normal `Available`.
/// A condition whose status and reason stay is announced once, when it changed.
pub fn transition_events(new: &EtcdClusterStatus, old: &EtcdClusterStatus) -> Vec<Announcement> {
    let adoption = match (old.coreos_members.is_empty(), new.coreos_members.is_empty()) {
        (true, false) => Some(Announcement {
            type_: EventType::Normal,
            reason: "AdoptingCoreOSMembers".into(),
            note: format!(
                "members made by CoreOS' operator found ({}): this operator adds its own members one at a time, then removes those one at a time",
                new.coreos_members.join(", ")
            ),
        }),
        (false, true) => Some(Announcement {
            type_: EventType::Normal,
            reason: "CoreOSMembersAdopted".into(),
            note: "the cluster runs on this operator's members alone".into(),
        }),
        _ => None,
    };
    let conditions = new
        .conditions
        .iter()
        .filter(|c| {
            !old.conditions
                .iter()
                .any(|o| o.type_ == c.type_ && o.status == c.status && o.reason == c.reason)
        })
        .filter_map(|c| {
            let warning = (c.type_ == status::AVAILABLE && c.status == "False")
                || (c.type_ == status::DEGRADED && c.status == "True");
            let (type_, reason) = if warning {
                (EventType::Warning, c.reason.clone())
            } else if c.type_ == status::AVAILABLE && c.status == "True" {
                (EventType::Normal, "Available".to_string())
            } else {
                return None;
            };
            Some(Announcement {
                type_,
                reason,
                note: c.message.clone(),
            })
        });
    adoption.into_iter().chain(conditions).collect()
}

/// Server-side applies one derived object under the operator's field manager, unless the
/// cached object already is what would be applied ([`cache::is_current`]): then nothing is
/// sent.
async fn apply<K, C>(
    ctx: &Context,
    view: &ClusterView,
    object: &K,
    cache: &Store<C>,
) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Serialize
        + DeserializeOwned
        + Clone
        + std::fmt::Debug,
    C: Resource<DynamicType = ()> + Clone + Serialize,
{
    let name = object.meta().name.clone().unwrap_or_default();
    let mut value = serde_json::to_value(object).map_err(|source| Error::Serialize {
        what: "object",
        source,
    })?;
    value["apiVersion"] = K::api_version(&()).into();
    value["kind"] = K::kind(&()).into();
    let hash = cache::content_hash(&value);
    if cache::is_current(cache, &view.namespace, &name, &hash, &value) {
        return Ok(());
    }
    value["metadata"]["annotations"][cache::APPLIED_HASH] = hash.into();
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &view.namespace);
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&value),
    )
    .await
    .map_err(Error::kube(format!("apply {} {name}", K::kind(&()))))?;
    ctx.metrics.applied(&K::kind(&()));
    Ok(())
}

/// Writes the status when it changed, and clears what another writer left beside it.
async fn write_status(
    api: &Api<EtcdCluster>,
    name: &str,
    new: &EtcdClusterStatus,
    previous: Option<&EtcdClusterStatus>,
) -> Result<(), Error> {
    if !status::changed(new, previous) {
        return Ok(());
    }
    apply_status(api, name, new).await?;
    // What another writer (CoreOS' operator) left beside our fields: server-side apply keeps
    // it, so clear it explicitly.
    if let Some(stale) = previous.and_then(|p| status::stale_fields(new, p)) {
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&stale))
            .await
            .map_err(Error::kube(format!("clear stale status fields of {name}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    #[test]
    fn requeue_table() {
        let config = ControllerConfig::default();
        let (idle, wait, busy) = (
            config.idle_requeue,
            config.wait_requeue,
            config.busy_requeue,
        );
        for (step, expected) in [
            (Step::Done, idle),
            (Step::Blocked(Blocked::Paused), idle),
            (Step::Wait(Waiting::MemberStarting("demo-1".into())), idle),
            (
                Step::Wait(Waiting::LearnerCatchingUp("demo-1".into())),
                wait,
            ),
            (Step::Wait(Waiting::Unhealthy(vec!["demo-1".into()])), wait),
            (Step::Blocked(Blocked::AllMembersLost), wait),
            (
                Step::Blocked(Blocked::QuorumLost {
                    missing: vec!["demo-0".into(), "demo-1".into()],
                    voters: 3,
                    unconfirmed: vec![],
                }),
                wait,
            ),
            (Step::DeletePod("demo-1".into()), busy),
            (crate::planner::fixtures::add_member(3, true), busy),
            (Step::RecordSnapshotBarrier { index: 7 }, busy),
        ] {
            assert_eq!(requeue_after(&step, &config), expected, "{step:?}");
        }
    }

    fn condition(type_: &str, status: &str, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: format!("{type_} {status} {reason}"),
            observed_generation: None,
            last_transition_time: etcd_shared::types::status::unknown_time(),
        }
    }

    fn with(conditions: Vec<Condition>) -> EtcdClusterStatus {
        EtcdClusterStatus {
            conditions,
            ..EtcdClusterStatus::default()
        }
    }

    #[test]
    fn transition_events_table() {
        use status::{AVAILABLE, DEGRADED};
        let warn = |reason: &str, type_: &str, status: &str| Announcement {
            type_: EventType::Warning,
            reason: reason.into(),
            note: format!("{type_} {status} {reason}"),
        };
        let available = Announcement {
            type_: EventType::Normal,
            reason: "Available".into(),
            note: format!("{AVAILABLE} True QuorumHealthy"),
        };
        for (old, new, expected) in [
            // Nothing changed: nothing said.
            (
                vec![condition(AVAILABLE, "True", "QuorumHealthy")],
                vec![condition(AVAILABLE, "True", "QuorumHealthy")],
                vec![],
            ),
            // Quorum lost, then regained.
            (
                vec![condition(AVAILABLE, "True", "QuorumHealthy")],
                vec![condition(AVAILABLE, "False", "QuorumLost")],
                vec![warn("QuorumLost", AVAILABLE, "False")],
            ),
            (
                vec![condition(AVAILABLE, "False", "QuorumLost")],
                vec![condition(AVAILABLE, "True", "QuorumHealthy")],
                vec![available.clone()],
            ),
            // A first status: Available True is announced.
            (
                vec![],
                vec![condition(AVAILABLE, "True", "QuorumHealthy")],
                vec![available],
            ),
            // Still unavailable, for another reason: announced again.
            (
                vec![condition(AVAILABLE, "False", "QuorumLost")],
                vec![condition(AVAILABLE, "False", "AllMembersLost")],
                vec![warn("AllMembersLost", AVAILABLE, "False")],
            ),
            // Degraded turning True is a warning; turning False, or Progressing, is not said.
            (
                vec![condition(DEGRADED, "False", "AllMembersHealthy")],
                vec![condition(DEGRADED, "True", "MembersUnhealthy")],
                vec![warn("MembersUnhealthy", DEGRADED, "True")],
            ),
            (
                vec![condition(DEGRADED, "True", "MembersUnhealthy")],
                vec![
                    condition(DEGRADED, "False", "AllMembersHealthy"),
                    condition("Progressing", "True", "ScalingUp"),
                ],
                vec![],
            ),
        ] {
            assert_eq!(
                transition_events(&with(new.clone()), &with(old.clone())),
                expected,
                "{old:?} -> {new:?}"
            );
        }
    }

    /// The start and the end of an adoption of CoreOS' members are announced once each.
    #[test]
    fn adoption_start_and_end_are_announced() {
        let listing = |members: &[&str]| EtcdClusterStatus {
            coreos_members: members.iter().map(|m| m.to_string()).collect(),
            ..EtcdClusterStatus::default()
        };
        let reasons = |new: &EtcdClusterStatus, old: &EtcdClusterStatus| {
            transition_events(new, old)
                .into_iter()
                .map(|a| a.reason)
                .collect::<Vec<_>>()
        };
        let three = listing(&["demo-a", "demo-b", "demo-c"]);
        assert_eq!(reasons(&three, &listing(&[])), ["AdoptingCoreOSMembers"]);
        assert!(reasons(&listing(&["demo-c"]), &three).is_empty());
        assert_eq!(
            reasons(&listing(&[]), &listing(&["demo-c"])),
            ["CoreOSMembersAdopted"]
        );
        assert!(transition_events(&three, &three).is_empty());
    }
}
