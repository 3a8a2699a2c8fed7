//! Where a release's own books live: its status, its finalizer, the notes told about it. The
//! executor (the reconcile) writes them through a [`Home`] and never names where they go,
//! so that it has two drivers (STYLE.md, "Two drivers, one engine"):
//!
//! - the operator ([`Object`]): the SequencedRelease object itself (the status subresource, a
//!   merge patch of `metadata.finalizers`) and Kubernetes Events on it;
//! - a driver without a SequencedRelease object (the `sequenced install|upgrade|...` commands),
//!   which keeps the same status in the release record and tells the notes on a terminal; it
//!   implements this trait where it lives, and the controller imports nothing of it.

use futures::future::BoxFuture;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::context::Context;
use super::{Error, kube_error};
use crate::api::{Identity, SequencedRelease};
use crate::rollout::Note;

/// A write of the release's books: the release as written, or [`Written::Conflict`] when it
/// changed since it was read (the newer one comes with its own wake; the step is taken again
/// from it).
#[derive(Debug)]
pub(crate) enum Written {
    Written(Box<SequencedRelease>),
    Conflict,
}

/// Where the status, the finalizer and the notes of a release go.
pub(crate) trait Home: Send + Sync {
    /// Replaces the release's status with `release.status` (the rest of `release` is the
    /// release as last read).
    fn replace_status<'a>(
        &'a self,
        ctx: &'a Context,
        release: &'a SequencedRelease,
    ) -> BoxFuture<'a, Result<Written, Error>>;

    /// Sets the release's finalizers to `finalizers`, unless it changed since it was read.
    fn set_finalizers<'a>(
        &'a self,
        ctx: &'a Context,
        release: &'a SequencedRelease,
        finalizers: Vec<String>,
    ) -> BoxFuture<'a, Result<Written, Error>>;

    /// The release as it is now: read again after its lock was taken, so that the operation
    /// goes on from where the previous holder left it.
    fn read<'a>(
        &'a self,
        ctx: &'a Context,
        release: &'a SequencedRelease,
    ) -> BoxFuture<'a, Result<SequencedRelease, Error>>;

    /// Tells `note` about the release; a failure is only logged by the caller.
    fn tell<'a>(
        &'a self,
        ctx: &'a Context,
        release: &'a SequencedRelease,
        note: &'a Note,
    ) -> BoxFuture<'a, Result<(), String>>;
}

/// The operator's home: the SequencedRelease object and Events on it.
pub(crate) struct Object;

fn api(ctx: &Context, release: &SequencedRelease) -> Api<SequencedRelease> {
    Api::namespaced(
        ctx.client.clone(),
        release.namespace().as_deref().unwrap_or("default"),
    )
}

impl Home for Object {
    fn replace_status<'a>(
        &'a self,
        ctx: &'a Context,
        release: &'a SequencedRelease,
    ) -> BoxFuture<'a, Result<Written, Error>> {
        Box::pin(async move {
            let mut object = release.clone();
            object.metadata.managed_fields = None;
            let name = release.name_any();
            match api(ctx, release)
                .replace_status(&name, &PostParams::default(), &object)
                .await
            {
                Ok(written) => Ok(Written::Written(Box::new(written))),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Written::Conflict),
                Err(e) => Err(kube_error(format!(
                    "writing the status of {}",
                    Identity::of(release).owner
                ))(e)),
            }
        })
    }

    fn set_finalizers<'a>(
        &'a self,
        ctx: &'a Context,
        release: &'a SequencedRelease,
        finalizers: Vec<String>,
    ) -> BoxFuture<'a, Result<Written, Error>> {
        Box::pin(async move {
            let patch = json!({
                "metadata": {
                    "finalizers": finalizers,
                    "resourceVersion": release.resource_version(),
                }
            });
            let name = release.name_any();
            match api(ctx, release)
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(written) => Ok(Written::Written(Box::new(written))),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Written::Conflict),
                Err(e) => Err(kube_error(format!(
                    "updating the finalizers of {}",
                    Identity::of(release).owner
                ))(e)),
            }
        })
    }

    fn read<'a>(
        &'a self,
        ctx: &'a Context,
        release: &'a SequencedRelease,
    ) -> BoxFuture<'a, Result<SequencedRelease, Error>> {
        Box::pin(async move {
            api(ctx, release)
                .get(&release.name_any())
                .await
                .map_err(kube_error(format!(
                    "reading {}",
                    Identity::of(release).owner
                )))
        })
    }

    fn tell<'a>(
        &'a self,
        ctx: &'a Context,
        release: &'a SequencedRelease,
        note: &'a Note,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            ctx.events
                .publish(
                    &release.object_ref(&()),
                    note.warning,
                    &note.reason.to_string(),
                    &note.message,
                )
                .await
                .map_err(|e| e.to_string())
        })
    }
}
