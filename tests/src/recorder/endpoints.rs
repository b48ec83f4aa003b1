//! Where a recorder's client sends each request: a set of endpoints that may change while it
//! runs (a `watch` channel the test feeds), a way to pick one per request, and one
//! connection per endpoint, dropped after a request whose outcome was not an answer and
//! tried again after a back-off.
//!
//! Over `https://` URLs the connections speak TLS with the client's [`TlsOptions`] (the
//! recorder's by default: see [`super::RecorderOptions::tls`]), and each new connection is
//! confirmed by an unrecorded `Status` call before a recorded request goes on it. In TLS 1.3
//! the client's side of the handshake ends before the server has checked the client's
//! certificate, so a refused certificate (expired, from an untrusted CA, missing) reaches the
//! first request on the connection, most often as a bare `Cancelled: operation was canceled`
//! (hyper's `connection closed`) that cannot be told from a connection lost after the request
//! went out. A failed confirmation proves the recorded request was never sent: a fail.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, TlsOptions};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::classify::describe;
use super::traffic::Mix;

/// The first back-off after a failed request on an endpoint; it doubles up to
/// [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest back-off.
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// The connection timeout.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a new TLS connection's confirming `Status` call may take (handshake included).
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(2);

/// How a client picks the endpoint of a request among the current set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    /// The next endpoint for each request, as etcd's Go client does given every member
    /// (kube-apiserver's `--etcd-servers`).
    RoundRobin,
    /// One endpoint until it fails or leaves the set, then the next: a connection through a
    /// Service lands on one backend and stays there.
    Sticky,
}

/// A client of the recorder: its endpoints and how it picks one.
#[derive(Clone, Debug)]
pub struct ClientSpec {
    /// The current endpoints (URLs like `http://10.244.0.5:2379`, or `https://...` with TLS).
    pub endpoints: watch::Receiver<Vec<String>>,
    /// How it picks.
    pub pick: Pick,
    /// Where a sticky client starts in the set (spreads sticky clients over the members).
    pub offset: usize,
    /// This client's operation mix (`None`: the recorder's).
    pub mix: Option<Mix>,
    /// This client's TLS (`None`: the recorder's, [`super::RecorderOptions::tls`]), e.g. a
    /// client presenting a certificate the members do not trust.
    pub tls: Option<TlsOptions>,
    /// TLS options that change (a client that reads its mounted certificate Secret again,
    /// as the kubelet updates it): each new connection takes the latest; connections already
    /// made keep theirs. Overrides [`Self::tls`] when set.
    pub tls_feed: Option<watch::Receiver<TlsOptions>>,
}

impl ClientSpec {
    /// A client pinned to one endpoint.
    pub fn pinned(endpoint: impl Into<String>) -> Self {
        let (_, endpoints) = watch::channel(vec![endpoint.into()]);
        ClientSpec {
            endpoints,
            pick: Pick::Sticky,
            offset: 0,
            mix: None,
            tls: None,
            tls_feed: None,
        }
    }

    /// A client sending each request to the next endpoint of `endpoints`.
    pub fn round_robin(endpoints: watch::Receiver<Vec<String>>) -> Self {
        ClientSpec {
            endpoints,
            pick: Pick::RoundRobin,
            offset: 0,
            mix: None,
            tls: None,
            tls_feed: None,
        }
    }

    /// A client staying on one endpoint of `endpoints` (starting at `offset`) until it fails.
    pub fn sticky(endpoints: watch::Receiver<Vec<String>>, offset: usize) -> Self {
        ClientSpec {
            endpoints,
            pick: Pick::Sticky,
            offset,
            mix: None,
            tls: None,
            tls_feed: None,
        }
    }

    /// The same client with its own operation mix (e.g. a read-only client).
    pub fn with_mix(mut self, mix: Mix) -> Self {
        self.mix = Some(mix);
        self
    }

    /// The same client with its own TLS options (CA, client identity, domain name) instead of
    /// the recorder's.
    pub fn with_tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }
}

