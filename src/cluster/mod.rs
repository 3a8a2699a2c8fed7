//! All Kubernetes I/O of a release: discovery, server-side apply, get and delete of untyped
//! objects, and the cluster's capabilities for rendering.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIResourceList, ObjectMeta};
use kube::Client;
use kube::api::{
    Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, PropagationPolicy,
};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::Value;
use tokio::sync::RwLock;

use crate::api::{FIELD_MANAGER, ObjectKey};
use crate::rollout::drift::Drift;
use crate::rollout::ignore::{self, Pointer};

mod access;
pub mod health;
mod logs;
pub mod remote;
pub use access::{Account, Verb};
pub use health::{Health, reconnecting};

/// Discovery is refreshed on an unknown kind at most this often.
const REFRESH_EVERY: Duration = Duration::from_secs(2);
/// How long one group-version of discovery may take to answer: an aggregated API whose backend
/// hangs is left out after this, as one that answers 503 is at once.
const GROUP_VERSION_TIMEOUT: Duration = Duration::from_secs(5);
/// A group-version that failed is asked again after 1 s, 2 s, 4 s, ... up to this.
const UNAVAILABLE_BACKOFF: Duration = Duration::from_secs(60);

/// What went wrong talking to the API server.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("the API server does not serve kind {kind} of {api_version}")]
    UnknownKind { api_version: String, kind: String },
    /// The group-version of a kind cannot be listed now (an aggregated API whose backend is
    /// down answers 503): it is left out of discovery and asked again with backoff.
    #[error("API group {group_version} is unavailable: {reason}")]
    GroupUnavailable {
        group_version: String,
        /// What failed, and the condition of its APIService when it has one.
        reason: String,
    },
    #[error("discovery: {0}")]
    Discovery(#[source] kube::Error),
    /// The service account a release acts as may not do this: refused by the API server, or
    /// by a SelfSubjectAccessReview before anything was written.
    #[error("{account} cannot {action}")]
    Forbidden {
        account: String,
        /// The verb, the plural resource with its group and the name:
        /// `create clusterroles.rbac.authorization.k8s.io "x"`.
        action: String,
    },
    /// The API server answered but is not done starting (it answered again moments ago, says
    /// 503 with `retryAfterSeconds` because custom resources are not served yet, or its
    /// `/readyz` is not ok): what it refused now says nothing about the request, which is tried
    /// again. A restarted kube-apiserver refuses every service account for a second or two
    /// while RBAC's caches load.
    #[error("{action} {object}: the API server is starting, tried again: {message}")]
    Starting {
        action: String,
        object: String,
        message: String,
        /// How soon the server asked to be asked again.
        retry_after: Option<Duration>,
    },
    #[error("{action} {object}: {message}")]
    Api {
        action: &'static str,
        object: String,
        message: String,
        code: Option<u16>,
        #[source]
        source: kube::Error,
    },
}

impl ClusterError {
    /// A fixed short category, for metrics labels.
    pub fn category(&self) -> &'static str {
        match self {
            ClusterError::UnknownKind { .. } => "unknown_kind",
            ClusterError::GroupUnavailable { .. } => "group_unavailable",
            ClusterError::Discovery(_) => "discovery",
            ClusterError::Forbidden { .. } => "forbidden",
            ClusterError::Starting { .. } => "starting",
            ClusterError::Api { code, .. } => match code {
                Some(403) => "forbidden",
                Some(404) => "not_found",
                Some(409) => "conflict",
                Some(400 | 422) => "invalid",
                Some(429) => "throttled",
                Some(c) if *c >= 500 => "server",
                _ => "api",
            },
        }
    }

    /// Whether retrying the same request later can succeed: server errors, throttling,
    /// conflicts, connection problems and whatever a starting API server answers, but not a
    /// request the server refused as invalid, nor a refusal of a server that is up (a 403 is
    /// [`ClusterError::Forbidden`] or [`ClusterError::Starting`] as [`Cluster::error`] judged it).
    pub fn is_transient(&self) -> bool {
        match self {
            ClusterError::UnknownKind { .. } => true,
            ClusterError::GroupUnavailable { .. } => true,
            ClusterError::Discovery(_) => true,
            ClusterError::Forbidden { .. } => false,
            ClusterError::Starting { .. } => true,
            // A server-side apply of a field the kind's schema does not declare is answered
            // 500 (structured-merge-diff's typed conversion) but fails the same way every time
            // until the object or the schema changes (a chart using a field of a CRD that was
            // not updated): it is told at once, not retried.
            ClusterError::Api { code, message, .. } => match code {
                Some(400 | 403 | 422) => false,
                Some(500) => !is_undeclared_field(message),
                _ => true,
            },
        }
    }

    /// How soon to try again when the API server is starting (its `retryAfterSeconds`, or a
    /// second): the retry does not back off further, the server said when it will answer.
    pub fn retry_soon(&self) -> Option<Duration> {
        match self {
            ClusterError::Starting { retry_after, .. } => {
                Some(retry_after.unwrap_or(Duration::from_secs(1)))
            }
            ClusterError::Api {
                source: kube::Error::Api(status),
                ..
            } => retry_after(status),
            _ => None,
        }
    }
}

