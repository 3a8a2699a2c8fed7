//! The kubeconfig Secrets of remote releases (`spec.kubeConfig`) are kept while a release still
//! needs them: each one a release of its namespace names carries the finalizer
//! [`KUBECONFIG_FINALIZER`] (and the label [`IN_USE_LABEL`], by which they are listed), and loses
//! it once no release there needs it any more (the last one's uninstall finished, or its spec
//! names another Secret or none).
//!
//! Without it a namespace deleted while no controller runs (an operator upgrade, a node drain)
//! loses the kubeconfig with everything else the namespace controller can delete, and the
//! release's objects on its remote cluster could never be reached again: a Secret cannot be
//! created again in a namespace being deleted.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use super::context::Context;
use super::{Error, kube_error};
use crate::api::FINALIZER;

/// On a kubeconfig Secret a release of its namespace needs.
pub const KUBECONFIG_FINALIZER: &str = "sequenced.dev/kubeconfig-in-use";
/// The label of the Secrets that carry [`KUBECONFIG_FINALIZER`], to list them.
pub const IN_USE_LABEL: &str = "sequenced.dev/kubeconfig-in-use";

/// The kubeconfig Secrets of `namespace` the releases there need: those a release names that
/// is not being deleted, or that still has its finalizer (its uninstall reaches its cluster
/// through it); `finished` is a release whose uninstall is over (the store may not know yet).
fn needed(ctx: &Context, namespace: &str, finished: Option<&str>) -> BTreeSet<String> {
    ctx.store
        .state()
        .iter()
        .filter(|sr| sr.namespace().as_deref() == Some(namespace))
        .filter(|sr| finished != Some(sr.name_any().as_str()))
        .filter(|sr| {
            sr.metadata.deletion_timestamp.is_none()
                || sr.finalizers().iter().any(|f| f == FINALIZER)
        })
        .filter_map(|sr| sr.spec.kube_config.as_ref())
        .map(|k| k.secret_ref.name.clone())
        .collect()
}

/// Puts the finalizer on the kubeconfig Secrets of `namespace` its releases need, and takes it
/// off those they no longer do (as the controller). A Secret being deleted already cannot be
/// given a finalizer (the API server refuses new ones: the error is the caller's to log); one
/// that is gone needs nothing.
pub(super) async fn settle(
    ctx: &Context,
    namespace: &str,
    finished: Option<&str>,
) -> Result<(), Error> {
    let wanted = needed(ctx, namespace, finished);
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let kept = api
        .list_metadata(&ListParams::default().labels(IN_USE_LABEL))
        .await
        .map_err(kube_error(format!(
            "listing the kubeconfig Secrets kept in namespace {namespace}"
        )))?;
    let mut have = BTreeSet::new();
    for secret in kept.items {
        let name = secret.name_any();
        let finalizers = secret.finalizers();
        let held = finalizers.iter().any(|f| f == KUBECONFIG_FINALIZER);
        if wanted.contains(&name) {
            if held {
                have.insert(name);
            }
            continue;
        }
        let rest: Vec<&String> = finalizers
            .iter()
            .filter(|f| *f != KUBECONFIG_FINALIZER)
            .collect();
        let patch = json!({"metadata": {
            "resourceVersion": secret.resource_version(),
            "labels": {IN_USE_LABEL: null},
            "finalizers": rest,
        }});
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(secret = %name, "kubeconfig Secret no longer needed: finalizer removed")
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                return Err(kube_error(format!(
                    "removing the finalizer {KUBECONFIG_FINALIZER} of the kubeconfig Secret \
                     {namespace}/{name}"
                ))(e));
            }
        }
    }
    // Added without reading the Secret (in multi-tenant mode only the release's account reads
    // it): a strategic merge patch merges finalizers as a set.
    for name in wanted.difference(&have) {
        let patch = json!({"metadata": {
            "labels": {IN_USE_LABEL: "true"},
            "finalizers": [KUBECONFIG_FINALIZER],
        }});
        match api
            .patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(secret = %name, "kubeconfig Secret kept while its releases need it")
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                return Err(kube_error(format!(
                    "putting the finalizer {KUBECONFIG_FINALIZER} on the kubeconfig Secret \
                     {namespace}/{name}"
                ))(e));
            }
        }
    }
    Ok(())
}
