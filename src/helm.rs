//! The helm binary: finding it and running it.
//!
//! sequenced renders charts with `helm template` and downloads them with `helm pull`, so that
//! charts behave exactly as they do with Helm. The binary is `$SEQUENCED_HELM`, else `helm` on PATH.
//!
//! Every run is bounded: helm runs in its own process group, its output is read to the end, and
//! when the deadline passes (or the caller stops waiting) the whole group is killed, so a hung
//! `helm pull` or `helm template` never pins a release.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;

/// The environment variable that names the helm binary.
pub const HELM_ENV: &str = "SEQUENCED_HELM";

/// How to get helm, for messages when it is missing.
const INSTALL_HINT: &str = "install Helm 4 and put it on PATH, or set SEQUENCED_HELM to the helm binary \
     (in a clone of sequenced, scripts/install-helm.sh puts one into .tools/bin)";

/// How long each kind of helm call may take before it is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// `helm template`: rendering works on local files only.
    pub template: Duration,
    /// `helm pull`: a download, which may be large and slow.
    pub pull: Duration,
    /// Anything else (`helm version`).
    pub other: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            template: Duration::from_secs(120),
            pull: Duration::from_secs(300),
            other: Duration::from_secs(30),
        }
    }
}

/// The most helm may print on stdout by default ([`Helm::with_output_limit`]).
pub const DEFAULT_OUTPUT_LIMIT: u64 = 32 * 1024 * 1024;
/// The most of helm's stderr that is kept (the rest is read and dropped): its message.
const STDERR_LIMIT: u64 = 256 * 1024;

/// A helm binary, the time each call of it may take and how much it may print.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Helm {
    path: PathBuf,
    timeouts: Timeouts,
    output_limit: u64,
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
    /// Helm did not finish in time and was killed.
    #[error("{command} timed out after {after} and was stopped")]
    TimedOut { command: String, after: String },
    /// Helm printed more than it may ([`Helm::with_output_limit`]) and was stopped.
    #[error("{command} printed more than {limit} and was stopped (--render-output-limit)")]
    TooLarge { command: String, limit: String },
    /// Helm ran and failed; `stderr` is its message, unchanged, after its gist
    /// ([`gist`]) on the first line: what a one-line view (a `kubectl get` column, an event
    /// list) keeps.
    #[error("{command} failed ({status}): {}", with_gist(stderr))]
    Failed {
        command: String,
        status: String,
        stderr: String,
    },
}

/// What helm's message says about why it failed, on one line: from its last `Error:` line (helm
/// prints warnings and debug lines before it) to the end, the lines joined and the prefix and the
/// `Use --debug flag` hint dropped; else its last non-empty line.
pub fn gist(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("Use --debug flag"))
        .collect();
    match lines.iter().rposition(|l| l.starts_with("Error:")) {
        Some(start) => lines[start..]
            .join(" ")
            .trim_start_matches("Error:")
            .trim()
            .to_string(),
        None => lines.last().copied().unwrap_or("no message").to_string(),
    }
}

/// The gist on the first line, then the whole message unless the gist says all of it.
fn with_gist(stderr: &str) -> String {
    let gist = gist(stderr);
    let whole = stderr.trim();
    if whole == gist || whole.strip_prefix("Error:").map(str::trim) == Some(gist.as_str()) {
        gist
    } else {
        format!("{gist}\n{whole}")
    }
}

impl HelmError {
    /// A fixed short category, for metrics labels.
    pub fn category(&self) -> &'static str {
        match self {
            HelmError::NotFound | HelmError::EnvNotFound { .. } => "helm_missing",
            HelmError::Spawn { .. } => "helm_spawn",
            HelmError::TimedOut { .. } => "helm_timeout",
            HelmError::TooLarge { .. } => "helm_output_too_large",
            HelmError::Failed { .. } => "helm_failed",
        }
    }

    /// Whether running helm again later may succeed: a helm that could not be found or started,
    /// or did not finish in time, may do better next time; a helm that ran and failed says
    /// something about its input.
    pub fn is_transient(&self) -> bool {
        !matches!(self, HelmError::Failed { .. } | HelmError::TooLarge { .. })
    }
}

