//! The end of a run's checks on the cluster: every key read once more linearizably (recorded,
//! so the last unknown writes are pinned down), and the members' key-value stores compared at
//! one revision: `HashKV` (etcd 3.3 and later), or for older members a digest of a full
//! serializable range read at that revision. Each request goes over TLS when the recorder has
//! [`TlsOptions`].

use std::fmt;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions, TlsOptions};
use sha2::{Digest, Sha256};

use super::classify::describe;
use super::traffic::Traffic;
use crate::wait::poll_until;

/// How long each member may take to reach the revision and answer.
pub const HASH_TIMEOUT: Duration = Duration::from_secs(15);
/// One request's timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// How the stores were compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashMethod {
    /// Maintenance `HashKV` at the revision.
    HashKv,
    /// SHA-256 of a serializable read of every key at the revision (for 3.2).
    RangeDigest,
}

/// One member's hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberHash {
    /// The member's client URL.
    pub endpoint: String,
    /// Its hash (hex), or why there is none.
    pub hash: Result<String, String>,
}

/// The members' stores at one revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HashCheck {
    /// The revision compared.
    pub revision: i64,
    /// How.
    pub method: HashMethod,
    /// Each member's hash.
    pub members: Vec<MemberHash>,
}

impl HashCheck {
    /// Whether every member answered, and with one hash.
    pub fn equal(&self) -> bool {
        let mut hashes = self.members.iter().map(|m| m.hash.as_ref().ok());
        match hashes.next() {
            Some(Some(first)) => hashes.all(|h| h == Some(first)),
            _ => false,
        }
    }
}

impl fmt::Display for HashCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let method = match self.method {
            HashMethod::HashKv => "HashKV",
            HashMethod::RangeDigest => "range digest",
        };
        if self.equal() {
            let hash = self
                .members
                .first()
                .and_then(|m| m.hash.as_ref().ok())
                .map_or("", String::as_str);
            return write!(
                f,
                "equal on {} members at revision {} ({method} {hash})",
                self.members.len(),
                self.revision
            );
        }
        write!(f, "NOT EQUAL at revision {} ({method}):", self.revision)?;
        for m in &self.members {
            match &m.hash {
                Ok(h) => write!(f, " {} {h};", m.endpoint)?,
                Err(e) => write!(f, " {} ({e});", m.endpoint)?,
            }
        }
        Ok(())
    }
}

/// A connection to `endpoint` for the end-of-run requests, over TLS with `tls`.
pub async fn connect(endpoint: &str, tls: Option<&TlsOptions>) -> Result<Client, String> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(REQUEST_TIMEOUT)
        .with_timeout(REQUEST_TIMEOUT);
    // Plain members (a cluster switching to TLS has both kinds) are dialled in plain.
    if let Some(tls) = tls.filter(|_| endpoint.starts_with("https://")) {
        options = options.with_tls(tls.clone());
    }
    Client::connect([endpoint], Some(options))
        .await
        .map_err(|e| describe(&e))
}

/// Reads every key once through the first of `members` that answers (over TLS with `tls`);
/// returns the endpoint and the highest revision read.
pub async fn final_reads(
    traffic: &Traffic,
    client_id: u64,
    members: &[String],
    tls: Option<&TlsOptions>,
) -> Result<(String, i64), String> {
    let mut errors = Vec::new();
    'members: for endpoint in members {
        let mut client = match connect(endpoint, tls).await {
            Ok(client) => client,
            Err(e) => {
                errors.push(format!("{endpoint}: {e}"));
                continue;
            }
        };
        let mut revision = 0;
        for key in &traffic.keys {
            match super::traffic::final_read(traffic, client_id, endpoint, &mut client, key).await {
                Ok(r) => revision = revision.max(r),
                Err(e) => {
                    errors.push(format!("{endpoint}: {e}"));
                    continue 'members;
                }
            }
        }
        return Ok((endpoint.clone(), revision));
    }
    Err(format!(
        "no member answered every final read: {}",
        errors.join("; ")
    ))
}

