//! Calls to etcd's member and maintenance APIs, each with a timeout.

use std::time::Duration;

use etcd_client::{Client, ConnectOptions, MemberAddOptions, TlsOptions};

use crate::error::Error;

/// How to reach the members of one cluster.
#[derive(Clone, Debug)]
pub struct EtcdAccess {
    /// Client TLS, when the members serve clients over TLS.
    pub tls: Option<TlsOptions>,
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
    async fn connect(&self, endpoints: &[String]) -> Result<Client, etcd_client::Error> {
        let mut options = ConnectOptions::new()
            .with_timeout(self.timeout)
            .with_connect_timeout(self.timeout);
        if let Some(tls) = &self.tls {
            options = options.with_tls(tls.clone());
        }
        tokio::time::timeout(self.timeout, Client::connect(endpoints, Some(options)))
            .await
            .map_err(|_| {
                etcd_client::Error::InvalidArgs(format!("connecting to {endpoints:?} timed out"))
            })?
    }

    /// The member list, from any of the endpoints.
    pub async fn member_list(&self, endpoints: &[String]) -> Result<Vec<ListedMember>, Error> {
        let mut client = self
            .connect(endpoints)
            .await
            .map_err(Error::etcd("connect"))?;
        let resp = client
            .member_list()
            .await
            .map_err(Error::etcd("member list"))?;
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
        let eps = [endpoint.to_string()];
        let mut client = self.connect(&eps).await.map_err(Error::etcd("connect"))?;
        let resp = client
            .status()
            .await
            .map_err(Error::etcd(format!("status of {endpoint}")))?;
        Ok(MemberStatus {
            member_id: resp.header().map_or(0, |h| h.member_id()),
            leader: resp.leader(),
            version: resp.version().to_string(),
            errors: resp.errors().to_vec(),
        })
    }

    /// Adds a member (as a learner where asked); returns its ID.
    pub async fn add_member(
        &self,
        endpoints: &[String],
        peer_url: &str,
        learner: bool,
    ) -> Result<u64, Error> {
        let mut client = self
            .connect(endpoints)
            .await
            .map_err(Error::etcd("connect"))?;
        let options = learner.then(|| MemberAddOptions::new().with_is_learner());
        let resp = client
            .member_add([peer_url], options)
            .await
            .map_err(Error::etcd(format!("member add {peer_url}")))?;
        Ok(resp.member().map_or(0, |m| m.id()))
    }

    /// Asks the leader at `leader_endpoint` to hand leadership to member `to`.
    pub async fn move_leader(&self, leader_endpoint: &str, to: u64) -> Result<(), Error> {
        let eps = [leader_endpoint.to_string()];
        let mut client = self.connect(&eps).await.map_err(Error::etcd("connect"))?;
        client
            .move_leader(to)
            .await
            .map_err(Error::etcd(format!("move leader to {to:x}")))?;
        Ok(())
    }

    /// Removes a member.
    pub async fn remove_member(&self, endpoints: &[String], id: u64) -> Result<(), Error> {
        let mut client = self
            .connect(endpoints)
            .await
            .map_err(Error::etcd("connect"))?;
        client
            .member_remove(id)
            .await
            .map_err(Error::etcd(format!("member remove {id:x}")))?;
        Ok(())
    }

    /// Promotes a learner. `Ok(false)` when etcd says it has not caught up yet.
    pub async fn promote_member(&self, endpoints: &[String], id: u64) -> Result<bool, Error> {
        let mut client = self
            .connect(endpoints)
            .await
            .map_err(Error::etcd("connect"))?;
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
