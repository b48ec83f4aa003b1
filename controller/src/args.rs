//! The controller's command line. Every flag has an environment variable equivalent
//! (`ETCD_CONTROLLER_<FLAG>`, e.g. `ETCD_CONTROLLER_LEADER_ELECT=true`); a flag given on the
//! command line wins over its variable.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
pub use etcd_process::listen::ListenAddress;
pub use etcd_process::logging::LogFormat;
use etcd_shared::duration::parse_duration;
use etcd_shared::version::{DEFAULT_REPOSITORY, DEFAULT_VERSION};

use crate::leader::{LeaderElectionError, LeaderElectionParams};

/// Environment variable the pod's namespace is read from (downward API).
pub const POD_NAMESPACE_ENV: &str = "POD_NAMESPACE";
/// The namespace file of the in-cluster service account.
pub const IN_CLUSTER_NAMESPACE_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The etcd operator's controller: reconciles each EtcdCluster into a running etcd cluster.
/// `etcd-controller`'s command line: the controller's flags, or one of the steps its image runs
/// in other pods (`restore fetch|place`, `backup save|verify`; [`crate::in_pod`]), never both.
#[derive(Debug, Parser)]
#[command(
    name = "etcd-controller",
    version,
    about,
    long_about = None,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// The controller's flags.
    #[command(flatten)]
    pub args: Args,
    /// A step run in another pod instead of the controller.
    #[command(subcommand)]
    pub step: Option<crate::in_pod::Subcommand>,
}

/// The controller's flags.
#[derive(Debug, Clone, Parser)]
#[command(name = "etcd-controller", version, about, long_about = None)]
pub struct Args {
    /// Path to a kubeconfig file. Without it the in-cluster service account is used, falling
    /// back to $KUBECONFIG or ~/.kube/config.
    #[arg(long, env = "ETCD_CONTROLLER_KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// Watch EtcdClusters in this namespace only. Empty or absent: all namespaces.
    #[arg(long, env = "ETCD_CONTROLLER_NAMESPACE", value_name = "NS")]
    pub namespace: Option<String>,

