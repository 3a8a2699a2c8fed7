//! A kube-apiserver restart and an etcd outage, as clients see them.
//!
//! The restart follows `tests/apiserver-recordings/restart/` (kube-apiserver v1.36.2 killed with
//! SIGKILL, down 10 s, started again, probed every 0.2 s; etcd kept running):
//! - [`TestApiServer::kill`]: open connections are reset (watches end with an incomplete read,
//!   requests in flight get no answer), then new connections are refused: the listening socket
//!   is closed until the restart.
//! - [`TestApiServer::restart`] (after `kill` or [`TestApiServer::set_down`]): the server
//!   listens again with everything etcd held, and for the windows of [`Restart`], counted from
//!   its first answer:
//!   - `/readyz` answers 500 with the recorded list of failed post-start hooks;
//!   - custom resources (every path of a CRD's group) answer 503 `the request has been made
//!     before all known HTTP paths have been installed, please try again`, reason
//!     `ServiceUnavailable`, `retryAfterSeconds: 5` and `Retry-After: 5`, after authorization
//!     (a request RBAC refuses gets its 403 first);
//!   - RBAC's caches are empty: every user outside system:masters (a service account, whether
//!     authenticated as one or impersonated) is refused with the usual 403 wording and no
//!     reason, the `impersonate` check of a requester outside system:masters included;
//!   - the watch cache is new: a watch resumed from a resourceVersion of before the restart
//!     answers 200 with one `ERROR` event, 410 `Expired`, `too old resource version: OLD (NEW)`
//!     (the server wrote once on starting, so every earlier resourceVersion is too old), and
//!     the watch history is gone.
//!
//!   Core and built-in resources and discovery answer at once.
//!
//! The etcd outage ([`TestApiServer::set_storage_down`]) is not recorded; it follows what
//! kube-apiserver's storage layer does with etcd unreachable: requests that read or write etcd
//! (gets, lists without `resourceVersion=0`, every write) wait for it until the request timeout
//! (60 s, kube-apiserver's `--request-timeout`; [`TestApiServer::set_storage_timeout`]) and then
//! answer 504 `Timeout`, or go through when etcd is back in time; the watch cache stops: open
//! watches end once they have sent the events it already had, and new watches and lists served
//! from it answer 429 `storage is (re)initializing` (`retryAfterSeconds: 1`); `/readyz` answers
//! 500 (`[-]etcd failed`). When etcd is back the watch cache starts again from a fresh list: the
//! watch history is gone, so watches resumed from before get 410 `Expired`.
//!
//! Known differences: discovery (`/apis`) lists the CRD groups at once (the recordings leave
//! its body out); `/healthz` and `/livez` always answer ok; the windows are fixed lengths, where
//! a real server's depend on its load (readyz took 7.6 s and 3.0 s in the two runs).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use super::errors::ApiError;
use super::store::State;
use super::{Inner, Reply, Req, Route, TestApiServer};

/// The windows of a restart, counted from the moment the server answers again. The defaults
/// are the longest of the two recorded runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Restart {
    /// `/readyz` answers 500 (7.6 s and 3.0 s recorded).
    pub not_ready: Duration,
    /// Custom resources answer 503 (2.35 s and 1.71 s recorded).
    pub custom_resources: Duration,
    /// Users outside system:masters are refused, RBAC's caches being empty (1.36 s recorded).
    pub rbac: Duration,
}

impl Default for Restart {
    fn default() -> Restart {
        Restart {
            not_ready: Duration::from_millis(7600),
            custom_resources: Duration::from_millis(2400),
            rbac: Duration::from_millis(1400),
        }
    }
}

