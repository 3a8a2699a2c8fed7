//! The helm binary: finding it and running it.
//!
//! sequenced renders charts with `helm template` and downloads them with `helm pull`, so that
//! charts behave exactly as they do with Helm. The binary is `$SEQUENCED_HELM`, else `helm` on PATH.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The environment variable that names the helm binary.
pub const HELM_ENV: &str = "SEQUENCED_HELM";

/// How to get helm, for messages when it is missing.
const INSTALL_HINT: &str = "install Helm 4 and put it on PATH, or set SEQUENCED_HELM to the helm binary \
     (in a clone of sequenced, scripts/install-helm.sh puts one into .tools/bin)";

/// A helm binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Helm {
    path: PathBuf,
}

/// Why helm could not be run, or what it said when it failed.
#[derive(Debug, thiserror::Error)]
pub enum HelmError {
    #[error("helm not found: {INSTALL_HINT}")]
    NotFound,
    #[error("{HELM_ENV}={path}: no such file; {INSTALL_HINT}")]
    EnvNotFound { path: String },
    #[error("cannot run {path}: {message}")]
    Spawn { path: String, message: String },
    /// Helm ran and failed; `stderr` is its message, unchanged.
    #[error("{command} failed ({status}):\n{stderr}")]
    Failed {
        command: String,
        status: String,
        stderr: String,
    },
}

impl HelmError {
    /// A fixed short category, for metrics labels.
    pub fn category(&self) -> &'static str {
        match self {
            HelmError::NotFound | HelmError::EnvNotFound { .. } => "helm_missing",
            HelmError::Spawn { .. } => "helm_spawn",
            HelmError::Failed { .. } => "helm_failed",
        }
    }

    /// Whether running helm again later may succeed: a helm that could not be found or started
    /// may be there next time; a helm that ran and failed says something about its input.
    pub fn is_transient(&self) -> bool {
        !matches!(self, HelmError::Failed { .. })
    }
}

impl Helm {
    /// `$SEQUENCED_HELM` when set, else `helm` on PATH.
    pub fn locate() -> Result<Self, HelmError> {
        match std::env::var_os(HELM_ENV) {
            Some(path) if !path.is_empty() => {
                let path = PathBuf::from(path);
                if path.is_file() {
                    Ok(Helm { path })
                } else {
                    Err(HelmError::EnvNotFound {
                        path: path.display().to_string(),
                    })
                }
            }
            _ => which::which("helm")
                .map(|path| Helm { path })
                .map_err(|_| HelmError::NotFound),
        }
    }

    /// A specific helm binary.
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Helm { path: path.into() }
    }

    /// The binary's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs helm with `args` and returns what it printed on stdout. `name` is how the command is
    /// named in errors (`helm template`), never the full command line, which may hold credentials.
    pub fn run(&self, name: &str, args: &[OsString]) -> Result<String, HelmError> {
        let output =
            Command::new(&self.path)
                .args(args)
                .output()
                .map_err(|e| HelmError::Spawn {
                    path: self.path.display().to_string(),
                    message: crate::chart::io_message(&e),
                })?;
        if !output.status.success() {
            let status = match output.status.code() {
                Some(code) => format!("exit code {code}"),
                None => "killed by a signal".to_string(),
            };
            return Err(HelmError::Failed {
                command: name.to_string(),
                status,
                stderr: String::from_utf8_lossy(&output.stderr)
                    .trim_end()
                    .to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// What `helm version --short` prints, such as `v4.1.4+g05fa379`.
    pub fn version(&self) -> Result<String, HelmError> {
        Ok(self
            .run("helm version", &["version".into(), "--short".into()])?
            .trim()
            .to_string())
    }
}
