//! An in-process Kubernetes API server for tests: `kube::Client`, kube-runtime's `watcher`,
//! `metadata_watcher`, `Controller`, `events::Recorder` and `Discovery` talk to it over plain
//! HTTP on 127.0.0.1.
//!
//! It answers as a kube-apiserver v1.28 does, and is never kinder than one: the status codes,
//! `Status` bodies and object shapes follow the recordings of a real server, kept in
//! `tests/apiserver-recordings/` (requests.json: create, AlreadyExists, update, Conflict,
//! NotFound, the invalid annotation key, server-side apply with its fieldManager and conflict
//! errors, merge patch, deletion with finalizers, Lease MicroTime; watch-configmaps*.jsonl:
//! watch events and bookmarks, full and PartialObjectMetadata; discovery-*.json; version.json;
//! crd-established.json and crd-not-structural.txt; from v1.36: requests-lifecycle.json,
//! serviceaccount-missing.json, aggregated-api-unavailable.json).
//!
//! What it keeps: every object in one map behind a mutex, one global resourceVersion counter and
//! a log of watch events. What it does besides storing: validation (names, labels, annotations,
//! MicroTime, a few kind checks, CRD schemas), defaults of built-in kinds, managed fields and
//! server-side apply, `/status` subresources, generation, finalizers, ServiceAccount admission
//! of Pods, and the work a few controllers would do (namespace deletion, CRD establishment and
//! cleanup, garbage collection of dependents, a ServiceAccount `default` in every active
//! namespace, the aggregator's APIService availability). It runs no workload controllers: a
//! Deployment keeps the status that the test gives it with [`TestApiServer::set_status`], as on
//! a cluster without kube-controller-manager. The Job controller and the kubelet are played by
//! [`TestApiServer::job_controller`] (workloads.rs) while a test holds its guard.
//!
//! Pods (apiserver/pods.rs):
//! - A Pod create (POST, or a server-side apply that creates) whose ServiceAccount
//!   (`spec.serviceAccountName`, `default` when unset) does not exist in its namespace is
//!   refused with the recorded 403 (`error looking up service account NS/SA: ...`), naming the
//!   Pod's `generateName` when it has no name yet; an admitted Pod gets the name written into
//!   `serviceAccountName` and `serviceAccount`.
//! - `GET .../pods/NAME/log` (RBAC resource `pods/log`) answers `text/plain` with what the
//!   container wrote: set by [`TestApiServer::set_log`], or by the played kubelet from the
//!   Pod's annotations (`sequenced.test/log`, `sequenced.test/log.CONTAINER`; a Job's template
//!   annotations are its Pod's), empty when nothing was. `container`, `tailLines` (the last
//!   lines), `limitBytes` (the first bytes of what would be sent), `timestamps` (each line
//!   prefixed with the time of the write) and `previous` are read; the errors are the real
//!   ones: 422 for invalid options, 404 for an absent Pod, 400 when a Pod of several containers
//!   is not told which, for an unknown container, and the kubelet's for a container that has
//!   not started (a Pod no kubelet ran: `is waiting to start: ContainerCreating`) or whose
//!   previous instance is asked for.
//!
//! Aggregated APIs (apiserver/aggregator.rs): an `APIService` with `spec.service` hands its
//! group version to an extension API server. The server writes its `Available` condition as
//! the aggregator does (ServiceNotFound, ServicePortError, MissingEndpoints, Passed; a local
//! APIService is always available), lists its group in `/apis` whatever its availability, marks
//! the version `Stale` without resources in aggregated discovery while it is unavailable, and
//! answers every request under `/apis/G/V` with 503 `service unavailable\n` in plain text (not a
//! Status) meanwhile. A test brings it up by registering the backend with
//! [`TestApiServer::serve_aggregated`] and creating the Service the APIService names (with the
//! port it names); deleting that Service or [`TestApiServer::stop_aggregated`] takes it down
//! again. A running backend answers list (empty) and get (404) of the resources registered.
//!
//! Who may do what (apiserver/rbac.rs), as a kube-apiserver with `--authorization-mode=RBAC`
//! decides it (requests-lifecycle.json records its 403 and a SelfSubjectAccessReview):
//! - A request without the test header [`USER_HEADER`] is the cluster's administrator (group
//!   system:masters) and is allowed everything; with it ([`TestApiServer::client_as_user`]), it
//!   is that user, in the groups of [`GROUPS_HEADER`], a service account's groups for
//!   `system:serviceaccount:NS:NAME`, and system:authenticated.
//! - `Impersonate-User` and `Impersonate-Group` (what kube-client sends for
//!   `auth_info.impersonate` and `impersonate_groups`) need verb `impersonate` on users (or the
//!   service account) and groups; the request then runs as that user, and
//!   [`RecordedRequest::user`] names it.
//! - Every request is authorized from its URL by the Roles, ClusterRoles, RoleBindings and
//!   ClusterRoleBindings stored here (verbs, API groups, resources and `*/sub`, resourceNames,
//!   nonResourceURLs; User, Group and ServiceAccount subjects), with kube-apiserver's 403
//!   wording. The bootstrap policy that matters is built in, not stored: every authenticated
//!   user may read discovery, /version and the health paths and create
//!   SelfSubjectAccessReviews, and a binding may name the ClusterRole cluster-admin.
//! - An update or server-side apply that creates its object also needs `create`; a Role,
//!   ClusterRole or binding may only grant what its writer holds (or has `escalate` / `bind`
//!   for).
//! - SelfSubjectAccessReview is answered (allowed, with RBAC's reason) and never stored.
//!
//! Admission policies (apiserver/admission_policy.rs): the stored ValidatingAdmissionPolicies
//! (admissionregistration.k8s.io/v1) and their bindings judge every create, update and delete
//! after the object's own validation, as kube-apiserver's admission plugin does: resource rules
//! (groups, versions, operations, resources and subresources, names, scope, exclusions),
//! namespace and object selectors, `matchConditions`, `variables`, `validations` in CEL (kube's
//! `cel`, with the Kubernetes libraries) reading `object`, `oldObject`, `request` (its
//! `userInfo` names the user the request runs as, after impersonation) and `namespaceObject`;
//! `failurePolicy`; a binding's `matchResources` and `validationActions: [Deny]`. A denial is
//! the real Status: `<resource> "<name>" is forbidden: ValidatingAdmissionPolicy '<policy>' with
//! binding '<binding>' denied request: <message>`, code 422 `Invalid` unless the validation's
//! `reason` says otherwise. Policies and bindings are checked when written (required fields,
//! supported values, each expression parsed and its identifiers declared) and are never judged
//! by a policy.
//!
//! What clients such as kubectl and Helm read before they write: OpenAPI v3 (apiserver/openapi.rs:
//! every group version's paths and the query parameters of writes, `fieldValidation` among
//! them, so they leave field validation to the server), and `fieldValidation=Strict` is
//! honoured (unknown fields refused with kube-apiserver's strict decoding errors).
//!
//! Known differences from a real server:
//! - JSON and YAML bodies; protobuf only for the kinds client-go's generated clients send to
//!   it (Secret, DeleteOptions: Helm's release records, apiserver/protobuf.rs); no protobuf or
//!   Table output. A few virtual APIs (SubjectAccessReview and the other reviews besides
//!   SelfSubjectAccessReview, token requests, exec, attach, port-forward, proxy) are not
//!   served.
//! - OpenAPI v3 documents carry no schemas, and OpenAPI v2 is not served; strict field
//!   validation does not name unknown fields sent as null, nor duplicate fields in JSON.
//! - ServiceAccount admission mounts no token volume and copies no imagePullSecrets into the
//!   Pod. kube-controller-manager's other per-namespace object, the `kube-root-ca.crt`
//!   ConfigMap, is not created.
//! - Pods are never scheduled (no `nodeName`): a Pod no kubelet reported on answers its log as
//!   a scheduled Pod whose container is being created (400), where a real server answers an
//!   unscheduled Pod's log with 200 and an empty body. `follow` sends what was written and
//!   ends; `sinceSeconds`, `sinceTime` and `stream` are not applied; no previous instance's log
//!   is kept.
//! - There is no network behind Services: an extension API server is up when registered, not
//!   when Pods serve it; its Service's endpoints and the discovery check are one test switch,
//!   a non-ClusterIP Service without a backend fails the discovery check with a made-up dial
//!   error, and an unavailable version shows no resources even if it served some before. The
//!   built-in group versions have no APIService objects.
//! - Authorization is RBAC only (no Node, ABAC or webhook authorizers, no anonymous requests);
//!   ClusterRole aggregationRules are not evaluated; the bootstrap ClusterRoles other than
//!   cluster-admin (view, edit, admin, system:*) are not there to be bound or read, and the
//!   built-in ones cannot be listed; `Impersonate-Uid` and `Impersonate-Extra-*` are ignored.
//!   An escalation refusal on an update may come after validation errors where a real server
//!   would say it first.
//! - Validation covers metadata and the checks charts commonly trip over, not all of it;
//!   defaults are those of the workload kinds, Services, Secrets, namespaces and CRDs.
//! - Server-side apply is a simplified structured-merge-diff: list and map shapes come from a
//!   table for built-in kinds (and the schema for custom resources); `.` marks and conflict
//!   detection follow the recordings but edge cases of list merging may differ.
//! - A `/status` write changes only `.status` (a real server also takes some metadata).
//! - Lists are always served from the current state (a continue token does not pin a
//!   snapshot); `resourceVersionMatch=Exact` only works for the current resourceVersion.
//! - Admission policies: CEL is `cel` (Rust), not cel-go: expressions are not type-checked
//!   against the kinds' schemas (a field the kind lacks fails at evaluation, not when the policy
//!   is written), property names that are CEL reserved words are not escaped (kube-apiserver names
//!   `metadata.namespace` `__namespace__`; `request.namespace` is the same everywhere), there is no cost budget, and errors are worded by
//!   `cel`. Not implemented: `paramKind`/`paramRef` (a binding of such a policy denies with
//!   "params ... are not supported", under `failurePolicy: Fail`), the `authorizer` variable
//!   (an expression reading it fails), `auditAnnotations`, the `Warn` and `Audit` actions
//!   (nothing is sent or logged), `matchPolicy: Equivalent` across versions (rules match the
//!   version requested), the defaults written into stored policies, their `status`, and
//!   CONNECT. A deletecollection with an item a policy denies deletes nothing (kube-apiserver
//!   deletes the items it admits before the denial), and the policies of the other admission
//!   plugins (MutatingAdmissionPolicy, webhooks) are not run.
//! - Deletion is immediate for pods (no kubelet), and namespace and CRD cleanup and garbage
//!   collection run synchronously inside the request that triggers them.
//! - Watches never time out on their own without `timeoutSeconds`; bookmarks come every
//!   minute and two seconds before the timeout, as from the watch cache.

