//! The `dependsOn` of releases: what each entry names (another release, or any object), whether
//! it is ready (a release's Ready condition, an object's kstatus rules, or the entry's CEL
//! `readyExpr`), and whether the release is part of a cycle, which is printed whole, starting
//! and ending at the release. Releases are the graph's nodes; an object owned by a release (its
//! `sequenced.dev/owner` annotation) leads to that release.

use std::collections::BTreeMap;

use petgraph::algo::astar;
use petgraph::graphmap::DiGraphMap;
use serde_json::Value;

use crate::api::{DependencyStatus, OWNER_ANNOTATION, READY, SequencedRelease};
use crate::readiness::{self, Cel, Rules, Verdict};

/// The API group of SequencedReleases: a `dependsOn` entry naming this group and kind is a
/// release dependency, as one with a name alone.
const RELEASE_GROUP: &str = "sequenced.dev";
const RELEASE_KIND: &str = "SequencedRelease";

/// What one `dependsOn` entry names.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// A SequencedRelease, `namespace/name`.
    Release(String),
    /// Any other object. `namespace` is the entry's, else the release's own (a cluster-scoped
    /// kind has none: the controller drops it once discovery says so).
    Object {
        api_version: String,
        kind: String,
        namespace: String,
        name: String,
        /// Whether the entry named the namespace itself.
        explicit_namespace: bool,
    },
}

/// One `dependsOn` entry, read: its index in the spec (for its `readyExpr`) and its target.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dependency {
    pub index: usize,
    pub target: Target,
}

impl Dependency {
    /// `SequencedRelease ns/name`, `Deployment ns/web`: how messages name it.
    pub fn describe(&self, cluster_scoped: bool) -> String {
        match &self.target {
            Target::Release(reference) => format!("{RELEASE_KIND} {reference}"),
            Target::Object {
                kind,
                namespace,
                name,
                ..
            } if !cluster_scoped => format!("{kind} {namespace}/{name}"),
            Target::Object { kind, name, .. } => format!("{kind} {name}"),
        }
    }
}

/// What the controller found of one dependency.
#[derive(Debug, Clone, PartialEq)]
pub enum Seen {
    /// The object (a SequencedRelease as JSON), or None when it does not exist. A
    /// cluster-scoped object is `cluster_scoped`.
    Found {
        object: Option<Value>,
        cluster_scoped: bool,
    },
    /// It cannot be read: its kind is not served (yet), in words.
    Unreadable(String),
}

/// An edge of the graph: the release waited for, and the object it is waited for through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    pub to: String,
    /// `Deployment ns/web`, when the edge goes through an object the release owns.
    pub via: Option<String>,
}

/// What the lifecycle needs to judge a release's dependencies.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DependencyFacts {
    /// Every other release's edges, by `namespace/name`, as the controller's cache has them:
    /// its release dependencies, and the owners of the objects it waits for (from its
    /// `status.dependencies`).
    pub graph: BTreeMap<String, Vec<Edge>>,
    /// What was found of each dependency of this release, by index into `dependsOn`, read
    /// fresh.
    pub seen: BTreeMap<usize, Seen>,
}

/// Where a release stands with what it depends on.
#[derive(Debug, Clone, PartialEq)]
pub enum Dependencies {
    /// Every dependency is ready.
    Ready,
    /// The first that is not, in words; and where every one stands, for the status.
    Waiting {
        message: String,
        statuses: Vec<DependencyStatus>,
    },
    /// The whole cycle: `ns/a -> ns/b -> ns/a`.
    Cycle(String),
}

