//! Where a release acts (AGREEMENTS §3: remote or local, as its account or as the controller),
//! decided before anything else of a reconcile: the cluster that holds its objects (where they
//! are applied, read and watched), the same cluster as the controller (its Helm records and hook
//! logs), and for `spec.kubeConfig` the remote cluster, read from its Secret through the same
//! reader as `valuesFrom` (in multi-tenant mode, the release's account).
//!
//! The kubeconfig is read once and kept while the watch of inputs has seen no change of its
//! Secret: a wake that changes nothing reads nothing. A remote cluster marked unreachable by its
//! watches is asked once (`/version`) before the reconcile goes on.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::Error;
use super::context::{Context, Place};
use super::remotes::{Remote, remote_id};
use super::watches::InputKind;
use crate::api::{Reason, SequencedRelease};
use crate::cluster::{Account, Cluster};
use crate::rollout::lifecycle::Refusal;

/// How long the question to a remote cluster marked unreachable may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a release acts.
pub(super) struct Target {
    /// The cluster of the release's objects, as the release acts there.
    pub cluster: Arc<Cluster>,
    /// The same cluster as the controller (a remote one as its kubeconfig's identity): the
    /// release's Helm records, its hook logs.
    pub books: Arc<Cluster>,
    /// The remote cluster of `spec.kubeConfig`.
    pub remote: Option<Arc<Remote>>,
    /// The cluster the controller runs in, as the release's account (or the controller): where
    /// its inputs are read in multi-tenant mode, wherever its objects are.
    pub inputs: Arc<Cluster>,
    /// Err when `spec.kubeConfig` cannot be used: the lifecycle stalls the release.
    pub usable: Result<(), Refusal>,
}

impl Target {
    /// The cluster the controller runs in, as `local` (the release's account there, or the
    /// controller).
    pub fn local(ctx: &Context, local: Arc<Cluster>) -> Target {
        Target {
            inputs: Arc::clone(&local),
            cluster: local,
            books: Arc::clone(&ctx.cluster),
            remote: None,
            usable: Ok(()),
        }
    }

    /// What names the remote cluster in messages: its server and the Secret of its
    /// kubeconfig.
    pub fn remote_names(&self, sr: &SequencedRelease) -> Option<(String, String)> {
        let remote = self.remote.as_ref()?;
        Some((remote.server.clone(), origin(sr)))
    }
}

/// The Secret `spec.kubeConfig` names, for messages: `Secret apps/fleet-a key value`.
fn origin(sr: &SequencedRelease) -> String {
    let namespace = sr.namespace().unwrap_or_else(|| "default".to_string());
    match &sr.spec.kube_config {
        Some(k) => format!(
            "spec.kubeConfig: Secret {namespace}/{}{}",
            k.secret_ref.name,
            k.secret_ref
                .key
                .as_deref()
                .map(|key| format!(" key {key}"))
                .unwrap_or_default()
        ),
        None => "the cluster the controller runs in".to_string(),
    }
}