/// kube-apiserver's default `--request-timeout`: how long a request waits for etcd.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// What `/readyz` answers while the post-start hooks run (run1-samples/readyz-500-17.txt).
const NOT_READY: &str = "[+]ping ok
[+]log ok
[-]informer-sync failed: reason withheld
[+]poststarthook/start-apiserver-admission-initializer ok
[+]poststarthook/generic-apiserver-start-informers ok
[+]poststarthook/priority-and-fairness-config-consumer ok
[+]poststarthook/priority-and-fairness-filter ok
[+]poststarthook/storage-object-count-tracker-hook ok
[+]poststarthook/start-apiextensions-informers ok
[-]poststarthook/start-apiextensions-controllers failed: reason withheld
[-]poststarthook/crd-informer-synced failed: reason withheld
[+]poststarthook/start-system-namespaces-controller ok
[+]poststarthook/peer-endpoint-reconciler-controller ok
[+]poststarthook/start-cluster-authentication-info-controller ok
[-]poststarthook/start-kube-apiserver-identity-lease-controller failed: reason withheld
[+]poststarthook/start-kube-apiserver-identity-lease-garbage-collector ok
[+]poststarthook/storage-readiness ok
[+]poststarthook/start-legacy-token-tracking-controller ok
[-]poststarthook/start-service-ip-repair-controllers failed: reason withheld
[-]poststarthook/rbac/bootstrap-roles failed: reason withheld
[-]poststarthook/scheduling/bootstrap-system-priority-classes failed: reason withheld
[-]poststarthook/priority-and-fairness-config-producer failed: reason withheld
[-]poststarthook/bootstrap-controller failed: reason withheld
[-]poststarthook/start-kubernetes-service-cidr-controller failed: reason withheld
[+]poststarthook/aggregator-reload-proxy-client-cert ok
[+]poststarthook/start-kube-aggregator-informers ok
[+]poststarthook/apiservice-status-local-available-controller ok
[+]poststarthook/apiservice-status-remote-available-controller ok
[-]poststarthook/apiservice-registration-controller failed: reason withheld
[+]poststarthook/apiservice-wait-for-first-sync ok
[-]poststarthook/apiservice-discovery-controller failed: reason withheld
[+]poststarthook/kube-apiserver-autoregistration ok
[-]autoregister-completion failed: reason withheld
[+]poststarthook/apiservice-openapi-controller ok
[+]poststarthook/apiservice-openapiv3-controller ok
[+]shutdown ok
readyz check failed
";

/// What `/readyz` answers while etcd is unreachable.
const ETCD_DOWN: &str = "[+]ping ok
[+]log ok
[-]etcd failed: reason withheld
[+]etcd-readiness ok
[+]informer-sync ok
[+]poststarthook/start-apiextensions-informers ok
[+]poststarthook/start-apiextensions-controllers ok
[+]poststarthook/crd-informer-synced ok
[+]poststarthook/rbac/bootstrap-roles ok
[+]shutdown ok
readyz check failed
";

/// The restart and storage state of one server.
pub(super) struct Lifecycle {
    /// Killed: the listening socket is closed and no connection is served.
    killed: AtomicBool,
    /// Counts kills: a connection accepted before a kill is reset by it.
    kills: tokio::sync::watch::Sender<u64>,
    /// The last restart: when the server answered again, and its windows.
    back: Mutex<Option<(Instant, Restart)>>,
    /// etcd is unreachable.
    storage_down: tokio::sync::watch::Sender<bool>,
    /// Counts the times etcd went away: a watch opened before is ended.
    storage_losses: std::sync::atomic::AtomicU64,
    /// The resourceVersion when etcd last went away: what the watch cache had.
    storage_lost_at: std::sync::atomic::AtomicU64,
    storage_timeout: Mutex<Duration>,
    /// The request a test holds ([`TestApiServer::hold`]).
    holds: Mutex<Holds>,
    holds_tx: tokio::sync::watch::Sender<u64>,
}

impl Lifecycle {
    pub(super) fn new() -> Lifecycle {
        Lifecycle {
            killed: AtomicBool::new(false),
            kills: tokio::sync::watch::channel(0).0,
            back: Mutex::new(None),
            storage_down: tokio::sync::watch::channel(false).0,
            storage_losses: std::sync::atomic::AtomicU64::new(0),
            storage_lost_at: std::sync::atomic::AtomicU64::new(0),
            storage_timeout: Mutex::new(REQUEST_TIMEOUT),
            holds: Mutex::new(Holds::default()),
            holds_tx: tokio::sync::watch::channel(0).0,
        }
    }

    pub(super) fn killed(&self) -> bool {
        self.killed.load(Ordering::SeqCst)
    }

    /// A receiver that changes at the next kill.
    pub(super) fn kills(&self) -> tokio::sync::watch::Receiver<u64> {
        self.kills.subscribe()
    }

