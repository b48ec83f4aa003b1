//! The chart's webhook Deployment against the binary and the memory figures (issue 14: "the
//! chart's limits are derived from those figures"): every flag the chart passes is one
//! `etcd-webhook` accepts, `terminationGracePeriodSeconds` covers the shutdown delay and grace
//! period, the allocator settings are the ones the memory benchmark measured, and the memory
//! limit covers the worst case the benchmark measured for the flags the chart passes.
//!
//! Needs the pinned helm (`hack/build-tools.sh`); renders offline (`helm template`).

#[path = "support/process.rs"]
mod process;
#[path = "support/mod.rs"]
mod support;

use clap::Parser;
use etcd_tests::chart::{Manifests, fullname, template};
use etcd_tests::{Helm, HelmMajor, Tools};
use etcd_webhook::Args;
use serde_json::Value;

/// What `cargo bench -p etcd-webhook --bench memory` measured (release build, the chart's
/// `GLIBC_TUNABLES`; docs/development/benchmarks.md, "Webhook memory and connections", has the
/// tables), MiB and KiB. The process at rest, with no connection open.
const IDLE_MIB: f64 = 8.3;
/// One admission connection at its worst: an HTTP/2 connection open (29 KiB) holding the most
/// streams it may, each with the largest header list and its share of the window of unread
/// body (259 KiB more). An HTTP/1 connection holding a 63 KiB head costs less (15 + 42).
const ADMISSION_CONNECTION_KIB: f64 = 29.0 + 259.0;
/// One metrics or probe connection at its worst: an HTTP/1 head of 400 KiB being received
/// (hyper's default buffer bound on the process shell's plain listeners).
const ADMIN_CONNECTION_KIB: f64 = 6.0 + 423.0;
/// The margin kept above the measured worst case (allocator and measurement noise).
const MARGIN: f64 = 1.15;

/// The webhook container of a rendering, and its pod spec.
fn webhook_pod(manifests: &Manifests, release: &str) -> (Value, Value) {
    let name = format!("{}-webhook", fullname(release));
    let deployment = manifests
        .get("Deployment", &name)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let pod = deployment["spec"]["template"]["spec"].clone();
    let container = pod["containers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "webhook"))
        .cloned()
        .unwrap_or_else(|| panic!("no webhook container in {pod}"));
    (pod, container)
}

/// `Args` from the container's command line (the certificate flags are the chart's too).
fn args_of(container: &Value) -> Args {
    let mut argv = vec!["etcd-webhook".to_string()];
    argv.extend(
        container["args"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| a.as_str().unwrap_or_default().to_string()),
    );
    Args::try_parse_from(&argv).unwrap_or_else(|e| panic!("the chart's flags {argv:?}: {e}"))
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The memory one webhook process can reach with these flags, MiB, from the figures above.
fn worst_case_mib(args: &Args) -> f64 {
    IDLE_MIB
        + mib(args.max_in_flight_memory)
        + f64::from(args.max_connections) * ADMISSION_CONNECTION_KIB / 1024.0
        + 2.0 * f64::from(args.max_admin_connections) * ADMIN_CONNECTION_KIB / 1024.0
}

#[tokio::test]
async fn the_charts_webhook_flags_grace_period_and_memory_limit_follow_from_the_figures() {
    let tools = Tools::from_env().expect("the tools cache");
    let helm = Helm::offline(&tools, HelmMajor::V3).expect("helm 3 (hack/build-tools.sh)");
    let release = "eo";
    // (extra values, what they test)
    let renderings: [(&[&str], &str); 2] = [
        (&[], "the defaults"),
        (
            &[
                "--set",
                "webhook.shutdownDelaySeconds=12",
                "--set",
                "webhook.shutdownGracePeriodSeconds=30",
            ],
            "a longer shutdown",
        ),
    ];
    for (extra, what) in renderings {
        let manifests = template(&helm, release, "ops", extra)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e:#}"));
        let (pod, container) = webhook_pod(&manifests, release);
        let args = args_of(&container);
        // The pod is given the shutdown delay and the grace period, and 5 s more.
        let grace = pod["terminationGracePeriodSeconds"]
            .as_u64()
            .unwrap_or_else(|| panic!("{what}: no terminationGracePeriodSeconds"));
        assert_eq!(
            grace,
            args.shutdown_delay.as_secs() + args.shutdown_grace_period.as_secs() + 5,
            "{what}"
        );
        if extra.is_empty() {
            assert_eq!(args.shutdown_delay.as_secs(), 5, "{what}");
            assert_eq!(args.shutdown_grace_period.as_secs(), 15, "{what}");
        } else {
            assert_eq!(grace, 12 + 30 + 5, "{what}");
        }
        // The allocator the figures were measured with.
        let tunables = container["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == "GLIBC_TUNABLES")
            .and_then(|e| e["value"].as_str())
            .map(str::to_string);
        assert_eq!(tunables.as_deref(), Some(process::GLIBC_TUNABLES), "{what}");
        // The memory limit covers the worst case of these flags, with the margin; the request
        // covers the process at rest with its connections idle.
        let memory = |kind: &str| {
            let q = container["resources"][kind]["memory"]
                .as_str()
                .unwrap_or_else(|| panic!("{what}: no memory {kind}"));
            let q = etcd_shared::admission::parse_quantity(q)
                .unwrap_or_else(|e| panic!("{what}: {kind}: {e}"));
            q / (1024.0 * 1024.0)
        };
        let worst = worst_case_mib(&args);
        let limit = memory("limits");
        assert!(
            limit >= worst * MARGIN,
            "{what}: the memory limit {limit} MiB is under the worst case {worst:.1} MiB x {MARGIN}"
        );
        assert!(
            limit <= worst * 1.5,
            "{what}: the memory limit {limit} MiB is far above the worst case {worst:.1} MiB: derive it again"
        );
        assert!(memory("requests") >= IDLE_MIB * 2.0, "{what}");
    }
}
