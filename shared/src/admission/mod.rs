//! The admission rules of `EtcdCluster` (validation of creates and updates, and defaulting),
//! `EtcdBackup` and `EtcdRestore` (validation; nothing is defaulted).
//!
//! Everything here is a pure function of the objects given: the webhook calls these and
//! holds no rules of its own. Each refusal is a [`Violation`] that names the field and the
//! rule; accepted objects may carry warnings that `kubectl` prints.

mod backup_rules;
mod defaults;
mod image_ref;
mod pod_rules;
pub mod pod_security;
mod pod_spec_rules;
mod pvc_rules;
mod quantity;
mod spec_rules;
mod storage_rules;
mod syntax;
mod tls_rules;
mod update_rules;

use std::fmt;

pub use backup_rules::{MAX_SEED_BYTES, MIN_QUIET_INTERVAL_SECONDS};
pub use defaults::Defaults;
pub use pvc_rules::{
    ClaimPathError, MAX_CLAIM_PATH_BYTES, MAX_FILE_NAME_BYTES, METADATA_SUFFIX, TEMPORARY_SUFFIX,
    check_claim_path,
};
pub use quantity::{ParseQuantityError, parse_quantity};
pub use storage_rules::{
    ESCAPED_KEY_CHARACTERS, MAX_KEY_BYTES, ObjectPathError, check_bucket_name, check_object_key,
    check_object_path,
};
pub use syntax::clipped;

use crate::EtcdCluster;
use crate::types::{EtcdBackup, EtcdRestore};

/// One broken rule: the field path (`spec.size`) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Path of the offending field, such as `spec.pod.etcdEnv[0].name`.
    pub field: String,
    /// The rule and the value that breaks it.
    pub message: String,
    /// Short stable name of the rule, for metrics (`size-range`, `version-skip`, ...).
    pub rule: &'static str,
}

impl Violation {
    /// Builds a violation of `rule` at `field`.
    pub fn new(rule: &'static str, field: impl Into<String>, message: impl Into<String>) -> Self {
        Violation {
            field: field.into(),
            message: message.into(),
            rule,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// The violations of a refused object, displayed joined by "; ".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub Vec<Violation>);

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        write!(f, "{}", parts.join("; "))
    }
}

impl std::error::Error for Refusal {}

/// The admission rules, with the defaults this operator fills in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdmissionPolicy {
    /// What defaulting fills in.
    pub defaults: Defaults,
}

impl AdmissionPolicy {
    /// A policy that defaults to the given values.
    pub fn new(defaults: Defaults) -> Self {
        AdmissionPolicy { defaults }
    }

    /// Validates a create (`old` is `None`) or an update. Returns the warnings of an accepted
    /// object, or every violation of a refused one. Missing fields that defaulting fills in
    /// are judged by their default value.
    pub fn validate(
        &self,
        new: &EtcdCluster,
        old: Option<&EtcdCluster>,
    ) -> Result<Vec<String>, Refusal> {
        // An update that leaves the spec alone (labels, finalizers, status) is never refused:
        // an object stored before a rule existed must stay deletable and labelable. The
        // restore-seed annotation is judged whenever it is new or changed.
        let spec_changed = old.is_none_or(|o| o.spec != new.spec);
        let seed_changed = old
            .is_none_or(|o| backup_rules::seed_annotation(o) != backup_rules::seed_annotation(new));
        let recover = |c: &EtcdCluster| {
            c.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(crate::names::ANNOTATION_RECOVER))
                .cloned()
        };
        let recover_changed = old.is_none_or(|o| recover(o) != recover(new));
        let mut report = Report::default();
        if spec_changed {
            spec_rules::check_name(new, &mut report);
            spec_rules::check_size(new, &mut report);
            spec_rules::check_version(new, &self.defaults, &mut report);
            spec_rules::check_repository(new, &mut report);
            pod_rules::check(new, &self.defaults, &mut report);
            tls_rules::check(new, &mut report);
            backup_rules::check_safety_backup(new, &mut report);
            spec_rules::check_recovery(new, &mut report);
            spec_rules::check_network(new, &mut report);
            if let Some(old) = old {
                update_rules::check(new, old, &self.defaults, &mut report);
            }
        }
        if seed_changed {
            backup_rules::check_seed(new, &mut report);
        }
        if recover_changed {
            spec_rules::check_recover_annotation(new, &mut report);
        }
        report.finish()
    }

    /// Validates a change of a cluster's size through its scale subresource (`kubectl scale
    /// etcdcluster/NAME --replicas=N`, an autoscaler): `replicas` becomes `spec.size`, judged
    /// by the size rules `kubectl apply` meets, with the same messages and warnings. An update
    /// that leaves the size alone is never refused.
    pub fn validate_scale(
        &self,
        replicas: i32,
        old_replicas: Option<i32>,
    ) -> Result<Vec<String>, Refusal> {
        if old_replicas == Some(replicas) {
            return Ok(Vec::new());
        }
        let mut sized = EtcdCluster::new("scale", crate::EtcdClusterSpec::default());
        sized.spec.size = Some(replicas);
        let mut report = Report::default();
        spec_rules::check_size(&sized, &mut report);
        report.finish()
    }

    /// Validates an EtcdBackup of `namespace` (the request's): a create (`old` is `None`) or an
    /// update. Its endpoints must name one EtcdCluster of that namespace, its storage must be
    /// S3 with a valid path, secret and endpoint. Returns the warnings of an accepted object
    /// (retention without an interval, a very short interval), or every violation.
    pub fn validate_backup(
        &self,
        new: &EtcdBackup,
        namespace: &str,
        old: Option<&EtcdBackup>,
    ) -> Result<Vec<String>, Refusal> {
        // As for clusters: an update that leaves the spec alone is never refused.
        if old.is_some_and(|o| o.spec == new.spec) {
            return Ok(Vec::new());
        }
        let mut report = Report::default();
        backup_rules::check_backup(new, namespace, &mut report);
        report.finish()
    }

    /// Validates an EtcdRestore: a create (`old` is `None`) or an update. Its storage must be
    /// S3 with a valid path, secret and endpoint, and it must name a cluster; on update its
    /// spec may not change (metadata and status may).
    pub fn validate_restore(
        &self,
        new: &EtcdRestore,
        old: Option<&EtcdRestore>,
    ) -> Result<Vec<String>, Refusal> {
        let mut report = Report::default();
        match old {
            Some(old) if old.spec == new.spec => return Ok(Vec::new()),
            Some(old) => backup_rules::check_restore_update(new, old, &mut report),
            None => backup_rules::check_restore(new, &mut report),
        }
        report.finish()
    }

    /// Returns the object with every missing field filled in and the version normalized.
    /// Defaulting a defaulted object changes nothing.
    pub fn defaulted(&self, object: &EtcdCluster) -> EtcdCluster {
        self.defaults.apply(object)
    }

    /// Defaulting of an update: a field the update drops takes the stored object's value,
    /// not the operator's default, so removing `spec.version` never starts an upgrade.
    pub fn defaulted_update(&self, object: &EtcdCluster, old: Option<&EtcdCluster>) -> EtcdCluster {
        let Some(old) = old else {
            return self.defaulted(object);
        };
        let from_old = Defaults {
            size: old.spec.size.unwrap_or(self.defaults.size),
            version: old
                .spec
                .version
                .as_deref()
                .map(|v| v.strip_prefix('v').unwrap_or(v).to_string())
                .unwrap_or_else(|| self.defaults.version.clone()),
            repository: old
                .spec
                .repository
                .clone()
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| self.defaults.repository.clone()),
        };
        from_old.apply(object)
    }
}