    /// Address the /metrics endpoint listens on: IP:PORT, [IPv6]:PORT, HOST:PORT, or :PORT
    /// for every interface (IPv6 and IPv4, or IPv4 alone on a host without IPv6); `0`
    /// disables it.
    #[arg(
        long,
        env = "ETCD_CONTROLLER_METRICS_BIND_ADDRESS",
        value_name = "ADDR",
        default_value = ":8080"
    )]
    pub metrics_bind_address: ListenAddress,

    /// Address the /healthz and /readyz probes listen on, written as --metrics-bind-address;
    /// `0` disables them.
    #[arg(
        long,
        env = "ETCD_CONTROLLER_HEALTH_PROBE_BIND_ADDRESS",
        value_name = "ADDR",
        default_value = ":8081"
    )]
    pub health_probe_bind_address: ListenAddress,

    /// Elect a leader among the replicas through a coordination.k8s.io Lease, so only one
    /// reconciles at a time. Needed whenever more than one replica runs.
    #[arg(
        long,
        env = "ETCD_CONTROLLER_LEADER_ELECT",
        default_value_t = false,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub leader_elect: bool,

    /// Namespace of the leader election Lease. Default: the pod's namespace ($POD_NAMESPACE or
    /// the service account's namespace file), else `default`.
    #[arg(
        long,
        env = "ETCD_CONTROLLER_LEADER_ELECTION_NAMESPACE",
        value_name = "NS"
    )]
    pub leader_election_namespace: Option<String>,

    /// Name of the leader election Lease.
    #[arg(
        long,
        env = "ETCD_CONTROLLER_LEADER_ELECTION_ID",
        value_name = "NAME",
        default_value = "etcd-operator-controller"
    )]
    pub leader_election_id: String,

    /// How long a standby waits, after the leader's last renewal, before taking the Lease over.
    /// A duration in Go's grammar, such as 15s, 1.5s or 1m30s (every duration flag).
    #[arg(
        long,
        env = "ETCD_CONTROLLER_LEADER_ELECT_LEASE_DURATION",
        value_name = "DURATION",
        default_value = "15s",
        value_parser = parse_duration
    )]
    pub leader_elect_lease_duration: Duration,

    /// How long the leader keeps trying to renew before it gives leadership up. Must be shorter
    /// than the lease duration.
    #[arg(
        long,
        env = "ETCD_CONTROLLER_LEADER_ELECT_RENEW_DEADLINE",
        value_name = "DURATION",
        default_value = "10s",
        value_parser = parse_duration
    )]
    pub leader_elect_renew_deadline: Duration,

    /// How often candidates try to acquire and the leader renews the Lease. Must be shorter
    /// than the renew deadline.
    #[arg(
        long,
        env = "ETCD_CONTROLLER_LEADER_ELECT_RETRY_PERIOD",
        value_name = "DURATION",
        default_value = "2s",
        value_parser = parse_duration
    )]
    pub leader_elect_retry_period: Duration,

    /// How many EtcdClusters are reconciled at the same time (each cluster one at a time).
    #[arg(
        long,
        env = "ETCD_CONTROLLER_CONCURRENT_RECONCILES",
        value_name = "N",
        default_value_t = 4,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub concurrent_reconciles: u16,

    /// After SIGTERM, how long running reconciles get to finish before the controller is
    /// stopped anyway (keep it below the pod's terminationGracePeriodSeconds).
    #[arg(
        long,
        env = "ETCD_CONTROLLER_GRACEFUL_SHUTDOWN_TIMEOUT",
        value_name = "DURATION",
        default_value = "20s",
        value_parser = parse_duration
    )]
    pub graceful_shutdown_timeout: Duration,

    /// etcd version of clusters whose spec gives none (when the webhook did not default it).
    #[arg(
        long,
        env = "ETCD_CONTROLLER_DEFAULT_VERSION",
        value_name = "VERSION",
        default_value = DEFAULT_VERSION
    )]
    pub default_version: String,

    /// etcd image repository of clusters whose spec gives none.
    #[arg(
        long,
        env = "ETCD_CONTROLLER_DEFAULT_REPOSITORY",
        value_name = "REPOSITORY",
        default_value = DEFAULT_REPOSITORY
    )]
    pub default_repository: String,

    /// Image of the operator's controller, run as init containers of a restored cluster's
    /// first member (`etcd-controller restore fetch|place`). The chart sets it to the image
    /// the controller runs from; without it, EtcdRestores are refused.
    #[arg(long, env = "ETCD_CONTROLLER_RESTORE_IMAGE", value_name = "IMAGE")]
    pub restore_image: Option<String>,

    /// A Secret (by name, in the pod's namespace) with the registry credentials the pods that
    /// run `--restore-image` pull it with: a restored cluster's first member and the pods of
    /// PVC backups and restores. Repeat the flag, or separate names with commas; the chart
    /// passes its `imagePullSecrets`.
    #[arg(
        long = "restore-image-pull-secret",
        env = "ETCD_CONTROLLER_RESTORE_IMAGE_PULL_SECRET",
        value_name = "SECRET",
        value_delimiter = ','
    )]
    pub restore_image_pull_secrets: Vec<String>,

    /// The namespace Prometheus scrapes from: the members' NetworkPolicies admit their
    /// metrics port from it alone. Empty or absent: from anywhere.
    #[arg(long, env = "ETCD_CONTROLLER_MONITORING_NAMESPACE", value_name = "NS")]
    pub monitoring_namespace: Option<String>,

    /// A member pod still terminating this long past its deletion deadline (the delete plus
    /// its grace period) is taken as gone: its member is removed when quorum allows and
    /// replaced under a new name (its node died, or a finalizer holds it).
    #[arg(
        long,
        env = "ETCD_CONTROLLER_STUCK_POD_TIMEOUT",
        value_name = "DURATION",
        default_value = "60s",
        value_parser = parse_duration
    )]
    pub stuck_pod_timeout: Duration,

    /// Defragment a member (without an alarm) when its database file is at least this many
    /// times the data it holds ...
    #[arg(
        long,
        env = "ETCD_CONTROLLER_DEFRAG_RATIO",
        value_name = "RATIO",
        default_value_t = 2.0,
        value_parser = parse_ratio
    )]
    pub defrag_ratio: f64,

    /// ... and at least this many bytes larger than it.
    #[arg(
        long,
        env = "ETCD_CONTROLLER_DEFRAG_MIN_RECLAIM_BYTES",
        value_name = "BYTES",
        default_value_t = 64 * 1024 * 1024
    )]
    pub defrag_min_reclaim_bytes: u64,

    /// Each member is defragmented at most once per this long; `0` turns defragmentation
    /// without an alarm off (a NOSPACE alarm is still healed).
    #[arg(
        long,
        env = "ETCD_CONTROLLER_DEFRAG_INTERVAL",
        value_name = "DURATION",
        default_value = "24h",
        value_parser = parse_duration
    )]
    pub defrag_interval: Duration,

    /// Log format.
    #[arg(
        long,
        env = "ETCD_CONTROLLER_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text
    )]
    pub log_format: LogFormat,

    /// Log filter in tracing's EnvFilter syntax, e.g. `info` or
    /// `info,etcd_controller=debug,kube=warn`. Without it, $RUST_LOG when set, else info.
    /// Text lines are coloured only on a terminal.
    #[arg(long, env = "ETCD_CONTROLLER_LOG_LEVEL", value_name = "FILTER")]
    pub log_level: Option<String>,
}