mod admission_policy;
mod aggregator;
mod convert;
mod errors;
mod fields;
mod openapi;
mod patch;
mod pods;
mod protobuf;
mod rbac;
mod resources;
mod restart;
mod scale;
mod select;
mod store;
mod typed;
mod util;
mod validation;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, Method, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use errors::ApiError;
use rbac::User;
pub use rbac::{GROUPS_HEADER, USER_HEADER};
use resources::ResourceType;
pub use restart::Restart;
use select::{FieldSelector, LabelSelector};
use store::{DeleteOptions, Out, Selection, State, Write};

/// One request the server received, with what it answered.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    /// "GET", "PATCH", ...
    pub method: String,
    /// Without the query.
    pub path: String,
    /// The raw query string, "" when none.
    pub query: String,
    pub content_type: Option<String>,
    /// The JSON (or, for apply, YAML) body, parsed, when there was one.
    pub body: Option<Value>,
    pub at: Instant,
    /// The status code answered (200 for a watch that started).
    pub status: u16,
    /// "get", "list", "watch", "create", "update", "patch", "apply", "delete", "deletecollection".
    pub verb: &'static str,
    /// The kind of the resource addressed, when known (e.g. "Deployment").
    pub kind: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// "status" for /status.
    pub subresource: Option<String>,
    /// Which test client sent it (the `x-test-client` header of [`TestApiServer::client_as`]).
    pub client: Option<String>,
    /// The user the request ran as: the impersonated user when it impersonated one, else the
    /// authenticated one ([`USER_HEADER`]); None for the default administrator.
    pub user: Option<String>,
}

/// The header that names a test client.
const CLIENT_HEADER: &str = "x-test-client";

struct Inner {
    addr: SocketAddr,
    state: Mutex<State>,
    /// The latest resourceVersion, for watches to wait on.
    rv_tx: tokio::sync::watch::Sender<u64>,
    /// Clients whose watch streams deliver nothing for now ([`TestApiServer::pause_watches`]).
    paused: Mutex<std::collections::HashSet<String>>,
    /// The server is down ([`TestApiServer::set_down`]).
    down: std::sync::atomic::AtomicBool,
    /// Killed and restarted, etcd reachable or not (apiserver/restart.rs).
    lifecycle: restart::Lifecycle,
}

impl Inner {
    fn is_down(&self) -> bool {
        self.down.load(std::sync::atomic::Ordering::SeqCst) || self.lifecycle.killed()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn notify(&self, rv: u64) {
        self.rv_tx.send_if_modified(|cur| {
            if *cur != rv {
                *cur = rv;
                true
            } else {
                false
            }
        });
    }
}

/// A running test API server; clones share it.
#[derive(Clone)]
pub struct TestApiServer {
    inner: Arc<Inner>,
}

type Body = BoxBody<Bytes, Infallible>;

impl TestApiServer {
    /// Binds 127.0.0.1 on a free port and serves on the current tokio runtime. The namespaces
    /// default, kube-system, kube-public and kube-node-lease exist.
    pub async fn start() -> TestApiServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("local address");
        let state = State::new();
        let (rv_tx, _) = tokio::sync::watch::channel(state.rv);
        let inner = Arc::new(Inner {
            addr,
            state: Mutex::new(state),
            rv_tx,
            paused: Mutex::new(std::collections::HashSet::new()),
            down: std::sync::atomic::AtomicBool::new(false),
            lifecycle: restart::Lifecycle::new(),
        });
        let server = inner.clone();
        tokio::spawn(async move {
            let mut listener = Some(listener);
            let mut kills = server.lifecycle.kills();
            loop {
                let Some(open) = listener.as_ref() else {
                    // Killed: nothing listens (connections are refused) until the restart.
                    server.lifecycle.until_alive().await;
                    listener = Some(restart::rebind(addr).await);
                    kills.borrow_and_update();
                    continue;
                };
                let accepted = tokio::select! {
                    accepted = open.accept() => accepted,
                    _ = kills.changed() => {
                        if server.lifecycle.killed() {
                            listener = None;
                        }
                        continue;
                    }
                };
                let Ok((stream, _)) = accepted else {
                    continue;
                };
                if server.is_down() {
                    // As a server that is not there: the connection ends at once.
                    drop(stream);
                    continue;
                }
                let inner = server.clone();
                let mut killed = server.lifecycle.kills();
                tokio::spawn(async move {
                    let socket = restart::Conn::new(stream, inner.clone());
                    let service = service_fn(move |req| {
                        let inner = inner.clone();
                        async move {
                            if inner.is_down() {
                                // A connection kept alive from before: closed without answer.
                                return Err(std::io::Error::other("the API server is down"));
                            }
                            Ok::<_, std::io::Error>(serve(inner, req).await)
                        }
                    });
                    let connection =
                        http1::Builder::new().serve_connection(TokioIo::new(socket), service);
                    // A kill drops the connection where it is: its socket is reset.
                    tokio::select! {
                        _ = connection => {}
                        _ = killed.changed() => {}
                    }
                });
            }
        });
        TestApiServer { inner }
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    /// The `kube::Config` of [`TestApiServer::client`]: plain HTTP, default namespace
    /// "default", the cluster's administrator (group system:masters). Set
    /// `auth_info.impersonate` / `auth_info.impersonate_groups` on it to impersonate.
    pub fn config(&self) -> kube::Config {
        let uri: http::Uri = self.url().parse().expect("server url");
        let mut config = kube::Config::new(uri);
        config.default_namespace = "default".into();
        config
    }

    /// The `kube::Config` of [`TestApiServer::client_as`]: [`TestApiServer::config`] whose
    /// requests are recorded as sent by `client_name`.
    pub fn config_as(&self, client_name: &str) -> kube::Config {
        let mut config = self.config();
        config.headers.push((
            http::HeaderName::from_static(CLIENT_HEADER),
            http::HeaderValue::from_str(client_name).expect("client name"),
        ));
        config
    }

    /// The `kube::Config` of [`TestApiServer::client_as_user`]: requests recorded as sent by
    /// `client_name`, authenticated as `user` in `groups` ([`USER_HEADER`], [`GROUPS_HEADER`]).
    /// A service account's name (`system:serviceaccount:NS:NAME`) brings the groups
    /// system:serviceaccounts and system:serviceaccounts:NS; every such user is in
    /// system:authenticated, and is allowed what the RBAC objects in the server grant it.
    pub fn config_as_user(&self, client_name: &str, user: &str, groups: &[&str]) -> kube::Config {
        let mut config = self.config_as(client_name);
        config.headers.push((
            http::HeaderName::from_static(USER_HEADER),
            http::HeaderValue::from_str(user).expect("user name"),
        ));
        if !groups.is_empty() {
            config.headers.push((
                http::HeaderName::from_static(GROUPS_HEADER),
                http::HeaderValue::from_str(&groups.join(",")).expect("group names"),
            ));
        }
        config
    }

