//! Keeping a cluster's NetworkPolicy ([`crate::builders::network_policy`]): applied
//! server-side when what the API server holds differs from it (so a hand edit is undone on the
//! next reconcile), deleted when `spec.network.policy` turns `None` (only the operator's own:
//! owned by this cluster).

use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};

use etcd_shared::names;

use crate::builders::{network_policy, wants_network_policy};
use crate::cache;
use crate::context::Context;
use crate::error::{Error, FIELD_MANAGER};
use crate::view::ClusterView;

/// Applies, corrects or removes the cluster's NetworkPolicy.
pub async fn keep_network_policy(ctx: &Context, view: &ClusterView) -> Result<(), Error> {
    let api: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), &view.namespace);
    let name = names::network_policy_name(&view.name);
    let held = api
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("get networkpolicy {name}")))?;
    let Some(want) = network_policy(view, &ctx.config.network) else {
        let ours = held.as_ref().is_some_and(|p| {
            p.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.uid == view.owner.uid)
        });
        if ours && !wants_network_policy(view) {
            api.delete(&name, &DeleteParams::default())
                .await
                .map_err(Error::kube(format!("delete networkpolicy {name}")))?;
        }
        return Ok(());
    };
    let mut value = serde_json::to_value(&want).map_err(|source| Error::Serialize {
        what: "networkpolicy",
        source,
    })?;
    value["apiVersion"] = "networking.k8s.io/v1".into();
    value["kind"] = "NetworkPolicy".into();
    if let Some(held) = &held {
        let have = serde_json::to_value(held).map_err(|source| Error::Serialize {
            what: "networkpolicy",
            source,
        })?;
        // The spec must match exactly (a hand-added ingress rule opens the members too).
        let same_spec = have.get("spec") == value.get("spec");
        if same_spec && cache::contains(&have["metadata"], &value["metadata"]) {
            return Ok(());
        }
    }
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&value),
    )
    .await
    .map_err(Error::kube(format!("apply networkpolicy {name}")))?;
    ctx.metrics.applied("NetworkPolicy");
    Ok(())
}