/// Compares the members' stores at `revision` (over TLS with `tls`).
pub async fn hashes(members: &[String], revision: i64, tls: Option<&TlsOptions>) -> HashCheck {
    let mut method = HashMethod::HashKv;
    let mut results = Vec::new();
    for endpoint in members {
        let mut hash = member_hash(endpoint, revision, method, tls).await;
        // 3.2 has no HashKV: compare range digests, from every member.
        if method == HashMethod::HashKv
            && hash.as_ref().is_err_and(|e| e.starts_with("Unimplemented"))
        {
            method = HashMethod::RangeDigest;
            results.clear();
            for earlier in members.iter().take_while(|m| *m != endpoint) {
                results.push(MemberHash {
                    endpoint: earlier.clone(),
                    hash: member_hash(earlier, revision, method, tls).await,
                });
            }
            hash = member_hash(endpoint, revision, method, tls).await;
        }
        results.push(MemberHash {
            endpoint: endpoint.clone(),
            hash,
        });
    }
    HashCheck {
        revision,
        method,
        members: results,
    }
}

/// One member's hash at `revision`, waiting (up to [`HASH_TIMEOUT`]) for it to apply it.
async fn member_hash(
    endpoint: &str,
    revision: i64,
    method: HashMethod,
    tls: Option<&TlsOptions>,
) -> Result<String, String> {
    let attempt = || async move {
        let client = connect(endpoint, tls).await?;
        let answer = match method {
            HashMethod::HashKv => client
                .maintenance_client()
                .hash_kv(revision)
                .await
                .map(|r| format!("{:08x}", r.hash())),
            HashMethod::RangeDigest => client
                .kv_client()
                .get(
                    "\0",
                    Some(
                        GetOptions::new()
                            .with_from_key()
                            .with_serializable()
                            .with_revision(revision),
                    ),
                )
                .await
                .map(|r| {
                    let mut digest = Sha256::new();
                    for kv in r.kvs() {
                        for part in [kv.key(), kv.value()] {
                            digest.update((part.len() as u64).to_be_bytes());
                            digest.update(part);
                        }
                        for n in [kv.create_revision(), kv.mod_revision(), kv.version()] {
                            digest.update(n.to_be_bytes());
                        }
                    }
                    digest
                        .finalize()
                        .iter()
                        .take(8)
                        .map(|b| format!("{b:02x}"))
                        .collect::<String>()
                }),
        };
        match answer {
            Ok(hash) => Ok(Some(Ok(hash))),
            // Not there yet: ask again.
            Err(e) if describe(&e).contains("future revision") => Err(describe(&e)),
            Err(e) if describe(&e).starts_with("Unimplemented") => Ok(Some(Err(describe(&e)))),
            Err(e) => Err(describe(&e)),
        }
    };
    match poll_until(
        &format!("the hash of {endpoint} at revision {revision}"),
        HASH_TIMEOUT,
        attempt,
    )
    .await
    {
        Ok(result) => result,
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(hashes: &[Result<&str, &str>]) -> HashCheck {
        HashCheck {
            revision: 7,
            method: HashMethod::HashKv,
            members: hashes
                .iter()
                .enumerate()
                .map(|(i, h)| MemberHash {
                    endpoint: format!("m{i}"),
                    hash: h.map(str::to_string).map_err(str::to_string),
                })
                .collect(),
        }
    }

    #[test]
    fn equal_needs_every_member_and_one_hash() {
        assert!(check(&[Ok("a"), Ok("a"), Ok("a")]).equal());
        assert!(!check(&[Ok("a"), Ok("b"), Ok("a")]).equal());
        assert!(!check(&[Ok("a"), Err("down"), Ok("a")]).equal());
        assert!(!check(&[]).equal());
        assert_eq!(
            check(&[Ok("a"), Ok("a")]).to_string(),
            "equal on 2 members at revision 7 (HashKV a)"
        );
        assert_eq!(
            check(&[Ok("a"), Err("down")]).to_string(),
            "NOT EQUAL at revision 7 (HashKV): m0 a; m1 (down);"
        );
    }
}