/// Where `sr` acts as `account`; `local` is the cluster the controller runs in as that account
/// (or as the controller). An error is one trying again may fix (the Secret could not be read,
/// the remote cluster does not answer).
pub(super) async fn of(
    ctx: &Context,
    sr: &SequencedRelease,
    account: Option<&Account>,
    local: Arc<Cluster>,
) -> Result<Target, Error> {
    let key = ObjectRef::from_obj(sr);
    let Some(reference) = &sr.spec.kube_config else {
        if settle(ctx, &key, None) {
            // It no longer needs the kubeconfig Secret it named.
            keep_kubeconfigs(ctx, sr).await;
        }
        return Ok(Target::local(ctx, local));
    };
    // Read as `valuesFrom` is: in multi-tenant mode as the release's account.
    let reader = if ctx.options.tenancy.is_multi_tenant() {
        Arc::clone(&local)
    } else {
        Arc::clone(&ctx.cluster)
    };
    // A change of the Secret wakes the release, and is seen here as a new version.
    ctx.watches.reads(&key, super::source::inputs_of(sr));
    let namespace = sr.namespace().unwrap_or_else(|| "default".to_string());
    let input = (
        InputKind::Secret,
        namespace,
        reference.secret_ref.name.clone(),
    );
    let version = ctx.watches.input_version(&input);
    let read_from = format!(
        "{}/{:?}",
        reference.secret_ref.name, reference.secret_ref.key
    );
    let remote = match ctx.remotes.known(&key, &read_from, version) {
        Some(remote) => remote,
        None => match read(ctx, sr, &reader).await? {
            Ok(remote) => {
                // Read anew (a first reconcile, a changed Secret or spec): the Secret is kept
                // while the release needs it.
                keep_kubeconfigs(ctx, sr).await;
                remote
            }
            Err(refusal) => {
                return Ok(Target {
                    usable: Err(refusal),
                    ..Target::local(ctx, local)
                });
            }
        },
    };
    settle(ctx, &key, Some((&remote, &read_from, version)));
    if let Some(why) = ctx.remotes.failing(&remote.id) {
        // Its watches got no answer: ask it once before going on.
        let asked =
            tokio::time::timeout(PROBE_TIMEOUT, remote.cluster.client().apiserver_version());
        match asked.await {
            Ok(Ok(_)) => ctx.remotes.answered(&remote.id),
            Ok(Err(e)) => {
                return Err(Error::Unreachable {
                    server: remote.server.clone(),
                    origin: origin(sr),
                    message: e.to_string(),
                });
            }
            Err(_) => {
                return Err(Error::Unreachable {
                    server: remote.server.clone(),
                    origin: origin(sr),
                    message: format!("{why}; no answer within {}s", PROBE_TIMEOUT.as_secs()),
                });
            }
        }
    }
    let cluster = ctx
        .cluster_for(Place {
            remote: Some(&remote),
            account,
        })
        .map_err(super::kube_error(format!(
            "making a client for the remote cluster {}",
            remote.server
        )))?;
    Ok(Target {
        cluster,
        books: Arc::clone(&remote.cluster),
        remote: Some(remote),
        inputs: local,
        usable: Ok(()),
    })
}

/// Reads and checks the kubeconfig of `sr` through `reader`: its remote cluster, or why it
/// cannot be used.
async fn read(
    ctx: &Context,
    sr: &SequencedRelease,
    reader: &Cluster,
) -> Result<Result<Arc<Remote>, Refusal>, Error> {
    let refused = |message: String| Refusal {
        reason: Reason::InvalidKubeConfig,
        message,
    };
    let bytes = match super::source::kubeconfig(reader, sr).await? {
        Ok(bytes) => bytes,
        Err(missing) => {
            return Ok(Err(refused(format!(
                "spec.kubeConfig.secretRef: {missing}"
            ))));
        }
    };
    let id = remote_id(&bytes);
    if let Some(remote) = ctx.remotes.get(&id) {
        return Ok(Ok(remote));
    }
    let config = match crate::cluster::remote::config_of(&bytes).await {
        Ok(config) => config,
        Err(why) => {
            return Ok(Err(refused(format!(
                "{}: the kubeconfig cannot be used: {why}",
                origin(sr)
            ))));
        }
    };
    let remote = Remote::new(id, config).map_err(super::kube_error(format!(
        "making a client from the kubeconfig of {}",
        origin(sr)
    )))?;
    let remote = Arc::new(remote);
    ctx.remotes.insert(Arc::clone(&remote));
    Ok(Ok(remote))
}

/// Keeps the kubeconfig Secrets of the namespace of `sr` its releases need; a failure is
/// logged (the release goes on: the Secret is only at risk should its namespace be deleted while
/// no controller runs) and tried again at the next read of a kubeconfig.
async fn keep_kubeconfigs(ctx: &Context, sr: &SequencedRelease) {
    let namespace = sr.namespace().unwrap_or_else(|| "default".to_string());
    if let Err(e) = super::kubeconfigs::settle(ctx, &namespace, None).await {
        tracing::warn!(error = %e, "keeping the kubeconfig Secrets of namespace {namespace}");
    }
}

/// `release` targets `remote` from now on: the watches of remote clusters no release targets
/// any more stop, and a release whose target changed forgets its cached plan and records (they
/// were of the other cluster), its records kept from then on on the new one.
fn settle(
    ctx: &Context,
    release: &ObjectRef<SequencedRelease>,
    remote: Option<(&Arc<Remote>, &str, Option<u64>)>,
) -> bool {
    let (unused, changed) = ctx.remotes.target(release, remote);
    for id in &unused {
        ctx.watches.forget_remote(id);
    }
    if changed {
        ctx.plans.forget(release);
        ctx.records.forget(release);
    }
    ctx.records.target(
        release,
        remote.map(|(remote, _, _)| remote.cluster.client().clone()),
    );
    changed
}
