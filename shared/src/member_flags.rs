//! The command line and environment the operator gives every etcd member, and the
//! environment variables a user's `spec.pod.etcdEnv` may therefore not set.
//!
//! This is the one list both sides use: the controller's pod builder writes every `--flag` it
//! passes through [`MemberFlag`] and every variable of the container through [`POD_ENV`], and
//! the admission rules refuse an `etcdEnv` entry whenever [`reserved_env`] names a reason. A
//! flag added to the builder is therefore reserved as soon as it exists (and the builder's
//! tests fail if a flag is written by hand instead).
//!
//! etcd reads `ETCD_<FLAG>` for every flag (upper case, `-` as `_`). A variable that repeats a
//! flag given on the command line makes etcd exit at start ("conflicting environment variable
//! is shadowed by corresponding command-line flag", fatal on 3.4 to 3.7); one for a flag the
//! operator leaves out (TLS files of a plain cluster, the logger of 3.2) would quietly set
//! what the operator owns.

use std::fmt;

/// A flag the operator passes to every etcd member (some only on the lines or TLS modes that
/// need them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemberFlag {
    /// `--name`: the member's name.
    Name,
    /// `--data-dir`: where the member keeps its data, on its volume.
    DataDir,
    /// `--listen-peer-urls`.
    ListenPeerUrls,
    /// `--listen-client-urls`.
    ListenClientUrls,
    /// `--advertise-client-urls`.
    AdvertiseClientUrls,
    /// `--initial-advertise-peer-urls`.
    InitialAdvertisePeerUrls,
    /// `--initial-cluster`: the members the new member starts with.
    InitialCluster,
    /// `--initial-cluster-state`: `new` or `existing`.
    InitialClusterState,
    /// `--initial-cluster-token`.
    InitialClusterToken,
    /// `--listen-metrics-urls` (3.3 and later).
    ListenMetricsUrls,
    /// `--logger` (`zap`, 3.4 and later).
    Logger,
    /// `--peer-cert-file` (peer TLS).
    PeerCertFile,
    /// `--peer-key-file` (peer TLS).
    PeerKeyFile,
    /// `--peer-trusted-ca-file` (peer TLS).
    PeerTrustedCaFile,
    /// `--peer-client-cert-auth` (peer TLS).
    PeerClientCertAuth,
    /// `--cert-file` (client TLS).
    CertFile,
    /// `--key-file` (client TLS).
    KeyFile,
    /// `--trusted-ca-file` (client TLS).
    TrustedCaFile,
    /// `--client-cert-auth` (client TLS).
    ClientCertAuth,
}

impl MemberFlag {
    /// Every flag the operator passes, in the order the pod builder writes them.
    pub const ALL: [MemberFlag; 19] = [
        MemberFlag::Name,
        MemberFlag::DataDir,
        MemberFlag::ListenPeerUrls,
        MemberFlag::ListenClientUrls,
        MemberFlag::AdvertiseClientUrls,
        MemberFlag::InitialAdvertisePeerUrls,
        MemberFlag::InitialCluster,
        MemberFlag::InitialClusterState,
        MemberFlag::InitialClusterToken,
        MemberFlag::ListenMetricsUrls,
        MemberFlag::Logger,
        MemberFlag::PeerCertFile,
        MemberFlag::PeerKeyFile,
        MemberFlag::PeerTrustedCaFile,
        MemberFlag::PeerClientCertAuth,
        MemberFlag::CertFile,
        MemberFlag::KeyFile,
        MemberFlag::TrustedCaFile,
        MemberFlag::ClientCertAuth,
    ];

    /// etcd's name of the flag, without dashes: `name`, `data-dir`.
    pub const fn name(self) -> &'static str {
        match self {
            MemberFlag::Name => "name",
            MemberFlag::DataDir => "data-dir",
            MemberFlag::ListenPeerUrls => "listen-peer-urls",
            MemberFlag::ListenClientUrls => "listen-client-urls",
            MemberFlag::AdvertiseClientUrls => "advertise-client-urls",
            MemberFlag::InitialAdvertisePeerUrls => "initial-advertise-peer-urls",
            MemberFlag::InitialCluster => "initial-cluster",
            MemberFlag::InitialClusterState => "initial-cluster-state",
            MemberFlag::InitialClusterToken => "initial-cluster-token",
            MemberFlag::ListenMetricsUrls => "listen-metrics-urls",
            MemberFlag::Logger => "logger",
            MemberFlag::PeerCertFile => "peer-cert-file",
            MemberFlag::PeerKeyFile => "peer-key-file",
            MemberFlag::PeerTrustedCaFile => "peer-trusted-ca-file",
            MemberFlag::PeerClientCertAuth => "peer-client-cert-auth",
            MemberFlag::CertFile => "cert-file",
            MemberFlag::KeyFile => "key-file",
            MemberFlag::TrustedCaFile => "trusted-ca-file",
            MemberFlag::ClientCertAuth => "client-cert-auth",
        }
    }

    /// The flag as written on the command line: `--name`.
    pub fn flag(self) -> String {
        format!("--{}", self.name())
    }

    /// The argument `--name=VALUE`.
    pub fn arg(self, value: impl fmt::Display) -> String {
        format!("--{}={value}", self.name())
    }

    /// The environment variable etcd reads for this flag: `ETCD_NAME`.
    pub fn env(self) -> String {
        env_of_flag(self.name())
    }

    /// The flag whose variable is `env`, if the operator passes one.
    pub fn from_env(env: &str) -> Option<MemberFlag> {
        MemberFlag::ALL.into_iter().find(|f| f.env() == env)
    }
}

