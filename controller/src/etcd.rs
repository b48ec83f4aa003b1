//! Calls to etcd's member and maintenance APIs, each with a timeout, over connections reused
//! across reconciles ([`EtcdPool`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use etcd_client::{
    AlarmAction, AlarmOptions, AlarmType, Client, CompactionOptions, ConnectOptions, GetOptions,
    MemberAddOptions,
};

use crate::error::{Error, EtcdRefusal};
use crate::etcd_tls::{self, MemberTls};

/// How to reach the members of one cluster.
#[derive(Clone, Debug, Default)]
pub struct EtcdAccess {
    /// Client TLS, when the members serve clients over TLS (parsed once per reconcile).
    pub tls: Option<Arc<MemberTls>>,
    /// Identifies the TLS material (a hash of it): a pooled connection is reused only with
    /// the material it was made with.
    pub tls_id: u64,
    /// Timeout of each call (also of connecting).
    pub timeout: Duration,
    /// Where connections are reused, and the cluster's key in it (`NAMESPACE/NAME`); `None`
    /// connects for every call.
    pub pool: Option<(Arc<EtcdPool>, crate::object_key::ObjectKey)>,
}

/// Most connections kept per cluster (a cluster has at most 7 members; the least recently
/// used one goes first).
pub const MAX_CONNECTIONS_PER_CLUSTER: usize = 8;

/// Connections to the members of every cluster, reused across reconciles: at most
/// [`MAX_CONNECTIONS_PER_CLUSTER`] per cluster, the least recently used evicted, a connection
/// whose call failed dropped, and every connection of a cluster dropped when it is forgotten.
#[derive(Default)]
pub struct EtcdPool {
    clusters: Mutex<HashMap<crate::object_key::ObjectKey, Vec<Pooled>>>,
    connects: AtomicU64,
}

struct Pooled {
    endpoint: String,
    tls_id: u64,
    client: Client,
    used: Instant,
}

impl std::fmt::Debug for EtcdPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdPool")
            .field("clusters", &self.clusters().len())
            .field("connects", &self.connects())
            .finish()
    }
}

impl EtcdPool {
    fn clusters(&self) -> MutexGuard<'_, HashMap<crate::object_key::ObjectKey, Vec<Pooled>>> {
        self.clusters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn get(
        &self,
        cluster: &crate::object_key::ObjectKey,
        endpoint: &str,
        tls_id: u64,
    ) -> Option<Client> {
        let mut clusters = self.clusters();
        let pooled = clusters
            .get_mut(cluster)?
            .iter_mut()
            .find(|p| p.endpoint == endpoint && p.tls_id == tls_id)?;
        pooled.used = Instant::now();
        Some(pooled.client.clone())
    }

    fn put(
        &self,
        cluster: &crate::object_key::ObjectKey,
        endpoint: &str,
        tls_id: u64,
        client: Client,
    ) {
        self.connects.fetch_add(1, Ordering::Relaxed);
        let mut clusters = self.clusters();
        let kept = clusters.entry(cluster.clone()).or_default();
        kept.retain(|p| p.endpoint != endpoint);
        if kept.len() >= MAX_CONNECTIONS_PER_CLUSTER
            && let Some(oldest) = kept
                .iter()
                .enumerate()
                .min_by_key(|(_, p)| p.used)
                .map(|(i, _)| i)
        {
            kept.swap_remove(oldest);
        }
        kept.push(Pooled {
            endpoint: endpoint.to_string(),
            tls_id,
            client,
            used: Instant::now(),
        });
    }

    fn discard(&self, cluster: &crate::object_key::ObjectKey, endpoint: &str) {
        if let Some(kept) = self.clusters().get_mut(cluster) {
            kept.retain(|p| p.endpoint != endpoint);
        }
    }

    /// Drops every connection of a cluster (it was deleted).
    pub fn forget(&self, cluster: &crate::object_key::ObjectKey) {
        self.clusters().remove(cluster);
    }

