//! The controller's etcd calls against a real server of every release line the operator
//! supports (3.2 to the newest): member list, add, promote, status, move leader and remove
//! work where the line has them, and fail with [`Error::Unsupported`] (never a retry loop or a
//! silent wrong result) where it does not. Issue 13, item 6.
//!
//! Each line runs a two-member cluster on loopback: a seed, then a second member added the way
//! the planner adds it (a learner only where the line has learners), started, promoted where
//! needed, handed the leadership where the line has MoveLeader, and removed again.
//!
//! Run: `cargo test -p etcd-controller --test etcd_lines` (needs `hack/build-tools.sh`).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use etcd_controller::error::{Error, EtcdRefusal};
use etcd_controller::etcd::{EtcdAccess, EtcdPool, MemberStatus};
use etcd_shared::version::EtcdVersion;
use etcd_tests::ports::free_ports;
use etcd_tests::process::ManagedProcess;
use etcd_tests::{Tools, poll_until};

const WAIT: Duration = Duration::from_secs(60);

/// One etcd process on loopback.
struct Member {
    _process: ManagedProcess,
    client_url: String,
}

fn start_member(
    etcd: &Path,
    dir: &Path,
    name: &str,
    ports: (u16, u16),
    initial_cluster: &str,
    state: &str,
) -> anyhow::Result<Member> {
    let client_url = format!("http://127.0.0.1:{}", ports.0);
    let peer_url = format!("http://127.0.0.1:{}", ports.1);
    let args = [
        format!("--name={name}"),
        format!("--data-dir={}", dir.join(name).display()),
        format!("--listen-client-urls={client_url}"),
        format!("--advertise-client-urls={client_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster={initial_cluster}"),
        format!("--initial-cluster-state={state}"),
    ];
    let process = ManagedProcess::start(name, etcd, &args, dir.join(format!("{name}.log")))?;
    Ok(Member {
        _process: process,
        client_url,
    })
}

/// Waits until the member at `endpoint` answers its status with a leader.
async fn healthy(access: &EtcdAccess, endpoint: &str) -> anyhow::Result<MemberStatus> {
    let status = poll_until(&format!("{endpoint} healthy"), WAIT, || async {
        anyhow::Ok(access.status(endpoint).await.ok().filter(|s| s.leader != 0))
    })
    .await?;
    Ok(status)
}

/// Retries a membership change that etcd refuses only for now (its health window).
async fn until_accepted<T, F, Fut>(what: &str, mut call: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let result = poll_until(what, WAIT, || {
        let attempt = call();
        async move {
            match attempt.await {
                Ok(v) => Ok(Some(v)),
                Err(e) if e.is_etcd_not_ready() => Ok(None),
                Err(e) => Err(e),
            }
        }
    })
    .await?;
    Ok(result)
}