/// `n` clients over `endpoints`, alternately round-robin and sticky (the sticky ones
/// starting at different endpoints): the recorder's default mix.
pub fn default_clients(endpoints: &watch::Receiver<Vec<String>>, n: usize) -> Vec<ClientSpec> {
    (0..n)
        .map(|i| {
            if i % 2 == 0 {
                ClientSpec::round_robin(endpoints.clone())
            } else {
                ClientSpec::sticky(endpoints.clone(), i / 2)
            }
        })
        .collect()
}

/// Feeds a `watch` channel from `list`, called every `every`; a failed call keeps the last
/// list. For the client Service's ready endpoints:
///
/// ```ignore
/// let (endpoints, feed) = recorder::feed(Duration::from_millis(500), move || {
///     let slices = slices.clone();
///     async move {
///         let ips = etcd_tests::endpoints::ready_addresses(&slices, "example-client").await?;
///         Ok::<_, kube::Error>(ips.iter().map(|ip| format!("http://{ip}:2379")).collect())
///     }
/// }).await;
/// ```
///
/// The first list is awaited (a failure gives an empty set); the task ends when every
/// receiver is gone, or when the handle is aborted.
pub async fn feed<F, Fut, E>(
    every: Duration,
    mut list: F,
) -> (watch::Receiver<Vec<String>>, JoinHandle<()>)
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Result<Vec<String>, E>> + Send,
    E: Send,
{
    let first = list().await.unwrap_or_default();
    let (tx, rx) = watch::channel(first);
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = tx.closed() => return,
            }
            if let Ok(now) = list().await {
                tx.send_if_modified(|current| {
                    let changed = *current != now;
                    if changed {
                        *current = now;
                    }
                    changed
                });
            }
        }
    });
    (rx, task)
}

/// One endpoint's connection and back-off.
#[derive(Default)]
struct Slot {
    client: Option<Client>,
    failures: u32,
    retry_at: Option<Instant>,
}

/// A client's connections, one per endpoint, and its pick.
pub struct Pool {
    spec: ClientSpec,
    options: ConnectOptions,
    require_leader: bool,
    slots: HashMap<String, Slot>,
    next: usize,
    current: Option<String>,
}

/// The options of a new connection.
fn connect_options(tls: Option<TlsOptions>, require_leader: bool) -> ConnectOptions {
    let options = ConnectOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_keep_alive(Duration::from_secs(1), Duration::from_secs(1))
        .with_require_leader(require_leader);
    match tls {
        Some(tls) => options.with_tls(tls),
        None => options,
    }
}

/// Why [`Pool::client`] has no connection to hand out: the request it was for was never
/// sent.
#[derive(Debug)]
pub enum NoConnection {
    /// The client could not be made (e.g. a bad URL, TLS options for an `http://` URL).
    Connect(etcd_client::Error),
    /// A new TLS connection's confirming `Status` call failed: the member refused the
    /// handshake (e.g. the client's certificate), the client refused the member's
    /// certificate, or the member refused the call.
    Unconfirmed(etcd_client::Error),
    /// A new TLS connection's confirming `Status` call got no answer within
    /// [`CONFIRM_TIMEOUT`].
    Unanswered,
}

impl fmt::Display for NoConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoConnection::Connect(e) => f.write_str(&describe(e)),
            NoConnection::Unconfirmed(e) => write!(
                f,
                "not sent: the new connection's confirming Status call failed: {}",
                describe(e)
            ),
            NoConnection::Unanswered => write!(
                f,
                "not sent: the new connection's confirming Status call got no answer within \
                 {CONFIRM_TIMEOUT:?}"
            ),
        }
    }
}

/// Why no endpoint can be used now.
#[derive(Debug, PartialEq, Eq)]
pub enum Unusable {
    /// The set is empty.
    Empty,
    /// Every endpoint is backing off until then.
    BackingOff(Instant),
}