impl Helm {
    /// `$SEQUENCED_HELM` when set, else `helm` on PATH, with the default timeouts.
    pub fn locate() -> Result<Self, HelmError> {
        match std::env::var_os(HELM_ENV) {
            Some(path) if !path.is_empty() => {
                let path = PathBuf::from(path);
                if path.is_file() {
                    Ok(Helm::at(path))
                } else {
                    Err(HelmError::EnvNotFound {
                        path: path.display().to_string(),
                    })
                }
            }
            _ => which::which("helm")
                .map(Helm::at)
                .map_err(|_| HelmError::NotFound),
        }
    }

    /// A specific helm binary, with the default timeouts.
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Helm {
            path: path.into(),
            timeouts: Timeouts::default(),
            output_limit: DEFAULT_OUTPUT_LIMIT,
        }
    }

    /// The same binary, stopped when it prints more than `bytes` on stdout (a chart that
    /// renders without end must not fill the operator's memory).
    pub fn with_output_limit(mut self, bytes: u64) -> Self {
        self.output_limit = bytes.max(1);
        self
    }

    /// The same binary with other timeouts.
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = timeouts;
        self
    }

    /// The binary's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How long each kind of call may take.
    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// Runs helm with `args`, waits at most `timeout`, and returns what it printed on stdout.
    /// `name` is how the command is named in errors (`helm template`), never the full command
    /// line, which may hold credentials. When the deadline passes, or the returned future is
    /// dropped, helm and every process it started are killed.
    pub async fn run(
        &self,
        name: &str,
        args: &[OsString],
        timeout: Duration,
    ) -> Result<String, HelmError> {
        self.run_reporting(name, args, timeout, false, &[]).await
    }

    /// [`Helm::run`] with these variables added to (or, when empty, removed from) helm's
    /// environment: the proxy of a guarded chart fetch.
    pub async fn run_with_env(
        &self,
        name: &str,
        args: &[OsString],
        timeout: Duration,
        env: &[(String, String)],
    ) -> Result<String, HelmError> {
        self.run_reporting(name, args, timeout, false, env).await
    }

    /// [`Helm::run`] for commands that say why they failed on stdout (`helm repo update`
    /// prints each repository it could not read there): a failure's message holds stdout too.
    pub async fn run_reporting_stdout(
        &self,
        name: &str,
        args: &[OsString],
        timeout: Duration,
        env: &[(String, String)],
    ) -> Result<String, HelmError> {
        self.run_reporting(name, args, timeout, true, env).await
    }

    /// [`Helm::run_with_env`], returning what helm printed on stderr too (`helm pull` of an
    /// OCI chart says the manifest digest it pulled there).
    pub async fn run_with_env_and_stderr(
        &self,
        name: &str,
        args: &[OsString],
        timeout: Duration,
        env: &[(String, String)],
    ) -> Result<(String, String), HelmError> {
        self.run_capturing(name, args, timeout, false, env).await
    }

    async fn run_reporting(
        &self,
        name: &str,
        args: &[OsString],
        timeout: Duration,
        stdout_in_errors: bool,
        env: &[(String, String)],
    ) -> Result<String, HelmError> {
        self.run_capturing(name, args, timeout, stdout_in_errors, env)
            .await
            .map(|(stdout, _)| stdout)
    }

    async fn run_capturing(
        &self,
        name: &str,
        args: &[OsString],
        timeout: Duration,
        stdout_in_errors: bool,
        env: &[(String, String)],
    ) -> Result<(String, String), HelmError> {
        let mut command = tokio::process::Command::new(&self.path);
        for (key, value) in env {
            if value.is_empty() {
                command.env_remove(key);
            } else {
                command.env(key, value);
            }
        }
        let mut child = command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0)
            .spawn()
            .map_err(|e| HelmError::Spawn {
                path: self.path.display().to_string(),
                message: crate::chart::io_message(&e),
            })?;
        // Declared after `child`, so dropped before it: the group is killed while helm's own
        // process is not reaped yet and its id cannot have been reused.
        let mut group = ProcessGroup(child.id());
        let (Some(mut stdout), Some(mut stderr)) = (child.stdout.take(), child.stderr.take())
        else {
            return Err(HelmError::Spawn {
                path: self.path.display().to_string(),
                message: "its output could not be captured".to_string(),
            });
        };
        let limit = self.output_limit;
        let leader = child.id();
        let finished = tokio::time::timeout(timeout, async {
            let mut out = Vec::new();
            let mut err = Vec::new();
            // Past the limit helm is stopped at once (its output would otherwise be read to the
            // end); its stderr beyond what is kept is read and dropped, so that it never blocks.
            let read_out = async {
                let read = (&mut stdout).take(limit + 1).read_to_end(&mut out).await;
                if out.len() as u64 > limit {
                    kill_group(leader);
                }
                read
            };
            let read_err = async {
                let read = (&mut stderr).take(STDERR_LIMIT).read_to_end(&mut err).await;
                let rest = tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await;
                read.and(rest)
            };
            let (read_out, read_err, status) = tokio::join!(read_out, read_err, child.wait());
            read_out.and(read_err).and(status).map(|s| (s, out, err))
        })
        .await;
        let (status, stdout, stderr) = match finished {
            Err(_) => {
                group.kill();
                // Reaps helm; the group was killed above, so this does not wait long.
                let _ = child.kill().await;
                return Err(HelmError::TimedOut {
                    command: name.to_string(),
                    after: crate::readiness::format_duration(timeout),
                });
            }
            Ok(Err(e)) => {
                group.kill();
                return Err(HelmError::Spawn {
                    path: self.path.display().to_string(),
                    message: format!(
                        "reading the output of {name}: {}",
                        crate::chart::io_message(&e)
                    ),
                });
            }
            Ok(Ok(done)) => done,
        };
        group.done();
        if stdout.len() as u64 > limit {
            return Err(HelmError::TooLarge {
                command: name.to_string(),
                limit: format_size(limit),
            });
        }
        if !status.success() {
            let status = match status.code() {
                Some(code) => format!("exit code {code}"),
                None => "killed by a signal".to_string(),
            };
            let stderr = String::from_utf8_lossy(&stderr);
            let message = if stdout_in_errors {
                format!(
                    "{}\n{}",
                    String::from_utf8_lossy(&stdout).trim(),
                    stderr.trim()
                )
                .trim()
                .to_string()
            } else {
                stderr.trim_end().to_string()
            };
            return Err(HelmError::Failed {
                command: name.to_string(),
                status,
                stderr: message,
            });
        }
        Ok((
            String::from_utf8_lossy(&stdout).into_owned(),
            String::from_utf8_lossy(&stderr).into_owned(),
        ))
    }

    /// What `helm version --short` prints, such as `v4.1.4+g05fa379`.
    pub async fn version(&self) -> Result<String, HelmError> {
        let args = ["version".into(), "--short".into()];
        Ok(self
            .run("helm version", &args, self.timeouts.other)
            .await?
            .trim()
            .to_string())
    }
}

