//! How a member speaks on its two ports, and how a running cluster moves from plain HTTP to
//! TLS without an outage (issue 34).
//!
//! etcd cannot serve plain and TLS peer traffic on one port, a member dials its peers with the
//! scheme of the peer URL each one registered, and a member that holds no CA cannot dial a
//! peer that listens with TLS. It can serve plain and TLS clients on one port, and a member
//! with peer TLS files dials plain peers in plain (measured with the real binaries: 3.2.13,
//! 3.4, 3.5, 3.6 and 3.7). So members are replaced (the surge rollout of
//! [`crate::planner::rollout`]) in two passes:
//!
//! 1. **bridge** members: their peer port still plain, but they hold the peer TLS files (they
//!    can dial a TLS peer and show it their certificate), and their client port serves both
//!    schemes: while a plain member is left, a new member is a bridge;
//! 2. **target** members (TLS on both ports) once every member holds the peer TLS files:
//!    the bridges dial them with TLS, they dial the bridges in plain.
//!
//! At every moment every member serves clients in plain (pass 1) or every member serves them
//! with TLS (pass 2), and during pass 1's end both: clients can switch whenever they like
//! during the bridge phase.

use etcd_shared::names::PEER_PORT;

use super::ClusterView;

/// The schemes a member serves clients with on its client port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientSchemes {
    /// Plain HTTP only.
    Http,
    /// TLS only.
    Https,
    /// Both, on the one port (etcd tells them apart by the first bytes).
    Both,
}

/// How a member pod speaks: what its peer port listens with, whether it holds the peer TLS
/// files, and what its client port serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberTransport {
    /// Its peer port listens with TLS (its peer URL is `https://`).
    pub peer_tls: bool,
    /// It holds the peer certificate and trusted CA: it can dial a peer that listens with TLS.
    pub peer_files: bool,
    /// What its client port serves.
    pub client: ClientSchemes,
}

/// How far a member is from the transport its cluster asks for, lowest first: the order in
/// which a switch replaces members.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TransportStage {
    /// It lacks the peer TLS files the cluster needs: a TLS peer could not be dialled by it.
    WithoutFiles,
    /// It holds what it needs but listens or serves otherwise than the cluster asks.
    Bridge,
    /// As the cluster asks.
    Target,
}

impl MemberTransport {
    /// What the cluster asks of its members.
    pub fn target(view: &ClusterView) -> Self {
        let peer = view.tls.peer_secret.is_some();
        MemberTransport {
            peer_tls: peer,
            peer_files: peer,
            client: if view.tls.server_secret.is_some() {
                ClientSchemes::Https
            } else {
                ClientSchemes::Http
            },
        }
    }

    /// A member of the first pass of a switch: its peer port plain, the peer TLS files held,
    /// clients served in both schemes when the cluster asks for client TLS.
    pub fn bridge(view: &ClusterView) -> Self {
        let target = Self::target(view);
        MemberTransport {
            peer_tls: false,
            peer_files: target.peer_files,
            client: match target.client {
                ClientSchemes::Http => ClientSchemes::Http,
                ClientSchemes::Https | ClientSchemes::Both => ClientSchemes::Both,
            },
        }
    }

    /// The transport of a member registered with `peer_url`: its peer port must listen with
    /// that URL's scheme (its peers dial it so), and on a plain peer URL while the cluster asks
    /// for peer TLS it is a bridge.
    pub fn of_member(view: &ClusterView, peer_url: &str) -> Self {
        let target = Self::target(view);
        if target.peer_tls && peer_url.starts_with("http://") {
            Self::bridge(view)
        } else {
            target
        }
    }

