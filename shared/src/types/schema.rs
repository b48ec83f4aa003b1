//! Hand-written CRD schemas of the status fields whose accepted shapes are wider than their
//! Rust types: the API server validates status writes against them, and both this
//! controller's status and CoreOS' must pass.

use schemars::{Schema, SchemaGenerator, json_schema};

use super::phase::ClusterPhase;

/// `status.phase`: every phase, plus `""` (CoreOS' operator writes it before the first phase).
pub(super) fn phase(_: &mut SchemaGenerator) -> Schema {
    let mut names: Vec<&str> = vec![""];
    names.extend(ClusterPhase::READABLE.iter().map(|p| p.as_str()));
    json_schema!({
        "type": "string",
        "nullable": true,
        "enum": names,
    })
}

/// `status.conditions`: Kubernetes conditions (this controller's) and CoreOS' conditions, so
/// only `type` and `status` are required and CoreOS' `lastUpdateTime` is known.
pub(super) fn conditions(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "nullable": true,
        "items": {
            "type": "object",
            "required": ["type", "status"],
            "properties": {
                "type": {
                    "description": "Type of the condition: Available, Progressing, Degraded or Paused (CoreOS' operator wrote Available, Scaling, Recovering and Upgrading).",
                    "type": "string"
                },
                "status": {
                    "description": "Status of the condition: True, False or Unknown.",
                    "type": "string"
                },
                "reason": {
                    "description": "Why the condition last changed, in CamelCase.",
                    "type": "string"
                },
                "message": {
                    "description": "What the condition means now, for a person.",
                    "type": "string"
                },
                "observedGeneration": {
                    "description": "The metadata.generation the condition was computed from.",
                    "type": "integer",
                    "format": "int64"
                },
                "lastTransitionTime": {
                    "description": "When the status of the condition last changed.",
                    "type": "string",
                    "format": "date-time"
                },
                "lastUpdateTime": {
                    "description": "When CoreOS' operator last updated the condition (not written by this operator).",
                    "type": "string"
                }
            }
        }
    })
}