/// The `retryAfterSeconds` of a 503 (kube-apiserver before every path is installed, and
/// aggregated APIs that ask for it).
pub fn retry_after(status: &kube::core::Status) -> Option<Duration> {
    let seconds = status.details.as_ref()?.retry_after_seconds;
    (status.code == 503 && seconds > 0).then(|| Duration::from_secs(u64::from(seconds)))
}

/// Whether a failed request of any kind (not only a release's objects: its status, its Lease)
/// met an API server that is starting, and how soon to try again: a 503 with
/// `retryAfterSeconds`, or a 403 while [`Health::starting`]. The one judgement
/// [`Cluster::error`] makes, for the errors that do not go through it.
pub fn starting(health: &Health, error: &kube::Error) -> Option<Duration> {
    let kube::Error::Api(status) = error else {
        return None;
    };
    if let Some(after) = retry_after(status) {
        return Some(after);
    }
    (status.code == 403 && health.starting()).then_some(Duration::from_secs(1))
}

impl ClusterError {
    /// Whether the API server gave no answer at all: the connection was refused, reset or
    /// timed out, or its TLS handshake failed (an answer, even a 5xx, is not this). For a
    /// remote cluster, this is what makes it unreachable (reason `RemoteClusterUnreachable`).
    pub fn is_unreachable(&self) -> bool {
        match self {
            ClusterError::Discovery(source) | ClusterError::Api { source, .. } => {
                unanswered(source)
            }
            _ => false,
        }
    }
}

/// Whether a request got no answer from the API server (see [`ClusterError::is_unreachable`]).
pub fn unanswered(error: &kube::Error) -> bool {
    matches!(
        error,
        kube::Error::HyperError(_)
            | kube::Error::Service(_)
            | kube::Error::ReadEvents(_)
            | kube::Error::RustlsTls(_)
    )
}

/// kube-apiserver's answer to an apply of a field the schema does not have:
/// `failed to create typed patch object (ns/name; group/version, Kind=K): .spec.x: field not
/// declared in schema`.
fn is_undeclared_field(message: &str) -> bool {
    message.starts_with("failed to create typed patch object")
        && message.ends_with("field not declared in schema")
}

/// The error of a request on `object` as `action`, for a server that is up: see
/// [`Cluster::api_error`], which also judges whether it is starting.
fn api_error(action: &'static str, object: String, source: kube::Error) -> ClusterError {
    let (message, code) = match &source {
        kube::Error::Api(status) => (status.message.clone(), Some(status.code)),
        other => (other.to_string(), None),
    };
    ClusterError::Api {
        action,
        object,
        message,
        code,
        source,
    }
}

fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 404)
}

/// One resource discovery lists, with the names kubectl accepts for it.
#[derive(Debug, Clone)]
struct Served {
    resource: ApiResource,
    namespaced: bool,
    /// Lowercase: the plural, the singular (the lowercase kind when the server leaves it empty),
    /// the lowercase kind and the short names.
    names: Vec<String>,
    /// The group's preferred version.
    preferred: bool,
    /// Whether the server lists it (`list` among its verbs).
    listable: bool,
}

/// A group-version discovery could not list, and when to ask again.
#[derive(Debug, Clone)]
struct Unavailable {
    reason: String,
    failures: u32,
    retry_at: Instant,
}

/// What discovery found.
#[derive(Default)]
struct Catalog {
    /// Group-versions that failed (`group/version`), left out until they answer again.
    unavailable: HashMap<String, Unavailable>,
    /// Something changed (a CRD or an APIService): read again at the next unknown kind, however
    /// recently it was read.
    dirty: bool,
    /// By (apiVersion, kind).
    kinds: HashMap<(String, String), (ApiResource, bool)>,
    /// Every resource (not subresource), the core group first, then the groups in discovery
    /// order, each group's preferred version first: the order in which a name is resolved.
    served: Vec<Served>,
    kube_version: Option<String>,
    api_versions: Vec<String>,
    refreshed: Option<Instant>,
}

/// A kind the API server serves.
#[derive(Debug, Clone)]
pub struct Kind {
    pub resource: ApiResource,
    pub namespaced: bool,
}

/// Whether discovery was never read, was read long enough ago to read it again, or changed.
fn stale(catalog: &Catalog) -> bool {
    catalog.dirty
        || catalog
            .refreshed
            .is_none_or(|at| at.elapsed() >= REFRESH_EVERY)
}

/// The backoff after `failures` failures of a group-version: 1 s, doubling up to a minute.
fn unavailable_backoff(failures: u32) -> Duration {
    Duration::from_secs(1)
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(UNAVAILABLE_BACKOFF)
}

