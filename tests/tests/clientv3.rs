//! etcd's own Go client (clientv3 with its default options and retries, through
//! `hack/clientv3-load`) on real etcd members on loopback, without Kubernetes:
//!
//! - a steady load over three endpoints: nothing fails, every member serves, the history is
//!   linearizable;
//! - a follower, then the leader, stopped gracefully (SIGTERM: what a pod deletion does in an
//!   upgrade, a replacement or a scale-down) and restarted under the load: the history is
//!   linearizable, and the client is back on the member once it is up. A follower's stop fails
//!   no request. The leader's fails at most the request each client has in flight while it hands
//!   its leadership over: etcd's raft drops proposals during a transfer ("transfer leadership
//!   ... is in progress; dropping proposal"), and one forwarded by a follower is never answered,
//!   so its caller times out (outcome unknown, never applied). Measured: 0 in 11 of 11 runs on
//!   an idle machine, 1 timeout once in full CI load (the `clients` suite allows the same, one
//!   per client per handover);
//! - an endpoint dropped from the list while running (the client's `SetEndpoints`): the traffic
//!   goes on, on the other two only, and nothing fails;
//! - ignored (measured false, see their `ignore` reasons): a follower or the leader SIGKILLed
//!   and restarted, no request fails. clientv3 never resends a write once sent, so a write in
//!   flight on a crashed member's connection, or forwarded to a crashed leader, fails.
//!   `cargo test -p etcd-tests --test clientv3 -- --ignored` runs them.
//!
//! Needs the pinned etcd and clientv3-load (`hack/build-tools.sh`, or `ONLY=etcd` and
//! `ONLY=clientv3`). Histories, reports and logs go to `target/recorder/clientv3-*` (or
//! `$ETCD_TESTS_ARTIFACTS_DIR`). Run: `cargo test -p etcd-tests --test clientv3`.

use std::path::PathBuf;
use std::time::Duration;

use etcd_lincheck::history::{History, Op};
use etcd_tests::Tools;
use etcd_tests::clientv3::{Clientv3Load, Clientv3Options, Clientv3Report};
use etcd_tests::poll_until;
use etcd_tests::recorder::{LoopbackCluster, artifacts_dir};
use nix::sys::signal::Signal;

const READY: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(30);
const CHECK: Duration = Duration::from_secs(30);

fn etcd() -> PathBuf {
    let tools = Tools::from_env().expect("the tool cache");
    tools
        .apiserver_etcd()
        .expect("etcd is built (hack/build-tools.sh)")
}

async fn cluster() -> (LoopbackCluster, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = LoopbackCluster::start(&etcd(), dir.path(), 3).expect("start members");
    cluster.wait_ready(READY).await.expect("members ready");
    (cluster, dir)
}

fn start(name: &str, endpoints: Vec<String>) -> Clientv3Load {
    let mut options = Clientv3Options::new(format!("clientv3-{name}"), artifacts_dir(), endpoints);
    options.rate = 100.0;
    Clientv3Load::start(options).expect("start clientv3-load (hack/build-tools.sh builds it)")
}

/// Ok operations with an id above `after_id`, sent to `endpoint` if given.
fn ok_ops<'h>(
    history: &'h History,
    after_id: u64,
    endpoint: Option<&'h str>,
) -> impl Iterator<Item = &'h Op> {
    history
        .ops
        .iter()
        .filter(move |o| o.is_ok() && o.id > after_id && endpoint.is_none_or(|e| o.endpoint == e))
}

fn last_id(history: &History) -> u64 {
    history.ops.iter().map(|o| o.id).max().unwrap_or(0)
}

/// The index of the member that leads.
async fn leader(cluster: &LoopbackCluster) -> usize {
    for (i, endpoint) in cluster.endpoints().into_iter().enumerate() {
        let mut client = etcd_client::Client::connect([endpoint], None)
            .await
            .expect("connect");
        let status = client.status().await.expect("status");
        if status.header().map(|h| h.member_id()) == Some(status.leader()) {
            return i;
        }
    }
    panic!("no member leads");
}

