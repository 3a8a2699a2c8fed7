//! The `SequencedRelease` custom resource (group `sequenced.dev`), and the product's names and
//! reasons ([`names`], [`Reason`]), which every other module imports from here.
//!
//! The Rust types are the source of truth: `sequenced crd` prints the CRD generated from them and
//! `crds/sequencedrelease.yaml` is that output, checked by a test.

pub mod names;
mod object;
mod reason;
pub mod v1alpha1;

pub use names::*;
pub use object::ObjectKey;
pub use reason::{EventReason, Reason};
pub use v1alpha1::*;

use kube::CustomResourceExt;

/// The file the generated CRD is committed to.
pub const CRD_FILE: &str = "crds/sequencedrelease.yaml";

/// The CRD as YAML, exactly as committed in [`CRD_FILE`].
pub fn crd_yaml() -> Result<String, serde_yaml_ng::Error> {
    let body = serde_yaml_ng::to_string(&SequencedRelease::crd())?;
    Ok(format!(
        "# Generated from the Rust types in src/api by `sequenced crd`. Do not edit by hand.\n{body}"
    ))
}
