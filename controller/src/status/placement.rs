//! The placement record (`status.placement`): the node each member's pod runs on, kept for a
//! member whose pod is gone while it is still a member, so that the operator can tell later
//! whether the process of a deleted pod may still run (its node silent) or not (its node Ready,
//! gone or out of service). A pure function of the previous record and the observation.

use etcd_shared::types::MemberPlacement;

use crate::planner::Observed;

/// The record after `obs`: every member pod bound to a node, then, for a member whose pod is
/// gone but which is still in the member list (or may be: the list could not be read), the
/// node its pod last ran on. Members that left the member list are dropped, so the record
/// never outgrows the cluster. Sorted by member.
pub fn after(previous: &[MemberPlacement], obs: &Observed) -> Vec<MemberPlacement> {
    let still_member = |name: &str| match &obs.members {
        Ok(members) => members.iter().any(|m| m.name == name),
        Err(_) => true,
    };
    let mut record: Vec<MemberPlacement> = obs
        .pods
        .iter()
        .filter_map(|p| {
            Some(MemberPlacement {
                member: p.name.clone(),
                node: p.node.clone()?,
            })
        })
        .collect();
    record.extend(
        previous
            .iter()
            .filter(|old| obs.pod(&old.member).is_none() && still_member(&old.member))
            .cloned(),
    );
    record.sort_by(|a, b| a.member.cmp(&b.member));
    record.dedup_by(|a, b| a.member == b.member);
    record
}

/// Members whose pods share a node, in words (`node-a: demo-0, demo-1`), for the status:
/// losing that node loses all of them.
pub fn shared_nodes(record: &[MemberPlacement]) -> Vec<String> {
    let mut by_node: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for p in record {
        by_node.entry(&p.node).or_default().push(&p.member);
    }
    by_node
        .into_iter()
        .filter(|(_, members)| members.len() > 1)
        .map(|(node, members)| format!("{node}: {}", members.join(", ")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::fixtures::{healthy_member, ready_pod};

    fn placed(member: &str, node: &str) -> MemberPlacement {
        MemberPlacement {
            member: member.into(),
            node: node.into(),
        }
    }

    /// A deleted pod's node is kept while its member is in the member list, dropped once it
    /// left; pods in the API say where they are.
    #[test]
    fn a_deleted_pods_node_is_kept_while_it_is_a_member() {
        let members = |names: &[&str]| {
            Ok(names
                .iter()
                .enumerate()
                .map(|(i, n)| healthy_member(n, i as u64 + 1, None, i == 0))
                .collect())
        };
        let previous = vec![
            placed("demo-0", "node-0"),
            placed("demo-1", "node-1"),
            placed("demo-2", "node-1"),
        ];
        let obs = Observed {
            pods: vec![ready_pod(0, "3.6.16")],
            members: members(&["demo-0", "demo-1"]),
            ..Observed::default()
        };
        assert_eq!(
            after(&previous, &obs),
            vec![placed("demo-0", "node-0"), placed("demo-1", "node-1")],
            "demo-1 kept (still a member), demo-2 dropped (left the list)"
        );
        let blind = Observed {
            pods: vec![],
            ..Observed::default()
        };
        assert_eq!(
            after(&previous, &blind),
            previous,
            "member list unread: all kept"
        );
        assert_eq!(shared_nodes(&previous), vec!["node-1: demo-1, demo-2"]);
    }
}