/// `1048576` as `1Mi`, sizes as the flags take them.
pub fn format_size(bytes: u64) -> String {
    for (unit, size) in [("Gi", 1u64 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)] {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{}{unit}", bytes / size);
        }
    }
    format!("{bytes} bytes")
}

/// Kills the process group `leader` leads, while it is not reaped yet.
fn kill_group(leader: Option<u32>) {
    if let Some(id) = leader.and_then(|id| libc::pid_t::try_from(id).ok()) {
        // SAFETY: kill(2) takes plain integers; a negative id names the process group that
        // helm leads (it was started with process_group(0) and is not reaped yet).
        unsafe {
            libc::kill(-id, libc::SIGKILL);
        }
    }
}

/// The process group helm leads; killed when dropped unless helm finished by itself.
struct ProcessGroup(Option<u32>);

impl ProcessGroup {
    fn kill(&mut self) {
        kill_group(self.0.take());
    }

    /// Helm exited and was reaped: its id may be reused, so the group must not be signalled.
    fn done(&mut self) {
        self.0 = None;
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod gist_tests {
    use super::gist;

    #[test]
    fn the_gist_is_the_last_error_to_the_end_on_one_line() {
        let template = "walk.go:75: found symbolic link in path\nError: foo/templates/bad.yaml:1:10\n  executing \"foo/templates/bad.yaml\" at <.Values.missing.field>:\n    nil pointer evaluating interface {}.field\n\nUse --debug flag to render out invalid YAML\n";
        assert_eq!(
            gist(template),
            "foo/templates/bad.yaml:1:10 executing \"foo/templates/bad.yaml\" at <.Values.missing.field>: nil pointer evaluating interface {}.field"
        );
        assert_eq!(
            gist("Error: first\nError: release name \"x\": too long\n"),
            "release name \"x\": too long"
        );
        assert_eq!(gist("something odd\nand then this\n"), "and then this");
        assert_eq!(gist(""), "no message");
    }
}