    /// Resolves once the server is no longer killed.
    pub(super) async fn until_alive(&self) {
        let mut kills = self.kills.subscribe();
        while self.killed() {
            if kills.changed().await.is_err() {
                return;
            }
        }
    }

    /// How long ago the server answered again, if a restart's window of `which` is still open.
    fn within(&self, which: impl Fn(&Restart) -> Duration) -> bool {
        let back = *self.back.lock().unwrap_or_else(|e| e.into_inner());
        back.is_some_and(|(at, windows)| at.elapsed() < which(&windows))
    }

    /// RBAC's caches are still empty after a restart.
    pub(super) fn rbac_unsynced(&self) -> bool {
        self.within(|w| w.rbac)
    }

    pub(super) fn storage_down(&self) -> bool {
        *self.storage_down.borrow()
    }

    /// How many times etcd went away so far.
    pub(super) fn storage_losses(&self) -> u64 {
        self.storage_losses.load(Ordering::SeqCst)
    }

    /// The resourceVersion when etcd last went away.
    pub(super) fn storage_lost_at(&self) -> u64 {
        self.storage_lost_at.load(Ordering::SeqCst)
    }

    /// What the restart or an unreachable etcd answers instead of the handler, after
    /// authentication and authorization: `/readyz` not ok, a custom resource not served yet.
    pub(super) fn interpose(&self, req: &Req, route: &Route, state: &State) -> Option<Reply> {
        if req.path == "/readyz" {
            if self.storage_down() {
                return Some(Reply::Text(500, ETCD_DOWN.to_string()));
            }
            if self.within(|w| w.not_ready) {
                return Some(Reply::Text(500, NOT_READY.to_string()));
            }
            return None;
        }
        let custom = match route {
            Route::Resource(t) => t.rt.is_custom(),
            Route::Group(g) | Route::ResourceList(g, _) => state.custom_groups.contains(g),
            _ => false,
        };
        (custom && self.within(|w| w.custom_resources)).then(|| Reply::error(paths_not_installed()))
    }
}

/// The 503 of kube-apiserver's not-found handler before every path is installed.
fn paths_not_installed() -> ApiError {
    let mut e = ApiError::new(
        503,
        "ServiceUnavailable",
        "the request has been made before all known HTTP paths have been installed, please try again",
        Some(json!({"retryAfterSeconds": 5})),
    );
    e.retry_after = Some(5);
    e
}

/// The 504 of a request that waited for etcd for the whole request timeout.
fn storage_timeout() -> ApiError {
    ApiError::new(
        504,
        "Timeout",
        "Timeout: request did not complete within requested timeout - context deadline exceeded",
        Some(json!({})),
    )
}

/// The 429 of the watch cache while it starts again.
fn cache_initializing() -> ApiError {
    let mut e = ApiError::new(
        429,
        "TooManyRequests",
        "storage is (re)initializing",
        Some(json!({"retryAfterSeconds": 1})),
    );
    e.retry_after = Some(1);
    e
}

/// How a request meets etcd: not at all (discovery, health, reviews), through the watch cache
/// (watches, lists at `resourceVersion=0`), or directly.
#[derive(Debug, PartialEq)]
enum Storage {
    None,
    Cache,
    Direct,
}

fn storage_of(req: &Req) -> Storage {
    let segments: Vec<&str> = req.path.split('/').filter(|s| !s.is_empty()).collect();
    let resource = match segments.as_slice() {
        ["api", "v1", rest @ ..] => !rest.is_empty(),
        ["apis", _, _, rest @ ..] => !rest.is_empty(),
        _ => false,
    };
    let virtual_kind = segments
        .last()
        .is_some_and(|s| s.ends_with("accessreviews"));
    if !resource || virtual_kind {
        return Storage::None;
    }
    if req.method == http::Method::GET
        && (req.flag("watch") || req.param("resourceVersion") == Some("0"))
    {
        return Storage::Cache;
    }
    Storage::Direct
}