    /// A new `kube::Client` for this server, default namespace "default", as the cluster's
    /// administrator.
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.config()).expect("kube client")
    }

    /// A client whose requests are recorded as sent by `name` ([`RecordedRequest::client`]), to
    /// tell several controllers apart.
    pub fn client_as(&self, name: &str) -> kube::Client {
        kube::Client::try_from(self.config_as(name)).expect("kube client")
    }

    /// A client recorded as `name_for_recording` that authenticates as `user` in `groups`
    /// (see [`TestApiServer::config_as_user`]) instead of as the administrator.
    pub fn client_as_user(
        &self,
        name_for_recording: &str,
        user: &str,
        groups: &[&str],
    ) -> kube::Client {
        kube::Client::try_from(self.config_as_user(name_for_recording, user, groups))
            .expect("kube client")
    }

    /// Takes the server down (as kube-apiserver stopped: new connections are closed at once,
    /// requests on open ones get no answer, watches end) or brings it back with everything it
    /// held, as a restarted kube-apiserver over the same etcd.
    pub fn set_down(&self, down: bool) {
        self.inner
            .down
            .store(down, std::sync::atomic::Ordering::SeqCst);
        // Wakes the watch streams, which end while the server is down.
        self.inner.rv_tx.send_modify(|_| {});
    }

    /// Holds back every watch event for `client` (as a slow or partitioned watch connection
    /// would) until [`TestApiServer::resume_watches`]: its caches go stale while its requests
    /// are still answered.
    pub fn pause_watches(&self, client: &str) {
        self.inner
            .paused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(client.to_string());
    }

    /// Holds back the watch events of resource `plural` (e.g. `sequencedreleases`) for
    /// `client`, as [`TestApiServer::pause_watches`] does for all its watches; resumed by
    /// `resume_watches(&format!("{client}/{plural}"))`.
    pub fn pause_watches_of(&self, client: &str, plural: &str) {
        self.pause_watches(&format!("{client}/{plural}"));
    }

    /// Delivers the events held back for `client`, and the ones after them.
    pub fn resume_watches(&self, client: &str) {
        self.inner
            .paused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(client);
        self.inner.rv_tx.send_modify(|_| {});
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.inner.lock().requests.clone()
    }

    pub fn clear_requests(&self) {
        self.inner.lock().requests.clear();
    }

    /// How many requests had `verb` on `kind` (any kind when None).
    pub fn count(&self, verb: &str, kind: Option<&str>) -> usize {
        self.inner
            .lock()
            .requests
            .iter()
            .filter(|r| r.verb == verb && (kind.is_none() || r.kind.as_deref() == kind))
            .count()
    }

    /// The stored object (as served at `api_version`), None when absent.
    pub fn object(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let state = self.inner.lock();
        let (rt, version) = state.type_for_kind(api_version, kind)?;
        let obj = state
            .objects
            .get(&State::key(&rt, namespace.unwrap_or(""), name))?;
        Some(store::present(&rt, &version, obj))
    }

    /// The stored objects of `kind` (as served at `api_version`) in `namespace`, or in every
    /// namespace for None, in name order.
    pub fn objects(&self, api_version: &str, kind: &str, namespace: Option<&str>) -> Vec<Value> {
        let state = self.inner.lock();
        let Some((rt, version)) = state.type_for_kind(api_version, kind) else {
            return Vec::new();
        };
        state
            .of_resource(&rt.storage_group, &rt.storage_resource, namespace)
            .map(|(_, obj)| store::present(&rt, &version, obj))
            .collect()
    }

    /// Merges `status` into the object's .status (JSON merge patch), with a new resourceVersion
    /// and a MODIFIED watch event, as the kubelet or a built-in controller would. False when
    /// the object does not exist.
    pub fn set_status(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        status: Value,
    ) -> bool {
        let mut state = self.inner.lock();
        let Some((rt, _)) = state.type_for_kind(api_version, kind) else {
            return false;
        };
        let done = state.merge_status(&State::key(&rt, namespace.unwrap_or(""), name), &status);
        let rv = state.rv;
        drop(state);
        self.inner.notify(rv);
        done
    }

    /// Removes every metadata.finalizers entry, as the foreign controller owning them would;
    /// an object being deleted is then gone. False when the object does not exist.
    pub fn remove_finalizers(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> bool {
        let mut state = self.inner.lock();
        let Some((rt, _)) = state.type_for_kind(api_version, kind) else {
            return false;
        };
        let done = state.clear_finalizers(&State::key(&rt, namespace.unwrap_or(""), name));
        let rv = state.rv;
        drop(state);
        self.inner.notify(rv);
        done
    }

    /// Plays the kubelet: container `container` of Pod `namespace/name` has written `text`
    /// (all of it so far), which `GET .../pods/NAME/log` then serves. False when the Pod does
    /// not exist. The log goes with the Pod.
    pub fn set_log(&self, namespace: &str, name: &str, container: &str, text: &str) -> bool {
        let mut state = self.inner.lock();
        let key = store::Key {
            group: String::new(),
            resource: "pods".into(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        if !state.objects.contains_key(&key) {
            return false;
        }
        let at = k8s_openapi::jiff::Timestamp::now().to_string();
        state.logs.insert(
            (namespace.into(), name.into(), container.into()),
            pods::Log {
                text: text.to_string(),
                at,
            },
        );
        true
    }

    /// Starts an extension API server for `group`/`version` serving `resources` (plural,
    /// kind, namespaced), each a collection with nothing in it to list or get. An APIService
    /// for that group version whose Service exists (listening on its port) is then available
    /// and requests under `/apis/GROUP/VERSION` reach it; without the Service, or with
    /// [`TestApiServer::stop_aggregated`], they get 503 as from a real aggregator.
    pub fn serve_aggregated(&self, group: &str, version: &str, resources: &[(&str, &str, bool)]) {
        let resources = resources
            .iter()
            .map(|(plural, kind, namespaced)| aggregator::Resource {
                plural: plural.to_string(),
                kind: kind.to_string(),
                namespaced: *namespaced,
            })
            .collect();
        self.with_backends(|b| {
            b.insert((group.into(), version.into()), resources);
        });
    }

    /// Stops the extension API server of `group`/`version`: its APIService becomes
    /// unavailable (its Service has no endpoints left).
    pub fn stop_aggregated(&self, group: &str, version: &str) {
        self.with_backends(|b| {
            b.remove(&(group.to_string(), version.to_string()));
        });
    }

    fn with_backends(&self, change: impl FnOnce(&mut aggregator::Backends)) {
        let mut state = self.inner.lock();
        change(&mut state.backends);
        state.apiservices_due = true;
        state.reconcile();
        let rv = state.rv;
        drop(state);
        self.inner.notify(rv);
    }

    /// Makes the next `count` requests with `method` whose path (with query) contains
    /// `path_contains` fail with `status` and a Status body (429 and 503 with Retry-After: 1).
    pub fn fail_next(&self, method: &str, path_contains: &str, status: u16, count: usize) {
        self.inner.lock().failures.push(store::Failure {
            method: method.to_uppercase(),
            path_contains: path_contains.to_string(),
            status,
            remaining: count,
        });
    }

    /// Forgets the watch history, as etcd compaction does: watches from an older
    /// resourceVersion get 410 Gone.
    pub fn compact(&self) {
        self.inner.lock().compact();
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.inner.lock().rv
    }

    /// Waits until `predicate` holds or `timeout` passes; whether it held.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        predicate: impl Fn(&TestApiServer) -> bool,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if predicate(self) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A request as the handlers see it.
#[derive(Clone)]
struct Req {
    method: Method,
    path: String,
    query: String,
    params: Vec<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
}

impl Req {
    /// Whether the request asks for a dry run (`dryRun=All`).
    fn dry_run(&self) -> bool {
        self.params.iter().any(|(k, v)| k == "dryRun" && v == "All")
    }

    fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The media type of the body, without parameters.
    fn content_type(&self) -> Option<String> {
        self.header("content-type")
            .map(|c| c.split(';').next().unwrap_or("").trim().to_lowercase())
    }

    fn flag(&self, name: &str) -> bool {
        matches!(
            self.param(name),
            Some("1" | "t" | "T" | "true" | "TRUE" | "True")
        )
    }
}

/// How to answer.
enum Reply {
    Json {
        status: u16,
        body: Value,
        content_type: String,
        retry_after: Option<u32>,
    },
    Text(u16, String),
    /// A body sent as it is, with its media type (a container's log).
    Raw {
        status: u16,
        content_type: &'static str,
        body: Vec<u8>,
    },
    Watch(Box<WatchPlan>),
}

impl Reply {
    fn json(status: u16, body: Value) -> Reply {
        Reply::Json {
            status,
            body,
            content_type: "application/json".into(),
            retry_after: None,
        }
    }

    fn error(e: ApiError) -> Reply {
        Reply::Json {
            status: e.code,
            body: e.body,
            content_type: "application/json".into(),
            retry_after: e.retry_after,
        }
    }

    fn status(&self) -> u16 {
        match self {
            Reply::Json { status, .. } | Reply::Text(status, _) | Reply::Raw { status, .. } => {
                *status
            }
            Reply::Watch(_) => 200,
        }
    }
}

/// Everything a watch stream needs.
struct WatchPlan {
    rt: ResourceType,
    version: String,
    namespace: String,
    selection: Selection,
    metadata_only: bool,
    bookmarks: bool,
    /// Lines sent first (initial events, or the ERROR of a too old resourceVersion).
    first: Vec<Bytes>,
    from: u64,
    deadline: Option<tokio::time::Instant>,
    /// The stream ends after `first` (an ERROR event).
    finished: bool,
    /// The client that asked ([`CLIENT_HEADER`]).
    client: Option<String>,
}

async fn serve(inner: Arc<Inner>, req: http::Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let bytes = match Limited::new(body, 3 * 1024 * 1024).collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => {
            let e = ApiError::new(
                413,
                "RequestEntityTooLarge",
                "Request entity too large: limit is 3145728",
                None,
            );
            return json_response(e.code, &e.body, "application/json", None);
        }
    };
    let query = parts.uri.query().unwrap_or("").to_string();
    let req = Req {
        method: parts.method,
        path: parts.uri.path().to_string(),
        params: util::parse_query(&query),
        query,
        headers: parts.headers,
        body: bytes,
    };
    if restart::hold_gate(&inner, &req).await.is_some() {
        // Dropped: it never reached the server; the connection closes unanswered.
        return Response::builder()
            .status(StatusCode::SERVICE_UNAVAILABLE)
            .header("connection", "close")
            .body(Full::new(Bytes::new()).boxed())
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()));
    }
    let gated = restart::storage_gate(&inner, &req).await;
    let reply = dispatch(&inner, &req, gated);
    match reply {
        Reply::Json {
            status,
            body,
            content_type,
            retry_after,
        } => json_response(status, &body, &content_type, retry_after),
        // What Go's http.Error and the health checks send.
        Reply::Text(status, text) => Response::builder()
            .status(status)
            .header("content-type", "text/plain; charset=utf-8")
            .header("x-content-type-options", "nosniff")
            .body(Full::new(Bytes::from(text)).boxed())
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed())),
        Reply::Raw {
            status,
            content_type,
            body,
        } => Response::builder()
            .status(status)
            .header("content-type", content_type)
            .body(Full::new(Bytes::from(body)).boxed())
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed())),
        Reply::Watch(plan) => watch_response(inner, *plan),
    }
}

