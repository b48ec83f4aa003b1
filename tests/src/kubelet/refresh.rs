//! Keeps the Secret and ConfigMap files of running pods' volumes up to date, as a kubelet's
//! volume manager does: one task per kubelet re-reads the objects every
//! [`super::KubeletOptions::volume_resync`] and, for each volume whose files would change,
//! writes the new version and swaps `..data` to it ([`super::atomic_writer`]).
//!
//! - One list of Secrets and one of ConfigMaps per namespace that has such volumes, per period
//!   (not a request per pod or object).
//! - A volume set up after a list started is left to the next period (that list may predate
//!   the objects it was written from).
//! - A non-optional object or key that is missing keeps the files as they are, and is logged
//!   once (a kubelet's remount fails the same way and leaves the volume alone); an optional
//!   one that disappears takes its files with it, as in Kubernetes.
//! - A pod's state is registered when its volumes are set up and dropped when the pod ends or
//!   goes ([`forget`]), before its directory is removed; writes happen under the registry's
//!   lock, so none lands in a removed pod.
//! - Nothing is refreshed while the kubelet is silenced (a partitioned kubelet cannot read the
//!   API either).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use super::volumes::{self, Kind, Objects, Refreshable};
use super::{Shared, lock};

/// The refreshable volumes of one pod.
#[derive(Debug)]
pub(crate) struct PodVolumes {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) volumes: Vec<Refreshable>,
}

/// The keys of the listed objects of one namespace, and which kinds were listed.
struct Listing {
    kinds: BTreeSet<Kind>,
    objects: BTreeMap<(Kind, String), BTreeMap<String, Vec<u8>>>,
}

/// Registers the refreshable volumes of pod `uid` (nothing when there are none).
pub(crate) fn register(shared: &Shared, uid: &str, pod: PodVolumes) {
    if !pod.volumes.is_empty() {
        lock(&shared.refreshable).insert(uid.to_owned(), pod);
    }
}

/// Drops the state of pod `uid`; no refresh writes into its volumes after this returns.
pub(crate) fn forget(shared: &Shared, uid: &str) {
    lock(&shared.refreshable).remove(uid);
}

/// The refresh task (returns at once when the period is zero).
pub(crate) async fn run(shared: Arc<Shared>) {
    let period = shared.options.volume_resync;
    if period.is_zero() {
        return;
    }
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    // The namespaces whose last list failed, with the error (logged when it changes).
    let mut failing: BTreeMap<String, String> = BTreeMap::new();
    loop {
        tick.tick().await;
        if shared.is_silenced() || shared.is_shutting_down() {
            continue;
        }
        let wanted: BTreeMap<String, BTreeSet<Kind>> = {
            let mut wanted: BTreeMap<String, BTreeSet<Kind>> = BTreeMap::new();
            for pod in lock(&shared.refreshable).values() {
                let kinds = wanted.entry(pod.namespace.clone()).or_default();
                kinds.extend(pod.volumes.iter().flat_map(|v| v.objects().map(|(k, _)| k)));
            }
            wanted
        };
        if wanted.is_empty() {
            continue;
        }
        let started = Instant::now();
        let mut listings = BTreeMap::new();
        for (ns, kinds) in wanted {
            let listed = volumes::list_objects(
                &shared.client,
                &ns,
                kinds.contains(&Kind::Secret),
                kinds.contains(&Kind::ConfigMap),
            )
            .await;
            match listed {
                Ok(objects) => {
                    if failing.remove(&ns).is_some() {
                        shared
                            .log
                            .line(format_args!("volume refresh: listing {ns}/ works again"));
                    }
                    listings.insert(ns, Listing { kinds, objects });
                }
                Err(e) => {
                    let message = e.to_string();
                    if failing.get(&ns) != Some(&message) {
                        shared.log.line(format_args!(
                            "volume refresh: listing the secrets and configmaps of {ns}/: \
                             {message}; volumes there keep their files"
                        ));
                        failing.insert(ns, message);
                    }
                }
            }
        }
        let shared = shared.clone();
        let _ = tokio::task::spawn_blocking(move || apply(&shared, &listings, started)).await;
    }
}

/// Brings every registered volume of a listed namespace to what the listing (started at
/// `started`) holds.
fn apply(shared: &Shared, listings: &BTreeMap<String, Listing>, started: Instant) {
    let mut pods = lock(&shared.refreshable);
    for pod in pods.values_mut() {
        let Some(listing) = listings.get(&pod.namespace) else {
            continue;
        };
        for volume in &mut pod.volumes {
            if volume.as_of >= started || volume.objects().any(|(k, _)| !listing.kinds.contains(&k))
            {
                continue;
            }
            let objects: Objects = volume
                .objects()
                .map(|(kind, name)| {
                    let key = (kind, name.to_owned());
                    let keys = listing.objects.get(&key).cloned();
                    (key, keys)
                })
                .collect();
            let key = format!("{}/{}", pod.namespace, pod.name);
            let payload = match volumes::build(&volume.sources, &objects) {
                Ok(payload) => payload,
                Err(e) => {
                    let message = e.to_string();
                    if volume.failure.as_ref() != Some(&message) {
                        shared.log.line(format_args!(
                            "{key}: volume {} not refreshed: {message}; it keeps its files",
                            volume.volume
                        ));
                        volume.failure = Some(message);
                    }
                    continue;
                }
            };
            if volume.failure.take().is_some() {
                shared.log.line(format_args!(
                    "{key}: volume {}: its objects are back",
                    volume.volume
                ));
            }
            if payload == volume.payload {
                volume.as_of = started;
                continue;
            }
            match super::atomic_writer::write(&volume.dir, &payload) {
                Ok(version) => {
                    let changed: Vec<&str> = payload
                        .iter()
                        .filter(|(p, f)| volume.payload.get(*p) != Some(*f))
                        .map(|(p, _)| p.as_str())
                        .chain(
                            volume
                                .payload
                                .keys()
                                .filter(|p| !payload.contains_key(*p))
                                .map(String::as_str),
                        )
                        .collect();
                    shared.log.line(format_args!(
                        "{key}: volume {} refreshed ({}; changed: {})",
                        volume.volume,
                        version.as_deref().unwrap_or("files already current"),
                        changed.join(", ")
                    ));
                    volume.payload = payload;
                    volume.as_of = started;
                }
                Err(e) => shared.log.line(format_args!(
                    "{key}: volume {} not refreshed: {e}",
                    volume.volume
                )),
            }
        }
    }
}