    /// The transport of a member added now, beside members whose transports are `peers`
    /// (`None`: a member whose pod is not known, taken as the cluster asks): the target once
    /// every member can dial a TLS peer, else a bridge.
    pub fn for_new_member<'a>(
        view: &ClusterView,
        peers: impl IntoIterator<Item = Option<&'a MemberTransport>>,
    ) -> Self {
        let target = Self::target(view);
        let all_can_dial_tls = peers
            .into_iter()
            .all(|p| p.is_none_or(|t| t.peer_files || !target.peer_tls));
        if all_can_dial_tls {
            target
        } else {
            Self::bridge(view)
        }
    }

    /// The transport a member pod was made with, read from the etcd container's command and
    /// arguments (`--listen-peer-urls`, `--listen-client-urls`, `--peer-trusted-ca-file`; flags
    /// in one shell line, as CoreOS' pods have them, are read too). `None` when it names no
    /// peer URLs.
    pub fn of_args<'a>(args: impl IntoIterator<Item = &'a str>) -> Option<Self> {
        let words: Vec<&str> = args.into_iter().flat_map(str::split_whitespace).collect();
        let value = |flag: &str| {
            words.iter().enumerate().find_map(|(i, w)| {
                let rest = w.strip_prefix(flag)?;
                match rest.strip_prefix('=') {
                    Some(v) => Some(v.trim_matches(['"', '\''])),
                    None if rest.is_empty() => words.get(i + 1).copied(),
                    None => None,
                }
            })
        };
        let peer_urls = value("--listen-peer-urls")?;
        let peer_tls = peer_urls.contains("https://");
        let client_urls = value("--listen-client-urls").unwrap_or("");
        let (plain, tls) = (
            client_urls.contains("http://"),
            client_urls.contains("https://"),
        );
        Some(MemberTransport {
            peer_tls,
            peer_files: peer_tls || value("--peer-trusted-ca-file").is_some(),
            client: match (plain, tls) {
                (true, true) => ClientSchemes::Both,
                (false, true) => ClientSchemes::Https,
                _ => ClientSchemes::Http,
            },
        })
    }

    /// The transport of a member pod, from its `etcd` container's command and arguments
    /// ([`Self::of_args`]).
    pub fn of_pod(pod: &k8s_openapi::api::core::v1::Pod) -> Option<Self> {
        let container = pod
            .spec
            .as_ref()?
            .containers
            .iter()
            .find(|c| c.name == "etcd")?;
        Self::of_args(
            container
                .command
                .iter()
                .flatten()
                .chain(container.args.iter().flatten())
                .map(String::as_str),
        )
    }

    /// How far this member is from what `view` asks. A member that speaks TLS where the
    /// cluster no longer asks for it (TLS back to plain, which the webhook refuses: a spec
    /// written past it) counts as the target: it is left as it is, never replaced by a plain
    /// member its TLS peers could not reach.
    pub fn stage(&self, view: &ClusterView) -> TransportStage {
        let target = Self::target(view);
        if target.peer_files && !self.peer_files {
            TransportStage::WithoutFiles
        } else if *self == target || self.is_beyond(&target) {
            TransportStage::Target
        } else {
            TransportStage::Bridge
        }
    }

    /// It listens with TLS where `target` does not (peer port, or client port serving TLS
    /// only).
    fn is_beyond(&self, target: &MemberTransport) -> bool {
        (self.peer_tls && !target.peer_tls)
            || (self.client == ClientSchemes::Https && target.client == ClientSchemes::Http)
    }

    /// `http` or `https`: what the peer port listens with.
    pub fn peer_scheme(&self) -> &'static str {
        if self.peer_tls { "https" } else { "http" }
    }

    /// The peer URL of `member` with this transport.
    pub fn peer_url(&self, view: &ClusterView, member: &str) -> String {
        format!(
            "{}://{}:{PEER_PORT}",
            self.peer_scheme(),
            view.member_host(member)
        )
    }

    /// The client port serves TLS.
    pub fn serves_tls(&self) -> bool {
        self.client != ClientSchemes::Http
    }

    /// The client port serves plain HTTP.
    pub fn serves_plain(&self) -> bool {
        self.client != ClientSchemes::Https
    }

    /// The scheme the operator dials the member's client port with: plain wherever it is
    /// served (it needs no certificate), else TLS.
    pub fn dial_scheme(&self) -> &'static str {
        if self.serves_plain() { "http" } else { "https" }
    }

    /// The schemes its client port listens with.
    pub fn client_listen_schemes(&self) -> &'static [&'static str] {
        match self.client {
            ClientSchemes::Http => &["http"],
            ClientSchemes::Https => &["https"],
            ClientSchemes::Both => &["http", "https"],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::fixtures::view_of;

    fn plain() -> ClusterView {
        view_of("size: 3\nversion: 3.6.16")
    }

    fn tls() -> ClusterView {
        view_of("size: 3\nversion: 3.6.16\nTLS:\n  operatorManaged: {}")
    }

    #[test]
    fn a_plain_cluster_asks_for_plain_members_and_a_tls_one_for_tls_members() {
        let p = MemberTransport::target(&plain());
        assert_eq!(
            (p.peer_tls, p.peer_files, p.client),
            (false, false, ClientSchemes::Http)
        );
        let t = MemberTransport::target(&tls());
        assert_eq!(
            (t.peer_tls, t.peer_files, t.client),
            (true, true, ClientSchemes::Https)
        );
    }

    #[test]
    fn a_switch_adds_bridges_while_a_plain_member_is_left_then_tls_members() {
        let view = tls();
        let old = MemberTransport::target(&plain());
        let bridge = MemberTransport::bridge(&view);
        assert_eq!(
            (bridge.peer_tls, bridge.peer_files, bridge.client),
            (false, true, ClientSchemes::Both)
        );
        assert_eq!(
            MemberTransport::for_new_member(&view, [Some(&old), Some(&bridge), None]),
            bridge
        );
        assert_eq!(
            MemberTransport::for_new_member(&view, [Some(&bridge), Some(&bridge), None]),
            MemberTransport::target(&view)
        );
        assert_eq!(old.stage(&view), TransportStage::WithoutFiles);
        assert_eq!(bridge.stage(&view), TransportStage::Bridge);
        assert_eq!(
            MemberTransport::target(&view).stage(&view),
            TransportStage::Target
        );
        // A plain cluster adds plain members, whatever its members are.
        assert_eq!(MemberTransport::for_new_member(&plain(), [Some(&old)]), old);
    }

    #[test]
    fn tls_members_of_a_cluster_written_back_to_plain_are_left_alone() {
        let plain = plain();
        let tls = tls();
        // The webhook refuses TLS -> plain; a spec written past it replaces no TLS member
        // (a plain one could not reach its TLS peers).
        assert_eq!(
            MemberTransport::target(&tls).stage(&plain),
            TransportStage::Target
        );
        // A bridge holds nothing a plain member could not reach: it is replaced.
        assert_eq!(
            MemberTransport::bridge(&tls).stage(&plain),
            TransportStage::Bridge
        );
    }

    #[test]
    fn a_member_keeps_the_scheme_it_registered_with() {
        let view = tls();
        assert_eq!(
            MemberTransport::of_member(&view, "http://demo-0.demo.ns1.svc:2380"),
            MemberTransport::bridge(&view)
        );
        assert_eq!(
            MemberTransport::of_member(&view, "https://demo-0.demo.ns1.svc:2380"),
            MemberTransport::target(&view)
        );
    }

    #[test]
    fn the_transport_is_read_from_the_pods_flags() {
        let ours = MemberTransport::of_args([
            "--name=demo-0",
            "--listen-peer-urls=http://$(POD_IP):2380",
            "--listen-client-urls=http://$(POD_IP):2379,https://$(POD_IP):2379",
            "--peer-trusted-ca-file=/etc/etcd/peer/peer-ca.crt",
        ]);
        assert_eq!(ours, Some(MemberTransport::bridge(&tls())));
        // CoreOS' pods: one shell line.
        let coreos = MemberTransport::of_args([
            "/bin/sh",
            "-ec",
            "/usr/local/bin/etcd --data-dir=/var/etcd/data --name=x --listen-peer-urls=https://0.0.0.0:2380 --listen-client-urls=https://0.0.0.0:2379 --peer-trusted-ca-file=/etc/etcdtls/member/peer-tls/peer-ca.crt",
        ]);
        assert_eq!(coreos, Some(MemberTransport::target(&tls())));
        let spaced = MemberTransport::of_args([
            "--listen-peer-urls",
            "http://a:2380",
            "--listen-client-urls",
            "http://a:2379",
        ]);
        assert_eq!(spaced, Some(MemberTransport::target(&plain())));
        assert_eq!(MemberTransport::of_args(["--name=x"]), None);
    }

    #[test]
    fn the_operator_dials_plain_where_it_is_served() {
        let view = tls();
        assert_eq!(MemberTransport::bridge(&view).dial_scheme(), "http");
        assert_eq!(MemberTransport::target(&view).dial_scheme(), "https");
        assert_eq!(MemberTransport::target(&plain()).dial_scheme(), "http");
    }
}