    /// Connections kept for a cluster.
    pub fn connections(&self, cluster: &crate::object_key::ObjectKey) -> usize {
        self.clusters().get(cluster).map_or(0, Vec::len)
    }

    /// Connections made so far (each new one counts, reused ones do not).
    pub fn connects(&self) -> u64 {
        self.connects.load(Ordering::Relaxed)
    }
}

/// What one member says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberStatus {
    /// Its member ID.
    pub member_id: u64,
    /// The leader it knows (0: none).
    pub leader: u64,
    /// Its version.
    pub version: String,
    /// Errors it reports besides alarms (`etcdserver: no leader`).
    pub errors: Vec<String>,
    /// Alarms it lists in its errors (3.4+; older lines list none here).
    pub alarms: Vec<RaisedAlarm>,
    /// It is a learner (3.4+ report it; older lines have none).
    pub is_learner: bool,
    /// The raft index it has applied (3.4+; 0 on older lines).
    pub applied_index: u64,
    /// The raft index it has (committed to its log; every line reports it).
    pub raft_index: u64,
    /// The key-value store's revision as this member has applied it.
    pub revision: i64,
    /// Size of its backend database, bytes.
    pub db_size: i64,
    /// The part of it in use, bytes (3.4+; 0 on older lines).
    pub db_size_in_use: i64,
    /// Its `--quota-backend-bytes` (3.6+; 0 where Status does not say).
    pub db_size_quota: i64,
}

/// What a member's key-value store holds at one revision: etcd's `HashKV` there and the keys
/// live there (what a snapshot of that revision must hold too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvFingerprint {
    /// The revision asked.
    pub revision: i64,
    /// etcd's `HashKV` at it.
    pub hash_kv: u32,
    /// The revision the member's history is compacted to (the hash covers what is after it).
    pub compact_revision: i64,
    /// Keys live at it.
    pub keys: i64,
}

/// An alarm etcd reports, as raised for one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct RaisedAlarm {
    /// The member it was raised for.
    pub member_id: u64,
    /// Which alarm: `NOSPACE` or `CORRUPT` (others are not raised by etcd 3.2-3.7).
    pub kind: AlarmName,
}

/// The alarms etcd raises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum AlarmName {
    /// The backend reached its quota.
    NoSpace,
    /// The data differs from the other members'.
    Corrupt,
}

impl AlarmName {
    fn parse(name: &str) -> Option<Self> {
        match name {
            "NOSPACE" => Some(AlarmName::NoSpace),
            "CORRUPT" => Some(AlarmName::Corrupt),
            _ => None,
        }
    }
}

/// The alarm in one of Status' `errors`: etcd writes each raised alarm there as its protobuf
/// text, `memberID:8e9e05c52164694d alarm:NOSPACE ` (the member ID in decimal).
pub fn parse_alarm(error: &str) -> Option<RaisedAlarm> {
    let mut member_id = None;
    let mut kind = None;
    for field in error.split_whitespace() {
        if let Some(id) = field.strip_prefix("memberID:") {
            member_id = id.parse().ok();
        } else if let Some(name) = field.strip_prefix("alarm:") {
            kind = AlarmName::parse(name);
        }
    }
    Some(RaisedAlarm {
        member_id: member_id?,
        kind: kind?,
    })
}

/// A member of the member list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedMember {
    /// Member ID.
    pub id: u64,
    /// Name (empty while unstarted).
    pub name: String,
    /// Peer URLs.
    pub peer_urls: Vec<String>,
    /// Learner.
    pub learner: bool,
}

impl EtcdAccess {
    /// A client of the member at `endpoint`, over the operator's TLS where the members serve
    /// clients over TLS. Connecting is bounded by the call timeout.
    async fn connect(&self, endpoint: &str) -> Result<Client, Error> {
        if let Some((pool, cluster)) = &self.pool
            && let Some(client) = pool.get(cluster, endpoint, self.tls_id)
        {
            return Ok(client);
        }
        let client = self.dial(endpoint).await?;
        if let Some((pool, cluster)) = &self.pool {
            pool.put(cluster, endpoint, self.tls_id, client.clone());
        }
        Ok(client)
    }