/// A defragmentation ratio: a finite number of at least 1.
fn parse_ratio(input: &str) -> Result<f64, String> {
    match input.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r >= 1.0 => Ok(r),
        _ => Err(format!(
            "must be a number of at least 1 (a file 2 times its data is 2), got {input:?}"
        )),
    }
}

impl Args {
    /// Where the operator and the monitoring run, for the members' NetworkPolicies: the
    /// operator's namespace is the pod's (`$POD_NAMESPACE`, then the service account's
    /// namespace file; unknown outside a pod).
    pub fn network_access(&self) -> crate::builders::NetworkAccess {
        let pod_namespace = std::env::var(POD_NAMESPACE_ENV)
            .ok()
            .or_else(|| std::fs::read_to_string(IN_CLUSTER_NAMESPACE_FILE).ok())
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        crate::builders::NetworkAccess {
            operator_namespace: pod_namespace,
            monitoring_namespace: self
                .monitoring_namespace
                .as_deref()
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string),
        }
    }

    /// The operator's image for the pods that run it (`--restore-image`, empty is unset) with
    /// its pull secrets (`--restore-image-pull-secret`, empty names dropped).
    pub fn operator_image(&self) -> Option<crate::builders::OperatorImage> {
        let reference = self.restore_image.as_deref().filter(|i| !i.is_empty())?;
        Some(crate::builders::OperatorImage {
            reference: reference.to_string(),
            pull_secrets: self
                .restore_image_pull_secrets
                .iter()
                .filter(|s| !s.is_empty())
                .cloned()
                .collect(),
        })
    }

    /// The planner's settings the flags give.
    pub fn planner_settings(&self) -> crate::planner::PlannerSettings {
        crate::planner::PlannerSettings {
            stuck_terminating: self.stuck_pod_timeout,
            defragmentation: crate::planner::DefragmentationPolicy {
                ratio: self.defrag_ratio,
                min_reclaim_bytes: self.defrag_min_reclaim_bytes,
                interval: (!self.defrag_interval.is_zero()).then_some(self.defrag_interval),
            },
            ..crate::planner::PlannerSettings::default()
        }
    }

    /// The namespace to watch, `None` for all namespaces.
    pub fn watch_namespace(&self) -> Option<String> {
        self.namespace
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    }

    /// The namespace of the leader election Lease: the flag, else the pod's namespace
    /// (`$POD_NAMESPACE`, then the service account's namespace file), else `default`.
    pub fn leader_election_namespace(&self) -> String {
        resolve_leader_election_namespace(
            self.leader_election_namespace.as_deref(),
            std::env::var(POD_NAMESPACE_ENV).ok().as_deref(),
            std::fs::read_to_string(IN_CLUSTER_NAMESPACE_FILE)
                .ok()
                .as_deref(),
        )
    }

    /// The leader election the flags ask for, campaigning as `identity`.
    pub fn leader_election_params(&self, identity: String) -> LeaderElectionParams {
        LeaderElectionParams {
            namespace: self.leader_election_namespace(),
            lease_name: self.leader_election_id.clone(),
            identity,
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
        }
    }

    /// Checks what clap cannot, before anything starts: with `--leader-elect`, the timings
    /// ([`LeaderElectionParams::validate`]: retry period < renew deadline < lease duration);
    /// and the two servers need distinct addresses.
    pub fn validate(&self) -> Result<(), ArgsError> {
        if self.leader_elect {
            self.leader_election_params(crate::leader::default_identity())
                .validate()?;
        }
        if self
            .metrics_bind_address
            .overlaps(&self.health_probe_bind_address)
        {
            return Err(ArgsError::Invalid(format!(
                "--metrics-bind-address ({}) and --health-probe-bind-address ({}) are the same socket",
                self.metrics_bind_address, self.health_probe_bind_address
            )));
        }
        Ok(())
    }
}

/// A command line that parses but makes no sense.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// A flag's value, or a combination of flags, is invalid.
    #[error("invalid arguments: {0}")]
    Invalid(String),
    /// The leader election flags are inconsistent.
    #[error("invalid --leader-elect-* flags: {0}")]
    LeaderElection(#[from] LeaderElectionError),
}

