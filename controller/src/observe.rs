//! Observation: the member pods, data claims and etcd members of one cluster, turned into
//! the planner's model.

use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::Api;

use etcd_client::{Certificate, Identity, TlsOptions};
use etcd_shared::names::{self, CLIENT_PORT};
use etcd_shared::version::EtcdVersion;

use crate::builders::ClusterView;
use crate::cache::{self, Caches};
use crate::error::Error;
use crate::etcd::{EtcdAccess, ListedMember};
use crate::planner::{Health, MemberState, Observed, PodPhase, PodState};

/// Everything observed, with the pods as read (the executor needs their IPs).
pub struct Observation {
    /// The planner's model.
    pub model: Observed,
    /// Client endpoints of the member pods that run with an IP, by member name.
    pub member_endpoints: Vec<(String, String)>,
    /// How to reach etcd.
    pub access: EtcdAccess,
    /// Members whose health check failed, with the reason.
    pub health_failures: Vec<(String, String)>,
}

impl Observation {
    /// The client endpoints of every member pod that runs with an IP.
    pub fn endpoints(&self) -> Vec<String> {
        self.member_endpoints
            .iter()
            .map(|(_, endpoint)| endpoint.clone())
            .collect()
    }

    /// The client endpoint of one member's running pod.
    pub fn endpoint_of(&self, member: &str) -> Option<&str> {
        self.member_endpoints
            .iter()
            .find(|(name, _)| name == member)
            .map(|(_, endpoint)| endpoint.as_str())
    }
}

fn pod_state(pod: &Pod, now: Timestamp) -> Option<PodState> {
    let name = pod.metadata.name.clone()?;
    let status = pod.status.as_ref();
    let age = pod
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| (now.as_second() - t.0.as_second()).max(0));
    let image = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == "etcd"))
        .and_then(|c| c.image.clone())
        .unwrap_or_default();
    let version = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(names::LABEL_VERSION))
        .and_then(|v| v.parse::<EtcdVersion>().ok());
    let restarts = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == "etcd"))
        .map_or(0, |c| c.restart_count);
    let restarts_at_upgrade = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::ANNOTATION_RESTARTS_AT_UPGRADE))
        .and_then(|n| n.parse().ok());
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    Some(PodState {
        name,
        version,
        image,
        restarts,
        restarts_at_upgrade,
        phase: PodPhase::parse(status.and_then(|s| s.phase.as_deref())),
        ready,
        ip: status
            .and_then(|s| s.pod_ip.clone())
            .filter(|ip| !ip.is_empty()),
        terminating: pod.metadata.deletion_timestamp.is_some(),
        age: Duration::from_secs(u64::try_from(age).unwrap_or(0)),
    })
}

/// The client endpoint of a pod IP.
fn endpoint(view: &ClusterView, ip: &str) -> String {
    if ip.contains(':') {
        format!("{}://[{ip}]:{CLIENT_PORT}", view.client_scheme())
    } else {
        format!("{}://{ip}:{CLIENT_PORT}", view.client_scheme())
    }
}

/// The operator's client TLS from its Secret (etcd-client.crt, etcd-client.key, etcd-client-ca.crt).
async fn operator_tls(
    client: &kube::Client,
    view: &ClusterView,
) -> Result<Option<TlsOptions>, Error> {
    let Some(secret_name) = &view.tls.operator_secret else {
        return Ok(None);
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &view.namespace);
    let secret = secrets
        .get_opt(secret_name)
        .await
        .map_err(Error::kube(format!("get secret {secret_name}")))?
        .ok_or_else(|| Error::OperatorTls {
            secret: secret_name.clone(),
            reason: "not found".into(),
        })?;
    let data = secret.data.unwrap_or_default();
    let get = |key: &str| {
        data.get(key)
            .map(|b| b.0.clone())
            .ok_or_else(|| Error::OperatorTls {
                secret: secret_name.clone(),
                reason: format!("has no key {key}"),
            })
    };
    let (cert, key, ca) = (
        get("etcd-client.crt")?,
        get("etcd-client.key")?,
        get("etcd-client-ca.crt")?,
    );
    // Members are dialled by IP; their certificates name the member DNS names.
    let domain = view.member_host(&names::member_name(&view.name, 0));
    let wildcard_domain = domain
        .split_once('.')
        .map_or(domain.clone(), |(_, rest)| format!("member.{rest}"));
    Ok(Some(
        TlsOptions::new()
            .ca_certificate(Certificate::from_pem(ca))
            .identity(Identity::from_pem(cert, key))
            .domain_name(wildcard_domain),
    ))
}