/// Collects the violations and warnings of one validation.
#[derive(Debug, Default)]
pub(crate) struct Report {
    violations: Vec<Violation>,
    warnings: Vec<String>,
    unlisted_violations: usize,
    unlisted_warnings: usize,
}

/// The most violations, and the most warnings, one answer lists: an object with thousands of
/// bad labels gets the first ones and a count of the rest, so an answer (and its log line)
/// stays under about 25 KiB whatever the object holds.
pub const MAX_LISTED: usize = 25;

/// The longest field path a report holds, in bytes (a label key is part of its path).
const MAX_FIELD: usize = 256;
/// The longest message a report holds, in bytes: with its field, a violation or warning stays
/// under 1 KiB whatever the object holds.
const MAX_MESSAGE: usize = 700;

impl Report {
    /// Records a violation; the field and message are clipped (rules quote values with
    /// [`syntax::quoted`] already; this guards what they quote otherwise).
    pub(crate) fn refuse(
        &mut self,
        rule: &'static str,
        field: impl Into<String>,
        message: impl Into<String>,
    ) {
        if self.violations.len() >= MAX_LISTED {
            self.unlisted_violations += 1;
            return;
        }
        self.violations.push(Violation::new(
            rule,
            syntax::clipped(field.into(), MAX_FIELD),
            syntax::clipped(message.into(), MAX_MESSAGE),
        ));
    }

    /// Records a warning, clipped as [`Report::refuse`] clips.
    pub(crate) fn warn(&mut self, field: &str, message: impl fmt::Display) {
        if self.warnings.len() >= MAX_LISTED {
            self.unlisted_warnings += 1;
            return;
        }
        let field = syntax::clipped(field.to_string(), MAX_FIELD);
        let message = syntax::clipped(message.to_string(), MAX_MESSAGE);
        self.warnings.push(format!("{field}: {message}"));
    }

    fn finish(mut self) -> Result<Vec<String>, Refusal> {
        if self.violations.is_empty() {
            if self.unlisted_warnings > 0 {
                self.warnings.push(format!(
                    "and {} more warnings (only the first {MAX_LISTED} are listed)",
                    self.unlisted_warnings
                ));
            }
            Ok(self.warnings)
        } else {
            if self.unlisted_violations > 0 {
                self.violations.push(Violation::new(
                    "more-violations",
                    "spec",
                    format!(
                        "and {} more violations (only the first {MAX_LISTED} are listed)",
                        self.unlisted_violations
                    ),
                ));
            }
            Err(Refusal(self.violations))
        }
    }
}

#[cfg(test)]
mod backup_tests;
#[cfg(test)]
mod pod_tests;
#[cfg(test)]
mod tests;