/// While etcd is unreachable: a request that needs it waits until it is back (then None: served
/// as usual) or until the request timeout (504); one served from the watch cache gets 429.
pub(super) async fn storage_gate(inner: &Inner, req: &Req) -> Option<ApiError> {
    let lifecycle = &inner.lifecycle;
    if !lifecycle.storage_down() {
        return None;
    }
    match storage_of(req) {
        Storage::None => None,
        Storage::Cache => Some(cache_initializing()),
        Storage::Direct => {
            let timeout = *lifecycle
                .storage_timeout
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let mut down = lifecycle.storage_down.subscribe();
            let back = down.wait_for(|down| !*down);
            match tokio::time::timeout(timeout, back).await {
                Ok(_) => None,
                Err(_) => Some(storage_timeout()),
            }
        }
    }
}

/// A request to hold ([`TestApiServer::hold`]): the next one with this method whose path (with
/// query) contains this, and from this client when one is named.
#[derive(Debug, Clone)]
struct HoldRule {
    method: String,
    contains: String,
    client: Option<String>,
}

/// The held request, and what to do with it.
#[derive(Default)]
pub(super) struct Holds {
    rule: Option<HoldRule>,
    /// A request is held now.
    holding: bool,
    /// Let the held request go on (true) or answer nothing (false), once decided.
    decided: Option<bool>,
}

/// Holds the request if a rule asks for it, until the test lets it go on (None: served as
/// usual) or drops it (Some: it never reached the server; the connection is closed).
pub(super) async fn hold_gate(inner: &Inner, req: &Req) -> Option<()> {
    let mut changes = inner.lifecycle.holds_tx.subscribe();
    {
        let mut holds = inner
            .lifecycle
            .holds
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let full = if req.query.is_empty() {
            req.path.clone()
        } else {
            format!("{}?{}", req.path, req.query)
        };
        let client = req.header(super::CLIENT_HEADER);
        // A dry run (the drift check's applies) changes nothing, so it marks no stage.
        let matches = !req.dry_run()
            && holds.rule.as_ref().is_some_and(|rule| {
                rule.method == req.method.as_str()
                    && full.contains(&rule.contains)
                    && rule.client.as_deref().is_none_or(|c| Some(c) == client)
            });
        if !matches {
            return None;
        }
        holds.rule = None;
        holds.holding = true;
        holds.decided = None;
    }
    inner.lifecycle.holds_tx.send_modify(|n| *n += 1);
    loop {
        let decided = inner
            .lifecycle
            .holds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .decided;
        if let Some(go_on) = decided {
            let mut holds = inner
                .lifecycle
                .holds
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            holds.holding = false;
            holds.decided = None;
            return (!go_on).then_some(());
        }
        if changes.changed().await.is_err() {
            return None;
        }
    }
}

/// A connection's socket: reset (an RST, not a FIN) when dropped after a kill, as the sockets of
/// a killed process are.
pub(super) struct Conn {
    stream: tokio::net::TcpStream,
    inner: Arc<Inner>,
}

impl Conn {
    pub(super) fn new(stream: tokio::net::TcpStream, inner: Arc<Inner>) -> Conn {
        Conn { stream, inner }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.inner.lifecycle.killed() {
            let _ = self.stream.set_zero_linger();
        }
    }
}

impl tokio::io::AsyncRead for Conn {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Conn {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Binds `addr` again after a kill, retrying while the port is not free yet.
pub(super) async fn rebind(addr: std::net::SocketAddr) -> tokio::net::TcpListener {
    let mut wait = Duration::from_millis(10);
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => return listener,
            Err(e) => {
                if wait >= Duration::from_secs(1) {
                    eprintln!("test API server: binding {addr} again: {e}; retrying");
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(1));
            }
        }
    }
}

impl TestApiServer {
    /// Kills the server as SIGKILL kills kube-apiserver: every open connection is reset (open
    /// watches end with an incomplete read, requests in flight get no answer) and new
    /// connections are refused until [`TestApiServer::restart`]. Nothing stored is lost (etcd
    /// keeps running). [`TestApiServer::set_down`] is the plain network blip.
    pub fn kill(&self) {
        let lifecycle = &self.inner.lifecycle;
        lifecycle.killed.store(true, Ordering::SeqCst);
        lifecycle.kills.send_modify(|n| *n += 1);
        // Wakes the watch streams, which end.
        self.inner.rv_tx.send_modify(|_| {});
    }

    /// Starts a killed (or down) server again as a restarted kube-apiserver answers, with the
    /// recorded windows ([`Restart::default`]).
    pub fn restart(&self) {
        self.restart_with(Restart::default());
    }