    /// Drops the pooled connection to `endpoint` after a failed call, unless etcd itself
    /// answered (a refusal or an unknown call: the connection works).
    fn settle<T>(
        &self,
        endpoint: &str,
        result: Result<T, etcd_client::Error>,
    ) -> Result<T, etcd_client::Error> {
        if let Err(e) = &result {
            let answered = matches!(e, etcd_client::Error::GRpcStatus(s)
                if s.code() == tonic::Code::Unimplemented || EtcdRefusal::of(s).is_some());
            if !answered && let Some((pool, cluster)) = &self.pool {
                pool.discard(cluster, endpoint);
            }
        }
        result
    }

    /// A connection of its own to the member at `endpoint`, never pooled: for a long call
    /// (a continuous backup's watch, a restore's replay). Each request on it is bounded by
    /// [`Self::timeout`], a watch's stream included.
    pub async fn connection(&self, endpoint: &str) -> Result<Client, Error> {
        self.dial(endpoint).await
    }

    /// A new connection to the member at `endpoint`.
    async fn dial(&self, endpoint: &str) -> Result<Client, Error> {
        // Plain where the member serves plain (a member of a cluster switching to TLS may).
        if let Some(tls) = self
            .tls
            .as_ref()
            .filter(|_| endpoint.starts_with("https://"))
        {
            return etcd_tls::connect(endpoint, tls, self.timeout)
                .await
                .map_err(|source| Error::EtcdTls {
                    endpoint: endpoint.to_string(),
                    source,
                });
        }
        let options = ConnectOptions::new()
            .with_timeout(self.timeout)
            .with_connect_timeout(self.timeout);
        let endpoints = [endpoint];
        tokio::time::timeout(self.timeout, Client::connect(endpoints, Some(options)))
            .await
            .map_err(|_| {
                etcd_client::Error::InvalidArgs(format!("connecting to {endpoint} timed out"))
            })
            .and_then(|connected| connected)
            .map_err(Error::etcd(format!("connect to {endpoint}")))
    }

