//! Who sends a request and what they may do, as kube-apiserver decides it: authentication by a
//! test header, impersonation (k8s.io/apiserver `filters/impersonation.go`), the RBAC authorizer
//! (`plugin/pkg/auth/authorizer/rbac`) over the Roles, ClusterRoles and their bindings in the
//! store, RBAC escalation prevention (`pkg/registry/rbac/validation`) and
//! SelfSubjectAccessReview.
//!
//! A request without the [`USER_HEADER`] is the cluster's administrator (group
//! `system:masters`), allowed everything, as a kubeconfig with the admin certificate is.

use std::collections::BTreeMap;

use http::{HeaderMap, Method};
use serde_json::{Map, Value, json};

use super::errors::{ApiError, FieldError, qualified, quote};
use super::store::{Key, State};

/// The test-only authentication header: the request is sent by this user name.
pub const USER_HEADER: &str = "x-test-user";
/// With [`USER_HEADER`]: the user's groups, comma-separated.
pub const GROUPS_HEADER: &str = "x-test-groups";

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";
const MASTERS: &str = "system:masters";
const AUTHENTICATED: &str = "system:authenticated";
const UNAUTHENTICATED: &str = "system:unauthenticated";

/// An authenticated identity.
#[derive(Clone, Debug, PartialEq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

/// `system:serviceaccount:NS:NAME` split into (NS, NAME).
fn service_account(username: &str) -> Option<(&str, &str)> {
    let rest = username.strip_prefix("system:serviceaccount:")?;
    let (ns, name) = rest.split_once(':')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains(':')).then_some((ns, name))
}

fn service_account_groups(namespace: &str) -> Vec<String> {
    vec![
        "system:serviceaccounts".to_string(),
        format!("system:serviceaccounts:{namespace}"),
    ]
}

impl User {
    /// The administrator every request without [`USER_HEADER`] is.
    pub fn admin() -> User {
        User {
            name: "kubernetes-admin".into(),
            groups: vec![MASTERS.into(), AUTHENTICATED.into()],
        }
    }

    /// A user as an authenticator reports it: a service account's name brings its groups, and
    /// every authenticated user is in `system:authenticated`.
    pub fn authenticated(name: &str, groups: &[String]) -> User {
        let mut all: Vec<String> = Vec::new();
        if let Some((ns, _)) = service_account(name) {
            all.extend(service_account_groups(ns));
        }
        for g in groups {
            if !all.contains(g) {
                all.push(g.clone());
            }
        }
        if !all.iter().any(|g| g == AUTHENTICATED) {
            all.push(AUTHENTICATED.into());
        }
        User {
            name: name.to_string(),
            groups: all,
        }
    }

    pub fn is_admin(&self) -> bool {
        self.groups.iter().any(|g| g == MASTERS)
    }
}

/// The user a request authenticates as; None for the default administrator.
pub fn authenticate(headers: &HeaderMap) -> Option<User> {
    let name = headers.get(USER_HEADER)?.to_str().ok()?.trim();
    if name.is_empty() {
        return None;
    }
    let groups: Vec<String> = headers
        .get_all(GROUPS_HEADER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .map(String::from)
        .collect();
    Some(User::authenticated(name, &groups))
}

/// What an authorizer is asked (authorizer.Attributes).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attributes {
    pub verb: String,
    pub resource_request: bool,
    /// For non-resource requests.
    pub path: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
}

impl Attributes {
    pub fn resource(verb: &str, group: &str, resource: &str, namespace: &str, name: &str) -> Self {
        Attributes {
            verb: verb.into(),
            resource_request: true,
            group: group.into(),
            resource: resource.into(),
            namespace: namespace.into(),
            name: name.into(),
            ..Default::default()
        }
    }
}