impl fmt::Display for MemberFlag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "--{}", self.name())
    }
}

/// The variable etcd reads for the flag named `flag` (`data-dir` -> `ETCD_DATA_DIR`), by
/// etcd's own rule (`pkg/flags`: `ETCD_` + upper case, `-` as `_`).
pub fn env_of_flag(flag: &str) -> String {
    let flag = flag.trim_start_matches('-');
    let mut env = String::with_capacity(5 + flag.len());
    env.push_str("ETCD_");
    env.extend(flag.chars().map(|c| {
        if c == '-' {
            '_'
        } else {
            c.to_ascii_uppercase()
        }
    }));
    env
}

/// The variable of the member container that holds the pod's IP, which the listen URLs expand
/// as `$(POD_IP)`.
pub const POD_IP: &str = "POD_IP";

/// The variables the operator sets in every member container, from the downward API:
/// (name, field path). The user's `etcdEnv` follows them in the container, so a second
/// definition would replace them (the later one wins).
pub const POD_ENV: &[(&str, &str)] = &[
    ("POD_NAME", "metadata.name"),
    ("POD_NAMESPACE", "metadata.namespace"),
    (POD_IP, "status.podIP"),
];

/// etcd switches the operator never passes and no user may: each breaks a member's identity,
/// its durability or the operator's ownership of membership, URLs and TLS. (variable, why).
pub const DANGEROUS_ENV: &[(&str, &str)] = &[
    (
        "ETCD_CONFIG_FILE",
        "makes etcd read a configuration file and ignore every flag and variable the operator sets (name, data directory, URLs, TLS)",
    ),
    (
        "ETCD_FORCE_NEW_CLUSTER",
        "makes the member drop every other member and restart as a one-member cluster, splitting the cluster",
    ),
    (
        "ETCD_UNSAFE_NO_FSYNC",
        "turns off fsync: a member that loses power loses writes the cluster acknowledged",
    ),
    (
        "ETCD_WAL_DIR",
        "moves the write-ahead log off the member's data volume, so a restarted pod loses it",
    ),
    (
        "ETCD_DISCOVERY",
        "bootstraps membership through discovery instead of the operator's --initial-cluster",
    ),
    (
        "ETCD_PROXY",
        "turns the member into a v2 proxy (3.5 and older) instead of a member",
    ),
    (
        "ETCD_STRICT_RECONFIG_CHECK",
        "lets a membership change lose quorum when false; the operator's member changes rely on etcd's check",
    ),
    (
        "ETCD_AUTO_TLS",
        "makes the member serve clients with a self-signed certificate the operator does not trust",
    ),
    (
        "ETCD_LISTEN_CLIENT_HTTP_URLS",
        "moves the member's HTTP client endpoints off the URLs the operator set and probes",
    ),
];

/// Families of etcd settings the operator owns as a whole: (variable prefix, why).
pub const RESERVED_ENV_PREFIXES: &[(&str, &str)] = &[
    (
        "ETCD_PEER_",
        "belongs to peer TLS, which the operator owns as a whole (spec.TLS.static.member.peerSecret)",
    ),
    (
        "ETCD_CLIENT_",
        "belongs to client TLS, which the operator owns as a whole (spec.TLS.static.member.serverSecret and operatorSecret)",
    ),
    (
        "ETCD_DISCOVERY_",
        "bootstraps membership through discovery instead of the operator's --initial-cluster",
    ),
    (
        "ETCD_UNSAFE_",
        "is one of etcd's unsafe switches, which trade away durability",
    ),
];

/// Why the operator owns the environment variable `name` of a member container, as a phrase
/// that follows "it" ("stands for --name, ..."), or `None` when a user may set it through
/// `etcdEnv`.
pub fn reserved_env(name: &str) -> Option<String> {
    if let Some(flag) = MemberFlag::from_env(name) {
        return Some(format!(
            "stands for {flag}, which the operator sets: etcd exits when a variable repeats a flag of its command line, and where the operator leaves the flag out the setting is still the operator's"
        ));
    }
    if let Some((_, path)) = POD_ENV.iter().find(|(n, _)| *n == name) {
        return Some(format!(
            "holds the pod's {path} (the member's URLs expand $({POD_IP})); a second definition would replace it"
        ));
    }
    if let Some((_, why)) = DANGEROUS_ENV.iter().find(|(n, _)| *n == name) {
        return Some((*why).to_string());
    }
    RESERVED_ENV_PREFIXES
        .iter()
        .find(|(prefix, _)| name.starts_with(prefix))
        .map(|(_, why)| (*why).to_string())
}