async fn exercise(tools: &Tools, version: &str) -> anyhow::Result<()> {
    let caps = version
        .parse::<EtcdVersion>()?
        .capabilities()
        .with_context(|| format!("{version} is not a supported line"))?;
    let etcd = tools.etcd(version)?;
    let dir = tempfile::tempdir()?;
    let [c1, p1, c2, p2] = free_ports()?;
    let a_peer = format!("a=http://127.0.0.1:{p1}");
    let _a = start_member(&etcd, dir.path(), "a", (c1, p1), &a_peer, "new")?;
    let access = EtcdAccess {
        timeout: Duration::from_secs(3),
        ..EtcdAccess::default()
    };
    let ep_a = format!("http://127.0.0.1:{c1}");
    let status_a = healthy(&access, &ep_a).await?;
    ensure!(
        status_a.version == version,
        "status reports {}, expected {version}",
        status_a.version
    );
    ensure!(!status_a.is_learner);

    let listed = access.member_list(std::slice::from_ref(&ep_a)).await?;
    ensure!(
        listed.len() == 1 && listed[0].name == "a",
        "member list {listed:?}"
    );

    // Added as the planner adds it: a learner only where the line has learners.
    let b_peer = format!("http://127.0.0.1:{p2}");
    let id_b = until_accepted("member add", || {
        access.add_member(&ep_a, &b_peer, caps.learners)
    })
    .await?;
    let b = start_member(
        &etcd,
        dir.path(),
        "b",
        (c2, p2),
        &format!("{a_peer},b={b_peer}"),
        "existing",
    )?;
    let status_b = healthy(&access, &b.client_url).await?;
    ensure!(
        status_b.member_id == id_b,
        "b answers as {:x}",
        status_b.member_id
    );
    ensure!(
        status_b.is_learner == caps.learners,
        "b is_learner={} on {version}",
        status_b.is_learner
    );

    // Promotion: of the learner where the line has learners; elsewhere the call is unknown.
    if caps.learners {
        poll_until("the learner promoted", WAIT, || async {
            match access.promote_member(&ep_a, id_b).await {
                Ok(done) => anyhow::Ok(done.then_some(())),
                Err(e) if e.is_etcd_not_ready() => Ok(None),
                Err(e) => Err(e.into()),
            }
        })
        .await?;
    } else {
        match access.promote_member(&ep_a, id_b).await {
            Err(Error::Unsupported { .. }) => {}
            other => bail!("promote on {version}: expected Unsupported, got {other:?}"),
        }
    }
    let listed = access.member_list(std::slice::from_ref(&ep_a)).await?;
    ensure!(
        listed.len() == 2 && listed.iter().all(|m| !m.learner),
        "after the join, {version} lists {listed:?}"
    );

    // Leadership handover, where the line has MoveLeader.
    let leader = healthy(&access, &ep_a).await?.leader;
    let (leader_ep, follower_id) = if leader == status_a.member_id {
        (ep_a.clone(), id_b)
    } else {
        (b.client_url.clone(), status_a.member_id)
    };
    let moved = until_accepted("move leader", || async {
        match access.move_leader(&leader_ep, follower_id).await {
            Err(Error::Unsupported { .. }) => Ok(false),
            other => other.map(|()| true),
        }
    })
    .await?;
    ensure!(
        moved == caps.move_leader,
        "MoveLeader on {version}: served={moved}, capability table says {}",
        caps.move_leader
    );
    if moved {
        poll_until("the new leader", WAIT, || async {
            let s = access.status(&ep_a).await.ok();
            anyhow::Ok(s.filter(|s| s.leader == follower_id).map(|_| ()))
        })
        .await?;
    }

    // Removal of the follower, sent where the planner sends it (the leader's endpoint): the
    // planner never removes the leader while another member can go.
    let leader = healthy(&access, &ep_a).await?.leader;
    let (leader_ep, victim, survivor) = if leader == id_b {
        (&b.client_url, status_a.member_id, "b")
    } else {
        (&ep_a, id_b, "a")
    };
    until_accepted("member remove", || access.remove_member(leader_ep, victim)).await?;
    let listed = poll_until("one member left in the member list", WAIT, || async {
        let listed = access
            .member_list(std::slice::from_ref(leader_ep))
            .await
            .ok();
        anyhow::Ok(listed.filter(|l| l.len() == 1))
    })
    .await?;
    ensure!(listed[0].name == survivor, "{listed:?}");
    Ok(())
}

#[tokio::test]
async fn every_call_works_or_is_unsupported_on_every_line() -> anyhow::Result<()> {
    let tools = Tools::from_env()?;
    let versions = tools.versions().every_etcd();
    let results = futures::future::join_all(versions.iter().map(|v| {
        let tools = &tools;
        async move { (v.clone(), exercise(tools, v).await) }
    }))
    .await;
    let failed: Vec<String> = results
        .iter()
        .filter_map(|(v, r)| r.as_ref().err().map(|e| format!("{v}: {e:#}")))
        .collect();
    for (v, r) in &results {
        println!("etcd {v}: {}", if r.is_ok() { "ok" } else { "FAILED" });
    }
    ensure!(failed.is_empty(), "{}", failed.join("\n"));
    Ok(())
}

