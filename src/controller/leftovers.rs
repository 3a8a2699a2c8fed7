//! The objects of a release whose record is missing (deleted by hand, or lost), found by their
//! owner annotation so that an uninstall never leaves them behind silently: every kind the API
//! server lists, in the release's and the target namespace and at the cluster scope, as the
//! release's account, by the label every applied object carries (`app.kubernetes.io/managed-by:
//! sequenced`), kept when their owner annotation names the release.

use std::collections::BTreeSet;

use kube::api::{Api, DynamicObject, ListParams};

use super::Error;
use crate::api::{Identity, MANAGED_BY, MANAGED_BY_LABEL, OWNER_ANNOTATION, ObjectKey};
use crate::cluster::{Cluster, ClusterError, Kind, Verb};

/// Lists at once.
const CONCURRENCY: usize = 8;

/// What a release's books are (its records, its Lease): deleted with the release, never as one
/// of its objects.
fn is_book(kind: &Kind, name: &str) -> bool {
    match (kind.resource.group.as_str(), kind.resource.kind.as_str()) {
        ("", "Secret") => {
            // Helm's record names, and those of the earlier format.
            name.starts_with(crate::history::helm::helm_record_name("", 0).trim_end_matches(".v0"))
                || name.starts_with(crate::api::record_name("", 0).trim_end_matches(".v0"))
        }
        ("coordination.k8s.io", "Lease") => name.starts_with(crate::lock::LEASE_PREFIX),
        _ => false,
    }
}

/// The release's objects found by their owner annotation; Ok(Err(why)) when they cannot all
/// be looked for: a group the API server cannot serve now, or a kind the account may create
/// but not list.
pub(super) async fn find(
    cluster: &Cluster,
    me: &Identity,
    namespace: &str,
) -> Result<Result<Vec<ObjectKey>, String>, Error> {
    let (kinds, unavailable) = cluster.listable_kinds().await?;
    if let Some((gv, why)) = unavailable.first() {
        return Ok(Err(format!("API group {gv} is unavailable ({why})")));
    }
    let namespaces: BTreeSet<&str> = [namespace, me.target_namespace.as_str()].into();
    let mut scopes: Vec<(Kind, Option<String>)> = Vec::new();
    for kind in kinds {
        if kind.resource.kind == "CustomResourceDefinition" {
            // CRDs are never deleted.
            continue;
        }
        if kind.namespaced {
            for ns in &namespaces {
                scopes.push((kind.clone(), Some(ns.to_string())));
            }
        } else {
            scopes.push((kind, None));
        }
    }
    let params = ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
    let mut found = Vec::new();
    for chunk in scopes.chunks(CONCURRENCY) {
        let listed = futures::future::join_all(chunk.iter().map(|(kind, ns)| {
            let api: Api<DynamicObject> = match ns {
                Some(ns) => Api::namespaced_with(cluster.client().clone(), ns, &kind.resource),
                None => Api::all_with(cluster.client().clone(), &kind.resource),
            };
            let params = params.clone();
            async move { api.list_metadata(&params).await }
        }))
        .await;
        for ((kind, ns), listed) in chunk.iter().zip(listed) {
            let items = match listed {
                Ok(list) => list.items,
                Err(kube::Error::Api(status)) if status.code == 403 => {
                    // What the account may not create, it did not create: nothing to find.
                    match cluster.may(Verb::Create, kind, ns.as_deref(), "").await {
                        Err(ClusterError::Forbidden { .. }) => continue,
                        Err(e) => return Err(e.into()),
                        Ok(()) => {
                            let scope = ns.as_deref().map_or_else(
                                || "at the cluster scope".to_string(),
                                |ns| format!("in namespace {ns}"),
                            );
                            let who = cluster
                                .account()
                                .map_or_else(|| "the controller".to_string(), ToString::to_string);
                            return Ok(Err(format!(
                                "{who} may create but not list {} {scope}",
                                kind.resource.plural
                            )));
                        }
                    }
                }
                // A kind that went away meanwhile has no objects.
                Err(kube::Error::Api(status)) if status.code == 404 => continue,
                Err(e) => {
                    let what = format!("{} {}", kind.resource.plural, ns.as_deref().unwrap_or(""));
                    return Err(super::kube_error(format!("listing {what}"))(e));
                }
            };
            for item in items {
                let name = item.metadata.name.clone().unwrap_or_default();
                let ours = item
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(OWNER_ANNOTATION))
                    == Some(&me.owner);
                if ours && !is_book(kind, &name) {
                    found.push(ObjectKey {
                        api_version: kind.resource.api_version.clone(),
                        kind: kind.resource.kind.clone(),
                        namespace: item.metadata.namespace.clone(),
                        name,
                    });
                }
            }
        }
    }
    Ok(Ok(found))
}
