//! How one API server has been answering this process, seen on every request of the clients
//! made by [`client`]: away (a request got no HTTP answer: connection refused or reset), back
//! (it answered again after being away), and starting (it came back moments ago, answered 503
//! with `Retry-After` because not every path is installed yet, or its `/readyz` is not ok).
//!
//! A kube-apiserver that starts again (`tests/apiserver-recordings/restart/`) answers core
//! requests at once, custom resources 503 for seconds, and refuses every service account for
//! about a second and a half while RBAC's caches load: a refusal then says nothing about the
//! request. [`Health::starting`] is what the one classifier of API errors
//! ([`super::Cluster::error`]) reads to tell such a refusal from a final one; [`Health::backs`]
//! is what the watches ([`reconnecting`]), the shard keeping and the wake-up of the releases in
//! progress wait on, so that they go on when the server answers, not at their next backoff.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use http::{Request, Response, StatusCode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use kube::runtime::watcher;

/// How long after the API server answers again its refusals are not believed, and how long a
/// `/readyz` answer or a 503 with `Retry-After` counts: the recorded restarts refused service
/// accounts for 1.4 s and said not ready for 3 to 7.6 s after they answered again.
pub const STARTING_FOR: Duration = Duration::from_secs(10);

/// How long requests must have got no answer before the next answer counts as the server being
/// back.
const AWAY_AT_LEAST: Duration = Duration::from_secs(1);

/// What has been seen of one API server.
#[derive(Debug, Default)]
struct Seen {
    /// Since when requests get no HTTP answer; None while it answers.
    away_since: Option<Instant>,
    /// When it last answered again after being away.
    back_at: Option<Instant>,
    /// When it last answered 503 with `Retry-After` (paths not installed yet).
    unavailable_at: Option<Instant>,
    /// The last `/readyz` answer: ok or not, and when.
    ready: Option<(bool, Instant)>,
    /// A `/readyz` request is on its way.
    probing: bool,
    /// The spans in which the server was away or starting, oldest first, at most
    /// [`KEPT_OUTAGES`]: what [`Health::outages`] hands to the timeouts.
    outages: std::collections::VecDeque<(Instant, Instant)>,
}

/// How many spans of outage a [`Health`] keeps (an operation is bounded by its timeout, and the
/// spans before it do not count).
const KEPT_OUTAGES: usize = 64;

impl Seen {
    /// The server was away or starting from `from` to `to` (which may be ahead).
    fn outage(&mut self, from: Instant, to: Instant) {
        if let Some(last) = self.outages.back_mut()
            && from <= last.1
        {
            last.1 = last.1.max(to);
            last.0 = last.0.min(from);
            return;
        }
        if self.outages.len() == KEPT_OUTAGES {
            self.outages.pop_front();
        }
        self.outages.push_back((from, to));
    }
}

/// The health of one API server, shared by every client of it ([`client`]).
pub struct Health {
    seen: Mutex<Seen>,
    /// Counts the times the server answered again after being away.
    backs: tokio::sync::watch::Sender<u64>,
    /// The client that asks `/readyz` (the controller's own).
    prober: OnceLock<Client>,
    /// Counts the looks at `/readyz`.
    looked: tokio::sync::watch::Sender<u64>,
}

impl Default for Health {
    fn default() -> Health {
        Health::new()
    }
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("seen", &*self.lock())
            .finish()
    }
}

