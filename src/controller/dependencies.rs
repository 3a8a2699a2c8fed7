//! What a release's `dependsOn` names, gathered for the lifecycle: the graph of every release's
//! dependencies from the controller's cache, and each dependency read fresh (the event that
//! woke the release may be ahead of the cache). Releases are read as the controller; objects
//! as the release's account (its `get` and `watch` rights are what a person grants), and
//! watched from then on, so that one becoming ready starts the release at once. The pure
//! judgement (ready or not, cycles) is [`crate::rollout::dependencies`].

use std::collections::BTreeMap;

use kube::api::Api;
use kube::runtime::reflector::ObjectRef;

use super::context::Context;
use super::{Error, kube_error};
use crate::api::{ObjectKey, SequencedRelease};
use crate::cluster::{Cluster, ClusterError, Verb};
use crate::rollout::dependencies::{
    self, Dependency, DependencyFacts, Edge, Seen, Target, reference_of,
};

/// Gathers what `wanted` names for `release`, whose objects are read as `cluster`'s account.
pub(super) async fn gather(
    ctx: &Context,
    cluster: &Cluster,
    release: &ObjectRef<SequencedRelease>,
    wanted: &[Dependency],
) -> Result<DependencyFacts, Error> {
    let graph: BTreeMap<String, Vec<Edge>> = ctx
        .store
        .state()
        .iter()
        .map(|sr| (reference_of(sr), dependencies::edges_of(sr)))
        .collect();
    let mut seen = BTreeMap::new();
    for dependency in wanted {
        let found = match &dependency.target {
            Target::Release(reference) => read_release(ctx, reference).await?,
            Target::Object {
                api_version,
                kind,
                namespace,
                name,
                ..
            } => read_object(ctx, cluster, release, api_version, kind, namespace, name).await?,
        };
        seen.insert(dependency.index, found);
    }
    Ok(DependencyFacts { graph, seen })
}

/// A SequencedRelease, as the controller reads it.
async fn read_release(ctx: &Context, reference: &str) -> Result<Seen, Error> {
    let Some((namespace, name)) = reference.split_once('/') else {
        return Ok(Seen::Found {
            object: None,
            cluster_scoped: false,
        });
    };
    let api: Api<SequencedRelease> = Api::namespaced(ctx.client.clone(), namespace);
    let found = api
        .get_opt(name)
        .await
        .map_err(kube_error(format!("reading SequencedRelease {reference}")))?;
    Ok(Seen::Found {
        object: found.and_then(|sr| serde_json::to_value(sr).ok()),
        cluster_scoped: false,
    })
}

/// Any object, as the release's account reads it, watched from now on (the account must be
/// allowed to `get` and `watch` it: a refusal stalls the release `Forbidden`). A kind that is
/// not served (a CRD another release installs later) is waited for, not an error.
async fn read_object(
    ctx: &Context,
    cluster: &Cluster,
    release: &ObjectRef<SequencedRelease>,
    api_version: &str,
    kind: &str,
    namespace: &str,
    name: &str,
) -> Result<Seen, Error> {
    let resolved = match cluster.kind(api_version, kind).await {
        Ok(resolved) => resolved,
        Err(ClusterError::UnknownKind { .. }) => {
            return Ok(Seen::Unreadable(format!(
                "the API server does not serve kind {kind} of {api_version} (yet)"
            )));
        }
        Err(unavailable @ ClusterError::GroupUnavailable { .. }) => {
            return Ok(Seen::Unreadable(unavailable.to_string()));
        }
        Err(e) => return Err(e.into()),
    };
    let namespace = resolved.namespaced.then_some(namespace);
    let key = ObjectKey {
        api_version: resolved.resource.api_version.clone(),
        kind: resolved.resource.kind.clone(),
        namespace: namespace.map(str::to_string),
        name: name.to_string(),
    };
    let object = cluster.get(&key).await?;
    cluster.may(Verb::Watch, &resolved, namespace, name).await?;
    ctx.watches
        .dependency(cluster, &resolved, namespace, name, release.clone());
    Ok(Seen::Found {
        object,
        cluster_scoped: !resolved.namespaced,
    })
}