fn passed(report: &Clientv3Report) {
    println!("{report}");
    let check = report.check(CHECK).expect("check the history");
    assert!(check.passed(), "{report}\n{}", check.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_load_nothing_fails_every_member_serves_linearizable() {
    let (cluster, _dir) = cluster().await;
    let mut load = start("steady", cluster.endpoints());
    load.wait_for("300 ok operations", WAIT, |h| {
        ok_ops(h, 0, None).count() >= 300
    })
    .await
    .expect("traffic");
    let report = load.stop().await.expect("stop");
    passed(&report);
    assert_eq!(report.failed, 0, "{report}");
    assert!(report.ok >= 300, "{report}");
    // The rate is a target, not a floor, on a loaded machine: at least half of it.
    assert!(report.ops_per_sec > 50.0, "{report}");
    for endpoint in cluster.endpoints() {
        assert!(
            report.ok_by_endpoint.get(&endpoint).is_some_and(|&n| n > 0),
            "round-robin over every endpoint: {endpoint} served nothing: {report}"
        );
    }
}

/// How a member goes down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// SIGTERM: etcd hands its leadership over, closes its connections and exits (what a pod
    /// deletion does: an upgrade, a replacement, a scale-down).
    Graceful,
    /// SIGKILL: a crash.
    Crash,
}

/// How many times member `i`'s log says its etcd server closed (a graceful stop's last line).
fn closed(cluster: &LoopbackCluster, i: usize) -> usize {
    cluster
        .log_tail(i, 100_000)
        .matches("\"closed etcd server\"")
        .count()
}

/// Stops the leader or a follower under the load, restarts it, and waits until the client is
/// back on it; the report.
async fn stop_and_restart(name: &str, pick_leader: bool, stop: Stop) -> Clientv3Report {
    let (mut cluster, _dir) = cluster().await;
    let mut load = start(name, cluster.endpoints());
    let history = load
        .wait_for("100 ok operations", WAIT, |h| {
            ok_ops(h, 0, None).count() >= 100
        })
        .await
        .expect("traffic");
    let lead = leader(&cluster).await;
    let victim = if pick_leader { lead } else { (lead + 1) % 3 };
    let victim_url = cluster.endpoint(victim).expect("victim");
    let stopped_at = last_id(&history);
    match stop {
        Stop::Crash => cluster.kill(victim).expect("kill"),
        Stop::Graceful => {
            let before = closed(&cluster, victim);
            cluster.signal(victim, Signal::SIGTERM).expect("SIGTERM");
            poll_until("the member's graceful stop", READY, || {
                let done = closed(&cluster, victim) > before;
                async move { Ok::<_, String>(done.then_some(())) }
            })
            .await
            .expect("the member stopped");
        }
    }
    // The traffic goes on over the two others.
    let history = load
        .wait_for("200 ok operations with a member down", WAIT, |h| {
            ok_ops(h, stopped_at, None).count() >= 200
        })
        .await
        .expect("traffic with a member down");
    cluster.restart(victim).expect("restart");
    cluster
        .wait_member_ready(victim, READY)
        .await
        .expect("the member back");
    let restarted_at = last_id(&history);
    load.wait_for("ok operations served by the restarted member", WAIT, |h| {
        ok_ops(h, restarted_at, Some(&victim_url)).count() >= 20
    })
    .await
    .expect("the client back on the restarted member");
    let report = load.stop().await.expect("stop");
    passed(&report);
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_stopped_and_restarted_no_request_fails() {
    let report = stop_and_restart("stop-follower", false, Stop::Graceful).await;
    assert_eq!(report.failed, 0, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_stopped_and_restarted_fails_at_most_the_requests_in_flight_at_its_handover() {
    let report = stop_and_restart("stop-leader", true, Stop::Graceful).await;
    // Each client sends one request at a time: at most one each is caught by the handover.
    let in_flight = u64::try_from(report.clients).expect("clients");
    assert!(report.failed <= in_flight, "{report}");
    // Dropped by the leader handing over: never refused, only unanswered.
    assert_eq!(report.failed, report.unknown, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measured false: a write in flight on the SIGKILLed member's connection fails (Unavailable, outcome unknown) in about 1 run of 5; clientv3 does not resend writes"]
async fn a_follower_killed_and_restarted_no_request_fails() {
    let report = stop_and_restart("kill-follower", false, Stop::Crash).await;
    assert_eq!(report.failed, 0, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measured false: writes forwarded to the SIGKILLed leader are lost and time out (5 s): 1 or 2 failed requests in 15 runs of 17"]
async fn the_leader_killed_and_restarted_no_request_fails() {
    let report = stop_and_restart("kill-leader", true, Stop::Crash).await;
    assert_eq!(report.failed, 0, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_dropped_the_traffic_goes_on_the_others() {
    let (cluster, _dir) = cluster().await;
    let all = cluster.endpoints();
    let mut load = start("drop-endpoint", all.clone());
    load.wait_for("100 ok operations", WAIT, |h| {
        ok_ops(h, 0, None).count() >= 100
    })
    .await
    .expect("traffic");
    let fewer = vec![all[0].clone(), all[2].clone()];
    let applied = load.set_endpoints(&fewer).await.expect("set endpoints");
    // Requests already on the dropped member's connection may finish there: count from 0.5 s on.
    let from = u64::try_from((applied + Duration::from_millis(500)).as_nanos()).expect("ns");
    let after = |h: &History| -> Vec<Op> {
        h.ops
            .iter()
            .filter(|o| o.is_ok() && o.call >= from)
            .cloned()
            .collect()
    };
    let history = load
        .wait_for("200 ok operations after the change", WAIT, |h| {
            after(h).len() >= 200
        })
        .await
        .expect("traffic after the change");
    let report = load.stop().await.expect("stop");
    passed(&report);
    assert_eq!(report.failed, 0, "{report}");
    assert_eq!(
        report.endpoint_changes.last().map(|c| &c.endpoints),
        Some(&fewer),
        "{report}"
    );
    let ops = after(&history);
    let on = |e: &str| ops.iter().filter(|o| o.endpoint == e).count();
    assert_eq!(
        on(&all[1]),
        0,
        "nothing goes to the dropped endpoint: {report}"
    );
    assert!(
        on(&all[0]) > 0 && on(&all[2]) > 0,
        "both others serve: {report}"
    );
}