impl Health {
    pub fn new() -> Health {
        Health {
            seen: Mutex::new(Seen::default()),
            backs: tokio::sync::watch::channel(0).0,
            prober: OnceLock::new(),
            looked: tokio::sync::watch::channel(0).0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A request got no HTTP answer.
    pub fn unreachable(&self) {
        let mut seen = self.lock();
        if seen.away_since.is_none() {
            seen.away_since = Some(Instant::now());
        }
    }

    /// A request got an answer with this status and headers.
    pub fn answered(&self, status: StatusCode, headers: &http::HeaderMap) {
        let now = Instant::now();
        let back = {
            let mut seen = self.lock();
            if status == StatusCode::SERVICE_UNAVAILABLE && headers.contains_key("retry-after") {
                seen.unavailable_at = Some(now);
                seen.outage(now, now + STARTING_FOR);
            }
            match seen.away_since.take() {
                // A connection dropped now and then (an idle one closed by a proxy) is no outage.
                Some(since) if since.elapsed() >= AWAY_AT_LEAST => {
                    seen.back_at = Some(now);
                    seen.outage(since, now + STARTING_FOR);
                    tracing::info!(
                        away_s = since.elapsed().as_secs_f64(),
                        "the API server answers again"
                    );
                    true
                }
                _ => false,
            }
        };
        if back {
            self.backs.send_modify(|n| *n += 1);
        }
    }

    /// Whether requests get no HTTP answer now.
    pub fn away(&self) -> bool {
        self.lock().away_since.is_some()
    }

    /// When the server last answered again after being away.
    pub fn back_at(&self) -> Option<Instant> {
        self.lock().back_at
    }

    /// The spans in which the server was away or starting ([`Health::starting`]), as
    /// timestamps: an outage still going on ends now, and a server that answered again counts
    /// as starting until [`STARTING_FOR`] after. The lifecycle does not count them against
    /// `spec.timeout` and the readiness timeouts (`crate::rollout::outages`).
    pub fn outages(&self) -> Vec<(Time, Time)> {
        let now = Instant::now();
        let wall = k8s_openapi::jiff::Timestamp::now();
        let at = |instant: Instant| {
            let ago =
                k8s_openapi::jiff::SignedDuration::try_from(now.saturating_duration_since(instant))
                    .unwrap_or_default();
            let ahead =
                k8s_openapi::jiff::SignedDuration::try_from(instant.saturating_duration_since(now))
                    .unwrap_or_default();
            Time(
                wall.checked_sub(ago)
                    .and_then(|t| t.checked_add(ahead))
                    .unwrap_or(wall),
            )
        };
        let seen = self.lock();
        let mut spans: Vec<(Time, Time)> =
            seen.outages.iter().map(|&(a, b)| (at(a), at(b))).collect();
        if let Some(since) = seen.away_since.filter(|s| s.elapsed() >= AWAY_AT_LEAST) {
            spans.push((at(since), at(now)));
        }
        spans
    }

    /// Changes each time the server answers again after being away.
    pub fn backs(&self) -> tokio::sync::watch::Receiver<u64> {
        self.backs.subscribe()
    }

    /// Whether the server may still be starting, so that a refusal says nothing yet: it is away,
    /// it answered again within [`STARTING_FOR`], it said 503 with `Retry-After` within it, or its
    /// `/readyz` was not ok at a look within it (every 403 is answered after a look at
    /// `/readyz` younger than half of it, [`Health::look_at_readiness`], when there is a prober).
    pub fn starting(&self) -> bool {
        let seen = self.lock();
        let recent = |at: Option<Instant>| at.is_some_and(|at| at.elapsed() < STARTING_FOR);
        if seen.away_since.is_some() || recent(seen.back_at) || recent(seen.unavailable_at) {
            return true;
        }
        matches!(seen.ready, Some((false, at)) if at.elapsed() < STARTING_FOR)
    }

    /// Sets the client that asks `/readyz` (the controller's own identity).
    pub fn probe_with(&self, client: Client) {
        let _ = self.prober.set(client);
    }

    /// Makes sure the last look at `/readyz` is fresh: asks it (once for every caller that
    /// waits at the same moment) unless it was asked within half of [`STARTING_FOR`]. A refusal
    /// is classified after this, so that it is final only when the server said it is ready.
    pub async fn look_at_readiness(self: &Arc<Self>) {
        let Some(client) = self.prober.get().cloned() else {
            return;
        };
        let mut looked = self.looked.subscribe();
        let another = {
            let mut seen = self.lock();
            let fresh = seen
                .ready
                .is_some_and(|(_, at)| at.elapsed() < STARTING_FOR / 2);
            if fresh {
                return;
            }
            std::mem::replace(&mut seen.probing, true)
        };
        if another {
            let _ = tokio::time::timeout(PROBE_TIMEOUT, looked.changed()).await;
            return;
        }
        let request = Request::get("/readyz").body(kube::client::Body::empty());
        let ready = match request {
            Ok(request) => match tokio::time::timeout(PROBE_TIMEOUT, client.send(request)).await {
                // Only an answer that says so is "not ready": a path the controller may not
                // read (403) says nothing about the server.
                Ok(Ok(answer)) => !answer.status().is_server_error(),
                _ => false,
            },
            Err(_) => true,
        };
        {
            let mut seen = self.lock();
            let now = Instant::now();
            seen.ready = Some((ready, now));
            seen.probing = false;
            if !ready {
                seen.outage(now, now + STARTING_FOR);
            }
        }
        self.looked.send_modify(|n| *n += 1);
    }
}

/// How long a look at `/readyz` may take; longer, the server counts as not ready.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The tower layer that reports every answer (and every request without one) to a [`Health`].
#[derive(Clone)]
pub struct Observe(Arc<Health>);

impl<S> tower::Layer<S> for Observe {
    type Service = Observed<S>;

    fn layer(&self, inner: S) -> Observed<S> {
        Observed {
            inner,
            health: Arc::clone(&self.0),
        }
    }
}

/// A service whose answers are reported to a [`Health`].
#[derive(Clone)]
pub struct Observed<S> {
    inner: S,
    health: Arc<Health>,
}

impl<S, B, RB> tower::Service<Request<B>> for Observed<S>
where
    S: tower::Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    RB: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let readyz = request.uri().path() == "/readyz";
        let answer = self.inner.call(request);
        let health = Arc::clone(&self.health);
        Box::pin(async move {
            let answer = answer.await;
            match &answer {
                Ok(response) => {
                    health.answered(response.status(), response.headers());
                    if response.status() == StatusCode::FORBIDDEN && !readyz {
                        health.look_at_readiness().await;
                    }
                }
                Err(_) => health.unreachable(),
            }
            answer
        })
    }
}