fn is_true(s: &str) -> bool {
    matches!(s, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

/// The request's attributes as kube-apiserver's RequestInfoFactory reads them from the URL,
/// whether or not the resource exists.
pub fn request_info(method: &Method, path: &str, params: &[(String, String)]) -> Attributes {
    let mut info = Attributes {
        verb: method.as_str().to_lowercase(),
        path: path.to_string(),
        ..Default::default()
    };
    let mut parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    if parts.len() == 1 && parts[0].is_empty() {
        parts.clear();
    }
    if parts.len() < 3 || !matches!(parts[0], "api" | "apis") {
        return info;
    }
    let groupless = parts[0] == "api";
    let mut rest = &parts[1..];
    if !groupless {
        if rest.len() < 3 {
            return info;
        }
        info.group = rest[0].to_string();
        rest = &rest[1..];
    }
    info.resource_request = true;
    rest = &rest[1..];
    let mut special = false;
    if matches!(rest.first(), Some(&("proxy" | "watch"))) && rest.len() >= 2 {
        info.verb = rest[0].to_string();
        special = true;
        rest = &rest[1..];
    } else {
        info.verb = match *method {
            Method::POST => "create",
            Method::GET | Method::HEAD => "get",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "",
        }
        .to_string();
    }
    if rest.first() == Some(&"namespaces") && rest.len() > 1 {
        info.namespace = rest[1].to_string();
        if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
            rest = &rest[2..];
        }
    }
    if rest.len() >= 3 && !(special && info.verb == "proxy") {
        info.subresource = rest[2].to_string();
    }
    if rest.len() >= 2 {
        info.name = rest[1].to_string();
    }
    if let Some(r) = rest.first() {
        info.resource = r.to_string();
    }
    let param = |k: &str| params.iter().rev().find(|(n, _)| n == k).map(|(_, v)| v);
    if info.name.is_empty() && info.verb == "get" {
        info.verb = if param("watch").is_some_and(|w| is_true(w)) {
            "watch"
        } else {
            "list"
        }
        .into();
    }
    if matches!(info.verb.as_str(), "list" | "watch")
        && let Some(selector) = param("fieldSelector")
    {
        // RequiresExactMatch("metadata.name"): the only term, with = or ==.
        let terms: Vec<&str> = selector.split(',').filter(|t| !t.is_empty()).collect();
        if let [term] = terms.as_slice()
            && let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('='))
            && k.trim() == "metadata.name"
            && !v.contains('=')
            && !v.starts_with('!')
            && !matches!(v, "" | "." | "..")
            && !v.contains('/')
            && !v.contains('%')
        {
            info.name = v.to_string();
        }
    }
    if info.name.is_empty() && info.verb == "delete" {
        info.verb = "deletecollection".into();
    }
    info
}

/// One rule of a Role or ClusterRole.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rule {
    pub verbs: Vec<String>,
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub resource_names: Vec<String>,
    pub non_resource_urls: Vec<String>,
}