impl Pool {
    /// The connections of a client made by `spec` (over TLS with `spec.tls`, if any);
    /// `require_leader` makes the server refuse requests (and end watches) while it has no
    /// leader, as kube-apiserver's watches ask.
    pub fn new(spec: ClientSpec, require_leader: bool) -> Self {
        let next = spec.offset;
        let tls = match &spec.tls_feed {
            Some(feed) => Some(feed.borrow().clone()),
            None => spec.tls.clone(),
        };
        let options = connect_options(tls, require_leader);
        Pool {
            spec,
            options,
            require_leader,
            slots: HashMap::new(),
            next,
            current: None,
        }
    }

    /// The endpoint set's receiver (to await a change).
    pub fn endpoints(&mut self) -> &mut watch::Receiver<Vec<String>> {
        &mut self.spec.endpoints
    }

    fn usable(&self, endpoint: &str, now: Instant) -> bool {
        self.slots
            .get(endpoint)
            .and_then(|s| s.retry_at)
            .is_none_or(|t| t <= now)
    }

    /// The endpoint of the next request, by the pick, skipping those backing off.
    pub fn pick(&mut self) -> Result<String, Unusable> {
        let list = self.spec.endpoints.borrow_and_update().clone();
        if list.is_empty() {
            return Err(Unusable::Empty);
        }
        self.slots.retain(|e, _| list.contains(e));
        let now = Instant::now();
        if self.spec.pick == Pick::Sticky
            && let Some(current) = &self.current
            && list.contains(current)
            && self.usable(current, now)
        {
            return Ok(current.clone());
        }
        for i in 0..list.len() {
            let index = (self.next + i) % list.len();
            let Some(endpoint) = list.get(index) else {
                continue;
            };
            if self.usable(endpoint, now) {
                self.next = if self.spec.pick == Pick::RoundRobin {
                    index + 1
                } else {
                    index
                };
                self.current = Some(endpoint.clone());
                return Ok(endpoint.clone());
            }
        }
        let earliest = list
            .iter()
            .filter_map(|e| self.slots.get(e).and_then(|s| s.retry_at))
            .min()
            .unwrap_or(now);
        Err(Unusable::BackingOff(earliest))
    }

