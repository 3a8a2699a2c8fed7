//! The release's objects in the cluster: reading what the lifecycle wants to observe, applying
//! layers and CRDs, deleting what it decided to delete. Every kind written is watched, so that
//! its changes wake the release.

use kube::runtime::reflector::ObjectRef;
use serde_json::{Value, json};

mod orphans;

use super::Error;
use super::context::Context;
use crate::api::{
    Claim, HOOK_RUN_ANNOTATION, Identity, MANAGED_BY, MANAGED_BY_LABEL, OWNER_ANNOTATION,
    ObjectKey, RELEASE_NAME_ANNOTATION, RELEASE_NAMESPACE_ANNOTATION, Reason, SHARD_LABEL,
    SequencedRelease,
};
use crate::cluster::{Cluster, ClusterError, Kind, Verb};
use crate::history::HookRecord;
use crate::plan::{ExternalDependency, Resource};
use crate::readiness::{self, HealthChecks, Rules};
use crate::rollout::drift::{Drift, DriftReport, Drifted};
use crate::rollout::hooks::HookAction;
use crate::rollout::ignore::{self, IgnoreRules};
use crate::rollout::{ActionFailure, Deployable, Observations, Wanted};

/// How many objects are read at once.
const READ_CONCURRENCY: usize = 16;

/// An action that failed: what the status says, and the error itself (for the backoff of a
/// transient one).
pub(super) struct Failed {
    pub failure: ActionFailure,
    pub error: Error,
}

impl Failed {
    fn of(error: ClusterError, reason: Reason, place: Option<(&str, &str)>) -> Failed {
        // Rights a service account lacks are what a person fixes: say so, whatever was refused.
        let reason = match error {
            ClusterError::Forbidden { .. } => Reason::Forbidden,
            _ => reason,
        };
        let message = match place {
            Some((chart, template)) if !error.is_transient() => {
                format!("{error} (chart {chart}, {template})")
            }
            _ => error.to_string(),
        };
        Failed {
            failure: ActionFailure {
                transient: error.is_transient(),
                reason,
                message,
            },
            error: error.into(),
        }
    }
}

/// These resources of the plan (indexes into its resources), with their keys.
fn resources_of<'a>(
    deployable: &'a Deployable,
    resources: &'a [usize],
) -> impl Iterator<Item = (&'a Resource, &'a ObjectKey)> {
    resources
        .iter()
        .filter_map(|&r| Some((deployable.plan.resources.get(r)?, deployable.keys.get(r)?)))
}

/// Applying `resource` failed with `error`: the status names its chart and template.
fn apply_failed(error: ClusterError, resource: &Resource) -> Failed {
    Failed::of(
        error,
        Reason::ApplyFailed,
        Some((&resource.chart, &resource.template)),
    )
}

/// The objects of one release.
pub(super) struct Objects<'a> {
    pub ctx: &'a Context,
    /// The API server as the account the release acts as.
    pub cluster: &'a Cluster,
    /// The same API server as the controller (a remote cluster's: its kubeconfig's identity).
    pub books: &'a Cluster,
    pub me: &'a Identity,
    pub release: ObjectRef<SequencedRelease>,
    /// `spec.driftDetection.ignore`: fields drift detection neither reports nor corrects.
    pub ignore: &'a IgnoreRules,
    /// `spec.healthCheckExprs`: a kind they name is judged by its status, not its metadata.
    pub health: &'a HealthChecks,
}

