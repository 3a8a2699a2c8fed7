//! Objects by identity, as the operator records and addresses them.

use serde::{Deserialize, Serialize};

/// One object by identity, its namespace resolved (None for cluster-scoped kinds).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectKey {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectKey {
    /// What makes two keys the same object: group, kind, namespace and name. The version is how
    /// the object is served, not which object it is (`autoscaling/v1` and `autoscaling/v2`
    /// HorizontalPodAutoscaler `web` are one object).
    pub fn identity(&self) -> (&str, &str, Option<&str>, &str) {
        let group = self
            .api_version
            .rsplit_once('/')
            .map_or("", |(group, _)| group);
        (group, &self.kind, self.namespace.as_deref(), &self.name)
    }
}

impl std::fmt::Display for ObjectKey {
    /// `Deployment shop/db`, `ClusterRole reader`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {}/{}", self.kind, ns, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}