/// A client for `config` whose every request is seen by `health`.
pub fn client(config: kube::Config, health: &Arc<Health>) -> Result<Client, kube::Error> {
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(builder.with_layer(&Observe(Arc::clone(health))).build())
}

/// The reconnect backoff of the watches: from 250 ms, doubling, at most 4 s, with ±25 % jitter.
/// (kube's default reaches 30 s, which after an API-server outage left watches, and the releases
/// they wake, idle for up to half a minute after the server answered again.)
pub fn reconnect_delay(failures: u32) -> Duration {
    let base = Duration::from_millis(250).saturating_mul(1 << failures.min(4));
    base.mul_f64(0.75 + fastrand::f64() * 0.5)
}

/// The longest wait of a watch before it asks a starting server again.
const STARTING_RECONNECT: Duration = Duration::from_secs(1);

/// The wait of a watch the API server refused (403) while it is not starting: the account may
/// not list or watch the kind, which a person must grant. From 800 ms, doubling, at most 30 s,
/// with ±25 % jitter: client-go's reflector backoff, not the short one of an outage.
pub fn forbidden_delay(failures: u32) -> Duration {
    let base = Duration::from_millis(800).saturating_mul(1 << failures.min(6));
    base.min(Duration::from_secs(30))
        .mul_f64(0.75 + fastrand::f64() * 0.5)
}

/// Whether the API server refused the watch or its list with 403 Forbidden.
fn forbidden(error: &watcher::Error) -> bool {
    let api = |e: &kube::Error| matches!(e, kube::Error::Api(status) if status.code == 403);
    match error {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => api(e),
        watcher::Error::WatchError(status) => status.code == 403,
        watcher::Error::NoResourceVersion => false,
    }
}