impl Objects<'_> {
    /// Reads what the lifecycle wants to see.
    pub async fn observe(
        &self,
        deployable: Option<&Deployable>,
        hooks: &[HookRecord],
        wanted: &Wanted,
    ) -> Result<Observations, Error> {
        let cluster = self.cluster;
        let mut observed = Observations::default();
        if let Some(deployable) = deployable {
            let pending: Vec<(usize, &ObjectKey)> = wanted
                .resources
                .iter()
                .filter_map(|&r| deployable.keys.get(r).map(|k| (r, k)))
                .collect();
            let mut unknown = Vec::new();
            for (r, key) in pending {
                let by_metadata = deployable.plan.resources.get(r).is_some_and(|resource| {
                    let rules = match deployable.rules.get(r) {
                        Some(rules) => Some(std::borrow::Cow::Borrowed(rules)),
                        None => Rules::from_object(&resource.object)
                            .ok()
                            .map(std::borrow::Cow::Owned),
                    };
                    rules.is_some_and(|rules| {
                        readiness::judged_by_metadata(
                            resource.group(),
                            &resource.kind,
                            &rules,
                            self.health,
                        )
                    })
                });
                match self.indexed(key, by_metadata).await {
                    Some(found) => {
                        observed.resources.insert(r, found);
                    }
                    None => unknown.push((r, key)),
                }
            }
            for chunk in unknown.chunks(READ_CONCURRENCY) {
                let found =
                    futures::future::join_all(chunk.iter().map(|(_, key)| cluster.find(key))).await;
                for ((r, _), found) in chunk.iter().zip(found) {
                    observed.resources.insert(*r, found?);
                }
            }
            if wanted.crds {
                for (i, key) in deployable.crd_keys.iter().enumerate() {
                    observed.crds.insert(i, cluster.find(key).await?);
                }
            }
            for &(layer, index) in &wanted.external {
                let external = deployable
                    .plan
                    .layers
                    .get(layer)
                    .and_then(|l| l.external.get(index));
                let found = match external {
                    Some(external) => self.external(external).await?,
                    None => None,
                };
                observed.external.insert((layer, index), found);
            }
        }
        for &hook in &wanted.hooks {
            let found = match hooks.get(hook) {
                Some(h) => {
                    // Its changes (a Job completing) wake the release.
                    if let Ok(kind) = cluster.kind(&h.key.api_version, &h.key.kind).await {
                        self.ctx
                            .watches
                            .managed(&kind, cluster, h.key.namespace.as_deref());
                    }
                    cluster.find(&h.key).await?
                }
                None => None,
            };
            observed.hooks.insert(hook, found);
        }
        // Read as the controller, whose log it is to tell, except in multi-tenant mode: there
        // the log (a tenant's input) is read as the release's account, which may not have been
        // granted `pods/log` (the status then says so in the log's place).
        let reader = if self.ctx.options.tenancy.is_multi_tenant() {
            cluster
        } else {
            self.books
        };
        for &hook in &wanted.hook_logs {
            let found = match hooks.get(hook) {
                Some(h) => match cluster.find(&h.key).await? {
                    Some(object) => reader.hook_log(&object).await?,
                    None => None,
                },
                None => None,
            };
            observed.hook_logs.insert(hook, found);
        }
        for &(hook, index) in &wanted.hook_external {
            let found = match hooks.get(hook).and_then(|h| h.external.get(index)) {
                Some(external) => self.external(external).await?,
                None => None,
            };
            observed.hook_external.insert((hook, index), found);
        }
        self.orphans(&mut observed).await?;
        let mut present = Vec::new();
        for key in &wanted.present {
            match self.indexed(key, true).await {
                Some(found) => {
                    observed
                        .present
                        .insert(key.clone(), found.as_ref().map(Claim::of));
                }
                None => present.push(key.clone()),
            }
        }
        for chunk in present.chunks(READ_CONCURRENCY) {
            let found = futures::future::join_all(chunk.iter().map(|key| cluster.find(key))).await;
            for (key, found) in chunk.iter().zip(found) {
                observed
                    .present
                    .insert(key.clone(), found?.as_ref().map(Claim::of));
            }
        }
        Ok(observed)
    }

    /// The object as the watches of its kind know it, without a request: `Some(None)` when it
    /// does not exist, `Some(Some(stub))` with its metadata when `metadata_will_do`; None when
    /// it must be read (the kind is not watched yet, or its watch has not listed yet, or more
    /// than its metadata is needed). Starts the watch of its kind.
    async fn indexed(&self, key: &ObjectKey, metadata_will_do: bool) -> Option<Option<Value>> {
        let kind = self.cluster.kind(&key.api_version, &key.kind).await.ok()?;
        self.ctx
            .watches
            .managed(&kind, self.cluster, key.namespace.as_deref());
        let found = self.ctx.watches.lookup(
            self.cluster,
            &kind.resource.group,
            &kind.resource.kind,
            key.namespace.as_deref(),
            &key.name,
        )?;
        match found {
            None => Some(None),
            Some(stub) if metadata_will_do => Some(Some(stub)),
            Some(_) => None,
        }
    }

    /// An external dependency of a layer or hook (werf), watched from now on; None when it or
    /// its kind does not exist.
    async fn external(&self, external: &ExternalDependency) -> Result<Option<Value>, Error> {
        let cluster = self.cluster;
        let kind = match cluster
            .resolve(&external.kind, external.group.as_deref())
            .await
        {
            Ok(kind) => kind,
            // Not served (yet): planning refused kinds nothing serves, so this one is a kind of
            // the chart's own CRDs, not applied yet.
            Err(ClusterError::UnknownKind { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let namespace = kind.namespaced.then(|| {
            external
                .namespace
                .clone()
                .unwrap_or_else(|| self.me.target_namespace.clone())
        });
        self.ctx.watches.external(
            cluster,
            &kind,
            namespace.as_deref(),
            &external.name,
            self.release.clone(),
        );
        let key = ObjectKey {
            api_version: kind.resource.api_version.clone(),
            kind: kind.resource.kind.clone(),
            namespace,
            name: external.name.clone(),
        };
        Ok(cluster.find(&key).await?)
    }

    /// How the revision's objects differ from what it applied. Deleted objects are looked up in
    /// the managed watches' index, and one missing there (or of a kind whose watch has not
    /// listed yet) is read to be sure; with
    /// `full`, every object is also compared with a server-side apply dry run of what it was
    /// applied as (a GET and a dry-run PATCH each).
    pub async fn drift(&self, deployable: &Deployable, full: bool) -> Result<DriftReport, Error> {
        let cluster = self.cluster;
        let mut report = DriftReport::default();
        let mut unknown = Vec::new();
        for (r, key) in deployable.keys.iter().enumerate() {
            if ignore::whole(&self.ignore.for_object(key)) {
                // An ignore rule with the path "": the object is left alone, deleted or not.
                continue;
            }
            let kind = match cluster.kind(&key.api_version, &key.kind).await {
                Ok(kind) => kind,
                Err(ClusterError::UnknownKind { .. }) => {
                    report.drifted.push(Drifted {
                        resource: r,
                        drift: Drift::Deleted,
                    });
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            self.ctx
                .watches
                .managed(&kind, cluster, key.namespace.as_deref());
            if full {
                unknown.push(r);
                continue;
            }
            match self.ctx.watches.exists(
                cluster,
                &kind.resource.group,
                &kind.resource.kind,
                key.namespace.as_deref(),
                &key.name,
            ) {
                Some(true) => {}
                // The index may lag behind a create it has not seen yet: a GET confirms.
                Some(false) | None => unknown.push(r),
            }
        }
        for chunk in unknown.chunks(READ_CONCURRENCY) {
            let checked = futures::future::join_all(chunk.iter().map(|&r| async move {
                let key = &deployable.keys[r];
                if full {
                    let Some(resource) = deployable.plan.resources.get(r) else {
                        return Ok(None);
                    };
                    let mut ignored = self.ignore.for_object(key);
                    ignored.push(ignore::shard_label());
                    cluster
                        .drift(key, &self.owned(&resource.object, key), &ignored)
                        .await
                } else {
                    Ok(cluster.find(key).await?.is_none().then_some(Drift::Deleted))
                }
            }))
            .await;
            for (&r, drift) in chunk.iter().zip(checked) {
                if let Some(drift) = drift? {
                    report.drifted.push(Drifted { resource: r, drift });
                }
            }
        }
        report.drifted.sort_by_key(|d| d.resource);
        Ok(report)
    }

    /// Creates the chart's CRDs that do not exist yet; with `replace`, server-side applies every
    /// one (forcing, as every apply), which updates those that changed. Whose they are was
    /// judged before. Never deletes one.
    pub async fn apply_crds(&self, deployable: &Deployable, replace: bool) -> Result<(), Failed> {
        let cluster = self.cluster;
        for (crd, key) in deployable.plan.crds.iter().zip(&deployable.crd_keys) {
            let fail = |e| Failed::of(e, Reason::ApplyFailed, Some((&crd.chart, &crd.template)));
            let kind = cluster
                .kind(&key.api_version, &key.kind)
                .await
                .map_err(fail)?;
            self.ctx.watches.managed(&kind, cluster, None);
            let object = self.owned(&crd.object, key);
            if replace {
                cluster.apply(key, &object).await.map_err(fail)?;
            } else {
                cluster.create_if_absent(key, &object).await.map_err(fail)?;
            }
        }
        Ok(())
    }

    /// Applies every resource of plan layer `layer`, in order. Whose the objects are was
    /// observed and judged before. When `correcting` drift, the fields the ignore rules name
    /// keep their live values ([`ignore::keep_live`] says why they are applied, not left out),
    /// and an object ignored whole that exists is not applied.
    pub async fn apply_layer(
        &self,
        deployable: &Deployable,
        layer: usize,
        correcting: bool,
    ) -> Result<(), Failed> {
        let cluster = self.cluster;
        let Some(layer) = deployable.plan.layers.get(layer) else {
            return Ok(());
        };
        self.may_apply(deployable, &layer.resources).await?;
        for (resource, key) in resources_of(deployable, &layer.resources) {
            let kind = self.kind_of(resource, key).await?;
            self.ctx
                .watches
                .managed(&kind, cluster, key.namespace.as_deref());
            let mut object = self.owned(&resource.object, key);
            let ignored = self.ignore.for_object(key);
            if correcting && !ignored.is_empty() {
                let live = cluster
                    .get(key)
                    .await
                    .map_err(|e| apply_failed(e, resource))?;
                if let Some(live) = live {
                    if ignore::whole(&ignored) {
                        continue;
                    }
                    ignore::keep_live(&mut object, &live, &ignored);
                }
            }
            let applied = cluster
                .apply(key, &object)
                .await
                .map_err(|e| apply_failed(e, resource))?;
            self.ctx
                .watches
                .applied(cluster, &kind, key.namespace.as_deref(), &applied);
        }
        Ok(())
    }

    /// The kind of a resource of the plan; failing, what applying it failed with.
    async fn kind_of(&self, resource: &Resource, key: &ObjectKey) -> Result<Kind, Failed> {
        self.cluster
            .kind(&key.api_version, &key.kind)
            .await
            .map_err(|e| apply_failed(e, resource))
    }

    /// Whether the account the release acts as may apply (create, patch), read and watch (get,
    /// list, watch: readiness and the watches that wake the release) these resources of a
    /// layer: asked of the API server before the first of them is written, so that a layer it
    /// may not deploy is refused whole. One question per kind, namespace and verb, cached.
    async fn may_apply(&self, deployable: &Deployable, resources: &[usize]) -> Result<(), Failed> {
        let cluster = self.cluster;
        if cluster.account().is_none() {
            return Ok(());
        }
        for (resource, key) in resources_of(deployable, resources) {
            let kind = self.kind_of(resource, key).await?;
            for verb in [
                Verb::Create,
                Verb::Patch,
                Verb::Get,
                Verb::List,
                Verb::Watch,
            ] {
                // Answers are cached per kind, namespace and verb: asked once for the layer.
                cluster
                    .may(verb, &kind, key.namespace.as_deref(), &key.name)
                    .await
                    .map_err(|e| apply_failed(e, resource))?;
            }
        }
        Ok(())
    }

    /// Creates (server-side applies) a hook, marked with its run, or deletes it as its delete
    /// policy says (in the background, as Helm deletes hooks).
    pub async fn hook(&self, hooks: &[HookRecord], action: &HookAction) -> Result<(), Failed> {
        let cluster = self.cluster;
        match action {
            HookAction::Create { hook, run } => {
                let Some(hook) = hooks.get(*hook) else {
                    return Ok(());
                };
                let fail =
                    |e| Failed::of(e, Reason::HookFailed, Some((&hook.chart, &hook.template)));
                let kind = cluster
                    .kind(&hook.key.api_version, &hook.key.kind)
                    .await
                    .map_err(fail)?;
                self.ctx
                    .watches
                    .managed(&kind, cluster, hook.key.namespace.as_deref());
                let mut object = self.owned(&hook.object, &hook.key);
                if let Some(annotations) = object
                    .pointer_mut("/metadata/annotations")
                    .and_then(Value::as_object_mut)
                {
                    annotations.insert(HOOK_RUN_ANNOTATION.into(), run.clone().into());
                }
                let applied = cluster.apply(&hook.key, &object).await.map_err(fail)?;
                self.ctx
                    .watches
                    .applied(cluster, &kind, hook.key.namespace.as_deref(), &applied);
                Ok(())
            }
            HookAction::Delete { hook } => match hooks.get(*hook) {
                Some(hook) => self.delete(std::slice::from_ref(&hook.key)).await,
                None => Ok(()),
            },
        }
    }

    /// Deletes these objects, in order.
    pub async fn delete(&self, keys: &[ObjectKey]) -> Result<(), Failed> {
        let cluster = self.cluster;
        for key in keys {
            if let Ok(kind) = cluster.kind(&key.api_version, &key.kind).await {
                self.ctx
                    .watches
                    .managed(&kind, cluster, key.namespace.as_deref());
            }
            cluster
                .delete(key)
                .await
                .map_err(|e| Failed::of(e, Reason::DeleteFailed, None))?;
        }
        Ok(())
    }

    /// `createNamespace`: the target namespace, unless it exists.
    pub async fn create_namespace(&self) -> Result<(), Error> {
        let name = &self.me.target_namespace;
        let key = ObjectKey {
            api_version: "v1".to_string(),
            kind: "Namespace".to_string(),
            namespace: None,
            name: name.clone(),
        };
        let object = json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        });
        self.cluster.create_if_absent(&key, &object).await?;
        Ok(())
    }

    /// The object as it is applied: its namespace, and the ownership labels and annotations.
    fn owned(&self, object: &Value, key: &ObjectKey) -> Value {
        let shard = self.ctx.shards.shard(&self.me.uid).to_string();
        as_applied(object, key, self.me, Some(&shard))
    }
}

/// `object` (of plan identity `key`) as release `me` applies it: with its namespace, the
/// ownership labels and annotations, and the label of its release's `shard` (the operator's
/// shard count decides it: `sequenced diff` passes the live object's). `sequenced diff` sends
/// exactly this in its dry runs.
pub fn as_applied(object: &Value, key: &ObjectKey, me: &Identity, shard: Option<&str>) -> Value {
    let mut object = object.clone();
    let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) else {
        return object;
    };
    if let Some(ns) = &key.namespace {
        metadata.insert("namespace".into(), Value::String(ns.clone()));
    }
    let mut map = |field: &str| {
        let entry = metadata
            .entry(field)
            .or_insert_with(|| Value::Object(Default::default()));
        if !entry.is_object() {
            *entry = Value::Object(Default::default());
        }
        entry
            .as_object_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    };
    let mut labels = map("labels");
    let mut annotations = map("annotations");
    labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    if let Some(shard) = shard {
        labels.insert(SHARD_LABEL.into(), shard.into());
    }
    annotations.insert(
        RELEASE_NAME_ANNOTATION.into(),
        me.release_name.clone().into(),
    );
    annotations.insert(
        RELEASE_NAMESPACE_ANNOTATION.into(),
        me.target_namespace.clone().into(),
    );
    annotations.insert(OWNER_ANNOTATION.into(), me.owner.clone().into());
    metadata.insert("labels".into(), Value::Object(labels));
    metadata.insert("annotations".into(), Value::Object(annotations));
    object
}