    /// The member list, from the first of `endpoints` that answers (in the order given: the
    /// caller puts the leader first and leaves learners out).
    pub async fn member_list(&self, endpoints: &[String]) -> Result<Vec<ListedMember>, Error> {
        let mut last = Error::NoEndpoint("any voting member".into());
        for endpoint in endpoints {
            match self.member_list_at(endpoint).await {
                Ok(members) => return Ok(members),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    async fn member_list_at(&self, endpoint: &str) -> Result<Vec<ListedMember>, Error> {
        let mut client = self.connect(endpoint).await?;
        let resp = self
            .settle(endpoint, client.member_list().await)
            .map_err(Error::etcd(format!("member list at {endpoint}")))?;
        Ok(resp
            .members()
            .iter()
            .map(|m| ListedMember {
                id: m.id(),
                name: m.name().to_string(),
                peer_urls: m.peer_urls().to_vec(),
                learner: m.is_learner(),
            })
            .collect())
    }

    /// The status of the member at one endpoint.
    pub async fn status(&self, endpoint: &str) -> Result<MemberStatus, Error> {
        let mut client = self.connect(endpoint).await?;
        let resp = self
            .settle(endpoint, client.status().await)
            .map_err(Error::etcd(format!("status of {endpoint}")))?;
        let (alarms, errors): (Vec<&String>, Vec<&String>) =
            resp.errors().iter().partition(|e| parse_alarm(e).is_some());
        Ok(MemberStatus {
            member_id: resp.header().map_or(0, |h| h.member_id()),
            leader: resp.leader(),
            version: resp.version().to_string(),
            errors: errors.into_iter().cloned().collect(),
            alarms: alarms.into_iter().filter_map(|e| parse_alarm(e)).collect(),
            is_learner: resp.is_learner(),
            applied_index: resp.raft_applied_index(),
            raft_index: resp.raft_index(),
            revision: resp.header().map_or(0, |h| h.revision()),
            db_size: resp.db_size(),
            db_size_in_use: resp.raft_used_db_size(),
            db_size_quota: resp.db_size_quota(),
        })
    }

    /// etcd's `HashKV` and the key count of the member at `endpoint`, both at `revision` (an
    /// error `Compacted` when its history no longer reaches it).
    pub async fn kv_fingerprint(
        &self,
        endpoint: &str,
        revision: i64,
    ) -> Result<KvFingerprint, Error> {
        let mut client = self.connect(endpoint).await?;
        let hashed = self
            .settle(endpoint, client.hash_kv(revision).await)
            .map_err(Error::etcd(format!("hashKV at revision {revision}")))?;
        let every_key = GetOptions::new()
            .with_from_key()
            .with_count_only()
            .with_revision(revision);
        let counted = self
            .settle(endpoint, client.get(vec![0u8], Some(every_key)).await)
            .map_err(Error::etcd(format!("count keys at revision {revision}")))?;
        Ok(KvFingerprint {
            revision,
            hash_kv: hashed.hash(),
            compact_revision: hashed.compact_version(),
            keys: counted.count(),
        })
    }

    /// The alarms raised in the cluster, from the Alarm API (through raft: needs quorum; every
    /// line 3.2-3.7 serves it), asked of the first of `endpoints` that answers.
    pub async fn alarms(&self, endpoints: &[String]) -> Result<Vec<RaisedAlarm>, Error> {
        let mut last = Error::NoEndpoint("any voting member".into());
        for endpoint in endpoints {
            match self.alarms_at(endpoint).await {
                Ok(alarms) => return Ok(alarms),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    async fn alarms_at(&self, endpoint: &str) -> Result<Vec<RaisedAlarm>, Error> {
        let mut client = self.connect(endpoint).await?;
        let resp = self
            .settle(
                endpoint,
                client.alarm(AlarmAction::Get, AlarmType::None, None).await,
            )
            .map_err(Error::etcd(format!("alarm list at {endpoint}")))?;
        Ok(resp
            .alarms()
            .iter()
            .filter_map(|a| {
                let kind = match a.alarm() {
                    AlarmType::Nospace => AlarmName::NoSpace,
                    AlarmType::Corrupt => AlarmName::Corrupt,
                    _ => return None,
                };
                Some(RaisedAlarm {
                    member_id: a.member_id(),
                    kind,
                })
            })
            .collect())
    }

    /// Disarms the NOSPACE alarm raised for `member_id`.
    pub async fn disarm_no_space(&self, endpoint: &str, member_id: u64) -> Result<(), Error> {
        let mut client = self.connect(endpoint).await?;
        let mut options = AlarmOptions::new();
        options.with_member(member_id);
        self.settle(
            endpoint,
            client
                .alarm(AlarmAction::Deactivate, AlarmType::Nospace, Some(options))
                .await,
        )
        .map_err(Error::etcd(format!("disarm NOSPACE of {member_id:x}")))?;
        Ok(())
    }

    /// Compacts the key-value history to `revision`, waiting until the member that serves the
    /// call has removed the compacted entries (`physical`). A history already compacted past
    /// `revision` is fine.
    pub async fn compact(&self, endpoint: &str, revision: i64) -> Result<(), Error> {
        let mut client = self.connect(endpoint).await?;
        match self.settle(
            endpoint,
            client
                .compact(revision, Some(CompactionOptions::new().with_physical()))
                .await,
        ) {
            Ok(_) => Ok(()),
            Err(e) => match Error::etcd(format!("compact to revision {revision}"))(e) {
                Error::EtcdRefused {
                    refusal: EtcdRefusal::Compacted,
                    ..
                } => Ok(()),
                other => Err(other),
            },
        }
    }

    /// Defragments the backend of the member at `endpoint`, on a connection of its own whose
    /// call may take `timeout` (the member rewrites its whole database file and serves nothing
    /// meanwhile).
    pub async fn defragment(&self, endpoint: &str, timeout: Duration) -> Result<(), Error> {
        let long = EtcdAccess {
            timeout,
            pool: None,
            ..self.clone()
        };
        let mut client = long.dial(endpoint).await?;
        client
            .defragment()
            .await
            .map_err(Error::etcd(format!("defragment {endpoint}")))?;
        Ok(())
    }

    /// Streams a snapshot of the backend of the member at `endpoint` (the maintenance API's
    /// Snapshot RPC: the database, then its SHA-256), on a connection of its own whose calls may
    /// take `timeout` (a large database takes longer than a member call). Each item is the next
    /// chunk; the stream ends after the hash.
    pub async fn snapshot(
        &self,
        endpoint: &str,
        timeout: Duration,
    ) -> Result<impl futures::Stream<Item = Result<bytes::Bytes, Error>> + Unpin + use<>, Error>
    {
        let long = EtcdAccess {
            timeout,
            pool: None,
            ..self.clone()
        };
        let mut client = long.dial(endpoint).await?;
        let streaming = client
            .snapshot()
            .await
            .map_err(Error::etcd(format!("snapshot of {endpoint}")))?;
        let what = format!("snapshot of {endpoint}");
        Ok(Box::pin(futures::stream::unfold(
            Some((streaming, client, what)),
            |state| async move {
                let (mut streaming, client, what) = state?;
                match streaming.message().await {
                    Ok(Some(resp)) => Some((
                        Ok(bytes::Bytes::copy_from_slice(resp.blob())),
                        Some((streaming, client, what)),
                    )),
                    Ok(None) => None,
                    Err(e) => Some((Err(Error::etcd(what.clone())(e)), None)),
                }
            },
        )))
    }

    /// Adds a member (as a learner where asked); returns its ID.
    pub async fn add_member(
        &self,
        endpoint: &str,
        peer_url: &str,
        learner: bool,
    ) -> Result<u64, Error> {
        let mut client = self.connect(endpoint).await?;
        let options = learner.then(|| MemberAddOptions::new().with_is_learner());
        let resp = self
            .settle(endpoint, client.member_add([peer_url], options).await)
            .map_err(Error::etcd(format!("member add {peer_url}")))?;
        Ok(resp.member().map_or(0, |m| m.id()))
    }

    /// Asks the leader at `leader_endpoint` to hand leadership to member `to`.
    pub async fn move_leader(&self, leader_endpoint: &str, to: u64) -> Result<(), Error> {
        let mut client = self.connect(leader_endpoint).await?;
        self.settle(leader_endpoint, client.move_leader(to).await)
            .map_err(Error::etcd(format!("move leader to {to:x}")))?;
        Ok(())
    }

    /// Removes a member.
    pub async fn remove_member(&self, endpoint: &str, id: u64) -> Result<(), Error> {
        let mut client = self.connect(endpoint).await?;
        self.settle(endpoint, client.member_remove(id).await)
            .map_err(Error::etcd(format!("member remove {id:x}")))?;
        Ok(())
    }

    /// Promotes a learner. `Ok(false)` when etcd says it has not caught up yet.
    pub async fn promote_member(&self, endpoint: &str, id: u64) -> Result<bool, Error> {
        let mut client = self.connect(endpoint).await?;
        match self.settle(endpoint, client.member_promote(id).await) {
            Ok(_) => Ok(true),
            Err(e) => match Error::etcd(format!("member promote {id:x}"))(e) {
                Error::EtcdRefused {
                    refusal: EtcdRefusal::LearnerNotInSync,
                    ..
                } => Ok(false),
                other => Err(other),
            },
        }
    }
}