/// The refusal of a call that must fail, or why it did not.
fn refusal<T: std::fmt::Debug>(result: Result<T, Error>) -> anyhow::Result<Option<EtcdRefusal>> {
    match result {
        Err(e) => Ok(e.etcd_refusal()),
        Ok(v) => bail!("the call succeeded: {v:?}"),
    }
}

/// Issue 15, item 6: etcd's refusals, provoked on a real server of every line, classify by
/// gRPC code and etcd's error: "member not found" (remove of an unknown ID), "can only promote
/// a learner member which is in sync with leader" (promote right after the add), "too many
/// learner members" (a second learner) where the line has learners, and "unhealthy cluster"
/// (a member added while a voter is down).
async fn refusals(tools: &Tools, version: &str) -> anyhow::Result<()> {
    let caps = version
        .parse::<EtcdVersion>()?
        .capabilities()
        .with_context(|| format!("{version} is not a supported line"))?;
    let etcd = tools.etcd(version)?;
    let dir = tempfile::tempdir()?;
    let [c1, p1, c2, p2, _, p3, _, p4] = free_ports()?;
    let a_peer = format!("a=http://127.0.0.1:{p1}");
    let _a = start_member(&etcd, dir.path(), "a", (c1, p1), &a_peer, "new")?;
    let access = EtcdAccess {
        timeout: Duration::from_secs(3),
        ..EtcdAccess::default()
    };
    let ep_a = format!("http://127.0.0.1:{c1}");
    healthy(&access, &ep_a).await?;

    let got = refusal(access.remove_member(&ep_a, 0xdead_beef).await)?;
    ensure!(
        got == Some(EtcdRefusal::MemberNotFound),
        "remove of an unknown member: {got:?}"
    );

    // A second voter b, started; then, where the line has learners, learners that never start.
    let b_peer = format!("http://127.0.0.1:{p2}");
    let id_b = until_accepted("member add b", || {
        access.add_member(&ep_a, &b_peer, caps.learners)
    })
    .await?;
    let b = start_member(
        &etcd,
        dir.path(),
        "b",
        (c2, p2),
        &format!("{a_peer},b={b_peer}"),
        "existing",
    )?;
    healthy(&access, &b.client_url).await?;
    if caps.learners {
        poll_until("b promoted", WAIT, || async {
            match access.promote_member(&ep_a, id_b).await {
                Ok(done) => anyhow::Ok(done.then_some(())),
                Err(e) if e.is_etcd_not_ready() => Ok(None),
                Err(e) => Err(e.into()),
            }
        })
        .await?;
        let c_peer = format!("http://127.0.0.1:{p3}");
        let id_c = until_accepted("learner c added", || {
            access.add_member(&ep_a, &c_peer, true)
        })
        .await?;
        // Promoted at once, the learner is behind: the call says "not yet".
        ensure!(
            !access.promote_member(&ep_a, id_c).await?,
            "a learner that never started was promoted"
        );
        // The same call through the classifier, to see the variant itself.
        let mut client = etcd_client::Client::connect([ep_a.as_str()], None).await?;
        let raw = client
            .member_promote(id_c)
            .await
            .err()
            .context("the learner was promoted")?;
        let de = Error::etcd("member promote")(raw);
        ensure!(
            de.etcd_refusal() == Some(EtcdRefusal::LearnerNotInSync) && de.is_etcd_not_ready(),
            "promote of a learner behind: {de:?}"
        );
        let d_peer = format!("http://127.0.0.1:{p4}");
        let got = refusal(access.add_member(&ep_a, &d_peer, true).await)?;
        ensure!(
            got == Some(EtcdRefusal::TooManyLearners),
            "a second learner: {got:?}"
        );
        until_accepted("learner c removed", || access.remove_member(&ep_a, id_c)).await?;
    }

    // b down: a member add would leave the cluster without a connected majority.
    drop(b);
    let c_peer = format!("http://127.0.0.1:{p3}");
    let last = std::sync::Mutex::new(String::new());
    poll_until("the add refused as unhealthy", WAIT, || async {
        match access.add_member(&ep_a, &c_peer, caps.learners).await {
            Ok(id) => bail!("added {id:x} with a voter down"),
            Err(e) if e.etcd_refusal() == Some(EtcdRefusal::UnhealthyCluster) => {
                ensure!(e.is_etcd_not_ready(), "{e:?}");
                anyhow::Ok(Some(()))
            }
            // Until a notices b is gone (the health window), the add may time out.
            Err(e) => {
                *last
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = format!("{e:?}");
                Ok(None)
            }
        }
    })
    .await
    .with_context(|| {
        let last = last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        format!("the last answer: {last}")
    })?;
    Ok(())
}