/// The API server, as one release's operations see it: with the controller's own identity, or
/// impersonating the service account the release acts as. Every `Cluster` made from one with
/// [`Cluster::acting_as`] shares its discovery, which is read with the controller's identity.
pub struct Cluster {
    client: Client,
    /// Who the requests act as; None for the controller itself.
    account: Option<Account>,
    /// The controller's own client, for discovery.
    discovery: Client,
    catalog: Arc<RwLock<Catalog>>,
    /// Held while discovery is read: releases that need it at once wait for one reading.
    refreshing: Arc<tokio::sync::Mutex<()>>,
    /// What SelfSubjectAccessReviews answered for `account`, and when.
    access: Mutex<HashMap<access::Question, (bool, Instant)>>,
    /// A remote cluster (`spec.kubeConfig`): what identifies it (watches and caches are kept
    /// apart by it); None for the cluster the controller runs in.
    remote: Option<Arc<str>>,
    /// How the API server has been answering (every client of it reports there).
    health: Arc<Health>,
}

impl Cluster {
    /// The API server of `client`, whose answers nobody watches (a command line's): its
    /// refusals are final unless it says 503 with `retryAfterSeconds`.
    pub fn new(client: Client) -> Cluster {
        Cluster::with_health(client, Arc::new(Health::new()))
    }

    /// The API server of `client`, made by [`health::client`] with `health`.
    pub fn with_health(client: Client, health: Arc<Health>) -> Cluster {
        Cluster {
            discovery: client.clone(),
            client,
            account: None,
            catalog: Arc::new(RwLock::new(Catalog::default())),
            refreshing: Arc::new(tokio::sync::Mutex::new(())),
            access: Mutex::new(HashMap::new()),
            remote: None,
            health,
        }
    }

    /// A remote cluster, through `client` (its kubeconfig's own identity), known as `id`.
    pub fn remote(client: Client, id: Arc<str>) -> Cluster {
        Cluster {
            remote: Some(id),
            ..Cluster::new(client)
        }
    }

    /// What identifies the remote cluster this is; None for the controller's own.
    pub fn remote_id(&self) -> Option<&Arc<str>> {
        self.remote.as_ref()
    }

    /// How the API server has been answering.
    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// The same API server, every request impersonating `account` (`Impersonate-User:
    /// system:serviceaccount:NS:NAME`; the API server adds the service account's groups).
    /// `config` is the controller's own configuration.
    pub fn acting_as(
        &self,
        config: &kube::Config,
        account: Account,
    ) -> Result<Cluster, kube::Error> {
        let mut config = config.clone();
        config.auth_info.impersonate = Some(account.username());
        config.auth_info.impersonate_groups = None;
        let client = health::client(config, &self.health)?;
        Ok(Cluster {
            client,
            account: Some(account),
            discovery: self.discovery.clone(),
            catalog: Arc::clone(&self.catalog),
            refreshing: Arc::clone(&self.refreshing),
            access: Mutex::new(HashMap::new()),
            remote: self.remote.clone(),
            health: Arc::clone(&self.health),
        })
    }

    /// Who the requests act as; None for the controller itself.
    pub fn account(&self) -> Option<&Account> {
        self.account.as_ref()
    }

    /// The client the requests go through (impersonating [`Cluster::account`]).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The API server refused to let the controller impersonate the account at all: the
    /// controller lacks `impersonate` on serviceaccounts.
    fn impersonation_refused(&self, source: &kube::Error) -> Option<ClusterError> {
        let (Some(account), kube::Error::Api(status)) = (&self.account, source) else {
            return None;
        };
        (status.code == 403 && access::refused_verb(&status.message)? == "impersonate").then(|| {
            ClusterError::Forbidden {
                account: "the controller".to_string(),
                action: format!(
                    "impersonate {account} (grant it impersonate on serviceaccounts): {}",
                    status.message
                ),
            }
        })
    }

    /// The error of a request on `object` as `action`: [`ClusterError::Starting`] when the
    /// server is starting ([`starting`]), else the API's error as it is.
    fn api_error(&self, action: &'static str, object: String, source: kube::Error) -> ClusterError {
        match self.starting_error(action, &object, &source) {
            Some(starting) => starting,
            None => api_error(action, object, source),
        }
    }

    fn starting_error(
        &self,
        action: &str,
        object: &str,
        source: &kube::Error,
    ) -> Option<ClusterError> {
        let retry_after = starting(&self.health, source)?;
        let message = match source {
            kube::Error::Api(status) => status.message.clone(),
            other => other.to_string(),
        };
        Some(ClusterError::Starting {
            action: action.to_string(),
            object: object.to_string(),
            message,
            retry_after: Some(retry_after),
        })
    }