/// A watch (a kube-runtime `watcher` stream) that reconnects as the controller's watches must:
/// after an error it waits [`reconnect_delay`], or less when the API server answers again in
/// the meantime (the delay then starts again from the shortest), and at most a second while the
/// server is starting ([`Health::starting`]); a 410 `Expired` (a resumed
/// watch older than the server's watch cache, as after a restart) re-lists at once, as
/// client-go's reflector does. A 403 while the server is not starting (a refusal a person must
/// lift) waits [`forbidden_delay`], as client-go's reflector backs off. Errors other than 410 are
/// passed on, each before its wait. The failures are counted until the server answers
/// something: the `Init` a watch yields before each list attempt is no answer.
pub fn reconnecting<K: Send + 'static>(
    watch: BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>,
    health: &Arc<Health>,
) -> BoxStream<'static, Result<watcher::Event<K>, watcher::Error>> {
    struct State<K> {
        watch: BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>,
        failures: u32,
        wait: Option<Duration>,
        backs: tokio::sync::watch::Receiver<u64>,
        health: Arc<Health>,
    }
    let state = State {
        watch,
        failures: 0,
        wait: None,
        backs: health.backs(),
        health: Arc::clone(health),
    };
    futures::stream::unfold(state, |mut state| async move {
        loop {
            if let Some(wait) = state.wait.take() {
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    changed = state.backs.changed() => {
                        if changed.is_ok() {
                            state.failures = 0;
                        }
                    }
                }
            }
            match state.watch.next().await? {
                Ok(item) => {
                    if !matches!(item, watcher::Event::Init) {
                        state.failures = 0;
                    }
                    return Some((Ok(item), state));
                }
                Err(watcher::Error::WatchError(status)) if status.code == 410 => {
                    tracing::debug!(message = %status.message, "watch expired: listing again");
                }
                Err(e) => {
                    // A starting server serves everything within seconds: asked again every
                    // second at most, not after a backoff grown meanwhile.
                    let starting = state.health.starting();
                    let mut wait = if forbidden(&e) && !starting {
                        forbidden_delay(state.failures)
                    } else {
                        reconnect_delay(state.failures)
                    };
                    if starting {
                        wait = wait.min(STARTING_RECONNECT);
                    }
                    state.wait = Some(wait);
                    state.failures = state.failures.saturating_add(1);
                    // The server answering again ends the wait; it must not have ended it already.
                    state.backs.borrow_and_update();
                    return Some((Err(e), state));
                }
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gaps between the errors `reconnecting` passes on of a watch that yields `Init` then
    /// `error`, `times` times over.
    async fn gaps(error: fn() -> watcher::Error, times: usize) -> Vec<Duration> {
        let health = Arc::new(Health::new());
        let items = futures::stream::iter(
            (0..times).flat_map(move |_| [Ok(watcher::Event::<()>::Init), Err(error())]),
        );
        let mut watch = reconnecting(items.boxed(), &health);
        let mut at = Vec::new();
        while let Some(item) = watch.next().await {
            if item.is_err() {
                at.push(Instant::now());
                if at.len() == times {
                    // Not the wait after the last one.
                    break;
                }
            }
        }
        at.windows(2).map(|w| w[1] - w[0]).collect()
    }

    fn refused(code: u16) -> watcher::Error {
        let status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "message": "no", "reason": "Forbidden", "code": code,
        }))
        .expect("a Status");
        watcher::Error::InitialListFailed(kube::Error::Api(Box::new(status)))
    }

    #[test]
    fn a_refused_watch_waits_as_client_gos_reflector_up_to_30_s() {
        for failures in 0..12 {
            let base = (0.8 * f64::from(1u32 << failures.min(6))).min(30.0);
            let wait = forbidden_delay(failures).as_secs_f64();
            assert!(
                wait >= base * 0.75 && wait <= base * 1.25,
                "{failures}: {wait}"
            );
        }
        assert!(forbidden_delay(20) >= Duration::from_millis(22_500));
    }

    #[tokio::test]
    async fn the_init_before_each_list_is_no_answer_so_the_wait_grows() {
        // The waits grow (0.25, 0.5, 1 s of an outage's backoff, ±25 %) although the watch
        // yields an `Init` before each attempt: it used to reset them to the shortest.
        let waits = gaps(|| refused(500), 4).await;
        assert!(waits[2] >= Duration::from_millis(750), "{waits:?}");
        // A 403 of a server that is not starting waits 0.8 s, then 1.6 s (±25 %).
        let waits = gaps(|| refused(403), 3).await;
        assert!(waits[0] >= Duration::from_millis(600), "{waits:?}");
        assert!(waits[1] >= Duration::from_millis(1_200), "{waits:?}");
    }

    fn headers(retry_after: bool) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        if retry_after {
            headers.insert("retry-after", http::HeaderValue::from_static("5"));
        }
        headers
    }

    #[test]
    fn a_server_that_answers_after_an_outage_is_starting_and_back() {
        let health = Health::new();
        let backs = health.backs();
        assert!(!health.starting(), "nothing seen: a refusal is believed");
        health.unreachable();
        assert!(health.away() && health.starting());
        // Away for less than a second: a dropped connection, not an outage.
        health.answered(StatusCode::OK, &headers(false));
        assert!(!health.away() && !health.starting());
        assert!(!backs.has_changed().unwrap());
        health.lock().away_since = Some(Instant::now() - Duration::from_secs(12));
        health.answered(StatusCode::OK, &headers(false));
        assert!(backs.has_changed().unwrap(), "back after an outage");
        assert!(
            health.starting(),
            "refusals right after it came back say nothing"
        );
        health.lock().back_at = Some(Instant::now() - STARTING_FOR);
        assert!(!health.starting());
    }

    #[test]
    fn a_503_with_retry_after_or_a_readyz_not_ok_means_starting() {
        let health = Health::new();
        health.answered(StatusCode::SERVICE_UNAVAILABLE, &headers(false));
        assert!(
            !health.starting(),
            "an aggregated API that is down is not the server"
        );
        health.answered(StatusCode::SERVICE_UNAVAILABLE, &headers(true));
        assert!(health.starting());
        let health = Health::new();
        health.lock().ready = Some((false, Instant::now()));
        assert!(health.starting());
        health.lock().ready = Some((true, Instant::now()));
        assert!(!health.starting());
    }

    #[test]
    fn an_outage_and_the_start_after_it_are_kept_as_spans() {
        let health = Health::new();
        assert!(health.outages().is_empty());
        health.lock().away_since = Some(Instant::now() - Duration::from_secs(30));
        let away = health.outages();
        assert_eq!(away.len(), 1, "an outage going on ends now");
        let length = away[0].1.0.duration_since(away[0].0.0).as_secs_f64();
        assert!((29.0..31.0).contains(&length), "{length}");
        health.answered(StatusCode::OK, &headers(false));
        let back = health.outages();
        assert_eq!(back.len(), 1);
        let length = back[0].1.0.duration_since(back[0].0.0).as_secs_f64();
        assert!(
            (39.0..41.0).contains(&length),
            "away, then starting for {STARTING_FOR:?}: {length}"
        );
        // A 503 with Retry-After within that span makes it no longer.
        health.answered(StatusCode::SERVICE_UNAVAILABLE, &headers(true));
        assert_eq!(health.outages().len(), 1);
    }

    #[test]
    fn watches_reconnect_within_four_seconds() {
        for failures in 0..40 {
            let delay = reconnect_delay(failures);
            assert!(delay >= Duration::from_millis(187), "{delay:?}");
            assert!(delay <= Duration::from_secs(5), "{delay:?}");
        }
    }
}
