//! The kubectl binary, for its built-in kustomize (`kubectl kustomize`), which runs
//! `spec.postRenderers`: a real kustomize applies the patches and image overrides, so that they
//! behave exactly as in Flux or `kustomize build`.
//!
//! The binary is `$SEQUENCED_KUBECTL`, else `kubectl` on PATH, found when it is first needed (an
//! operator without post-renderers needs none). Every run is bounded as helm's are: its own
//! process group, killed whole when the deadline passes or the caller stops waiting
//! ([`crate::helm`] runs it).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::helm::{Helm, HelmError};

/// The environment variable that names the kubectl binary.
pub const KUBECTL_ENV: &str = "SEQUENCED_KUBECTL";

/// How to get kubectl, for messages when it is missing.
const INSTALL_HINT: &str = "spec.postRenderers run kustomize through kubectl 1.27 or later: put kubectl on PATH, or set SEQUENCED_KUBECTL to the kubectl binary (the operator image ships one; in a clone of sequenced, scripts/install-kubectl.sh puts one into .tools/bin)";

/// How long one `kubectl kustomize` may take before it is killed: it works on local files only.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Where kubectl is, or why it was not found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Location {
    At(PathBuf),
    /// `$SEQUENCED_KUBECTL` names no file.
    EnvMissing(String),
    /// Not set, and not on PATH.
    Missing,
}

/// A kubectl binary (or the reason there is none) and the time each run may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kubectl {
    found: Location,
    timeout: Duration,
}

/// Why kubectl could not be run, or what it said when it failed.
#[derive(Debug, thiserror::Error)]
pub enum KubectlError {
    #[error("kubectl not found: {INSTALL_HINT}")]
    NotFound,
    #[error("{KUBECTL_ENV}={path}: no such file; {INSTALL_HINT}")]
    EnvNotFound { path: String },
    /// It could not be started, did not finish in time, or failed; the message is kept whole.
    #[error("{0}")]
    Run(#[source] HelmError),
}

impl KubectlError {
    /// Whether running it again later may succeed: a kubectl that could not be found or started,
    /// or did not finish in time, may do better next time; a kubectl that ran and failed says
    /// something about its input.
    pub fn is_transient(&self) -> bool {
        match self {
            KubectlError::NotFound | KubectlError::EnvNotFound { .. } => true,
            KubectlError::Run(e) => e.is_transient(),
        }
    }

    /// A fixed short category, for metrics labels.
    pub fn category(&self) -> &'static str {
        match self {
            KubectlError::NotFound | KubectlError::EnvNotFound { .. } => "kubectl_missing",
            KubectlError::Run(HelmError::TimedOut { .. }) => "kubectl_timeout",
            KubectlError::Run(HelmError::Failed { .. }) => "kubectl_failed",
            KubectlError::Run(HelmError::TooLarge { .. }) => "kubectl_output_too_large",
            KubectlError::Run(_) => "kubectl_spawn",
        }
    }

    /// What kubectl said, without the command and status: its message, or this error's.
    pub fn message(&self) -> String {
        match self {
            KubectlError::Run(HelmError::Failed { stderr, .. }) => {
                let message = stderr.trim();
                message
                    .strip_prefix("error: ")
                    .unwrap_or(message)
                    .to_string()
            }
            other => other.to_string(),
        }
    }
}

impl Kubectl {
    /// `$SEQUENCED_KUBECTL` when set, else `kubectl` on PATH; when neither is there, a kubectl
    /// that says so when it is run.
    pub fn locate() -> Kubectl {
        let found = match std::env::var_os(KUBECTL_ENV) {
            Some(path) if !path.is_empty() => {
                let path = PathBuf::from(path);
                if path.is_file() {
                    Location::At(path)
                } else {
                    Location::EnvMissing(path.display().to_string())
                }
            }
            _ => which::which("kubectl").map_or(Location::Missing, Location::At),
        };
        Kubectl {
            found,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// A specific kubectl binary.
    pub fn at(path: impl Into<PathBuf>) -> Kubectl {
        Kubectl {
            found: Location::At(path.into()),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The same binary with another deadline for each run.
    pub fn with_timeout(mut self, timeout: Duration) -> Kubectl {
        self.timeout = timeout;
        self
    }

    /// The binary's path, or why there is none.
    pub fn path(&self) -> Result<&Path, KubectlError> {
        match &self.found {
            Location::At(path) => Ok(path),
            Location::EnvMissing(path) => Err(KubectlError::EnvNotFound { path: path.clone() }),
            Location::Missing => Err(KubectlError::NotFound),
        }
    }

    /// `kubectl kustomize DIR`: what the kustomization in `dir` builds.
    pub async fn kustomize(&self, dir: &Path) -> Result<String, KubectlError> {
        let path = self.path()?;
        let args: Vec<OsString> = vec!["kustomize".into(), dir.into()];
        // Helm's runner runs any binary the same way: bounded, in its own process group.
        Helm::at(path)
            .run("kubectl kustomize", &args, self.timeout)
            .await
            .map_err(KubectlError::Run)
    }
}