/// `namespace/name` of a release.
pub fn reference_of(sr: &SequencedRelease) -> String {
    format!(
        "{}/{}",
        sr.metadata.namespace.as_deref().unwrap_or_default(),
        sr.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The `dependsOn` entries of a release, read (the release's own namespace by default).
pub fn dependencies(sr: &SequencedRelease) -> Vec<Dependency> {
    let own = sr.metadata.namespace.as_deref().unwrap_or_default();
    sr.spec
        .depends_on
        .iter()
        .enumerate()
        .map(|(index, d)| {
            let namespace = d.namespace.as_deref().unwrap_or(own).to_string();
            let target = match (&d.api_version, &d.kind) {
                (Some(api_version), Some(kind))
                    if !(kind == RELEASE_KIND && group_of(api_version) == RELEASE_GROUP) =>
                {
                    Target::Object {
                        api_version: api_version.clone(),
                        kind: kind.clone(),
                        namespace,
                        name: d.name.clone(),
                        explicit_namespace: d.namespace.is_some(),
                    }
                }
                _ => Target::Release(format!("{namespace}/{}", d.name)),
            };
            Dependency { index, target }
        })
        .collect()
}

/// The releases a release's `dependsOn` names, each as `namespace/name`.
pub fn depends_on(sr: &SequencedRelease) -> Vec<String> {
    dependencies(sr)
        .into_iter()
        .filter_map(|d| match d.target {
            Target::Release(reference) => Some(reference),
            Target::Object { .. } => None,
        })
        .collect()
}

/// A release's edges as another release sees them from the cache: its release dependencies,
/// and the owners of the objects it waits for as its status last said.
pub fn edges_of(sr: &SequencedRelease) -> Vec<Edge> {
    let mut edges: Vec<Edge> = depends_on(sr)
        .into_iter()
        .map(|to| Edge { to, via: None })
        .collect();
    for status in sr.status.iter().flat_map(|s| s.dependencies.iter()) {
        if let (Some(owner), Some(_)) = (&status.owner, &status.api_version) {
            let via = match &status.namespace {
                Some(ns) => format!("{} {ns}/{}", status.kind, status.name),
                None => format!("{} {}", status.kind, status.name),
            };
            edges.push(Edge {
                to: owner.clone(),
                via: Some(via),
            });
        }
    }
    edges
}

fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

/// The release that owns an object, from its `sequenced.dev/owner` annotation.
fn owner_of(object: &Value) -> Option<String> {
    object
        .pointer("/metadata/annotations")?
        .get(OWNER_ANNOTATION)?
        .as_str()
        .filter(|o| o.contains('/'))
        .map(str::to_string)
}

/// Whether a SequencedRelease (as JSON) is Ready at its current generation, and if not its
/// Ready condition's message.
fn release_ready(object: &Value) -> Result<(), String> {
    let generation = object
        .pointer("/metadata/generation")
        .and_then(Value::as_i64);
    let observed = object
        .pointer("/status/observedGeneration")
        .and_then(Value::as_i64);
    let ready = object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(READY));
    let text = |key: &str| {
        ready
            .and_then(|c| c.get(key))
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    if generation.is_some() && observed != generation {
        return Err("its generation is not observed yet".to_string());
    }
    if text("status") == "True" {
        Ok(())
    } else if text("message").is_empty() {
        Err("not Ready".to_string())
    } else {
        Err(format!("not Ready: {}", text("message")))
    }
}

/// Whether one found dependency is ready; Err says why not. `ready_expr`, when the entry has
/// one, replaces the kstatus rules (for a release, its Ready condition).
fn judge(target: &Target, object: &Value, ready_expr: Option<&Cel>) -> Result<(), String> {
    if let Some(expression) = ready_expr {
        let text = readiness::expr::quote(expression.text());
        return match expression.holds(object, &[("dep", object)]) {
            Ok(true) => Ok(()),
            Ok(false) => Err(format!("readyExpr {text} is false")),
            Err(why) => Err(format!("readyExpr {text}: {why}")),
        };
    }
    match target {
        Target::Release(_) => release_ready(object),
        Target::Object { .. } => match readiness::assess(object, &Rules::default()) {
            Verdict::Ready => Ok(()),
            Verdict::InProgress(why) => Err(why),
            Verdict::Failed(why) => Err(format!("failed: {why}")),
        },
    }
}

/// Whether `me`'s `dependencies` are ready, and whether they lead back to `me`. `ready_exprs`
/// are the entries' compiled `readyExpr`s, by index into `dependsOn`.
pub fn check(
    me: &str,
    dependencies: &[Dependency],
    ready_exprs: &BTreeMap<usize, Cel>,
    facts: &DependencyFacts,
) -> Dependencies {
    let mut graph: DiGraphMap<&str, ()> = DiGraphMap::new();
    let mut labels: BTreeMap<(&str, &str), &str> = BTreeMap::new();
    for (from, edges) in &facts.graph {
        if from == me {
            continue;
        }
        for edge in edges {
            graph.add_edge(from.as_str(), edge.to.as_str(), ());
            if let Some(via) = &edge.via {
                labels.insert((from.as_str(), edge.to.as_str()), via.as_str());
            }
        }
    }
    // This release's own edges, read fresh: its releases, and the owners of its objects.
    let mut owned: Vec<(String, String)> = Vec::new();
    for dependency in dependencies {
        if let (
            Target::Object { .. },
            Some(Seen::Found {
                object: Some(object),
                cluster_scoped,
            }),
        ) = (&dependency.target, facts.seen.get(&dependency.index))
            && let Some(owner) = owner_of(object)
        {
            owned.push((owner, dependency.describe(*cluster_scoped)));
        }
    }
    let mut first_hops: Vec<(&str, Option<&str>)> = Vec::new();
    for dependency in dependencies {
        if let Target::Release(reference) = &dependency.target {
            first_hops.push((reference.as_str(), None));
        }
    }
    for (owner, via) in &owned {
        first_hops.push((owner.as_str(), Some(via.as_str())));
    }
    for (to, via) in &first_hops {
        graph.add_edge(me, to, ());
        if let Some(via) = via {
            labels.insert((me, to), via);
        }
    }
    // The shortest way back to `me` from each first hop, in the order the spec lists them.
    for (to, _) in &first_hops {
        let back = astar(&graph, to, |n| n == me, |_| 1, |_| 0);
        if let Some((_, path)) = back {
            let mut nodes = vec![me];
            nodes.extend(path);
            let mut text = nodes[0].to_string();
            for pair in nodes.windows(2) {
                match labels.get(&(pair[0], pair[1])) {
                    Some(via) => text.push_str(&format!(" -> {via} of {}", pair[1])),
                    None => text.push_str(&format!(" -> {}", pair[1])),
                }
            }
            return Dependencies::Cycle(text);
        }
    }
    let mut statuses = Vec::new();
    let mut first = None;
    for dependency in dependencies {
        let seen = facts.seen.get(&dependency.index);
        let cluster_scoped = matches!(
            seen,
            Some(Seen::Found {
                cluster_scoped: true,
                ..
            })
        );
        let described = dependency.describe(cluster_scoped);
        let (found, outcome) = match seen {
            None => (None, Err("not read yet".to_string())),
            Some(Seen::Unreadable(why)) => (None, Err(why.clone())),
            Some(Seen::Found { object: None, .. }) => (None, Err("does not exist".to_string())),
            Some(Seen::Found {
                object: Some(object),
                ..
            }) => (
                Some(object),
                judge(
                    &dependency.target,
                    object,
                    ready_exprs.get(&dependency.index),
                ),
            ),
        };
        if let Err(why) = &outcome
            && first.is_none()
        {
            first = Some(match (&dependency.target, why.as_str()) {
                (_, "does not exist") => format!("waiting for {described}, which does not exist"),
                (Target::Release(_), _) if !ready_exprs.contains_key(&dependency.index) => {
                    format!("waiting for {described} to be Ready ({why})")
                }
                _ => format!("waiting for {described}: {why}"),
            });
        }
        statuses.push(status_of(dependency, cluster_scoped, found, outcome.err()));
    }
    match first {
        None => Dependencies::Ready,
        Some(message) => Dependencies::Waiting { message, statuses },
    }
}

fn status_of(
    dependency: &Dependency,
    cluster_scoped: bool,
    found: Option<&Value>,
    why: Option<String>,
) -> DependencyStatus {
    let (kind, api_version, namespace, name) = match &dependency.target {
        Target::Release(reference) => {
            let (namespace, name) = reference.split_once('/').unwrap_or(("", reference));
            (
                RELEASE_KIND.to_string(),
                None,
                Some(namespace.to_string()),
                name.to_string(),
            )
        }
        Target::Object {
            api_version,
            kind,
            namespace,
            name,
            ..
        } => (
            kind.clone(),
            Some(api_version.clone()),
            (!cluster_scoped).then(|| namespace.clone()),
            name.clone(),
        ),
    };
    DependencyStatus {
        kind,
        api_version,
        namespace,
        name,
        ready: why.is_none(),
        message: why,
        owner: found
            .filter(|_| matches!(dependency.target, Target::Object { .. }))
            .and_then(owner_of),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn release(n: usize, reference: &str) -> Dependency {
        Dependency {
            index: n,
            target: Target::Release(reference.to_string()),
        }
    }

    fn object(n: usize, kind: &str, name: &str) -> Dependency {
        Dependency {
            index: n,
            target: Target::Object {
                api_version: "apps/v1".into(),
                kind: kind.into(),
                namespace: "ns".into(),
                name: name.into(),
                explicit_namespace: false,
            },
        }
    }

    fn facts(edges: &[(&str, &[&str])], seen: &[(usize, Seen)]) -> DependencyFacts {
        DependencyFacts {
            graph: edges
                .iter()
                .map(|(f, t)| {
                    let edges = t
                        .iter()
                        .map(|s| Edge {
                            to: s.to_string(),
                            via: None,
                        })
                        .collect();
                    (f.to_string(), edges)
                })
                .collect(),
            seen: seen.iter().cloned().collect(),
        }
    }

    fn found(object: Value) -> Seen {
        Seen::Found {
            object: Some(object),
            cluster_scoped: false,
        }
    }

    fn ready_release() -> Value {
        json!({"metadata": {"generation": 1}, "status": {"observedGeneration": 1,
            "conditions": [{"type": "Ready", "status": "True"}]}})
    }

    #[test]
    fn a_cycle_is_printed_whole_from_the_release() {
        let f = facts(&[("ns/b", &["ns/c"]), ("ns/c", &["ns/a"])], &[]);
        let none = BTreeMap::new();
        assert_eq!(
            check("ns/a", &[release(0, "ns/b")], &none, &f),
            Dependencies::Cycle("ns/a -> ns/b -> ns/c -> ns/a".into())
        );
        // A self-reference is a cycle too.
        assert_eq!(
            check("ns/a", &[release(0, "ns/a")], &none, &facts(&[], &[])),
            Dependencies::Cycle("ns/a -> ns/a".into())
        );
        // A cycle that does not pass through the release is not its problem.
        let f = facts(
            &[("ns/b", &["ns/c"]), ("ns/c", &["ns/b"])],
            &[(0, found(ready_release()))],
        );
        assert_eq!(
            check("ns/a", &[release(0, "ns/b")], &none, &f),
            Dependencies::Ready
        );
    }

    #[test]
    fn an_object_of_another_release_leads_to_it() {
        // a waits for Deployment web, which release b owns; b waits for a.
        let web = json!({"kind": "Deployment", "metadata": {"name": "web",
            "annotations": {"sequenced.dev/owner": "ns/b"}}});
        let f = facts(&[("ns/b", &["ns/a"])], &[(0, found(web.clone()))]);
        assert_eq!(
            check(
                "ns/a",
                &[object(0, "Deployment", "web")],
                &BTreeMap::new(),
                &f
            ),
            Dependencies::Cycle("ns/a -> Deployment ns/web of ns/b -> ns/a".into())
        );
        // Its own object: a waits for what only it would make.
        let own = json!({"kind": "Deployment", "metadata": {"name": "web",
            "annotations": {"sequenced.dev/owner": "ns/a"}}});
        let f = facts(&[], &[(0, found(own))]);
        assert_eq!(
            check(
                "ns/a",
                &[object(0, "Deployment", "web")],
                &BTreeMap::new(),
                &f
            ),
            Dependencies::Cycle("ns/a -> Deployment ns/web of ns/a".into())
        );
        // Seen from b: a's status says whose object a waits for.
        let f = DependencyFacts {
            graph: BTreeMap::from([(
                "ns/a".to_string(),
                vec![Edge {
                    to: "ns/b".into(),
                    via: Some("Deployment ns/web".into()),
                }],
            )]),
            seen: BTreeMap::new(),
        };
        assert_eq!(
            check("ns/b", &[release(0, "ns/a")], &BTreeMap::new(), &f),
            Dependencies::Cycle("ns/b -> ns/a -> Deployment ns/web of ns/b".into())
        );
    }

    #[test]
    fn dependencies_must_exist_and_be_ready_in_order() {
        let not_ready = json!({"metadata": {"generation": 2}, "status": {"observedGeneration": 2,
            "conditions": [{"type": "Ready", "status": "False", "message": "layer db waiting"}]}});
        let f = facts(
            &[],
            &[
                (0, found(ready_release())),
                (1, found(not_ready)),
                (
                    2,
                    Seen::Found {
                        object: None,
                        cluster_scoped: false,
                    },
                ),
            ],
        );
        let none = BTreeMap::new();
        let Dependencies::Waiting { message, statuses } = check(
            "ns/app",
            &[release(0, "ns/db"), release(1, "ns/mq")],
            &none,
            &f,
        ) else {
            panic!("waiting");
        };
        assert_eq!(
            message,
            "waiting for SequencedRelease ns/mq to be Ready (not Ready: layer db waiting)"
        );
        assert_eq!(
            statuses.iter().map(|s| s.ready).collect::<Vec<_>>(),
            [true, false]
        );
        let Dependencies::Waiting { message, .. } =
            check("ns/app", &[release(2, "ns/gone")], &none, &f)
        else {
            panic!("waiting");
        };
        assert_eq!(
            message,
            "waiting for SequencedRelease ns/gone, which does not exist"
        );
        assert_eq!(
            check("ns/app", &[release(0, "ns/db")], &none, &f),
            Dependencies::Ready
        );
    }

    #[test]
    fn objects_are_ready_by_kstatus_or_their_ready_expr() {
        let deployment = |available: i64| {
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "generation": 1},
                "spec": {"replicas": 2},
                "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2,
                    "readyReplicas": available, "availableReplicas": available,
                    "conditions": [{"type": "Available",
                        "status": if available == 2 { "True" } else { "False" }}]}})
        };
        let web = [object(0, "Deployment", "web")];
        let none = BTreeMap::new();
        let Dependencies::Waiting { message, statuses } = check(
            "ns/a",
            &web,
            &none,
            &facts(&[], &[(0, found(deployment(1)))]),
        ) else {
            panic!("waiting");
        };
        assert!(
            message.starts_with("waiting for Deployment ns/web: "),
            "{message}"
        );
        assert_eq!(statuses[0].api_version.as_deref(), Some("apps/v1"));
        assert_eq!(
            check(
                "ns/a",
                &web,
                &none,
                &facts(&[], &[(0, found(deployment(2)))])
            ),
            Dependencies::Ready
        );
        let expr = BTreeMap::from([(
            0,
            Cel::compile("self.status.availableReplicas >= 1 && dep.kind == 'Deployment'").unwrap(),
        )]);
        assert_eq!(
            check(
                "ns/a",
                &web,
                &expr,
                &facts(&[], &[(0, found(deployment(1)))])
            ),
            Dependencies::Ready
        );
        let Dependencies::Waiting { message, .. } = check(
            "ns/a",
            &web,
            &expr,
            &facts(&[], &[(0, found(deployment(0)))]),
        ) else {
            panic!("waiting");
        };
        assert_eq!(
            message,
            "waiting for Deployment ns/web: readyExpr \"self.status.availableReplicas >= 1 && dep.kind == 'Deployment'\" is false"
        );
        let unserved = facts(
            &[],
            &[(
                0,
                Seen::Unreadable("the API server does not serve kind Database".into()),
            )],
        );
        let Dependencies::Waiting { message, .. } = check("ns/a", &web, &none, &unserved) else {
            panic!("waiting");
        };
        assert_eq!(
            message,
            "waiting for Deployment ns/web: the API server does not serve kind Database"
        );
    }
}