    /// The one judgement of a failed request about `key` (and through [`starting`], of every
    /// other request of the controller): what a starting API server answered (a 503 with
    /// `retryAfterSeconds`, a 403 while it is starting) is [`ClusterError::Starting`], tried
    /// again; a 403 of the authorizer of a server that is up is [`ClusterError::Forbidden`],
    /// naming who was refused (the service account the release acts as, or the controller
    /// itself, whose ClusterRole may not cover what a chart holds: `rbac.profile: restricted`),
    /// the verb and the object, final until someone grants it; everything else is the API's
    /// error.
    pub fn error(
        &self,
        action: &'static str,
        key: &ObjectKey,
        source: kube::Error,
    ) -> ClusterError {
        if let Some(starting) = self.starting_error(action, &key.to_string(), &source) {
            return starting;
        }
        if let Some(refused) = self.impersonation_refused(&source) {
            return refused;
        }
        if let kube::Error::Api(status) = &source
            && status.code == 403
            && let Some(verb) = access::refused_verb(&status.message)
        {
            let account = match (&self.account, access::refused_user(&status.message)) {
                (Some(account), _) => account.to_string(),
                (None, Some(user)) => format!("the controller ({user})"),
                (None, None) => "the controller".to_string(),
            };
            let group = crate::plan::api_group(&key.api_version);
            let resource = status
                .details
                .as_ref()
                .map(|d| d.kind.clone())
                .filter(|k| !k.is_empty())
                .unwrap_or_else(|| format!("{}s", key.kind.to_ascii_lowercase()));
            return ClusterError::Forbidden {
                account,
                action: format!(
                    "{verb} {} \"{}\"",
                    access::qualified(group, &resource),
                    key.name
                ),
            };
        }
        api_error(action, key.to_string(), source)
    }

    /// Reads discovery and the server version again. A group whose resources cannot be listed
    /// (an aggregated API whose service is down) is left out, as kubectl does, rather than
    /// failing every release.
    pub async fn refresh(&self) -> Result<(), ClusterError> {
        self.refresh_when(|_| true).await
    }

    /// [`Cluster::refresh`] when the catalog, looked at once no other reading runs, is `stale`:
    /// callers at the same moment share one reading.
    async fn refresh_when(&self, stale: impl Fn(&Catalog) -> bool) -> Result<(), ClusterError> {
        let _reading = self.refreshing.lock().await;
        if !stale(&*self.catalog.read().await) {
            return Ok(());
        }
        let started = Instant::now();
        let client = &self.discovery;
        let version = client
            .apiserver_version()
            .await
            .map_err(ClusterError::Discovery)?;
        let core = client
            .list_core_api_versions()
            .await
            .map_err(ClusterError::Discovery)?;
        let groups = client
            .list_api_groups()
            .await
            .map_err(ClusterError::Discovery)?;
        // (group, version, preferred), the preferred version of each group first.
        let mut versions: Vec<(String, String, bool)> = core
            .versions
            .iter()
            .enumerate()
            .map(|(i, v)| (String::new(), v.clone(), i == 0))
            .collect();
        for group in &groups.groups {
            let preferred = group
                .preferred_version
                .as_ref()
                .map(|p| p.version.clone())
                .or_else(|| group.versions.first().map(|v| v.version.clone()));
            let mut listed: Vec<&str> = group.versions.iter().map(|v| v.version.as_str()).collect();
            listed.sort_by_key(|v| Some(*v) != preferred.as_deref());
            for v in listed {
                versions.push((
                    group.name.clone(),
                    v.to_string(),
                    Some(v) == preferred.as_deref(),
                ));
            }
        }
        // A group-version that failed is asked again only once its backoff is over; until
        // then it stays out, as kubectl and Helm leave out what they cannot list.
        let mut unavailable = self.catalog.read().await.unavailable.clone();
        let asked = Instant::now();
        let lists = futures::future::join_all(versions.iter().map(|(group, version, _)| {
            let gv = if group.is_empty() {
                version.clone()
            } else {
                format!("{group}/{version}")
            };
            let waiting = unavailable
                .get(&gv)
                .is_some_and(|u| u.retry_at > asked && !group.is_empty());
            async move {
                if waiting {
                    return None;
                }
                let listing = async {
                    if group.is_empty() {
                        client.list_core_api_resources(version).await
                    } else {
                        client.list_api_group_resources(&gv).await
                    }
                };
                Some(
                    tokio::time::timeout(GROUP_VERSION_TIMEOUT, listing)
                        .await
                        .map_err(|_| {
                            format!("no answer within {}s", GROUP_VERSION_TIMEOUT.as_secs())
                        }),
                )
            }
        }))
        .await;
        let mut kinds = HashMap::new();
        let mut served = Vec::new();
        let mut api_versions = Vec::new();
        for ((group, version, preferred), list) in versions.into_iter().zip(lists) {
            let gv = if group.is_empty() {
                version.clone()
            } else {
                format!("{group}/{version}")
            };
            let list: APIResourceList = match list {
                // Still backing off: left out.
                None => continue,
                Some(Ok(Ok(list))) => {
                    unavailable.remove(&gv);
                    list
                }
                Some(Ok(Err(e))) if group.is_empty() => return Err(ClusterError::Discovery(e)),
                Some(failed) => {
                    let why = match failed {
                        Ok(Err(e)) => match &e {
                            kube::Error::Api(status) => {
                                format!("GET /apis/{gv}: {} {}", status.code, status.message)
                            }
                            other => format!("GET /apis/{gv}: {other}"),
                        },
                        Err(timeout) => format!("GET /apis/{gv}: {timeout}"),
                        Ok(Ok(_)) => String::new(),
                    };
                    let reason = match self.apiservice_condition(&group, &version).await {
                        Some(condition) => format!("{condition}; {why}"),
                        None => why,
                    };
                    // A server that is starting serves custom resources within seconds: asked
                    // again after a second, not after a backoff grown meanwhile.
                    let failures = match self.health.starting() {
                        true => 1,
                        false => unavailable.get(&gv).map_or(0, |u| u.failures) + 1,
                    };
                    tracing::warn!(group_version = %gv, %reason, retry_in_s = unavailable_backoff(failures).as_secs(), "discovery left out a group-version it could not list");
                    unavailable.insert(
                        gv,
                        Unavailable {
                            reason,
                            failures,
                            retry_at: Instant::now() + unavailable_backoff(failures),
                        },
                    );
                    continue;
                }
            };
            let gv = list.group_version.clone();
            api_versions.push(gv.clone());
            for r in list.resources.iter().filter(|r| !r.name.contains('/')) {
                let resource = ApiResource {
                    group: group.clone(),
                    version: version.clone(),
                    api_version: gv.clone(),
                    kind: r.kind.clone(),
                    plural: r.name.clone(),
                };
                api_versions.push(format!("{gv}/{}", r.kind));
                let kind = r.kind.to_ascii_lowercase();
                let singular = if r.singular_name.is_empty() {
                    kind.clone()
                } else {
                    r.singular_name.to_ascii_lowercase()
                };
                let mut names = vec![r.name.to_ascii_lowercase(), singular, kind];
                names.extend(
                    r.short_names
                        .iter()
                        .flatten()
                        .map(|n| n.to_ascii_lowercase()),
                );
                names.dedup();
                kinds.insert(
                    (gv.clone(), r.kind.clone()),
                    (resource.clone(), r.namespaced),
                );
                served.push(Served {
                    resource,
                    namespaced: r.namespaced,
                    names,
                    preferred,
                    listable: r.verbs.iter().any(|v| v == "list"),
                });
            }
        }
        api_versions.sort();
        api_versions.dedup();
        let mut catalog = self.catalog.write().await;
        catalog.unavailable = unavailable;
        catalog.dirty = false;
        catalog.kinds = kinds;
        catalog.served = served;
        catalog.api_versions = api_versions;
        catalog.kube_version = Some(version.git_version);
        catalog.refreshed = Some(started);
        Ok(())
    }