fn member_name(view: &ClusterView, m: &ListedMember) -> String {
    m.peer_urls
        .iter()
        .find_map(|u| view.member_of_peer_url(u))
        .or_else(|| (!m.name.is_empty()).then(|| m.name.clone()))
        .unwrap_or_else(|| format!("unknown-{:x}", m.id))
}

/// Reads the pods, claims and etcd members of a cluster.
pub async fn observe(
    client: &kube::Client,
    caches: &Caches,
    view: &ClusterView,
    bootstrapped: bool,
    timeout: Duration,
) -> Result<Observation, Error> {
    let now = Timestamp::now();
    let mut pod_selector = names::selector_labels(&view.name);
    pod_selector.insert(names::LABEL_COMPONENT.into(), "member".into());
    let mut claim_selector = names::selector_labels(&view.name);
    claim_selector.insert(names::LABEL_COMPONENT.into(), "data".into());
    let pods = cache::select(&caches.pods, &view.namespace, &pod_selector);
    let claims = cache::select(&caches.claims, &view.namespace, &claim_selector);
    let tls = operator_tls(client, view).await?;
    let pods: Vec<PodState> = pods.iter().filter_map(|p| pod_state(p, now)).collect();
    let claims: Vec<String> = claims
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter_map(|c| {
            c.metadata
                .labels
                .as_ref()?
                .get(names::LABEL_MEMBER)
                .cloned()
        })
        .collect();

    let access = EtcdAccess { tls, timeout };
    let by_ip: Vec<(String, String)> = pods
        .iter()
        .filter(|p| !p.terminating && p.phase == PodPhase::Running)
        .filter_map(|p| Some((p.name.clone(), endpoint(view, p.ip.as_deref()?))))
        .collect();
    let endpoints: Vec<String> = by_ip.iter().map(|(_, e)| e.clone()).collect();

    let mut health_failures = Vec::new();
    let members = if endpoints.is_empty() {
        Err("no member pod is running with an IP yet".to_string())
    } else {
        match access.member_list(&endpoints).await {
            Err(e) => Err(e.to_string()),
            Ok(listed) => {
                let checks = listed.iter().map(|m| {
                    let name = member_name(view, m);
                    let ep = by_ip
                        .iter()
                        .find(|(n, _)| *n == name)
                        .map(|(_, e)| e.clone());
                    let access = access.clone();
                    async move {
                        let health = match ep {
                            None => Health::Unhealthy("no running pod".into()),
                            Some(ep) => match access.status(&ep).await {
                                Err(e) => Health::Unhealthy(e.to_string()),
                                Ok(s) if s.leader == 0 => Health::Unhealthy("no leader".into()),
                                Ok(s) if !s.errors.is_empty() => {
                                    Health::Unhealthy(s.errors.join("; "))
                                }
                                Ok(s) => Health::Healthy {
                                    version: s.version.parse().ok(),
                                    leader: s.leader == s.member_id,
                                },
                            },
                        };
                        (m, name, health)
                    }
                });
                let mut states = Vec::new();
                for (m, name, health) in join_all(checks).await {
                    if let Health::Unhealthy(why) = &health
                        && !m.name.is_empty()
                    {
                        health_failures.push((name.clone(), why.clone()));
                    }
                    states.push(MemberState {
                        id: m.id,
                        name,
                        learner: m.learner,
                        started: !m.name.is_empty(),
                        health,
                    });
                }
                Ok(states)
            }
        }
    };
    Ok(Observation {
        model: Observed {
            pods,
            claims,
            members,
            bootstrapped,
        },
        member_endpoints: by_ip,
        access,
        health_failures,
    })
}
