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

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use etcd_controller::error::{Error, EtcdRefusal};
use etcd_controller::etcd::{AlarmName, EtcdAccess, EtcdPool, MemberStatus};
use etcd_shared::version::EtcdVersion;
use etcd_tests::ports::free_ports;
use etcd_tests::process::{ManagedProcess, log_tail};
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
    start_member_with(etcd, dir, name, ports, initial_cluster, state, &[])
}

fn start_member_with(
    etcd: &Path,
    dir: &Path,
    name: &str,
    ports: (u16, u16),
    initial_cluster: &str,
    state: &str,
    extra: &[String],
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
    let args: Vec<String> = args.into_iter().chain(extra.iter().cloned()).collect();
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

async fn exercise(tools: &Tools, version: &str, dir: &Path) -> anyhow::Result<()> {
    let caps = version
        .parse::<EtcdVersion>()?
        .capabilities()
        .with_context(|| format!("{version} is not a supported line"))?;
    let etcd = tools.etcd(version)?;
    let [c1, p1, c2, p2] = free_ports()?;
    let a_peer = format!("a=http://127.0.0.1:{p1}");
    let _a = start_member(&etcd, dir, "a", (c1, p1), &a_peer, "new")?;
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
        dir,
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

/// Runs `check` against a real server of every pinned line at once, each line in a directory
/// of its own for its members' data and logs; prints each line's result (with the note `check`
/// returns) and fails with every failure, each with the tail of its members' logs.
async fn on_every_line<F, Fut>(check: F) -> anyhow::Result<()>
where
    F: Fn(Tools, String, PathBuf) -> Fut,
    Fut: Future<Output = anyhow::Result<String>>,
{
    let tools = Tools::from_env()?;
    let versions = tools.versions().every_etcd();
    let dirs = versions
        .iter()
        .map(|_| tempfile::tempdir())
        .collect::<Result<Vec<_>, _>>()?;
    let results = futures::future::join_all(versions.iter().zip(&dirs).map(|(v, dir)| {
        let run = check(tools.clone(), v.clone(), dir.path().to_path_buf());
        async move { (v.clone(), run.await) }
    }))
    .await;
    let mut failed = Vec::new();
    for ((v, r), dir) in results.iter().zip(&dirs) {
        match r {
            Ok(note) if note.is_empty() => println!("etcd {v}: ok"),
            Ok(note) => println!("etcd {v}: ok ({note})"),
            Err(e) => {
                println!("etcd {v}: FAILED");
                failed.push(format!("{v}: {e:#}\n{}", member_logs(dir.path())));
            }
        }
    }
    ensure!(failed.is_empty(), "{}", failed.join("\n"));
    Ok(())
}

/// The last lines of every member log in `dir`, for a failure's message.
fn member_logs(dir: &Path) -> String {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    logs.iter()
        .map(|log| {
            format!(
                "--- {} (last 20 lines)\n{}",
                log.display(),
                log_tail(log, 20)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn every_call_works_or_is_unsupported_on_every_line() -> anyhow::Result<()> {
    on_every_line(|tools, v, dir| async move {
        exercise(&tools, &v, &dir).await.map(|()| String::new())
    })
    .await
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
async fn refusals(tools: &Tools, version: &str, dir: &Path) -> anyhow::Result<()> {
    let caps = version
        .parse::<EtcdVersion>()?
        .capabilities()
        .with_context(|| format!("{version} is not a supported line"))?;
    let etcd = tools.etcd(version)?;
    let [c1, p1, c2, p2, _, p3, _, p4] = free_ports()?;
    let a_peer = format!("a=http://127.0.0.1:{p1}");
    let _a = start_member(&etcd, dir, "a", (c1, p1), &a_peer, "new")?;
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
        dir,
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
    on_every_line(|tools, v, dir| async move {
        refusals(&tools, &v, &dir).await.map(|()| String::new())
    })
    .await
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
    let key = |cluster: &str| {
        let (namespace, name) = cluster.split_once('/').unwrap_or(("", cluster));
        etcd_controller::object_key::ObjectKey::new(namespace, name)
    };
    let access = |cluster: &str| EtcdAccess {
        timeout: Duration::from_secs(3),
        pool: Some((pool.clone(), key(cluster))),
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
    ensure!(pool.connections(&key("ns/a")) == 1);
    // A member that does not answer: its connection is not kept.
    let down = format!("http://127.0.0.1:{dead}");
    ensure!(access("ns/a").status(&down).await.is_err());
    ensure!(pool.connections(&key("ns/a")) == 1, "{pool:?}");
    access("ns/b").status(&ep).await?;
    pool.forget(&key("ns/a"));
    ensure!(pool.connections(&key("ns/a")) == 0 && pool.connections(&key("ns/b")) == 1);
    Ok(())
}

/// The body of `GET path` on a plain HTTP endpoint (`http://IP:PORT`), as the kubelet's probe
/// asks it: the status code and the body.
async fn http_get(endpoint: &str, path: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let host = endpoint.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(host).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut answer = String::new();
    tokio::time::timeout(WAIT, stream.read_to_string(&mut answer)).await??;
    let code = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no status line")?;
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

/// Issue 23, item 2, on a real member of every line: a database filled to its quota raises
/// NOSPACE (writes refused with etcd's own error, classified as such); the alarm is seen where
/// the controller looks (Status' errors on 3.4+, the Alarm API everywhere); `/health` fails
/// while `/health?exclude=NOSPACE` answers healthy exactly on the lines the capability table
/// says (the readiness probe asks it there); and the controller's heal works: compaction (a
/// second one to the same revision is fine), defragmentation, disarm, writes accepted again.
async fn no_space(tools: &Tools, version: &str, dir: &Path) -> anyhow::Result<String> {
    let caps = version
        .parse::<EtcdVersion>()?
        .capabilities()
        .with_context(|| format!("{version} is not a supported line"))?;
    let etcd = tools.etcd(version)?;
    let [c1, p1] = free_ports()?;
    let quota = 16 * 1024 * 1024;
    let _a = start_member_with(
        &etcd,
        dir,
        "a",
        (c1, p1),
        &format!("a=http://127.0.0.1:{p1}"),
        "new",
        &[format!("--quota-backend-bytes={quota}")],
    )?;
    let access = EtcdAccess {
        timeout: Duration::from_secs(10),
        ..EtcdAccess::default()
    };
    let ep = format!("http://127.0.0.1:{c1}");
    let status = healthy(&access, &ep).await?;
    let mut client = etcd_client::Client::connect([ep.as_str()], None).await?;
    let value = vec![b'x'; 400 * 1024];
    let mut puts = 0;
    let refused = loop {
        match client.put("big", value.clone(), None).await {
            Ok(_) => puts += 1,
            Err(e) => break Error::etcd("put")(e),
        }
        ensure!(puts < 200, "no NOSPACE after {puts} puts of 400 KiB");
    };
    ensure!(
        refused.etcd_refusal() == Some(EtcdRefusal::NoSpace),
        "the refused put: {refused:?}"
    );
    let alarms = access.alarms(std::slice::from_ref(&ep)).await?;
    ensure!(
        alarms
            .iter()
            .any(|a| a.kind == AlarmName::NoSpace && a.member_id == status.member_id),
        "alarm list {alarms:?}"
    );
    let full = access.status(&ep).await?;
    ensure!(
        full.alarms.iter().any(|a| a.kind == AlarmName::NoSpace) == caps.status_lists_alarms,
        "{version}: Status lists {:?} (table: lists alarms = {})",
        full.alarms,
        caps.status_lists_alarms
    );
    ensure!(full.errors.is_empty(), "non-alarm errors {:?}", full.errors);
    ensure!(full.leader != 0, "NOSPACE costs no leader");
    if caps.status_lists_alarms {
        ensure!(full.db_size_in_use > 0, "3.4+ report the part in use");
    }
    let (plain, _) = http_get(&ep, "/health").await?;
    let (excluding, body) = http_get(&ep, "/health?exclude=NOSPACE").await?;
    // 3.2's /health is a v2 quorum read that looks at no alarm (measured: 200 under NOSPACE);
    // from 3.3 on it fails while any alarm is raised.
    ensure!(
        (plain != 200) == (caps.minor >= 3),
        "{version}: /health answered {plain} under NOSPACE"
    );
    ensure!(
        (excluding == 200) == (caps.health_excludes_alarms || caps.minor == 2),
        "{version}: /health?exclude=NOSPACE answered {excluding} {body:?} (table: excludes = {})",
        caps.health_excludes_alarms
    );

    // The heal, as the controller carries it out.
    let revision = full.revision;
    access.compact(&ep, revision).await?;
    access.compact(&ep, revision).await?;
    access.defragment(&ep, Duration::from_secs(60)).await?;
    let defragmented = access.status(&ep).await?;
    ensure!(
        defragmented.db_size < full.db_size / 2,
        "defragmentation left {} of {} bytes",
        defragmented.db_size,
        full.db_size
    );
    access.disarm_no_space(&ep, status.member_id).await?;
    ensure!(
        access.alarms(std::slice::from_ref(&ep)).await?.is_empty(),
        "alarm still raised"
    );
    client.put("after", "heal", None).await?;
    let quota_reported = full.db_size_quota;
    Ok(format!(
        "NOSPACE after {puts} puts, db {} -> {} bytes, quota reported {}",
        full.db_size, defragmented.db_size, quota_reported
    ))
}

#[tokio::test]
async fn no_space_is_seen_excluded_from_health_and_healed_on_every_line() -> anyhow::Result<()> {
    on_every_line(|tools, v, dir| async move { no_space(&tools, &v, &dir).await }).await
}

/// Issue 24: what the controller asks of the last member of a cluster that lost quorum, on a
/// real server of every line: a 3-member cluster, two members stopped for good, and the one
/// left answers Status (no leader; its raft index), the member list (our client asks it
/// serializable) and the Snapshot RPC, whose stream checks: the recovery starts from it.
async fn survivor(tools: &Tools, version: &str, dir: &Path) -> anyhow::Result<String> {
    let etcd = tools.etcd(version)?;
    let [c1, p1, c2, p2, c3, p3] = free_ports()?;
    let peers = format!("a=http://127.0.0.1:{p1},b=http://127.0.0.1:{p2},c=http://127.0.0.1:{p3}");
    let started = std::time::Instant::now();
    let a = start_member(&etcd, dir, "a", (c1, p1), &peers, "new")?;
    let b = start_member(&etcd, dir, "b", (c2, p2), &peers, "new")?;
    let c = start_member(&etcd, dir, "c", (c3, p3), &peers, "new")?;
    let access = EtcdAccess {
        timeout: Duration::from_secs(3),
        ..EtcdAccess::default()
    };
    healthy(&access, &a.client_url).await?;
    let elected = started.elapsed();
    let mut client = etcd_client::Client::connect([a.client_url.as_str()], None).await?;
    for i in 0..100 {
        client.put(format!("k{i:03}"), "v", None).await?;
    }
    drop((b, c));
    // The survivor notices it has no leader after an election timeout.
    let status = poll_until("the survivor without a leader", WAIT, || async {
        anyhow::Ok(
            access
                .status(&a.client_url)
                .await
                .ok()
                .filter(|s| s.leader == 0),
        )
    })
    .await?;
    ensure!(status.revision >= 101, "revision {}", status.revision);
    let listed = access
        .member_list(std::slice::from_ref(&a.client_url))
        .await
        .context("member list without quorum")?;
    ensure!(listed.len() == 3, "{listed:?}");
    let stream = access
        .snapshot(&a.client_url, Duration::from_secs(30))
        .await
        .context("snapshot without quorum")?;
    let mut hasher = etcd_controller::snapshot::integrity::SnapshotHasher::new();
    let mut stream = std::pin::pin!(stream);
    while let Some(chunk) = futures::StreamExt::next(&mut stream).await {
        hasher.update(&chunk?);
    }
    let checked = hasher.finish()?;
    Ok(format!(
        "a leader {:.1} s after start; revision {}, raft index {}, snapshot {} bytes checked",
        elected.as_secs_f64(),
        status.revision,
        status.raft_index,
        checked.db_size
    ))
}

#[tokio::test]
async fn the_last_member_answers_without_quorum_on_every_line() -> anyhow::Result<()> {
    on_every_line(|tools, v, dir| async move { survivor(&tools, &v, &dir).await }).await
}