fn strings(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

fn rules_of(role: &Value) -> Vec<Rule> {
    role.get("rules")
        .and_then(Value::as_array)
        .map(|rules| {
            rules
                .iter()
                .map(|r| Rule {
                    verbs: strings(r, "verbs"),
                    api_groups: strings(r, "apiGroups"),
                    resources: strings(r, "resources"),
                    resource_names: strings(r, "resourceNames"),
                    non_resource_urls: strings(r, "nonResourceURLs"),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn has(set: &[String], s: &str) -> bool {
    set.iter().any(|x| x == s)
}

impl Rule {
    fn new(verbs: &[&str], groups: &[&str], resources: &[&str], urls: &[&str]) -> Rule {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect();
        Rule {
            verbs: v(verbs),
            api_groups: v(groups),
            resources: v(resources),
            resource_names: Vec::new(),
            non_resource_urls: v(urls),
        }
    }

    /// RuleAllows.
    pub fn allows(&self, a: &Attributes) -> bool {
        let verb = has(&self.verbs, "*") || has(&self.verbs, &a.verb);
        if !verb {
            return false;
        }
        if !a.resource_request {
            return self.non_resource_urls.iter().any(|u| {
                u == "*"
                    || *u == a.path
                    || (u.ends_with('*') && a.path.starts_with(u.trim_end_matches('*')))
            });
        }
        let combined = if a.subresource.is_empty() {
            a.resource.clone()
        } else {
            format!("{}/{}", a.resource, a.subresource)
        };
        let group = has(&self.api_groups, "*") || has(&self.api_groups, &a.group);
        let resource = self.resources.iter().any(|r| {
            r == "*"
                || *r == combined
                || (!a.subresource.is_empty()
                    && r.len() == a.subresource.len() + 2
                    && r.starts_with("*/")
                    && r.ends_with(&a.subresource))
        });
        let name = self.resource_names.is_empty() || has(&self.resource_names, &a.name);
        group && resource && name
    }

    /// CompactString: `{APIGroups:[""], Resources:["secrets"], Verbs:["get"]}`.
    fn compact_string(&self) -> String {
        let list = |l: &[String]| {
            let q: Vec<String> = l.iter().map(|s| quote(s)).collect();
            format!("[{}]", q.join(" "))
        };
        let mut parts = Vec::new();
        for (label, l) in [
            ("APIGroups", &self.api_groups),
            ("Resources", &self.resources),
            ("NonResourceURLs", &self.non_resource_urls),
            ("ResourceNames", &self.resource_names),
            ("Verbs", &self.verbs),
        ] {
            if !l.is_empty() {
                parts.push(format!("{label}:{}", list(l)));
            }
        }
        format!("{{{}}}", parts.join(", "))
    }
}

/// A binding as the authorizer walks it.
struct Binding {
    /// `ClusterRoleBinding "x"` / `RoleBinding "x/ns"`.
    describe: String,
    namespace: String,
    role_kind: String,
    role_name: String,
    subjects: Vec<Value>,
}

/// The ClusterRoles and ClusterRoleBindings a new cluster starts with that matter here
/// (bootstrap policy); the stored objects of the same name take precedence.
fn bootstrap_cluster_role(name: &str) -> Option<Vec<Rule>> {
    Some(match name {
        "cluster-admin" => vec![
            Rule::new(&["*"], &["*"], &["*"], &[]),
            Rule::new(&["*"], &[], &[], &["*"]),
        ],
        "system:discovery" => vec![Rule::new(
            &["get"],
            &[],
            &[],
            &[
                "/api",
                "/api/*",
                "/apis",
                "/apis/*",
                "/healthz",
                "/livez",
                "/openapi",
                "/openapi/*",
                "/readyz",
                "/version",
                "/version/",
            ],
        )],
        "system:public-info-viewer" => vec![Rule::new(
            &["get"],
            &[],
            &[],
            &["/healthz", "/livez", "/readyz", "/version", "/version/"],
        )],
        "system:basic-user" => vec![
            Rule::new(
                &["create"],
                &["authorization.k8s.io"],
                &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                &[],
            ),
            Rule::new(
                &["create"],
                &["authentication.k8s.io"],
                &["selfsubjectreviews"],
                &[],
            ),
        ],
        _ => return None,
    })
}

fn bootstrap_bindings() -> Vec<Binding> {
    let group = |g: &str| json!({"kind": "Group", "apiGroup": RBAC_GROUP, "name": g});
    [
        ("system:basic-user", vec![group(AUTHENTICATED)]),
        ("system:discovery", vec![group(AUTHENTICATED)]),
        (
            "system:public-info-viewer",
            vec![group(AUTHENTICATED), group(UNAUTHENTICATED)],
        ),
    ]
    .into_iter()
    .map(|(name, subjects)| Binding {
        describe: format!("ClusterRoleBinding {}", quote(name)),
        namespace: String::new(),
        role_kind: "ClusterRole".into(),
        role_name: name.into(),
        subjects,
    })
    .collect()
}

fn stored<'a>(
    state: &'a State,
    resource: &'a str,
    namespace: &'a str,
) -> impl Iterator<Item = &'a Value> + 'a {
    state
        .of_resource(RBAC_GROUP, resource, Some(namespace))
        .map(|(_, v)| v)
}

fn binding(obj: &Value, namespaced: bool) -> Binding {
    let s = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or("");
    let namespace = if namespaced {
        s("/metadata/namespace")
    } else {
        ""
    };
    let name = s("/metadata/name");
    Binding {
        describe: if namespaced {
            format!("RoleBinding {}", quote(&format!("{name}/{namespace}")))
        } else {
            format!("ClusterRoleBinding {}", quote(name))
        },
        namespace: namespace.to_string(),
        role_kind: s("/roleRef/kind").to_string(),
        role_name: s("/roleRef/name").to_string(),
        subjects: obj
            .get("subjects")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
    }
}

/// The bindings that count for a request in `namespace`: every ClusterRoleBinding, then the
/// RoleBindings of the namespace.
fn bindings(state: &State, namespace: &str) -> Vec<Binding> {
    let mut out = bootstrap_bindings();
    out.retain(|b| {
        !state.objects.contains_key(&Key {
            group: RBAC_GROUP.into(),
            resource: "clusterrolebindings".into(),
            namespace: String::new(),
            name: b.role_name.clone(),
        })
    });
    out.extend(stored(state, "clusterrolebindings", "").map(|b| binding(b, false)));
    if !namespace.is_empty() {
        out.extend(stored(state, "rolebindings", namespace).map(|b| binding(b, true)));
    }
    out
}

/// appliesTo: the first subject of the binding that is the user, described.
fn subject_for(user: &User, b: &Binding) -> Option<String> {
    b.subjects.iter().find_map(|s| {
        let f = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or("");
        let (kind, name) = (f("kind"), f("name"));
        let applies = match kind {
            "User" => user.name == name,
            "Group" => has(&user.groups, name),
            "ServiceAccount" => {
                let ns = if f("namespace").is_empty() {
                    b.namespace.as_str()
                } else {
                    f("namespace")
                };
                !ns.is_empty() && user.name == format!("system:serviceaccount:{ns}:{name}")
            }
            _ => false,
        };
        applies.then(|| match kind {
            "ServiceAccount" => {
                let ns = if f("namespace").is_empty() {
                    b.namespace.as_str()
                } else {
                    f("namespace")
                };
                format!("{kind} {}", quote(&format!("{name}/{ns}")))
            }
            _ => format!("{kind} {}", quote(name)),
        })
    })
}

/// How a role is looked up: the authorizer reads listers (`role.rbac...` in its errors), the
/// registry's escalation checks read storage (`roles.rbac...`).
#[derive(Clone, Copy)]
enum Lookup {
    Lister,
    Registry,
}

fn role_rules(
    state: &State,
    kind: &str,
    namespace: &str,
    name: &str,
    lookup: Lookup,
) -> Result<Vec<Rule>, String> {
    let (resource, ns, singular) = match kind {
        "Role" => ("roles", namespace, "role"),
        "ClusterRole" => ("clusterroles", "", "clusterrole"),
        other => return Err(format!("unsupported role reference kind: {}", quote(other))),
    };
    let key = Key {
        group: RBAC_GROUP.into(),
        resource: resource.into(),
        namespace: ns.into(),
        name: name.into(),
    };
    if let Some(obj) = state.objects.get(&key) {
        return Ok(rules_of(obj));
    }
    if kind == "ClusterRole"
        && let Some(rules) = bootstrap_cluster_role(name)
    {
        return Ok(rules);
    }
    let shown = match lookup {
        Lookup::Lister => qualified(RBAC_GROUP, singular),
        Lookup::Registry => qualified(RBAC_GROUP, resource),
    };
    Err(format!("{shown} {} not found", quote(name)))
}

/// An authorizer's answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// With the reason (`RBAC: allowed by ...`; "" for system:masters).
    Allow(String),
    /// With the reason, "" unless roles could not be resolved.
    NoOpinion(String),
}

impl Decision {
    pub fn allowed(&self) -> bool {
        matches!(self, Decision::Allow(_))
    }
}

fn aggregate(errors: &[String]) -> String {
    let mut unique: Vec<&String> = Vec::new();
    for e in errors {
        if !unique.contains(&e) {
            unique.push(e);
        }
    }
    match unique.as_slice() {
        [] => String::new(),
        [one] => one.to_string(),
        many => format!(
            "[{}]",
            many.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The union of kube-apiserver's authorizers: system:masters, then RBAC.
pub fn authorize(state: &State, user: &User, a: &Attributes) -> Decision {
    if user.is_admin() {
        return Decision::Allow(String::new());
    }
    if state.rbac_unsynced {
        // Just restarted: no Role or binding (not even the bootstrap policy) is loaded yet.
        return Decision::NoOpinion(String::new());
    }
    let mut errors = Vec::new();
    for b in bindings(state, &a.namespace) {
        let Some(subject) = subject_for(user, &b) else {
            continue;
        };
        match role_rules(
            state,
            &b.role_kind,
            &b.namespace,
            &b.role_name,
            Lookup::Lister,
        ) {
            Ok(rules) => {
                if rules.iter().any(|r| r.allows(a)) {
                    return Decision::Allow(format!(
                        "RBAC: allowed by {} of {} {} to {subject}",
                        b.describe,
                        b.role_kind,
                        quote(&b.role_name)
                    ));
                }
            }
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Decision::NoOpinion(String::new())
    } else {
        Decision::NoOpinion(format!("RBAC: {}", aggregate(&errors)))
    }
}

/// Every rule the user holds in `namespace` (RulesFor), and the errors met resolving them.
fn rules_for(state: &State, user: &User, namespace: &str) -> (Vec<Rule>, Vec<String>) {
    let mut rules = Vec::new();
    let mut errors = Vec::new();
    for b in bindings(state, namespace) {
        if subject_for(user, &b).is_none() {
            continue;
        }
        match role_rules(
            state,
            &b.role_kind,
            &b.namespace,
            &b.role_name,
            Lookup::Lister,
        ) {
            Ok(r) => rules.extend(r),
            Err(e) => errors.push(e),
        }
    }
    (rules, errors)
}

/// `Status` of a request the authorizer did not allow (responsewriters.Forbidden).
pub fn forbidden(user: &User, a: &Attributes, reason: &str) -> ApiError {
    let sanitize = |s: String| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let mut msg = if !a.resource_request {
        sanitize(format!(
            "User {} cannot {} path {}",
            quote(&user.name),
            a.verb,
            quote(&a.path)
        ))
    } else {
        let resource = if a.subresource.is_empty() {
            a.resource.clone()
        } else {
            format!("{}/{}", a.resource, a.subresource)
        };
        let scope = if a.namespace.is_empty() {
            "at the cluster scope".to_string()
        } else {
            format!("in the namespace {}", quote(&a.namespace))
        };
        sanitize(format!(
            "User {} cannot {} resource {} in API group {} {scope}",
            quote(&user.name),
            a.verb,
            quote(&resource),
            quote(&a.group)
        ))
    };
    if !reason.is_empty() {
        msg = format!("{msg}: {reason}");
    }
    let (group, resource) = if a.resource_request {
        (a.group.as_str(), a.resource.as_str())
    } else {
        ("", "")
    };
    new_forbidden(group, resource, &a.name, &msg)
}

/// apierrors.NewForbidden.
pub fn new_forbidden(group: &str, resource: &str, name: &str, why: &str) -> ApiError {
    let message = if group.is_empty() && resource.is_empty() {
        format!("forbidden: {why}")
    } else if name.is_empty() {
        format!("{} is forbidden: {why}", qualified(group, resource))
    } else {
        format!(
            "{} {} is forbidden: {why}",
            qualified(group, resource),
            quote(name)
        )
    };
    let mut details = Map::new();
    if !name.is_empty() {
        details.insert("name".into(), json!(name));
    }
    if !group.is_empty() {
        details.insert("group".into(), json!(group));
    }
    if !resource.is_empty() {
        details.insert("kind".into(), json!(resource));
    }
    ApiError::new(403, "Forbidden", message, Some(Value::Object(details)))
}

/// Checks a request with the authorizer; the 403 to answer when it is not allowed.
pub fn check(state: &State, user: &User, a: &Attributes) -> Result<(), ApiError> {
    match authorize(state, user, a) {
        Decision::Allow(_) => Ok(()),
        Decision::NoOpinion(reason) => Err(forbidden(user, a, &reason)),
    }
}

/// The create authorization of an update or apply that creates the object (`withAuthorization`
/// in the update and patch handlers): its 403 carries only the authorizer's reason.
pub fn check_create_on_update(
    state: &State,
    user: &User,
    group: &str,
    resource: &str,
    namespace: &str,
    name: &str,
) -> Result<(), ApiError> {
    let a = Attributes::resource("create", group, resource, namespace, name);
    match authorize(state, user, &a) {
        Decision::Allow(_) => Ok(()),
        Decision::NoOpinion(reason) => Err(new_forbidden(group, resource, name, &reason)),
    }
}

/// Why the impersonation filter refused a request.
pub enum Refused {
    /// 403 with a Status.
    Forbidden(ApiError),
    /// 500 with a plain-text body.
    Internal(String),
}

/// The impersonation filter: the user the request runs as (None: no impersonation), or why not.
pub fn impersonate(
    state: &State,
    requester: &User,
    headers: &HeaderMap,
    request_uri: &str,
) -> Result<Option<User>, Refused> {
    let header = |n: &str| -> Vec<String> {
        headers
            .get_all(n)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(String::from)
            .collect()
    };
    let user = header("impersonate-user")
        .into_iter()
        .next()
        .filter(|u| !u.is_empty());
    let groups = header("impersonate-group");
    let Some(username) = user else {
        if groups.is_empty() {
            return Ok(None);
        }
        let requested: Vec<String> = groups
            .iter()
            .map(|g| format!("{{Group  {g}    }}"))
            .collect();
        return Err(Refused::Internal(format!(
            "Internal Server Error: {}: requested [{}] without impersonating a user\n",
            quote(request_uri),
            requested.join(" ")
        )));
    };
    let mut new_groups: Vec<String> = Vec::new();
    let user_attrs = match service_account(&username) {
        Some((ns, name)) => {
            if groups.is_empty() {
                new_groups.extend(service_account_groups(ns));
            }
            Attributes::resource("impersonate", "", "serviceaccounts", ns, name)
        }
        None => Attributes::resource("impersonate", "", "users", "", &username),
    };
    check(state, requester, &user_attrs).map_err(Refused::Forbidden)?;
    for g in &groups {
        let a = Attributes::resource("impersonate", "", "groups", "", g);
        check(state, requester, &a).map_err(Refused::Forbidden)?;
        new_groups.push(g.clone());
    }
    if !new_groups
        .iter()
        .any(|g| g == AUTHENTICATED || g == UNAUTHENTICATED)
    {
        new_groups.push(AUTHENTICATED.into());
    }
    Ok(Some(User {
        name: username,
        groups: new_groups,
    }))
}

// ----- escalation prevention -----

fn breakdown(rule: &Rule) -> Vec<Rule> {
    let mut out = Vec::new();
    let one = |s: &String| vec![s.clone()];
    for g in &rule.api_groups {
        for r in &rule.resources {
            for v in &rule.verbs {
                if rule.resource_names.is_empty() {
                    out.push(Rule {
                        verbs: one(v),
                        api_groups: one(g),
                        resources: one(r),
                        ..Default::default()
                    });
                } else {
                    for n in &rule.resource_names {
                        out.push(Rule {
                            verbs: one(v),
                            api_groups: one(g),
                            resources: one(r),
                            resource_names: one(n),
                            ..Default::default()
                        });
                    }
                }
            }
        }
    }
    for u in &rule.non_resource_urls {
        for v in &rule.verbs {
            out.push(Rule {
                verbs: one(v),
                non_resource_urls: one(u),
                ..Default::default()
            });
        }
    }
    out
}

fn has_all(set: &[String], wanted: &[String]) -> bool {
    wanted.iter().all(|w| has(set, w))
}

fn covers(owner: &Rule, sub: &Rule) -> bool {
    let verbs = has(&owner.verbs, "*") || has_all(&owner.verbs, &sub.verbs);
    let groups = has(&owner.api_groups, "*") || has_all(&owner.api_groups, &sub.api_groups);
    let resources = has(&owner.resources, "*")
        || has_all(&owner.resources, &sub.resources)
        || sub.resources.iter().all(|path| {
            has(&owner.resources, path)
                || path
                    .split_once('/')
                    .is_some_and(|(_, s)| has(&owner.resources, &format!("*/{s}")))
        });
    let urls = sub.non_resource_urls.iter().all(|path| {
        owner
            .non_resource_urls
            .iter()
            .any(|o| o == path || (o.ends_with('*') && path.starts_with(o.trim_end_matches('*'))))
    });
    let names = if sub.resource_names.is_empty() {
        owner.resource_names.is_empty()
    } else {
        owner.resource_names.is_empty() || has_all(&owner.resource_names, &sub.resource_names)
    };
    verbs && groups && resources && names && urls
}

/// CompactRules: rules of one group and resource (at most one name) that differ only by verb
/// are merged.
fn compact(rules: Vec<Rule>) -> Vec<Rule> {
    let mut out = Vec::new();
    let mut simple: BTreeMap<(String, String, Option<String>), Rule> = BTreeMap::new();
    for r in rules {
        let is_simple = r.resource_names.len() <= 1
            && r.non_resource_urls.is_empty()
            && r.api_groups.len() == 1
            && r.resources.len() == 1;
        if is_simple {
            let key = (
                r.api_groups[0].clone(),
                r.resources[0].clone(),
                r.resource_names.first().cloned(),
            );
            match simple.get_mut(&key) {
                Some(existing) => existing.verbs.extend(r.verbs),
                None => {
                    simple.insert(key, r);
                }
            }
        } else {
            out.push(r);
        }
    }
    out.extend(simple.into_values());
    out
}

/// ConfirmNoEscalation: the user must hold every permission in `rules` in `namespace`.
fn confirm_no_escalation(
    state: &State,
    user: &User,
    namespace: &str,
    rules: &[Rule],
) -> Result<(), String> {
    let (owned, errors) = rules_for(state, user, namespace);
    let missing: Vec<Rule> = rules
        .iter()
        .flat_map(breakdown)
        .filter(|sub| !owned.iter().any(|o| covers(o, sub)))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let mut descriptions: Vec<String> = compact(missing).iter().map(Rule::compact_string).collect();
    descriptions.sort();
    descriptions.dedup();
    let groups: Vec<String> = user.groups.iter().map(|g| quote(g)).collect();
    let mut msg = format!(
        "user {} (groups=[{}]) is attempting to grant RBAC permissions not currently held:\n{}",
        quote(&user.name),
        groups.join(" "),
        descriptions.join("\n")
    );
    if !errors.is_empty() {
        msg.push_str(&format!("; resolution errors: [{}]", errors.join(" ")));
    }
    Err(msg)
}

/// Everything but what garbage collection changes (IsOnlyMutatingGCFields).
fn without_gc_fields(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in [
            "ownerReferences",
            "finalizers",
            "managedFields",
            "resourceVersion",
            "generation",
        ] {
            m.remove(k);
        }
    }
    v
}

/// The escalation checks of the RBAC registry on a write of `new` (replacing `old`) to `kind`
/// in `namespace` by `user`, who is not in system:masters.
pub fn check_escalation(
    state: &State,
    user: &User,
    kind: &str,
    namespace: &str,
    request_name: &str,
    old: Option<&Value>,
    new: &Value,
) -> Result<(), ApiError> {
    if user.is_admin() {
        return Ok(());
    }
    if let Some(old) = old
        && without_gc_fields(old) == without_gc_fields(new)
    {
        return Ok(());
    }
    let name = new
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let ns = if matches!(kind, "Role" | "RoleBinding") {
        namespace
    } else {
        ""
    };
    match kind {
        "Role" | "ClusterRole" => {
            let resource = if kind == "Role" {
                "roles"
            } else {
                "clusterroles"
            };
            let escalate = Attributes::resource("escalate", RBAC_GROUP, resource, ns, request_name);
            if authorize(state, user, &escalate).allowed() {
                return Ok(());
            }
            confirm_no_escalation(state, user, ns, &rules_of(new))
                .map_err(|e| new_forbidden(RBAC_GROUP, resource, name, &e))?;
            if kind == "ClusterRole" && new.get("aggregationRule").is_some_and(|a| !a.is_null()) {
                let full = [
                    Rule::new(&["*"], &["*"], &["*"], &[]),
                    Rule::new(&["*"], &[], &[], &["*"]),
                ];
                confirm_no_escalation(state, user, "", &full).map_err(|_| {
                    new_forbidden(
                        RBAC_GROUP,
                        resource,
                        name,
                        "must have cluster-admin privileges to use the aggregationRule",
                    )
                })?;
            }
            Ok(())
        }
        "RoleBinding" | "ClusterRoleBinding" => {
            let resource = if kind == "RoleBinding" {
                "rolebindings"
            } else {
                "clusterrolebindings"
            };
            let s = |p: &str| new.pointer(p).and_then(Value::as_str).unwrap_or("");
            let (role_kind, role_name) = (s("/roleRef/kind"), s("/roleRef/name"));
            let role_resource = match role_kind {
                "Role" => "roles",
                "ClusterRole" => "clusterroles",
                _ => "",
            };
            if !role_resource.is_empty() {
                let bind = Attributes::resource("bind", RBAC_GROUP, role_resource, ns, role_name);
                if authorize(state, user, &bind).allowed() {
                    return Ok(());
                }
            }
            let rules = role_rules(state, role_kind, ns, role_name, Lookup::Registry)
                .map_err(|e| new_forbidden(RBAC_GROUP, resource, name, &e))?;
            confirm_no_escalation(state, user, ns, &rules)
                .map_err(|e| new_forbidden(RBAC_GROUP, resource, name, &e))
        }
        _ => Ok(()),
    }
}

// ----- SelfSubjectAccessReview -----

const RESOURCE_ATTRIBUTES: &[&str] = &[
    "namespace",
    "verb",
    "group",
    "version",
    "resource",
    "subresource",
    "name",
];
const NON_RESOURCE_ATTRIBUTES: &[&str] = &["path", "verb"];

/// The attributes of a review's spec as the server keeps them: the known fields, empty
/// strings left out (omitempty).
fn review_attributes(spec: &Value, key: &str, fields: &[&str]) -> Option<Map<String, Value>> {
    let given = spec.get(key).filter(|v| !v.is_null())?;
    let mut out = Map::new();
    for f in fields {
        if let Some(s) = given
            .get(*f)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
        {
            out.insert(f.to_string(), json!(s));
        }
    }
    Some(out)
}

/// POST selfsubjectaccessreviews: the review, answered for `user`, with the managed fields
/// entry a create records. Nothing is stored.
pub fn self_subject_access_review(
    state: &State,
    user: &User,
    body: &Value,
    manager: &str,
    now: &str,
) -> Result<Value, ApiError> {
    let spec = body.get("spec").cloned().unwrap_or(Value::Null);
    let resource = review_attributes(&spec, "resourceAttributes", RESOURCE_ATTRIBUTES);
    let non_resource = review_attributes(&spec, "nonResourceAttributes", NON_RESOURCE_ATTRIBUTES);
    let invalid = |field: &str, value: &str, detail: &str| {
        ApiError::invalid(
            "authorization.k8s.io",
            "SelfSubjectAccessReview",
            "",
            &[FieldError::invalid_raw(field, value, detail)],
        )
    };
    let (key, attrs, a) = match (resource, non_resource) {
        (Some(r), None) => {
            let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            let a = Attributes {
                verb: s("verb"),
                resource_request: true,
                group: s("group"),
                resource: s("resource"),
                subresource: s("subresource"),
                namespace: s("namespace"),
                name: s("name"),
                ..Default::default()
            };
            ("resourceAttributes", r, a)
        }
        (None, Some(n)) => {
            let s = |k: &str| n.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            let a = Attributes {
                verb: s("verb"),
                path: s("path"),
                ..Default::default()
            };
            ("nonResourceAttributes", n, a)
        }
        (Some(_), Some(n)) => {
            let shown = format!(
                "&authorization.NonResourceAttributes{{Path:{}, Verb:{}}}",
                quote(n.get("path").and_then(Value::as_str).unwrap_or("")),
                quote(n.get("verb").and_then(Value::as_str).unwrap_or(""))
            );
            return Err(invalid(
                "spec.nonResourceAttributes",
                &shown,
                "cannot be specified in combination with resourceAttributes",
            ));
        }
        (None, None) => {
            return Err(invalid(
                "spec.resourceAttributes",
                "\"null\"",
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            ));
        }
    };
    let status = match authorize(state, user, &a) {
        Decision::Allow(reason) if reason.is_empty() => json!({"allowed": true}),
        Decision::Allow(reason) => json!({"allowed": true, "reason": reason}),
        Decision::NoOpinion(reason) if reason.is_empty() => json!({"allowed": false}),
        Decision::NoOpinion(reason) => json!({"allowed": false, "reason": reason}),
    };
    let mut fields = Map::new();
    fields.insert(".".into(), json!({}));
    for k in attrs.keys() {
        fields.insert(format!("f:{k}"), json!({}));
    }
    let mut metadata = Map::new();
    if !manager.is_empty() {
        metadata.insert(
            "managedFields".into(),
            json!([{
                "manager": manager,
                "operation": "Update",
                "apiVersion": "authorization.k8s.io/v1",
                "time": now,
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {format!("f:{key}"): Value::Object(fields)}},
            }]),
        );
    }
    Ok(json!({
        "kind": "SelfSubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": Value::Object(metadata),
        "spec": {key: Value::Object(attrs)},
        "status": status,
    }))
}