fn json_response(
    status: u16,
    body: &Value,
    content_type: &str,
    retry_after: Option<u32>,
) -> Response<Body> {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut b = Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", content_type)
        .header("cache-control", "no-cache, private");
    if let Some(s) = retry_after {
        b = b.header("retry-after", s.to_string());
    }
    b.body(Full::new(Bytes::from(bytes)).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

/// Where a path points.
enum Route {
    Version,
    Health,
    CoreVersions,
    Groups,
    Group(String),
    ResourceList(String, String),
    /// `/openapi/v3`: the index of group versions.
    OpenApiIndex,
    /// `/openapi/v3/api/v1`, `/openapi/v3/apis/GROUP/VERSION`.
    OpenApi(String, String),
    Resource(Box<Target>),
    /// Under `/apis/G/V` of an APIService that is not available.
    Unavailable,
    /// Under `/apis/G/V/` of a running extension API server: group, version, the path after.
    Aggregated(String, String, Vec<String>),
}

struct Target {
    rt: ResourceType,
    version: String,
    namespace: String,
    name: String,
    sub: String,
}

fn route(state: &State, path: &str) -> Result<Route, ApiError> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let served = |g: &str| state.groups().into_iter().find(|(name, _)| name == g);
    match segs.as_slice() {
        ["version"] => Ok(Route::Version),
        ["healthz" | "readyz" | "livez"] => Ok(Route::Health),
        ["api"] => Ok(Route::CoreVersions),
        ["api", "v1"] => Ok(Route::ResourceList(String::new(), "v1".into())),
        ["api", "v1", rest @ ..] => resource_route(state, "", "v1", rest),
        ["apis"] => Ok(Route::Groups),
        ["apis", g] => served(g)
            .map(|_| Route::Group(g.to_string()))
            .ok_or_else(ApiError::no_such_resource),
        ["apis", g, v, rest @ ..] if aggregator::remote(state, g, v).is_some() => {
            Ok(match aggregator::remote(state, g, v) {
                Some(true) => Route::Aggregated(
                    g.to_string(),
                    v.to_string(),
                    rest.iter().map(|s| s.to_string()).collect(),
                ),
                _ => Route::Unavailable,
            })
        }
        ["apis", g, v] => served(g)
            .filter(|(_, vs)| vs.iter().any(|x| x == v))
            .map(|_| Route::ResourceList(g.to_string(), v.to_string()))
            .ok_or_else(ApiError::no_such_resource),
        ["apis", g, v, rest @ ..] => resource_route(state, g, v, rest),
        ["openapi", "v3"] => Ok(Route::OpenApiIndex),
        ["openapi", "v3", rest @ ..] => openapi::parse(rest)
            .filter(|(g, v)| openapi_served(state).contains(&(g.clone(), v.clone())))
            .map(|(g, v)| Route::OpenApi(g, v))
            .ok_or_else(ApiError::no_such_resource),
        _ => Err(ApiError::no_such_resource()),
    }
}

/// Every served group version, the core one first: what /openapi/v3 lists.
fn openapi_served(state: &State) -> Vec<(String, String)> {
    std::iter::once((String::new(), "v1".to_string()))
        .chain(
            state
                .groups()
                .into_iter()
                .flat_map(|(g, vs)| vs.into_iter().map(move |v| (g.clone(), v))),
        )
        .collect()
}

fn resource_route(
    state: &State,
    group: &str,
    version: &str,
    rest: &[&str],
) -> Result<Route, ApiError> {
    let (namespace, plural, name, sub) = match rest {
        ["namespaces", ns, plural]
            if !(group.is_empty() && matches!(*plural, "status" | "finalize")) =>
        {
            (*ns, *plural, "", "")
        }
        ["namespaces", ns, plural, name] => (*ns, *plural, *name, ""),
        ["namespaces", ns, plural, name, sub] => (*ns, *plural, *name, *sub),
        [plural] => ("", *plural, "", ""),
        [plural, name] => ("", *plural, *name, ""),
        [plural, name, sub] => ("", *plural, *name, *sub),
        _ => return Err(ApiError::no_such_resource()),
    };
    let rt = state
        .find_type(group, version, plural)
        .ok_or_else(ApiError::no_such_resource)?;
    if !namespace.is_empty() && !rt.namespaced {
        return Err(ApiError::no_such_resource());
    }
    if rt.namespaced && namespace.is_empty() && !name.is_empty() {
        return Err(ApiError::no_such_resource());
    }
    let log = sub == "log" && rt.serves_log();
    if !(sub.is_empty()
        || (sub == "status" && rt.status)
        || (sub == "scale" && scale::serves(&rt))
        || log)
    {
        return Err(ApiError::no_such_resource());
    }
    Ok(Route::Resource(Box::new(Target {
        rt,
        version: version.to_string(),
        namespace: namespace.to_string(),
        name: name.to_string(),
        sub: sub.to_string(),
    })))
}

fn verb_of(req: &Req, target: Option<&Target>) -> &'static str {
    let has_name = target.is_some_and(|t| !t.name.is_empty());
    match req.method {
        Method::GET if has_name => "get",
        Method::GET if target.is_some() && req.flag("watch") => "watch",
        Method::GET if target.is_some() => "list",
        Method::GET => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH if req.content_type().as_deref() == Some("application/apply-patch+yaml") => {
            "apply"
        }
        Method::PATCH => "patch",
        Method::DELETE if has_name => "delete",
        Method::DELETE => "deletecollection",
        _ => "get",
    }
}