    /// What the APIService of `group`/`version` says of its availability, when it is not
    /// Available: `APIService v1beta1.metrics.k8s.io is not Available (ServiceNotFound:
    /// service/metrics-server in "monitoring" is not present)`. None when there is no such
    /// APIService or it cannot be read.
    async fn apiservice_condition(&self, group: &str, version: &str) -> Option<String> {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apiregistration.k8s.io", "v1", "APIService"),
            "apiservices",
        );
        let api: Api<DynamicObject> = Api::all_with(self.discovery.clone(), &resource);
        let name = format!("{version}.{group}");
        let found = tokio::time::timeout(GROUP_VERSION_TIMEOUT, api.get_opt(&name))
            .await
            .ok()?
            .ok()??;
        let conditions = found.data.pointer("/status/conditions")?.as_array()?;
        let available = conditions
            .iter()
            .find(|c| c.get("type").and_then(Value::as_str) == Some("Available"))?;
        let field = |f: &str| available.get(f).and_then(Value::as_str).unwrap_or_default();
        if field("status") == "True" {
            return None;
        }
        Some(format!(
            "APIService {name} is not Available ({}: {})",
            field("reason"),
            field("message")
        ))
    }

    /// Discovery changed (a CRD or an APIService was created, changed or deleted): it is read
    /// again at the next kind it does not know, and group-versions that failed are asked again
    /// at once.
    pub async fn invalidate(&self) {
        let mut catalog = self.catalog.write().await;
        catalog.dirty = true;
        let now = Instant::now();
        for unavailable in catalog.unavailable.values_mut() {
            unavailable.retry_at = now;
        }
    }

    /// Why `api_version` is not served, when discovery left it out because it failed.
    async fn unavailable(&self, api_version: &str) -> Option<ClusterError> {
        let catalog = self.catalog.read().await;
        let failed = catalog.unavailable.get(api_version)?;
        Some(ClusterError::GroupUnavailable {
            group_version: api_version.to_string(),
            reason: failed.reason.clone(),
        })
    }

    /// The group-versions discovery left out because they failed, with why.
    pub async fn unavailable_groups(&self) -> Vec<(String, String)> {
        let catalog = self.catalog.read().await;
        let mut out: Vec<(String, String)> = catalog
            .unavailable
            .iter()
            .map(|(gv, u)| (gv.clone(), u.reason.clone()))
            .collect();
        out.sort();
        out
    }

    /// The kind a person named, as kubectl resolves `TYPE[.GROUP]` (`secret`, `Secret`, `cm`,
    /// `deployment.apps`, `statefulsets.apps`, `deployments.v1.apps`): by plural, singular, kind
    /// or short name in any case, in the group when one is given, at the group's preferred
    /// version, the core group first. Discovery is read again when nothing matches.
    pub async fn resolve(&self, name: &str, group: Option<&str>) -> Result<Kind, ClusterError> {
        self.ensure_discovered().await?;
        if let Some(found) = self.resolve_known(name, group).await {
            return Ok(found);
        }
        if self.is_stale().await {
            self.refresh_when(stale).await?;
            if let Some(found) = self.resolve_known(name, group).await {
                return Ok(found);
            }
        }
        if let Some(group) = group {
            let catalog = self.catalog.read().await;
            let down = catalog.unavailable.iter().find(|(gv, _)| {
                gv.rsplit_once('/')
                    .is_some_and(|(g, _)| g.eq_ignore_ascii_case(group))
            });
            if let Some((gv, failed)) = down {
                return Err(ClusterError::GroupUnavailable {
                    group_version: gv.clone(),
                    reason: failed.reason.clone(),
                });
            }
        }
        Err(ClusterError::UnknownKind {
            api_version: group.unwrap_or("").to_string(),
            kind: name.to_string(),
        })
    }

    async fn resolve_known(&self, name: &str, group: Option<&str>) -> Option<Kind> {
        let catalog = self.catalog.read().await;
        let name = name.to_ascii_lowercase();
        let group = group.map(str::to_ascii_lowercase);
        // `deployments.v1.apps`: a version before the group.
        let versioned = group.as_deref().and_then(|g| g.split_once('.'));
        let matches = |s: &Served, group: Option<&str>, version: Option<&str>| {
            s.names.contains(&name)
                && group.is_none_or(|g| s.resource.group == g)
                && version.is_none_or(|v| s.resource.version == v)
        };
        let pick = |group: Option<&str>, version: Option<&str>| {
            let candidates = || catalog.served.iter().filter(|s| matches(s, group, version));
            candidates()
                .find(|s| s.preferred || version.is_some())
                .or_else(|| candidates().next())
                .map(|s| Kind {
                    resource: s.resource.clone(),
                    namespaced: s.namespaced,
                })
        };
        pick(group.as_deref(), None).or_else(|| {
            let (version, group) = versioned?;
            pick(Some(group), Some(version))
        })
    }

    async fn is_stale(&self) -> bool {
        stale(&*self.catalog.read().await)
    }

    async fn ensure_discovered(&self) -> Result<(), ClusterError> {
        self.read_if(|catalog| catalog.refreshed.is_none()).await
    }

    /// Reads discovery when the catalog is `wanting` it (and still is once no other reading
    /// runs).
    async fn read_if(&self, wanting: impl Fn(&Catalog) -> bool) -> Result<(), ClusterError> {
        if wanting(&*self.catalog.read().await) {
            self.refresh_when(wanting).await?;
        }
        Ok(())
    }

    /// `--kube-version` and `--api-versions` for `helm template`, read again first when discovery
    /// changed since (a CRD or an APIService), so that a chart rendered after its CRD was
    /// installed sees it in `.Capabilities.APIVersions`.
    /// Every kind the server lists, in its group's preferred version (discovery read first if
    /// it never was), and the group-versions discovery leaves out now (unavailable), with why.
    pub async fn listable_kinds(&self) -> Result<(Vec<Kind>, Vec<(String, String)>), ClusterError> {
        self.ensure_discovered().await?;
        let kinds = {
            let catalog = self.catalog.read().await;
            catalog
                .served
                .iter()
                .filter(|s| s.preferred && s.listable)
                .map(|s| Kind {
                    resource: s.resource.clone(),
                    namespaced: s.namespaced,
                })
                .collect()
        };
        Ok((kinds, self.unavailable_groups().await))
    }

    pub async fn capabilities(&self) -> Result<(Option<String>, Vec<String>), ClusterError> {
        self.read_if(|catalog| catalog.refreshed.is_none() || catalog.dirty)
            .await?;
        let catalog = self.catalog.read().await;
        Ok((catalog.kube_version.clone(), catalog.api_versions.clone()))
    }

    /// The kind behind `api_version` and `kind`; discovery is read again when the kind is new
    /// (a CRD applied a moment ago).
    pub async fn kind(&self, api_version: &str, kind: &str) -> Result<Kind, ClusterError> {
        self.ensure_discovered().await?;
        let key = (api_version.to_string(), kind.to_string());
        if let Some(found) = self.lookup(&key).await {
            return Ok(found);
        }
        if self.is_stale().await {
            self.refresh_when(stale).await?;
            if let Some(found) = self.lookup(&key).await {
                return Ok(found);
            }
        }
        if let Some(unavailable) = self.unavailable(api_version).await {
            return Err(unavailable);
        }
        Err(ClusterError::UnknownKind {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
        })
    }

    async fn lookup(&self, key: &(String, String)) -> Option<Kind> {
        let catalog = self.catalog.read().await;
        catalog.kinds.get(key).map(|(resource, namespaced)| Kind {
            resource: resource.clone(),
            namespaced: *namespaced,
        })
    }

    fn api(&self, kind: &Kind, namespace: Option<&str>) -> Api<DynamicObject> {
        match namespace {
            Some(ns) if kind.namespaced => {
                Api::namespaced_with(self.client.clone(), ns, &kind.resource)
            }
            _ => Api::all_with(self.client.clone(), &kind.resource),
        }
    }

    /// The object, or None when it does not exist.
    pub async fn get(&self, key: &ObjectKey) -> Result<Option<Value>, ClusterError> {
        let kind = self.kind(&key.api_version, &key.kind).await?;
        let api = self.api(&kind, key.namespace.as_deref());
        match api.get_opt(&key.name).await {
            Ok(found) => Ok(found.map(|o| serde_json::to_value(o).unwrap_or(Value::Null))),
            Err(e) => Err(self.error("reading", key, e)),
        }
    }

    /// Server-side apply of `object` as field manager `sequenced`. Fields another manager owns
    /// through a subresource (an HPA's `spec.replicas`, written through `/scale`) are never
    /// fought over: they are left out of the apply. Fields someone changed on the object itself
    /// (`kubectl edit`, `kubectl patch`, another apply) are taken back, as the chart says.
    /// Returns the metadata of the object as applied.
    pub async fn apply(&self, key: &ObjectKey, object: &Value) -> Result<ObjectMeta, ClusterError> {
        self.apply_as(key, object, false)
            .await
            .map(|applied| applied.metadata)
    }

    /// What [`Cluster::apply`] would make of the object, asked of the API server as a dry run
    /// (`dryRun=All`: admitted, defaulted and given its managed fields, but nothing is stored):
    /// the same requests, with the same field manager and the same forcing.
    pub async fn apply_dry_run(
        &self,
        key: &ObjectKey,
        object: &Value,
    ) -> Result<Value, ClusterError> {
        self.apply_as(key, object, true)
            .await
            .map(|applied| serde_json::to_value(applied).unwrap_or(Value::Null))
    }

    async fn apply_as(
        &self,
        key: &ObjectKey,
        object: &Value,
        dry_run: bool,
    ) -> Result<DynamicObject, ClusterError> {
        let kind = self.kind(&key.api_version, &key.kind).await?;
        let api = self.api(&kind, key.namespace.as_deref());
        let mut params = PatchParams::apply(FIELD_MANAGER);
        params.dry_run = dry_run;
        let conflicts = match api.patch(&key.name, &params, &Patch::Apply(object)).await {
            Ok(applied) => return Ok(applied),
            Err(kube::Error::Api(status)) if status.code == 409 => match conflicts_of(&status) {
                Some(conflicts) => conflicts,
                None => {
                    return Err(self.error("applying", key, kube::Error::Api(status)));
                }
            },
            Err(e) => return Err(self.error("applying", key, e)),
        };
        let mut object = object.clone();
        for conflict in conflicts.iter().filter(|c| c.subresource) {
            if remove_field(&mut object, &conflict.field) {
                tracing::debug!(object = %key, field = %conflict.field, manager = %conflict.manager, "leaving a field to the manager that owns it through a subresource");
            }
        }
        api.patch(&key.name, &params.force(), &Patch::Apply(&object))
            .await
            .map_err(|e| self.error("applying", key, e))
    }

    /// How the object differs from what applying `object` would make of it (a server-side apply
    /// dry run): None when it matches, [`Drift::Deleted`] when it is gone, else the fields that
    /// differ. Fields another manager owns through a subresource do not count, nor do the
    /// fields at `ignored` (`spec.driftDetection.ignore`): the dry run applies their live values
    /// (so that a value another manager set is no conflict), and they are left out of both sides
    /// of the comparison.
    pub async fn drift(
        &self,
        key: &ObjectKey,
        object: &Value,
        ignored: &[&Pointer],
    ) -> Result<Option<Drift>, ClusterError> {
        let kind = match self.kind(&key.api_version, &key.kind).await {
            Ok(kind) => kind,
            Err(ClusterError::UnknownKind { .. }) => return Ok(Some(Drift::Deleted)),
            Err(e) => return Err(e),
        };
        let api = self.api(&kind, key.namespace.as_deref());
        // The read and the dry run compare one version of the object: when it changed between
        // the two (an edit in the middle of a burst of them, which is when a watch event makes
        // a release compare its objects), both are asked again.
        let mut attempts = 0;
        let (live, applied) = loop {
            attempts += 1;
            let live = match api.get_opt(&key.name).await {
                Ok(Some(live)) => serde_json::to_value(live).unwrap_or(Value::Null),
                Ok(None) => return Ok(Some(Drift::Deleted)),
                Err(e) => return Err(self.error("reading", key, e)),
            };
            let mut object = object.clone();
            ignore::keep_live(&mut object, &live, ignored);
            let mut params = PatchParams::apply(FIELD_MANAGER);
            params.dry_run = true;
            let applied = match api.patch(&key.name, &params, &Patch::Apply(&object)).await {
                Ok(applied) => serde_json::to_value(applied).unwrap_or(Value::Null),
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    let Some(conflicts) = conflicts_of(&status) else {
                        return Err(self.error("checking", key, kube::Error::Api(status)));
                    };
                    let fields: Vec<String> = conflicts
                        .into_iter()
                        .filter(|c| !c.subresource)
                        .map(|c| c.field)
                        .collect();
                    return Ok((!fields.is_empty()).then_some(Drift::Changed(fields)));
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    return Ok(Some(Drift::Deleted));
                }
                Err(e) => return Err(self.error("checking", key, e)),
            };
            let version = |o: &Value| o.pointer("/metadata/resourceVersion").cloned();
            if version(&live) == version(&applied) || attempts >= 3 {
                break (live, applied);
            }
        };
        let (mut live, mut applied) = (comparable(&live), comparable(&applied));
        ignore::strip(&mut live, ignored);
        ignore::strip(&mut applied, ignored);
        let mut fields = Vec::new();
        differences(&live, &applied, "", &mut fields);
        Ok((!fields.is_empty()).then_some(Drift::Changed(fields)))
    }

    /// Creates `object` unless it exists; true when it was created.
    pub async fn create_if_absent(
        &self,
        key: &ObjectKey,
        object: &Value,
    ) -> Result<bool, ClusterError> {
        if self.get(key).await?.is_some() {
            return Ok(false);
        }
        let kind = self.kind(&key.api_version, &key.kind).await?;
        let api = self.api(&kind, key.namespace.as_deref());
        let object: DynamicObject =
            serde_json::from_value(object.clone()).map_err(|e| ClusterError::Api {
                action: "creating",
                object: key.to_string(),
                message: e.to_string(),
                code: None,
                source: kube::Error::SerdeError(e),
            })?;
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        match api.create(&params, &object).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(self.error("creating", key, e)),
        }
    }

    /// Deletes the object in the background (its dependents are collected after it); false when
    /// it was already gone.
    pub async fn delete(&self, key: &ObjectKey) -> Result<bool, ClusterError> {
        let kind = match self.kind(&key.api_version, &key.kind).await {
            Ok(kind) => kind,
            // A kind the server no longer serves has no objects left.
            Err(ClusterError::UnknownKind { .. }) => return Ok(false),
            Err(e) => return Err(e),
        };
        let api = self.api(&kind, key.namespace.as_deref());
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..DeleteParams::default()
        };
        match api.delete(&key.name, &params).await {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(self.error("deleting", key, e)),
        }
    }

    /// The object, or None when it does not exist or the server does not serve its kind (an
    /// unknown kind has no objects).
    pub async fn find(&self, key: &ObjectKey) -> Result<Option<Value>, ClusterError> {
        match self.get(key).await {
            Err(ClusterError::UnknownKind { .. }) => Ok(None),
            found => found,
        }
    }
}