/// Every reserved variable by name (the prefixes of [`RESERVED_ENV_PREFIXES`] aside), sorted:
/// the flags' variables, the container's own variables and the dangerous switches.
pub fn reserved_env_names() -> Vec<String> {
    let mut names: Vec<String> = MemberFlag::ALL.iter().map(|f| f.env()).collect();
    names.extend(POD_ENV.iter().map(|(n, _)| (*n).to_string()));
    names.extend(DANGEROUS_ENV.iter().map(|(n, _)| (*n).to_string()));
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_their_variables() {
        assert_eq!(MemberFlag::Name.flag(), "--name");
        assert_eq!(MemberFlag::Name.env(), "ETCD_NAME");
        assert_eq!(MemberFlag::DataDir.arg("/d"), "--data-dir=/d");
        assert_eq!(
            MemberFlag::InitialAdvertisePeerUrls.env(),
            "ETCD_INITIAL_ADVERTISE_PEER_URLS"
        );
        assert_eq!(
            env_of_flag("--peer-trusted-ca-file"),
            "ETCD_PEER_TRUSTED_CA_FILE"
        );
        for flag in MemberFlag::ALL {
            assert_eq!(MemberFlag::from_env(&flag.env()), Some(flag));
            assert!(reserved_env(&flag.env()).is_some(), "{flag}");
        }
        let mut names: Vec<&str> = MemberFlag::ALL.iter().map(|f| f.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), MemberFlag::ALL.len(), "a flag is listed twice");
    }

    /// The names issue #14 found admitted, and the ones reserved before, stay reserved.
    #[test]
    fn reserves_what_breaks_or_takes_over_a_member() {
        for name in [
            "ETCD_LOGGER",
            "ETCD_CONFIG_FILE",
            "POD_IP",
            "POD_NAME",
            "POD_NAMESPACE",
            "ETCD_FORCE_NEW_CLUSTER",
            "ETCD_UNSAFE_NO_FSYNC",
            "ETCD_PEER_CERT_ALLOWED_CN",
            "ETCD_PEER_AUTO_TLS",
            "ETCD_PEER_CRL_FILE",
            "ETCD_CLIENT_CRL_FILE",
            "ETCD_CLIENT_CERT_ALLOWED_HOSTNAME",
            "ETCD_NAME",
            "ETCD_DATA_DIR",
            "ETCD_WAL_DIR",
            "ETCD_INITIAL_CLUSTER",
            "ETCD_INITIAL_CLUSTER_STATE",
            "ETCD_INITIAL_CLUSTER_TOKEN",
            "ETCD_INITIAL_ADVERTISE_PEER_URLS",
            "ETCD_ADVERTISE_CLIENT_URLS",
            "ETCD_LISTEN_CLIENT_URLS",
            "ETCD_LISTEN_PEER_URLS",
            "ETCD_LISTEN_METRICS_URLS",
            "ETCD_DISCOVERY",
            "ETCD_DISCOVERY_SRV",
            "ETCD_CERT_FILE",
            "ETCD_KEY_FILE",
            "ETCD_TRUSTED_CA_FILE",
            "ETCD_CLIENT_CERT_AUTH",
            "ETCD_AUTO_TLS",
            "ETCD_PEER_CERT_FILE",
            "ETCD_PEER_KEY_FILE",
            "ETCD_PEER_TRUSTED_CA_FILE",
            "ETCD_PEER_CLIENT_CERT_AUTH",
        ] {
            assert!(reserved_env(name).is_some(), "{name} is not reserved");
        }
        for name in [
            "ETCD_QUOTA_BACKEND_BYTES",
            "ETCD_SNAPSHOT_COUNT",
            "ETCD_AUTO_COMPACTION_RETENTION",
            "ETCD_LOG_LEVEL",
            "ETCD_LOG_OUTPUTS",
            "ETCD_HEARTBEAT_INTERVAL",
            "ETCD_ELECTION_TIMEOUT",
            "ETCD_ENABLE_V2",
            "ETCD_CIPHER_SUITES",
            "ETCD_NAMESPACE",
            "PODIP",
            "pod_ip",
        ] {
            assert_eq!(reserved_env(name), None, "{name} is reserved");
        }
        let names = reserved_env_names();
        assert!(names.contains(&"ETCD_LOGGER".to_string()));
        assert!(names.windows(2).all(|w| w[0] < w[1]));
    }
}
