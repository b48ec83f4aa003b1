//! Calls to etcd's member and maintenance APIs, each with a timeout.

use std::time::Duration;

use std::sync::Arc;

use etcd_client::{Client, ConnectOptions, MemberAddOptions};

use crate::error::Error;
use crate::etcd_tls::{self, MemberTls};

/// How to reach the members of one cluster.
#[derive(Clone, Debug)]
pub struct EtcdAccess {
    /// Client TLS, when the members serve clients over TLS (parsed once per reconcile).
    pub tls: Option<Arc<MemberTls>>,
    /// Timeout of each call (also of connecting).
    pub timeout: Duration,
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
    /// Errors it reports (alarms such as NOSPACE).
    pub errors: Vec<String>,
    /// It is a learner (3.4+ report it; older lines have none).
    pub is_learner: bool,
    /// The raft index it has applied (3.4+; 0 on older lines).
    pub applied_index: u64,
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
        if let Some(tls) = &self.tls {
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
        let resp = client
            .member_list()
            .await
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
        let resp = client
            .status()
            .await
            .map_err(Error::etcd(format!("status of {endpoint}")))?;
        Ok(MemberStatus {
            member_id: resp.header().map_or(0, |h| h.member_id()),
            leader: resp.leader(),
            version: resp.version().to_string(),
            errors: resp.errors().to_vec(),
            is_learner: resp.is_learner(),
            applied_index: resp.raft_applied_index(),
        })
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
        let resp = client
            .member_add([peer_url], options)
            .await
            .map_err(Error::etcd(format!("member add {peer_url}")))?;
        Ok(resp.member().map_or(0, |m| m.id()))
    }

    /// Asks the leader at `leader_endpoint` to hand leadership to member `to`.
    pub async fn move_leader(&self, leader_endpoint: &str, to: u64) -> Result<(), Error> {
        let mut client = self.connect(leader_endpoint).await?;
        client
            .move_leader(to)
            .await
            .map_err(Error::etcd(format!("move leader to {to:x}")))?;
        Ok(())
    }

    /// Removes a member.
    pub async fn remove_member(&self, endpoint: &str, id: u64) -> Result<(), Error> {
        let mut client = self.connect(endpoint).await?;
        client
            .member_remove(id)
            .await
            .map_err(Error::etcd(format!("member remove {id:x}")))?;
        Ok(())
    }

    /// Promotes a learner. `Ok(false)` when etcd says it has not caught up yet.
    pub async fn promote_member(&self, endpoint: &str, id: u64) -> Result<bool, Error> {
        let mut client = self.connect(endpoint).await?;
        match client.member_promote(id).await {
            Ok(_) => Ok(true),
            Err(etcd_client::Error::GRpcStatus(s))
                if s.message().contains("not in sync") || s.message().contains("not ready") =>
            {
                Ok(false)
            }
            Err(e) => Err(Error::etcd(format!("member promote {id:x}"))(e)),
        }
    }
}