    /// [`TestApiServer::restart`] with these windows.
    pub fn restart_with(&self, windows: Restart) {
        {
            let mut state = self.inner.lock();
            // The writes of a starting kube-apiserver (its identity Lease, the kubernetes
            // Endpoints): every resourceVersion seen before is older than the new watch cache.
            state.rv += 1;
            state.compact();
        }
        let lifecycle = &self.inner.lifecycle;
        *lifecycle.back.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), windows));
        lifecycle.killed.store(false, Ordering::SeqCst);
        lifecycle.kills.send_modify(|n| *n += 1);
        self.inner.down.store(false, Ordering::SeqCst);
        self.inner.rv_tx.send_modify(|_| {});
    }

    /// Kills the server, waits `down`, and restarts it with the recorded windows.
    pub async fn kill_and_restart(&self, down: Duration) {
        self.kill();
        tokio::time::sleep(down).await;
        self.restart();
    }

    /// Whether `/readyz` would answer ok now (no restart window, etcd reachable).
    pub fn is_ready(&self) -> bool {
        let lifecycle = &self.inner.lifecycle;
        !self.inner.is_down() && !lifecycle.storage_down() && !lifecycle.within(|w| w.not_ready)
    }

    /// Makes etcd unreachable (true) or reachable again (false): see the module's description.
    /// Back, the watch cache starts again from a fresh list and its history is gone.
    pub fn set_storage_down(&self, down: bool) {
        let lifecycle = &self.inner.lifecycle;
        if down {
            let rv = self.inner.lock().rv;
            lifecycle.storage_lost_at.store(rv, Ordering::SeqCst);
            lifecycle.storage_losses.fetch_add(1, Ordering::SeqCst);
        } else {
            self.inner.lock().compact();
        }
        lifecycle.storage_down.send_replace(down);
        // Wakes the watch streams, which end when etcd went away.
        self.inner.rv_tx.send_modify(|_| {});
    }

    /// Holds the next request with `method` whose path (with query) contains `contains`, sent
    /// by `client` when one is named ([`TestApiServer::config_as`]), before the server looks at
    /// it: a test kills its sender at that very point ([`TestApiServer::held`]), then drops it
    /// ([`TestApiServer::drop_held`]: it never reached the server) or lets it go on
    /// ([`TestApiServer::release_held`]). One rule at a time; a new one replaces the last. A dry
    /// run (`dryRun=All`) is never held: it changes nothing.
    pub fn hold(&self, method: &str, contains: &str, client: Option<&str>) {
        let lifecycle = &self.inner.lifecycle;
        let mut holds = lifecycle.holds.lock().unwrap_or_else(|e| e.into_inner());
        holds.rule = Some(HoldRule {
            method: method.to_uppercase(),
            contains: contains.to_string(),
            client: client.map(str::to_string),
        });
    }

    /// Whether a request is held now.
    pub fn held(&self) -> bool {
        self.inner
            .lifecycle
            .holds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .holding
    }

    /// Waits until a request is held, at most `timeout`; whether one is.
    pub async fn wait_held(&self, timeout: Duration) -> bool {
        let mut changes = self.inner.lifecycle.holds_tx.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.held() {
                return true;
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                return self.held();
            }
        }
    }

    /// Forgets the held request: it is not served (its connection is closed unanswered), as if
    /// its sender had died before sending it. A rule that held nothing yet is forgotten too.
    pub fn drop_held(&self) {
        self.decide_held(false);
    }

    /// Lets the held request go on.
    pub fn release_held(&self) {
        self.decide_held(true);
    }

    fn decide_held(&self, go_on: bool) {
        let lifecycle = &self.inner.lifecycle;
        {
            let mut holds = lifecycle.holds.lock().unwrap_or_else(|e| e.into_inner());
            holds.rule = None;
            if holds.holding {
                holds.decided = Some(go_on);
            }
        }
        lifecycle.holds_tx.send_modify(|n| *n += 1);
    }

    /// How long a request waits for an unreachable etcd before its 504 (60 s by default).
    pub fn set_storage_timeout(&self, timeout: Duration) {
        *self
            .inner
            .lifecycle
            .storage_timeout
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = timeout;
    }
}
