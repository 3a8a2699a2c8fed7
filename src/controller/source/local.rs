//! Which local chart directories a multi-tenant controller may read (`--allow-local-charts`).

use std::path::{Path, PathBuf};

/// Whether `path` is under one of the `allowed` directories (`--allow-local-charts`), judged
/// first by its text alone (nothing outside them is even looked at: no file's existence is told)
/// and then with symbolic links resolved. Err says why not.
pub(super) fn local_chart_allowed(path: &Path, allowed: &[PathBuf]) -> Result<(), String> {
    let refused = || {
        format!(
            "{}: this controller runs multi-tenant and reads local charts only under the \
             directories --allow-local-charts lists{}",
            path.display(),
            if allowed.is_empty() {
                " (none)".to_string()
            } else {
                format!(
                    " ({})",
                    allowed
                        .iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        )
    };
    let plain = path.is_absolute()
        && path
            .components()
            .all(|c| !matches!(c, std::path::Component::ParentDir));
    if !plain || !allowed.iter().any(|dir| path.starts_with(dir)) {
        return Err(refused());
    }
    // A link inside an allowed directory may still point out of it.
    match std::fs::canonicalize(path) {
        Ok(real) => {
            let inside = allowed
                .iter()
                .any(|dir| std::fs::canonicalize(dir).is_ok_and(|dir| real.starts_with(dir)));
            if inside { Ok(()) } else { Err(refused()) }
        }
        // Missing: told as missing by the caller, which may now say so.
        Err(_) => Ok(()),
    }
}