#[tokio::test]
async fn refusals_classify_by_code_on_every_line() -> anyhow::Result<()> {
    let tools = Tools::from_env()?;
    let versions = tools.versions().every_etcd();
    let results = futures::future::join_all(versions.iter().map(|v| {
        let tools = &tools;
        async move { (v.clone(), refusals(tools, v).await) }
    }))
    .await;
    let failed: Vec<String> = results
        .iter()
        .filter_map(|(v, r)| r.as_ref().err().map(|e| format!("{v}: {e:#}")))
        .collect();
    for (v, r) in &results {
        println!("etcd {v}: {}", if r.is_ok() { "ok" } else { "FAILED" });
    }
    ensure!(failed.is_empty(), "{}", failed.join("\n"));
    Ok(())
}

/// Issue 15, item 5: calls of a pooled access reuse one connection per member across calls
/// (and reconciles: the pool outlives the access), a failed connection is dropped and made
/// again, and forgetting the cluster drops its connections.
#[tokio::test]
async fn connections_are_reused_per_member_and_dropped_with_the_cluster() -> anyhow::Result<()> {
    let tools = Tools::from_env()?;
    let etcd = tools.etcd(etcd_shared::version::DEFAULT_VERSION)?;
    let dir = tempfile::tempdir()?;
    let [c1, p1, dead] = free_ports()?;
    let _a = start_member(
        &etcd,
        dir.path(),
        "a",
        (c1, p1),
        &format!("a=http://127.0.0.1:{p1}"),
        "new",
    )?;
    let pool = std::sync::Arc::new(EtcdPool::default());
    let access = |cluster: &str| EtcdAccess {
        timeout: Duration::from_secs(3),
        pool: Some((pool.clone(), cluster.to_string())),
        ..EtcdAccess::default()
    };
    let ep = format!("http://127.0.0.1:{c1}");
    healthy(&access("ns/a"), &ep).await?;
    let before = pool.connects();
    for _ in 0..10 {
        // A new access per reconcile, as observe makes it.
        let a = access("ns/a");
        a.status(&ep).await?;
        a.member_list(std::slice::from_ref(&ep)).await?;
    }
    ensure!(
        pool.connects() == before,
        "{} connections for 20 calls to one member",
        pool.connects() - before
    );
    ensure!(pool.connections("ns/a") == 1);
    // A member that does not answer: its connection is not kept.
    let down = format!("http://127.0.0.1:{dead}");
    ensure!(access("ns/a").status(&down).await.is_err());
    ensure!(pool.connections("ns/a") == 1, "{pool:?}");
    access("ns/b").status(&ep).await?;
    pool.forget("ns/a");
    ensure!(pool.connections("ns/a") == 0 && pool.connections("ns/b") == 1);
    Ok(())
}