fn resolve_leader_election_namespace(
    flag: Option<&str>,
    pod_namespace: Option<&str>,
    namespace_file: Option<&str>,
) -> String {
    [flag, pod_namespace, namespace_file]
        .into_iter()
        .flatten()
        .map(str::trim)
        .find(|s| !s.is_empty())
        .unwrap_or("default")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("etcd-controller").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_line_is_the_controller_or_one_step_in_another_pod() {
        let run = |argv: &[&str]| {
            Cli::try_parse_from(std::iter::once("etcd-controller").chain(argv.iter().copied()))
        };
        let controller = run(&["--leader-elect=false"]).unwrap();
        assert!(controller.step.is_none() && !controller.args.leader_elect);
        let restore = run(&[
            "restore",
            "place",
            "--work-dir",
            "/w",
            "--data-dir",
            "/var/etcd/data",
        ]);
        assert!(
            matches!(
                restore.as_ref().map(|c| &c.step),
                Ok(Some(crate::in_pod::Subcommand::Restore(_)))
            ),
            "{restore:?}"
        );
        let backup = run(&["backup", "verify", "--file", "/backups/a.db"]);
        assert!(
            matches!(
                backup.as_ref().map(|c| &c.step),
                Ok(Some(crate::in_pod::Subcommand::Backup(_)))
            ),
            "{backup:?}"
        );
        // A step takes no controller flag, and an unknown word is refused.
        assert!(run(&["--leader-elect=false", "restore", "place"]).is_err());
        assert!(run(&["resotre"]).is_err());
    }

    #[test]
    fn defaults() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.kubeconfig, None);
        assert_eq!(a.watch_namespace(), None);
        assert_eq!(a.metrics_bind_address, ListenAddress::AnyInterface(8080));
        assert_eq!(
            a.health_probe_bind_address,
            ListenAddress::AnyInterface(8081)
        );
        assert!(!a.leader_elect);
        assert_eq!(a.leader_election_namespace, None);
        assert_eq!(a.leader_election_id, "etcd-operator-controller");
        assert_eq!(a.leader_elect_lease_duration, Duration::from_secs(15));
        assert_eq!(a.leader_elect_renew_deadline, Duration::from_secs(10));
        assert_eq!(a.leader_elect_retry_period, Duration::from_secs(2));
        assert_eq!(a.concurrent_reconciles, 4);
        assert_eq!(a.graceful_shutdown_timeout, Duration::from_secs(20));
        assert_eq!(a.default_version, DEFAULT_VERSION);
        assert_eq!(a.default_repository, DEFAULT_REPOSITORY);
        assert_eq!(a.log_format, LogFormat::Text);
        assert_eq!(a.log_level, None);
        assert_eq!(
            a.planner_settings(),
            crate::planner::PlannerSettings::default()
        );
        a.validate().unwrap();
    }

    #[test]
    fn maintenance_flags() {
        let a = parse(&[
            "--defrag-ratio=1.5",
            "--defrag-min-reclaim-bytes=1048576",
            "--defrag-interval=1h",
            "--stuck-pod-timeout=2m",
        ])
        .unwrap();
        let s = a.planner_settings();
        assert_eq!(s.defragmentation.ratio, 1.5);
        assert_eq!(s.defragmentation.min_reclaim_bytes, 1_048_576);
        assert_eq!(s.defragmentation.interval, Some(Duration::from_secs(3600)));
        assert_eq!(s.stuck_terminating, Duration::from_secs(120));
        let off = parse(&["--defrag-interval=0"]).unwrap();
        assert_eq!(off.planner_settings().defragmentation.interval, None);
        for bad in ["0.5", "nan", "inf", "x"] {
            let e = parse(&[&format!("--defrag-ratio={bad}")]).unwrap_err();
            assert!(e.to_string().contains("at least 1"), "{bad}: {e}");
        }
    }

    #[test]
    fn every_flag() {
        let a = parse(&[
            "--kubeconfig",
            "/tmp/kc",
            "--namespace",
            "etcd",
            "--metrics-bind-address",
            "127.0.0.1:9090",
            "--health-probe-bind-address=[::]:9091",
            "--leader-elect",
            "--leader-election-namespace",
            "ops",
            "--leader-election-id",
            "my-lock",
            "--leader-elect-lease-duration",
            "30s",
            "--leader-elect-renew-deadline",
            "20s",
            "--leader-elect-retry-period",
            "1.5s",
            "--concurrent-reconciles",
            "8",
            "--graceful-shutdown-timeout=1m",
            "--default-version",
            "3.5.21",
            "--default-repository",
            "registry.example/etcd",
            "--log-format",
            "json",
            "--log-level",
            "debug,kube=warn",
        ])
        .unwrap();
        assert_eq!(a.kubeconfig, Some(PathBuf::from("/tmp/kc")));
        assert_eq!(a.watch_namespace().as_deref(), Some("etcd"));
        assert_eq!(
            a.metrics_bind_address,
            ListenAddress::Socket("127.0.0.1:9090".parse().unwrap())
        );
        assert_eq!(
            a.health_probe_bind_address,
            ListenAddress::Socket("[::]:9091".parse().unwrap())
        );
        assert!(a.leader_elect);
        assert_eq!(a.leader_election_namespace(), "ops");
        assert_eq!(a.leader_election_id, "my-lock");
        assert_eq!(a.leader_elect_lease_duration, Duration::from_secs(30));
        assert_eq!(a.leader_elect_renew_deadline, Duration::from_secs(20));
        assert_eq!(a.leader_elect_retry_period, Duration::from_millis(1500));
        assert_eq!(a.concurrent_reconciles, 8);
        assert_eq!(a.graceful_shutdown_timeout, Duration::from_secs(60));
        assert_eq!(a.default_version, "3.5.21");
        assert_eq!(a.default_repository, "registry.example/etcd");
        assert_eq!(a.log_format, LogFormat::Json);
        assert_eq!(a.log_level.as_deref(), Some("debug,kube=warn"));
        a.validate().unwrap();
    }

    #[test]
    fn leader_elect_takes_an_optional_value() {
        assert!(parse(&["--leader-elect"]).unwrap().leader_elect);
        assert!(parse(&["--leader-elect=true"]).unwrap().leader_elect);
        assert!(!parse(&["--leader-elect=false"]).unwrap().leader_elect);
    }

    #[test]
    fn empty_namespace_is_all_namespaces() {
        assert_eq!(parse(&["--namespace", ""]).unwrap().watch_namespace(), None);
        assert_eq!(parse(&["--namespace="]).unwrap().watch_namespace(), None);
    }

    #[test]
    fn invalid_values_are_refused() {
        for bad in [
            &["--concurrent-reconciles", "0"][..],
            &["--metrics-bind-address", "8080"],
            &["--metrics-bind-address", ":http"],
            &["--health-probe-bind-address", "a:b:1"],
            &["--leader-elect-lease-duration", "15"],
            &["--leader-elect-retry-period", "2x"],
            &["--log-format", "xml"],
            &["--no-such-flag"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn validate_passes_timings_to_the_elector_and_checks_addresses() {
        // The timings are the elector's to judge (LeaderElectionParams::validate, tested in
        // leader.rs); the flags only reach it, and only with leader election.
        let bad_timings = parse(&[
            "--leader-elect",
            "--leader-elect-lease-duration=10s",
            "--leader-elect-renew-deadline=10s",
        ])
        .unwrap();
        assert!(matches!(
            bad_timings.validate(),
            Err(ArgsError::LeaderElection(_))
        ));
        let no_election = parse(&["--leader-elect-retry-period=10s"]).unwrap();
        no_election.validate().unwrap();
        let same_port = parse(&[
            "--metrics-bind-address=:9000",
            "--health-probe-bind-address=0.0.0.0:9000",
        ])
        .unwrap();
        assert!(same_port.validate().is_err());
        let ephemeral = parse(&[
            "--metrics-bind-address=127.0.0.1:0",
            "--health-probe-bind-address=127.0.0.1:0",
        ])
        .unwrap();
        ephemeral.validate().unwrap();
    }

    #[test]
    fn leader_election_namespace_fallbacks() {
        assert_eq!(
            resolve_leader_election_namespace(Some("a"), Some("b"), Some("c")),
            "a"
        );
        assert_eq!(
            resolve_leader_election_namespace(None, Some("b"), Some("c")),
            "b"
        );
        assert_eq!(
            resolve_leader_election_namespace(None, Some(""), Some("c\n")),
            "c"
        );
        assert_eq!(
            resolve_leader_election_namespace(None, None, None),
            "default"
        );
    }

    #[test]
    fn environment_variables_name_every_flag() {
        use clap::CommandFactory;
        let command = Args::command();
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            let long = arg.get_long().unwrap();
            let env = arg.get_env().unwrap().to_str().unwrap().to_string();
            assert_eq!(
                env,
                format!("ETCD_CONTROLLER_{}", long.replace('-', "_").to_uppercase()),
                "--{long}"
            );
            assert!(arg.get_help().is_some(), "--{long} has no help");
        }
    }
}
