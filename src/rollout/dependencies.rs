//! The `dependsOn` graph of releases: whether a release's dependencies are Ready, and whether it
//! is part of a cycle (which is printed whole, starting and ending at the release).

use std::collections::BTreeMap;

use petgraph::algo::astar;
use petgraph::graphmap::DiGraphMap;

use crate::api::{READY, SequencedRelease};

/// Where a `dependsOn` release stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DependencyState {
    /// No such SequencedRelease.
    Missing,
    /// It exists but is not Ready at its current generation.
    NotReady,
    Ready,
}

impl DependencyState {
    /// The state of a release as read from the API server.
    pub fn of(release: Option<&SequencedRelease>) -> DependencyState {
        let Some(release) = release else {
            return DependencyState::Missing;
        };
        let ready = release.status.as_ref().is_some_and(|s| {
            s.observed_generation == release.metadata.generation
                && s.conditions
                    .iter()
                    .any(|c| c.type_ == READY && c.status == "True")
        });
        if ready {
            DependencyState::Ready
        } else {
            DependencyState::NotReady
        }
    }
}

/// What the lifecycle needs to judge a release's dependencies.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DependencyFacts {
    /// Every release's `dependsOn`, by `namespace/name`, as the controller's cache has them.
    pub graph: BTreeMap<String, Vec<String>>,
    /// The state of each direct dependency, read fresh.
    pub states: BTreeMap<String, DependencyState>,
}

/// Where a release stands with the releases it depends on.
#[derive(Debug, Clone, PartialEq)]
pub enum Dependencies {
    Ready,
    Waiting(String),
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

/// The `dependsOn` of a release, each as `namespace/name` (its own namespace by default).
pub fn depends_on(sr: &SequencedRelease) -> Vec<String> {
    let own = sr.metadata.namespace.as_deref().unwrap_or_default();
    sr.spec
        .depends_on
        .iter()
        .map(|d| format!("{}/{}", d.namespace.as_deref().unwrap_or(own), d.name))
        .collect()
}

/// Whether `me`'s `dependencies` are Ready, and whether they lead back to `me`.
pub fn check(me: &str, dependencies: &[String], facts: &DependencyFacts) -> Dependencies {
    let mut graph: DiGraphMap<&str, ()> = DiGraphMap::new();
    for (from, to) in &facts.graph {
        if from == me {
            continue;
        }
        for to in to {
            graph.add_edge(from.as_str(), to.as_str(), ());
        }
    }
    for to in dependencies {
        graph.add_edge(me, to.as_str(), ());
    }
    // The shortest way back to `me` from each dependency, in the order the spec lists them.
    for dependency in dependencies {
        let back = astar(&graph, dependency.as_str(), |n| n == me, |_| 1, |_| 0);
        if let Some((_, path)) = back {
            let mut cycle = vec![me];
            cycle.extend(path);
            return Dependencies::Cycle(cycle.join(" -> "));
        }
    }
    for dependency in dependencies {
        match facts.states.get(dependency) {
            Some(DependencyState::Ready) => {}
            Some(DependencyState::NotReady) => {
                return Dependencies::Waiting(format!(
                    "waiting for SequencedRelease {dependency} to be Ready"
                ));
            }
            Some(DependencyState::Missing) | None => {
                return Dependencies::Waiting(format!(
                    "waiting for SequencedRelease {dependency}, which does not exist"
                ));
            }
        }
    }
    Dependencies::Ready
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(edges: &[(&str, &[&str])], states: &[(&str, DependencyState)]) -> DependencyFacts {
        DependencyFacts {
            graph: edges
                .iter()
                .map(|(f, t)| (f.to_string(), t.iter().map(|s| s.to_string()).collect()))
                .collect(),
            states: states.iter().map(|(n, s)| (n.to_string(), *s)).collect(),
        }
    }

    fn deps(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_cycle_is_printed_whole_from_the_release() {
        let f = facts(&[("ns/b", &["ns/c"]), ("ns/c", &["ns/a"])], &[]);
        assert_eq!(
            check("ns/a", &deps(&["ns/b"]), &f),
            Dependencies::Cycle("ns/a -> ns/b -> ns/c -> ns/a".into())
        );
        // A self-reference is a cycle too.
        assert_eq!(
            check("ns/a", &deps(&["ns/a"]), &facts(&[], &[])),
            Dependencies::Cycle("ns/a -> ns/a".into())
        );
        // A cycle that does not pass through the release is not its problem.
        let f = facts(
            &[("ns/b", &["ns/c"]), ("ns/c", &["ns/b"])],
            &[("ns/b", DependencyState::Ready)],
        );
        assert_eq!(check("ns/a", &deps(&["ns/b"]), &f), Dependencies::Ready);
    }

    #[test]
    fn dependencies_must_exist_and_be_ready_in_order() {
        let f = facts(
            &[],
            &[
                ("ns/db", DependencyState::Ready),
                ("ns/mq", DependencyState::NotReady),
            ],
        );
        assert_eq!(
            check("ns/app", &deps(&["ns/db", "ns/mq"]), &f),
            Dependencies::Waiting("waiting for SequencedRelease ns/mq to be Ready".into())
        );
        assert_eq!(
            check("ns/app", &deps(&["ns/gone"]), &f),
            Dependencies::Waiting(
                "waiting for SequencedRelease ns/gone, which does not exist".into()
            )
        );
        assert_eq!(check("ns/app", &deps(&["ns/db"]), &f), Dependencies::Ready);
    }
}