/// Parses the request body as JSON (YAML too for apply and application/yaml).
fn parse_body(req: &Req) -> Option<Result<Value, String>> {
    if req.body.is_empty() {
        return None;
    }
    if req.content_type().as_deref() == Some(protobuf::MEDIA_TYPE) {
        return Some(protobuf::decode(&req.body).map_err(|e| match e {
            protobuf::Error::Unsupported(kind) => {
                format!("no protobuf decoding of {kind} in this test server")
            }
            protobuf::Error::Invalid(why) => why,
        }));
    }
    let yaml = matches!(
        req.content_type().as_deref(),
        Some("application/apply-patch+yaml" | "application/yaml")
    );
    Some(if yaml {
        serde_yaml_ng::from_slice::<Value>(&req.body)
            .map_err(|e| format!("error decoding YAML: {e}"))
    } else {
        serde_json::from_slice::<Value>(&req.body)
            .map_err(|e| format!("couldn't get version/kind; json parse error: {e}"))
    })
}

/// Answers `req`; `gated` is what an unreachable etcd answers instead of the handler.
fn dispatch(inner: &Inner, req: &Req, gated: Option<ApiError>) -> Reply {
    let mut state = inner.lock();
    state.rbac_unsynced = inner.lifecycle.rbac_unsynced();
    let routed = route(&state, &req.path);
    let target = match &routed {
        Ok(Route::Resource(t)) => Some(t.as_ref()),
        _ => None,
    };
    let verb = verb_of(req, target);
    let parsed = parse_body(req);
    let full_path = if req.query.is_empty() {
        req.path.clone()
    } else {
        format!("{}?{}", req.path, req.query)
    };
    // Authentication, then the impersonation filter: who the request runs as.
    let authenticated = rbac::authenticate(&req.headers);
    let requester = authenticated.clone().unwrap_or_else(User::admin);
    let impersonated = rbac::impersonate(&state, &requester, &req.headers, &full_path);
    let (user, user_name) = match &impersonated {
        Ok(Some(u)) => (u.clone(), Some(u.name.clone())),
        _ => (requester, authenticated.map(|u| u.name)),
    };
    let index = state.requests.len();
    state.requests.push(RecordedRequest {
        method: req.method.to_string(),
        path: req.path.clone(),
        query: req.query.clone(),
        content_type: req.header("content-type").map(String::from),
        body: parsed.as_ref().and_then(|r| r.as_ref().ok().cloned()),
        at: Instant::now(),
        status: 0,
        verb,
        kind: target.map(|t| t.rt.kind.clone()),
        namespace: target
            .filter(|t| !t.namespace.is_empty())
            .map(|t| t.namespace.clone()),
        // As an audit log names the object of a create: from the body.
        name: target
            .filter(|t| !t.name.is_empty())
            .map(|t| t.name.clone())
            .or_else(|| {
                let body = parsed.as_ref()?.as_ref().ok()?;
                Some(body.pointer("/metadata/name")?.as_str()?.to_string())
            })
            .filter(|_| target.is_some()),
        subresource: target.filter(|t| !t.sub.is_empty()).map(|t| t.sub.clone()),
        client: req.header(CLIENT_HEADER).map(String::from),
        user: user_name,
    });
    let method = req.method.as_str().to_uppercase();
    let injected = state
        .failures
        .iter_mut()
        .find(|f| f.remaining > 0 && f.method == method && full_path.contains(&f.path_contains))
        .map(|f| {
            f.remaining -= 1;
            f.status
        });
    state.failures.retain(|f| f.remaining > 0);
    let reply = match (injected, impersonated) {
        (Some(code), _) => Reply::error(ApiError::injected(code)),
        (None, Err(rbac::Refused::Forbidden(e))) => Reply::error(e),
        (None, Err(rbac::Refused::Internal(text))) => Reply::Text(500, text),
        (None, Ok(_)) => {
            // The authorizer judges the request as its URL reads, before any routing.
            let attributes = rbac::request_info(&req.method, &req.path, &req.params);
            match (rbac::check(&state, &user, &attributes), routed) {
                (Err(e), _) | (Ok(()), Err(e)) => Reply::error(e),
                (Ok(()), Ok(route)) => match inner.lifecycle.interpose(req, &route, &state) {
                    Some(reply) => reply,
                    None => {
                        match admission_policy::admit(&mut state, req, &route, &parsed, &user) {
                            Err(e) => Reply::error(e),
                            Ok(()) => match gated {
                                Some(e) => Reply::error(e),
                                None => handle(&mut state, req, route, parsed, &user),
                            },
                        }
                    }
                },
            }
        }
    };
    state.requests[index].status = reply.status();
    let rv = state.rv;
    drop(state);
    inner.notify(rv);
    reply
}

fn handle(
    state: &mut State,
    req: &Req,
    route: Route,
    body: Option<Result<Value, String>>,
    user: &User,
) -> Reply {
    let get_only = |r: Reply| {
        if req.method == Method::GET {
            r
        } else {
            Reply::error(ApiError::method_not_allowed())
        }
    };
    let accept = req.header("accept").unwrap_or("").to_string();
    match route {
        Route::Version => get_only(Reply::json(200, version_doc())),
        Route::Health => get_only(Reply::Text(200, "ok".into())),
        Route::CoreVersions => get_only(match aggregated(&accept) {
            Some(Ok(())) => aggregated_reply(json!([{
                "metadata": {"creationTimestamp": null},
                "versions": [{"version": "v1", "resources": resources::aggregated_resources(&state.types_in("", "v1").iter().collect::<Vec<_>>(), "v1"), "freshness": "Current"}],
            }])),
            Some(Err(e)) => Reply::error(e),
            None => Reply::json(
                200,
                json!({
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": req.header("host").unwrap_or("127.0.0.1")}],
                }),
            ),
        }),
        Route::Groups => get_only(match aggregated(&accept) {
            Some(Ok(())) => {
                let items: Vec<Value> = state
                    .groups()
                    .into_iter()
                    .map(|(g, versions)| {
                        let versions: Vec<Value> = versions
                            .iter()
                            .map(|v| match aggregator::remote(state, &g, v) {
                                // The aggregator could not fetch the backend's discovery.
                                Some(false) => json!({"version": v, "freshness": "Stale"}),
                                Some(true) => {
                                    let served = state.backends.get(&(g.clone(), v.clone())).map(Vec::as_slice).unwrap_or_default();
                                    json!({"version": v, "resources": aggregator::discovery_resources(&g, v, served), "freshness": "Current"})
                                }
                                None => json!({"version": v, "resources": resources::aggregated_resources(&state.types_in(&g, v).iter().collect::<Vec<_>>(), v), "freshness": "Current"}),
                            })
                            .collect();
                        json!({"metadata": {"name": g, "creationTimestamp": null}, "versions": versions})
                    })
                    .collect();
                aggregated_reply(Value::Array(items))
            }
            Some(Err(e)) => Reply::error(e),
            None => {
                let groups: Vec<Value> = state
                    .groups()
                    .iter()
                    .map(|(g, vs)| resources::api_group(g, vs))
                    .collect();
                Reply::json(
                    200,
                    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}),
                )
            }
        }),
        Route::Group(g) => get_only({
            let versions = state
                .groups()
                .into_iter()
                .find(|(n, _)| *n == g)
                .map(|(_, v)| v)
                .unwrap_or_default();
            let mut doc = resources::api_group(&g, &versions);
            doc["kind"] = json!("APIGroup");
            doc["apiVersion"] = json!("v1");
            Reply::json(200, doc)
        }),
        Route::ResourceList(g, v) => get_only({
            let types = state.types_in(&g, &v);
            let list = resources::api_resources(&types.iter().collect::<Vec<_>>());
            let gv = if g.is_empty() {
                v.clone()
            } else {
                format!("{g}/{v}")
            };
            if g.is_empty() {
                Reply::json(
                    200,
                    json!({"kind": "APIResourceList", "groupVersion": gv, "resources": list}),
                )
            } else {
                Reply::json(
                    200,
                    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list}),
                )
            }
        }),
        Route::OpenApiIndex => get_only({
            let mut served: Vec<(String, Vec<String>)> = Vec::new();
            for (g, v) in openapi_served(state) {
                match served.iter_mut().find(|(name, _)| *name == g) {
                    Some((_, vs)) => vs.push(v),
                    None => served.push((g, vec![v])),
                }
            }
            Reply::json(
                200,
                openapi::index(&served, |g, v| {
                    openapi::document(g, v, &state.types_in(g, v))
                }),
            )
        }),
        Route::OpenApi(g, v) => get_only(Reply::json(
            200,
            openapi::document(&g, &v, &state.types_in(&g, &v)),
        )),
        Route::Resource(t) => match resource(state, req, &t, body, user) {
            Ok(r) => r,
            Err(e) => Reply::error(e),
        },
        // The aggregator's proxy: http.Error, not a Status.
        Route::Unavailable => Reply::Text(503, "service unavailable\n".into()),
        Route::Aggregated(g, v, rest) => {
            let Some(served) = state.backends.get(&(g.clone(), v.clone())) else {
                return Reply::Text(503, "service unavailable\n".into());
            };
            let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
            match aggregator::serve(req.method == Method::GET, &g, &v, served, &rest) {
                Ok(body) => Reply::json(200, body),
                Err(e) => Reply::error(e),
            }
        }
    }
}

