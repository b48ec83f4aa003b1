//! Which rules a request meets: its kind and operation choose them, the `decode` module reads
//! the object for them, the policy judges.

use etcd_shared::EtcdCluster;
use etcd_shared::admission::{AdmissionPolicy, Refusal, clipped};
use etcd_shared::types::{EtcdBackup, EtcdRestore};
use kube::Resource;
use kube::core::admission::Operation;
use serde_json::value::RawValue;

use super::answer::{Decision, Verdict, failure, refused, undecodable};
use super::decode::{self, DecodeError, decode_backup, decode_restore, decode_scale};
use super::error::ReviewError;
use super::patch::defaulting_patch;
use super::request::{RawObject, Request};
use super::{Endpoint, MAX_QUOTED};

/// The kinds this webhook reviews.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reviewed {
    Cluster,
    Backup,
    Restore,
    /// The `autoscaling/v1` Scale of an EtcdCluster (its scale subresource).
    Scale,
}

impl Reviewed {
    /// The kind of the request's object, when it is one of ours (group and version included).
    fn of(request: &Request<'_>) -> Option<Self> {
        let kind = &request.kind;
        let resource = &request.resource;
        if kind.group == "autoscaling"
            && kind.version == "v1"
            && kind.kind == "Scale"
            && resource.group == EtcdCluster::group(&())
            && resource.resource == EtcdCluster::plural(&())
            && request.sub_resource.as_deref() == Some("scale")
        {
            return Some(Reviewed::Scale);
        }
        if kind.group != EtcdCluster::group(&()) || kind.version != EtcdCluster::version(&()) {
            return None;
        }
        match kind.kind.as_str() {
            k if k == EtcdCluster::kind(&()) => Some(Reviewed::Cluster),
            k if k == EtcdBackup::kind(&()) => Some(Reviewed::Backup),
            k if k == EtcdRestore::kind(&()) => Some(Reviewed::Restore),
            _ => None,
        }
    }
}

/// The decision on `request` at `endpoint`; `verdict` gets the rules of a refusal.
pub(super) fn decide(
    policy: &AdmissionPolicy,
    endpoint: Endpoint,
    request: &Request<'_>,
    verdict: &mut Verdict,
) -> Result<Decision, ReviewError> {
    match request.operation {
        Operation::Create | Operation::Update => {}
        // Nothing to check or default: deleting and connecting are always allowed.
        Operation::Delete | Operation::Connect => return Ok(Decision::allow()),
    }
    let Some(kind) = Reviewed::of(request) else {
        return Ok(Decision::Deny(Box::new(failure(
            other_kind(request),
            "BadRequest",
            400,
            None,
        ))));
    };
    let Some(object) = request.object.as_ref().map(RawObject::text) else {
        return Err(ReviewError::MissingObject {
            operation: verdict.operation,
        });
    };
    let old_object = match request.operation {
        Operation::Update => request.old_object.as_ref().map(RawObject::text),
        _ => None,
    };
    let judged = Judged {
        request,
        object,
        old_object,
        verdict,
    };
    match kind {
        Reviewed::Cluster => match endpoint {
            Endpoint::Validate => judged.by(decode::decode, |new, old| policy.validate(new, old)),
            Endpoint::Mutate => mutate_cluster(policy, request, object, old_object),
        },
        Reviewed::Backup => {
            let namespace = request.namespace.clone().unwrap_or_default();
            judged.by(decode_backup, |new, old| {
                policy.validate_backup(new, &namespace, old)
            })
        }
        Reviewed::Restore => {
            judged.by(decode_restore, |new, old| policy.validate_restore(new, old))
        }
        // `kubectl scale etcdcluster/NAME`: the size rules, never a patch.
        Reviewed::Scale => judged.by(decode_scale, |new, old| {
            policy.validate_scale(*new, old.copied())
        }),
    }
}

/// The refusal's message for a kind that is not ours.
fn other_kind(request: &Request<'_>) -> String {
    let got = &request.kind;
    let got = if got.group.is_empty() {
        format!("{} {}", got.version, got.kind)
    } else {
        format!("{}/{} {}", got.group, got.version, got.kind)
    };
    let got = clipped(got, MAX_QUOTED);
    format!(
        "this webhook only handles {}/{} {}, {} and {} (and the Scale of {}), got {got}",
        EtcdCluster::group(&()),
        EtcdCluster::version(&()),
        EtcdCluster::kind(&()),
        EtcdBackup::kind(&()),
        EtcdRestore::kind(&()),
        EtcdCluster::plural(&()),
    )
}

/// The defaulting of an EtcdCluster on `/mutate`: the patch of what is missing, never a
/// refusal by the rules (those are `/validate`'s). `old_object` is the stored object of an
/// UPDATE.
fn mutate_cluster(
    policy: &AdmissionPolicy,
    request: &Request<'_>,
    object: &RawValue,
    old_object: Option<&RawValue>,
) -> Result<Decision, ReviewError> {
    let (new, present) = match decode::decode_cluster(object) {
        Ok(decoded) => decoded,
        Err(e) => return Ok(Decision::Deny(Box::new(undecodable(request, &e)))),
    };
    // On UPDATE, a dropped field keeps the stored value (decode errors of the stored object
    // fall back to the operator's defaults).
    let old = old_object.and_then(|o| decode::decode(o).ok());
    let patch = defaulting_patch(policy, present, &new, old.as_ref())?;
    Ok(Decision::Allow {
        warnings: Vec::new(),
        patch: Some(patch),
    })
}

/// An object to be judged by the rules of its kind.
struct Judged<'r, 'a> {
    request: &'r Request<'a>,
    object: &'a RawValue,
    old_object: Option<&'a RawValue>,
    verdict: &'r mut Verdict,
}

impl Judged<'_, '_> {
    /// The decision on an object the rules judge as it is (an EtcdCluster on `/validate`;
    /// EtcdBackup, EtcdRestore and Scale on either endpoint, never with a patch): an object
    /// that does not decode is refused with the field at fault, a stored object that does not
    /// is a warning and the update rules are not checked.
    fn by<T>(
        self,
        decode: fn(&RawValue) -> Result<T, DecodeError>,
        validate: impl FnOnce(&T, Option<&T>) -> Result<Vec<String>, Refusal>,
    ) -> Result<Decision, ReviewError> {
        let new = match decode(self.object) {
            Ok(new) => new,
            Err(e) => return Ok(Decision::Deny(Box::new(undecodable(self.request, &e)))),
        };
        let mut warnings = Vec::new();
        let old = match self.old_object.map(decode) {
            Some(Ok(old)) => Some(old),
            Some(Err(e)) => {
                warnings.push(format!(
                    "the stored object could not be read ({e}); the update rules were not checked"
                ));
                None
            }
            None => None,
        };
        match validate(&new, old.as_ref()) {
            Ok(mut rule_warnings) => {
                warnings.append(&mut rule_warnings);
                Ok(Decision::Allow {
                    warnings,
                    patch: None,
                })
            }
            Err(refusal) => {
                self.verdict.rules = refusal.0.iter().map(|v| v.rule).collect();
                Ok(Decision::Deny(Box::new(refused(self.request, &refusal))))
            }
        }
    }
}