/// A field of a server-side apply conflict: its path (`.spec.replicas`), the manager that owns
/// it, and whether that manager owns it through a subresource.
struct Conflict {
    field: String,
    manager: String,
    subresource: bool,
}

/// The field conflicts of a 409 answer to an apply, as kube-apiserver words each cause:
/// `conflict with "kube-controller-manager" with subresource "scale" using apps/v1 at ...`.
/// None when the 409 is not about fields.
fn conflicts_of(status: &kube::core::Status) -> Option<Vec<Conflict>> {
    let causes = &status.details.as_ref()?.causes;
    let conflicts: Vec<Conflict> = causes
        .iter()
        .filter(|c| c.reason == "FieldManagerConflict")
        .map(|c| {
            let rest = c.message.trim_start_matches("conflict with ");
            let manager = rest
                .strip_prefix('"')
                .and_then(|r| r.split('"').next())
                .unwrap_or(rest)
                .to_string();
            Conflict {
                field: c.field.clone(),
                manager,
                subresource: c.message.contains(" with subresource "),
            }
        })
        .collect();
    (!conflicts.is_empty()).then_some(conflicts)
}

/// Removes a field given as a path of map keys (`.spec.replicas`); false when the path goes
/// through a list item (`.spec.containers[name="app"].image`) or is not there.
fn remove_field(object: &mut Value, path: &str) -> bool {
    if path.contains('[') {
        return false;
    }
    let mut parts: Vec<&str> = path.trim_start_matches('.').split('.').collect();
    let Some(last) = parts.pop() else {
        return false;
    };
    let mut at = object;
    for part in parts {
        match at.get_mut(part) {
            Some(next) => at = next,
            None => return false,
        }
    }
    at.as_object_mut().is_some_and(|m| m.remove(last).is_some())
}

/// The object without what the server keeps for itself (status, resourceVersion, managed
/// fields, timestamps): what a user's change can touch.
fn comparable(object: &Value) -> Value {
    let mut object = object.clone();
    if let Value::Object(m) = &mut object {
        m.remove("status");
        if let Some(Value::Object(meta)) = m.get_mut("metadata") {
            for k in [
                "managedFields",
                "resourceVersion",
                "generation",
                "creationTimestamp",
                "uid",
                "selfLink",
            ] {
                meta.remove(k);
            }
        }
    }
    object
}

/// At most this many differing fields are named for one object.
const MAX_DIFFERENCES: usize = 20;

/// The paths (`.data.a`, `.spec.ports[0].port`) where `a` and `b` differ.
fn differences(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
    if out.len() >= MAX_DIFFERENCES || a == b {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let null = Value::Null;
                differences(
                    x.get(k).unwrap_or(&null),
                    y.get(k).unwrap_or(&null),
                    &format!("{path}.{k}"),
                    out,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                differences(p, q, &format!("{path}[{i}]"), out);
            }
        }
        _ => out.push(if path.is_empty() {
            ".".to_string()
        } else {
            path.to_string()
        }),
    }
}