/// Whether the Accept header asks for aggregated discovery: a 1.28 server serves
/// apidiscovery.k8s.io/v2beta1 and does not know v2.
fn aggregated(accept: &str) -> Option<Result<(), ApiError>> {
    let clauses: Vec<&str> = accept.split(',').map(str::trim).collect();
    let mut wanted_aggregated = false;
    for c in &clauses {
        if c.contains("as=APIGroupDiscoveryList") {
            wanted_aggregated = true;
            if c.contains("v=v2beta1") && c.contains("g=apidiscovery.k8s.io") {
                return Some(Ok(()));
            }
        } else if c.starts_with("application/json") || c.starts_with("*/*") || c.is_empty() {
            return None;
        }
    }
    if wanted_aggregated {
        Some(Err(ApiError::not_acceptable()))
    } else {
        None
    }
}

fn aggregated_reply(items: Value) -> Reply {
    Reply::Json {
        status: 200,
        body: json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2beta1", "metadata": {}, "items": items}),
        content_type: "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
            .into(),
        retry_after: None,
    }
}

fn version_doc() -> Value {
    json!({
        "major": "1",
        "minor": "28",
        "gitVersion": "v1.28.7",
        "gitCommit": "c8dcb00be9961ec36d141d2e4103f85f92bcf291",
        "gitTreeState": "clean",
        "buildDate": "2024-03-19T00:00:00Z",
        "goVersion": "go1.21.13",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// What the Accept header asks an object to be shown as.
#[derive(Debug, Clone, Copy, PartialEq)]
enum View {
    Full,
    /// PartialObjectMetadata (List for lists).
    Metadata,
}

fn view(req: &Req, list: bool) -> Result<View, ApiError> {
    let accept = req.header("accept").unwrap_or("");
    let mut saw_other = false;
    for clause in accept.split(',').map(str::trim) {
        let params: Vec<&str> = clause.split(';').map(str::trim).collect();
        let as_ = params.iter().find_map(|p| p.strip_prefix("as="));
        match as_ {
            None => return Ok(View::Full),
            Some("PartialObjectMetadata") if !list => return Ok(View::Metadata),
            Some("PartialObjectMetadataList") if list => return Ok(View::Metadata),
            Some(_) => saw_other = true,
        }
    }
    if saw_other {
        Err(ApiError::not_acceptable())
    } else {
        Ok(View::Full)
    }
}

fn show(t: &Target, view: View, obj: &Value) -> Value {
    let presented = store::present(&t.rt, &t.version, obj);
    match view {
        View::Full => presented,
        View::Metadata => store::as_partial(&presented),
    }
}

fn list_options_invalid(field: &str, detail: &str) -> ApiError {
    let cause = errors::FieldError::forbidden(field, detail);
    let mut e = ApiError::invalid("meta.k8s.io", "ListOptions", "", &[cause]);
    if let Some(d) = e.body.get_mut("details").and_then(Value::as_object_mut) {
        d.remove("name");
    }
    e
}

fn selection(req: &Req, rt: &ResourceType) -> Result<Selection, ApiError> {
    let labels = LabelSelector::parse(req.param("labelSelector").unwrap_or(""))
        .map_err(ApiError::bad_request)?;
    let fields = FieldSelector::parse(
        req.param("fieldSelector").unwrap_or(""),
        &rt.group,
        &rt.kind,
    )
    .map_err(ApiError::bad_request)?;
    Ok(Selection { labels, fields })
}

fn body_value(body: Option<Result<Value, String>>) -> Result<Value, ApiError> {
    match body {
        None => Err(ApiError::bad_request("the body of the request was empty")),
        Some(Err(e)) => Err(ApiError::bad_request(e)),
        Some(Ok(v)) => Ok(v),
    }
}

fn resource(
    state: &mut State,
    req: &Req,
    t: &Target,
    body: Option<Result<Value, String>>,
    user: &User,
) -> Result<Reply, ApiError> {
    let dry_run = req.dry_run();
    let manager_param = req.param("fieldManager").map(String::from);
    let manager = manager_param.clone().unwrap_or_else(|| {
        let ua = req.header("user-agent").unwrap_or("");
        ua.split('/')
            .next()
            .unwrap_or("")
            .chars()
            .filter(|c| !c.is_control())
            .take(128)
            .collect()
    });
    let w = Write {
        rt: &t.rt,
        version: &t.version,
        namespace: &t.namespace,
        name: &t.name,
        sub: &t.sub,
        manager: &manager,
        dry_run,
        strict: match (req.param("fieldValidation"), &req.method) {
            (Some("Strict"), &Method::PATCH) => store::Strict::Patch,
            (Some("Strict"), _) => store::Strict::Body,
            _ => store::Strict::No,
        },
    };
    let item = !t.name.is_empty();
    if t.rt.is_review() {
        if req.method != Method::POST || item {
            return Err(ApiError::method_not_allowed());
        }
        let review = rbac::self_subject_access_review(
            state,
            user,
            &body_value(body)?,
            &manager,
            &util::now_time(),
        )?;
        return Ok(Reply::json(201, review));
    }
    if t.sub == "log" {
        if req.method != Method::GET {
            return Err(ApiError::method_not_allowed());
        }
        let body = pods::log(state, &t.namespace, &t.name, &req.params)?;
        return Ok(Reply::Raw {
            status: 200,
            content_type: "text/plain",
            body,
        });
    }
    if !user.is_admin() && t.sub.is_empty() {
        authorize_write(state, req, t, &body, user)?;
    }
    if t.sub == "scale" {
        let body = match body {
            Some(Err(e)) => return Err(ApiError::bad_request(e)),
            Some(Ok(v)) => Some(v),
            None => None,
        };
        let content_type = req.content_type().unwrap_or_default();
        let scale = scale::handle(state, &w, &req.method, &content_type, body)?;
        return Ok(Reply::json(200, scale));
    }
    let object_reply = |out: Out, v: View| match out {
        Out::Object(code, obj) => Reply::json(code, show(t, v, &obj)),
        Out::Raw(code, body) => Reply::json(code, body),
    };
    match (req.method.clone(), item) {
        (Method::GET, true) => {
            let v = view(req, false)?;
            let obj = state.get(&t.rt, &t.namespace, &t.name)?;
            Ok(Reply::json(200, show(t, v, &obj)))
        }
        (Method::GET, false) if req.flag("watch") => watch(state, req, t),
        (Method::GET, false) => list(state, req, t),
        (Method::POST | Method::PUT, _) if !body_media_type_ok(req) => {
            Err(ApiError::unsupported_media_type(
                &req.content_type().unwrap_or_default(),
                &[
                    "application/json",
                    "application/yaml",
                    "application/vnd.kubernetes.protobuf",
                ],
            ))
        }
        (Method::POST, false) => {
            let v = view(req, false)?;
            Ok(object_reply(state.create(&w, body_value(body)?)?, v))
        }
        (Method::PUT, true) => {
            let v = view(req, false)?;
            Ok(object_reply(state.update(&w, body_value(body)?)?, v))
        }
        (Method::PATCH, true) => {
            let v = view(req, false)?;
            let ct = req.content_type().unwrap_or_default();
            let force = req.param("force");
            if ct == "application/apply-patch+yaml" {
                if manager_param.as_deref().unwrap_or("").is_empty() {
                    return Err(patch_options_invalid(errors::FieldError::required(
                        "fieldManager",
                        "is required for apply patch",
                    )));
                }
                let force = matches!(force, Some("true" | "1"));
                return Ok(object_reply(state.apply(&w, body_value(body)?, force)?, v));
            }
            if force.is_some_and(|f| f == "true" || f == "1") {
                return Err(patch_options_invalid(errors::FieldError::forbidden(
                    "force",
                    "may not be specified for non-apply patch",
                )));
            }
            let mut accepted = vec![
                "application/json-patch+json",
                "application/merge-patch+json",
            ];
            if !t.rt.is_custom() {
                accepted.push("application/strategic-merge-patch+json");
            }
            accepted.push("application/apply-patch+yaml");
            if !accepted.contains(&ct.as_str()) {
                return Err(ApiError::unsupported_media_type(&ct, &accepted));
            }
            Ok(object_reply(state.patch(&w, &ct, &body_value(body)?)?, v))
        }
        (Method::DELETE, true) => {
            let v = view(req, false)?;
            let opts = delete_options(req, body)?;
            Ok(object_reply(
                state.delete(&t.rt, &t.namespace, &t.name, &opts)?,
                v,
            ))
        }
        (Method::DELETE, false) => {
            let opts = delete_options(req, body)?;
            let sel = selection(req, &t.rt)?;
            let mut list = state.delete_collection(&t.rt, &t.version, &t.namespace, &sel, &opts)?;
            if !t.rt.is_custom()
                && let Some(items) = list.get_mut("items").and_then(Value::as_array_mut)
            {
                for i in items.iter_mut().filter_map(Value::as_object_mut) {
                    i.remove("apiVersion");
                    i.remove("kind");
                }
            }
            Ok(Reply::json(200, list))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// What kube-apiserver checks of a write beyond the request's own authorization: RBAC
/// escalation prevention for roles and bindings (on the object the write would store), and
/// `create` for an update or apply that would create its object.
fn authorize_write(
    state: &mut State,
    req: &Req,
    t: &Target,
    body: &Option<Result<Value, String>>,
    user: &User,
) -> Result<(), ApiError> {
    let item = !t.name.is_empty();
    if t.rt.group == "rbac.authorization.k8s.io" {
        match req.method {
            Method::POST if !item => {
                if let Some(Ok(new)) = body {
                    rbac::check_escalation(state, user, &t.rt.kind, &t.namespace, "", None, new)?;
                }
            }
            Method::PUT | Method::PATCH if item => {
                let old = state.get(&t.rt, &t.namespace, &t.name).ok();
                let mut dry = req.clone();
                dry.params.push(("dryRun".into(), "All".into()));
                if let Reply::Json {
                    status, body: new, ..
                } = resource(state, &dry, t, body.clone(), &User::admin())?
                    && status < 300
                {
                    rbac::check_escalation(
                        state,
                        user,
                        &t.rt.kind,
                        &t.namespace,
                        &t.name,
                        old.as_ref(),
                        &new,
                    )?;
                }
            }
            _ => {}
        }
    }
    let apply = req.method == Method::PATCH
        && req.content_type().as_deref() == Some("application/apply-patch+yaml");
    let put_create = req.method == Method::PUT && t.rt.create_on_update();
    if item && (apply || put_create) && state.get(&t.rt, &t.namespace, &t.name).is_err() {
        rbac::check_create_on_update(
            state,
            user,
            &t.rt.group,
            &t.rt.plural,
            &t.namespace,
            &t.name,
        )?;
    }
    Ok(())
}

/// POST and PUT take JSON or YAML (protobuf is not understood here); no Content-Type is JSON.
fn body_media_type_ok(req: &Req) -> bool {
    match req.content_type().as_deref() {
        None | Some("" | "application/json" | "application/yaml") => true,
        Some(protobuf::MEDIA_TYPE) => protobuf::decodable(&req.body),
        Some(_) => false,
    }
}

fn patch_options_invalid(cause: errors::FieldError) -> ApiError {
    let mut e = ApiError::invalid("meta.k8s.io", "PatchOptions", "", &[cause]);
    if let Some(d) = e.body.get_mut("details").and_then(Value::as_object_mut) {
        d.remove("name");
    }
    e
}

fn delete_options(
    req: &Req,
    body: Option<Result<Value, String>>,
) -> Result<DeleteOptions, ApiError> {
    let body = match body {
        None => Value::Null,
        Some(b) => b.map_err(ApiError::bad_request)?,
    };
    let s = |k: &str| body.get(k).and_then(Value::as_str).map(String::from);
    let mut propagation = req
        .param("propagationPolicy")
        .map(String::from)
        .or_else(|| s("propagationPolicy"));
    if propagation.is_none() {
        match body.get("orphanDependents").and_then(Value::as_bool) {
            Some(true) => propagation = Some("Orphan".into()),
            Some(false) => propagation = Some("Background".into()),
            None => {}
        }
    }
    if let Some(p) = &propagation
        && !matches!(p.as_str(), "Orphan" | "Background" | "Foreground")
    {
        let cause = errors::FieldError::not_supported(
            "propagationPolicy",
            p,
            &["Foreground", "Background", "Orphan", "nil"],
        );
        let mut e = ApiError::invalid("meta.k8s.io", "DeleteOptions", "", &[cause]);
        if let Some(d) = e.body.get_mut("details").and_then(Value::as_object_mut) {
            d.remove("name");
        }
        return Err(e);
    }
    let dry_run = req.dry_run()
        || body
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|x| x == "All"));
    Ok(DeleteOptions {
        propagation,
        precondition_uid: body
            .get("preconditions")
            .and_then(|p| p.get("uid"))
            .and_then(Value::as_str)
            .map(String::from),
        precondition_rv: body
            .get("preconditions")
            .and_then(|p| p.get("resourceVersion"))
            .and_then(Value::as_str)
            .map(String::from),
        dry_run,
    })
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ContinueToken {
    v: String,
    rv: u64,
    start: String,
}

fn list(state: &mut State, req: &Req, t: &Target) -> Result<Reply, ApiError> {
    let v = view(req, true)?;
    let sel = selection(req, &t.rt)?;
    let rv_param = req.param("resourceVersion").filter(|s| !s.is_empty());
    let rv_match = req.param("resourceVersionMatch").filter(|s| !s.is_empty());
    let cont = req.param("continue").filter(|s| !s.is_empty());
    if rv_match.is_some() && rv_param.is_none() {
        return Err(list_options_invalid(
            "resourceVersionMatch",
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        ));
    }
    if cont.is_some() && rv_param.is_some_and(|r| r != "0") {
        return Err(list_options_invalid(
            "resourceVersion",
            "specifying resource version is not allowed when using continue",
        ));
    }
    if let Some(m) = rv_match
        && m != "Exact"
        && m != "NotOlderThan"
    {
        let cause = errors::FieldError::not_supported(
            "resourceVersionMatch",
            m,
            &["Exact", "NotOlderThan", ""],
        );
        return Err(ApiError::invalid(
            "meta.k8s.io",
            "ListOptions",
            "",
            &[cause],
        ));
    }
    let requested: Option<u64> = match rv_param {
        None => None,
        Some(s) => Some(
            s.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s}")))?,
        ),
    };
    if let Some(r) = requested {
        if rv_match == Some("Exact") {
            if r == 0 {
                return Err(list_options_invalid(
                    "resourceVersionMatch",
                    "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                ));
            }
            if r != state.rv {
                return Err(ApiError::expired(
                    "The resourceVersion for the provided list is too old.",
                ));
            }
        } else if r > state.rv {
            let mut e = ApiError::new(
                504,
                "Timeout",
                format!("Too large resource version: {r}, current: {}", state.rv),
                Some(
                    json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}),
                ),
            );
            e.retry_after = Some(1);
            return Err(e);
        }
    }
    let mut list_rv = state.rv;
    let mut start_after: Option<String> = None;
    if let Some(token) = cont {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(token)
            .ok()
            .and_then(|b| serde_json::from_slice::<ContinueToken>(&b).ok())
            .ok_or_else(|| {
                ApiError::bad_request(
                    "continue key is not valid: illegal base64 data at input byte 0",
                )
            })?;
        list_rv = decoded.rv;
        start_after = Some(decoded.start);
    }
    let limit: usize = req.param("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
    let from_cache = requested == Some(0);
    let mut items: Vec<(store::Key, Value)> = state.select(&t.rt, &t.version, &t.namespace, &sel);
    if let Some(start) = &start_after {
        // Namespaces have no '/': "namespace/name", compared as the key order is.
        let (ns, name) = start.split_once('/').unwrap_or(("", start.as_str()));
        items.retain(|(k, _)| (k.namespace.as_str(), k.name.as_str()) > (ns, name));
    }
    let mut next = None;
    let mut remaining = None;
    if limit > 0 && !from_cache && items.len() > limit {
        let rest = items.split_off(limit);
        if let Some((k, _)) = items.last() {
            let token = ContinueToken {
                v: "meta.k8s.io/v1".into(),
                rv: list_rv,
                start: format!("{}/{}", k.namespace, k.name),
            };
            next = Some(
                base64::engine::general_purpose::STANDARD
                    .encode(serde_json::to_vec(&token).unwrap_or_default()),
            );
            remaining = Some(rest.len());
        }
    }
    let items: Vec<Value> = items
        .into_iter()
        .map(|(_, obj)| match v {
            View::Metadata => store::as_partial(&obj),
            View::Full => {
                let mut obj = obj;
                if !t.rt.is_custom()
                    && let Value::Object(m) = &mut obj
                {
                    m.remove("apiVersion");
                    m.remove("kind");
                }
                obj
            }
        })
        .collect();
    let mut meta = serde_json::Map::new();
    meta.insert("resourceVersion".into(), json!(list_rv.to_string()));
    if let Some(c) = next {
        meta.insert("continue".into(), json!(c));
    }
    if let Some(r) = remaining {
        meta.insert("remainingItemCount".into(), json!(r));
    }
    let (kind, api_version) = match v {
        View::Metadata => (
            "PartialObjectMetadataList".to_string(),
            "meta.k8s.io/v1".to_string(),
        ),
        View::Full => (format!("{}List", t.rt.kind), t.rt.api_version(&t.version)),
    };
    Ok(Reply::json(
        200,
        json!({"kind": kind, "apiVersion": api_version, "metadata": meta, "items": items}),
    ))
}

fn line(event_type: &str, object: &Value) -> Bytes {
    let mut s =
        serde_json::to_string(&json!({"type": event_type, "object": object})).unwrap_or_default();
    s.push('\n');
    Bytes::from(s)
}

fn bookmark(plan: &WatchPlan, rv: u64, initial_end: bool) -> Bytes {
    let (kind, api_version) = match plan.metadata_only {
        true => (
            "PartialObjectMetadata".to_string(),
            "meta.k8s.io/v1".to_string(),
        ),
        false => (plan.rt.kind.clone(), plan.rt.api_version(&plan.version)),
    };
    let mut metadata = json!({"resourceVersion": rv.to_string(), "creationTimestamp": null});
    if initial_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line(
        "BOOKMARK",
        &json!({"kind": kind, "apiVersion": api_version, "metadata": metadata}),
    )
}

fn watch(state: &mut State, req: &Req, t: &Target) -> Result<Reply, ApiError> {
    let v = view(req, false)?;
    let sel = selection(req, &t.rt)?;
    let send_initial = req
        .param("sendInitialEvents")
        .map(|s| matches!(s, "true" | "1"));
    let rv_match = req.param("resourceVersionMatch").filter(|s| !s.is_empty());
    if send_initial.is_some() && rv_match != Some("NotOlderThan") {
        return Err(list_options_invalid(
            "resourceVersionMatch",
            "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ));
    }
    if send_initial.is_none() && rv_match.is_some() {
        return Err(list_options_invalid(
            "resourceVersionMatch",
            "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        ));
    }
    let requested: Option<u64> = match req.param("resourceVersion").filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => Some(
            s.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s}")))?,
        ),
    };
    let bookmarks = req.flag("allowWatchBookmarks");
    let deadline = req
        .param("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .and_then(|s| tokio::time::Instant::now().checked_add(Duration::from_secs(s)));
    let mut plan = WatchPlan {
        rt: t.rt.clone(),
        version: t.version.clone(),
        namespace: t.namespace.clone(),
        selection: sel.clone(),
        metadata_only: v == View::Metadata,
        bookmarks,
        first: Vec::new(),
        from: state.rv,
        deadline,
        finished: false,
        client: req.header(CLIENT_HEADER).map(String::from),
    };
    let initial = send_initial == Some(true);
    match state.watch_start(&t.rt, &t.version, &t.namespace, &sel, requested, initial) {
        Ok(start) => {
            for obj in &start.initial {
                let shown = if plan.metadata_only {
                    store::as_partial(obj)
                } else {
                    obj.clone()
                };
                plan.first.push(line("ADDED", &shown));
            }
            plan.from = start.from;
            if initial && bookmarks {
                let b = bookmark(&plan, start.from, true);
                plan.first.push(b);
            }
        }
        Err(e) => {
            plan.first.push(line("ERROR", &e.body));
            plan.finished = true;
        }
    }
    Ok(Reply::Watch(Box::new(plan)))
}

/// The watch event a change makes for this watch, if any.
fn event_for(plan: &WatchPlan, change: &store::Change) -> Option<Bytes> {
    let rt = &plan.rt;
    if change.key.group != rt.storage_group || change.key.resource != rt.storage_resource {
        return None;
    }
    if !plan.namespace.is_empty() && change.key.namespace != plan.namespace {
        return None;
    }
    let now = store::present(rt, &plan.version, &change.object);
    let now_matches = plan.selection.matches(&now);
    let before_matches = change.old.as_ref().map(|o| {
        plan.selection
            .matches(&store::present(rt, &plan.version, o))
    });
    let etype = match (change.etype, before_matches, now_matches) {
        ("ADDED", _, true) => "ADDED",
        ("DELETED", _, true) => "DELETED",
        ("MODIFIED", Some(true), true) => "MODIFIED",
        ("MODIFIED", Some(false) | None, true) => "ADDED",
        ("MODIFIED", Some(true), false) => "DELETED",
        _ => return None,
    };
    let shown = if plan.metadata_only {
        store::as_partial(&now)
    } else {
        now
    };
    Some(line(etype, &shown))
}

struct WatchStream {
    inner: Arc<Inner>,
    plan: WatchPlan,
    pending: VecDeque<Bytes>,
    last: u64,
    rx: tokio::sync::watch::Receiver<u64>,
    next_bookmark: Option<tokio::time::Instant>,
    done: bool,
    /// How many times etcd had gone away when the watch started: it ends at the next time.
    storage_losses: u64,
}

const BOOKMARK_EVERY: Duration = Duration::from_secs(60);

/// When the next bookmark is due: every minute, and 2 seconds before the watch times out.
fn next_bookmark_at(
    now: tokio::time::Instant,
    deadline: Option<tokio::time::Instant>,
) -> Option<tokio::time::Instant> {
    let mut at = now + BOOKMARK_EVERY;
    if let Some(d) = deadline {
        let before = d.checked_sub(Duration::from_secs(2)).unwrap_or(d);
        if before < at {
            at = before;
        }
        if at <= now {
            return None;
        }
    }
    Some(at)
}

impl WatchStream {
    /// Takes the events after the last one sent (up to resourceVersion `upto`, when given).
    fn collect(&mut self, upto: Option<u64>) {
        let state = self.inner.lock();
        if state.floor > self.last {
            let e = ApiError::expired(format!(
                "too old resource version: {} ({})",
                self.last, state.floor
            ));
            self.pending.push_back(line("ERROR", &e.body));
            self.done = true;
            return;
        }
        let start = state.log.partition_point(|c| c.rv <= self.last);
        let limit = upto.unwrap_or(state.rv);
        for change in state.log.range(start..).take_while(|c| c.rv <= limit) {
            if let Some(b) = event_for(&self.plan, change) {
                self.pending.push_back(b);
            }
        }
        self.last = self.last.max(limit);
    }

    fn paused(&self) -> bool {
        self.plan.client.as_ref().is_some_and(|c| {
            let paused = self.inner.paused.lock().unwrap_or_else(|e| e.into_inner());
            paused.contains(c) || paused.contains(&format!("{c}/{}", self.plan.rt.plural))
        })
    }

    async fn next(mut self) -> Option<(Result<Frame<Bytes>, Infallible>, WatchStream)> {
        loop {
            if self.inner.lifecycle.killed() {
                // A killed server writes nothing more, not even the end of the stream: its
                // connection is reset where it is (the read of the watch is incomplete).
                std::future::pending::<()>().await;
            }
            if self.inner.is_down() {
                return None;
            }
            let losses = self.inner.lifecycle.storage_losses();
            if losses != self.storage_losses {
                // etcd went away: what the watch cache had is sent, then the watch ends.
                self.storage_losses = losses;
                if !self.done {
                    self.collect(Some(self.inner.lifecycle.storage_lost_at()));
                    self.done = true;
                }
                continue;
            }
            if self.paused() {
                if self.rx.changed().await.is_err() {
                    return None;
                }
                continue;
            }
            if let Some(b) = self.pending.pop_front() {
                return Some((Ok(Frame::data(b)), self));
            }
            if self.done {
                return None;
            }
            self.rx.borrow_and_update();
            self.collect(None);
            if !self.pending.is_empty() {
                continue;
            }
            let far = tokio::time::Instant::now() + Duration::from_secs(86_400);
            let deadline = self.plan.deadline.unwrap_or(far);
            let bookmark_at = self
                .next_bookmark
                .filter(|_| self.plan.bookmarks)
                .unwrap_or(far);
            tokio::select! {
                changed = self.rx.changed() => {
                    if changed.is_err() {
                        self.done = true;
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {
                    self.done = true;
                }
                _ = tokio::time::sleep_until(bookmark_at) => {
                    self.collect(None);
                    let rv = self.last;
                    self.pending.push_back(bookmark(&self.plan, rv, false));
                    self.next_bookmark = next_bookmark_at(tokio::time::Instant::now(), self.plan.deadline);
                }
            }
        }
    }
}

fn watch_response(inner: Arc<Inner>, plan: WatchPlan) -> Response<Body> {
    let rx = inner.rv_tx.subscribe();
    let state = WatchStream {
        pending: plan.first.iter().cloned().collect(),
        last: plan.from,
        done: plan.finished,
        next_bookmark: next_bookmark_at(tokio::time::Instant::now(), plan.deadline),
        storage_losses: inner.lifecycle.storage_losses(),
        inner,
        plan,
        rx,
    };
    let stream = futures::stream::unfold(state, WatchStream::next);
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .header("cache-control", "no-cache, private")
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}
