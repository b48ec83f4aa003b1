//! What a Service routes to, read from its EndpointSlices (there is no kube-proxy here).

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::ListParams;

/// The addresses of the ready endpoints of `service`, sorted, each once.
pub async fn ready_addresses(
    slices: &Api<EndpointSlice>,
    service: &str,
) -> Result<Vec<String>, kube::Error> {
    let selector = format!("kubernetes.io/service-name={service}");
    let mut addresses: Vec<String> = slices
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        .flat_map(|e| e.addresses.iter().cloned())
        .collect();
    addresses.sort();
    addresses.dedup();
    Ok(addresses)
}