    /// The connection to `endpoint`. Over `http://` it is made lazily (connecting happens
    /// with the first request); over `https://` a new one is confirmed by a `Status` call
    /// first (see the module docs). An error means nothing was sent for the caller's request.
    pub async fn client(&mut self, endpoint: &str) -> Result<Client, NoConnection> {
        if let Some(feed) = &mut self.spec.tls_feed
            && feed.has_changed().unwrap_or(false)
        {
            let tls = feed.borrow_and_update().clone();
            self.options = connect_options(Some(tls), self.require_leader);
        }
        let slot = self.slots.entry(endpoint.to_string()).or_default();
        if let Some(client) = &slot.client {
            return Ok(client.clone());
        }
        // TLS options only for `https://` (etcd-client refuses them with `http://`: a cluster
        // switching to TLS has members of both kinds).
        let options = if endpoint.starts_with("https://") {
            self.options.clone()
        } else {
            connect_options(None, self.require_leader)
        };
        let mut client = Client::connect([endpoint], Some(options))
            .await
            .map_err(NoConnection::Connect)?;
        if endpoint.starts_with("https://") {
            match tokio::time::timeout(CONFIRM_TIMEOUT, client.status()).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(NoConnection::Unconfirmed(e)),
                Err(_) => return Err(NoConnection::Unanswered),
            }
        }
        slot.client = Some(client.clone());
        Ok(client)
    }

    /// An answer came from `endpoint`: its back-off is over.
    pub fn succeeded(&mut self, endpoint: &str) {
        if let Some(slot) = self.slots.get_mut(endpoint) {
            slot.failures = 0;
            slot.retry_at = None;
        }
    }

    /// A request to `endpoint` got no answer: drop its connection and back off (for a sticky
    /// client, the next request goes to the next endpoint).
    pub fn failed(&mut self, endpoint: &str) {
        let slot = self.slots.entry(endpoint.to_string()).or_default();
        slot.client = None;
        let factor = 1u32 << slot.failures.min(8);
        slot.retry_at =
            Some(Instant::now() + FIRST_BACKOFF.saturating_mul(factor).min(MAX_BACKOFF));
        slot.failures = slot.failures.saturating_add(1);
        if self.current.as_deref() == Some(endpoint) {
            self.current = None;
            self.next += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("http://127.0.0.1:{}", 2379 + i))
            .collect()
    }

    #[tokio::test]
    async fn round_robin_and_sticky_picks() {
        let (tx, rx) = watch::channel(urls(3));
        let mut rr = Pool::new(ClientSpec::round_robin(rx.clone()), false);
        let picks: Vec<String> = (0..4).filter_map(|_| rr.pick().ok()).collect();
        assert_eq!(picks, [&urls(3)[..], &urls(1)[..]].concat());

        let mut sticky = Pool::new(ClientSpec::sticky(rx.clone(), 1), false);
        assert_eq!(sticky.pick(), Ok(urls(3)[1].clone()));
        assert_eq!(sticky.pick(), Ok(urls(3)[1].clone()));
        sticky.failed(&urls(3)[1]);
        assert_eq!(
            sticky.pick(),
            Ok(urls(3)[2].clone()),
            "moves on after a failure"
        );
        // The set changes: the current endpoint leaves it.
        tx.send(urls(2)).expect("send");
        assert_eq!(sticky.pick(), Ok(urls(3)[0].clone()));
        // Every endpoint backing off (the one that failed first still is).
        sticky.failed(&urls(3)[0]);
        assert!(matches!(sticky.pick(), Err(Unusable::BackingOff(_))));
        sticky.succeeded(&urls(3)[1]);
        assert_eq!(sticky.pick(), Ok(urls(3)[1].clone()));
        tx.send(Vec::new()).expect("send");
        assert_eq!(sticky.pick(), Err(Unusable::Empty));
    }

    #[tokio::test]
    async fn a_feed_publishes_changes_and_keeps_the_last_list_on_errors() {
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = calls.clone();
        let (mut rx, task) = feed(Duration::from_millis(10), move || {
            let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                match n {
                    0 => Ok(urls(1)),
                    1 | 2 => Err("the API server is away"),
                    _ => Ok(urls(2)),
                }
            }
        })
        .await;
        assert_eq!(*rx.borrow_and_update(), urls(1));
        let changed = tokio::time::timeout(Duration::from_secs(5), rx.changed()).await;
        assert!(matches!(changed, Ok(Ok(()))), "{changed:?}");
        assert_eq!(*rx.borrow(), urls(2), "the errors kept the first list");
        assert!(calls.load(std::sync::atomic::Ordering::SeqCst) >= 4);
        drop(rx);
        let ended = tokio::time::timeout(Duration::from_secs(5), task).await;
        assert!(
            matches!(ended, Ok(Ok(()))),
            "the feed ends with its receivers"
        );
    }

    #[test]
    fn the_default_clients_alternate() {
        let (_tx, rx) = watch::channel(urls(3));
        let specs = default_clients(&rx, 4);
        let picks: Vec<(Pick, usize)> = specs.iter().map(|s| (s.pick, s.offset)).collect();
        assert_eq!(
            picks,
            [
                (Pick::RoundRobin, 0),
                (Pick::Sticky, 0),
                (Pick::RoundRobin, 0),
                (Pick::Sticky, 1)
            ]
        );
    }

    #[test]
    fn the_back_off_doubles_to_its_cap() {
        let (_tx, rx) = watch::channel(urls(1));
        let mut pool = Pool::new(ClientSpec::round_robin(rx), false);
        let mut waits = Vec::new();
        for _ in 0..6 {
            let before = Instant::now();
            pool.failed(&urls(1)[0]);
            let at = pool
                .slots
                .get(&urls(1)[0])
                .and_then(|s| s.retry_at)
                .expect("set");
            waits.push((at - before).as_millis() / 100);
        }
        assert_eq!(waits, [1, 2, 4, 8, 10, 10]);
    }
}
