//! `sequenced reconcile`, `sequenced rollback` and `sequenced test`: ask the operator, through
//! annotations on the SequencedRelease, to reconcile it now, to roll it back or to run its Helm
//! tests, then wait until it has acted and the operation has ended (as `flux reconcile` does).
//!
//! Asking is one merge patch of the release's annotations, carrying a fresh token; the operator
//! writes the token it acted on to the status. Reading the release is I/O ([`run`]); the patch,
//! whether the wait has ended and the lines printed are pure ([`patch`], [`judge`], [`summary`]),
//! so tests compare exact values.

use std::process::ExitCode;
use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::status::{
    EXIT_FAILED, Target, connect, error_chain, object_missing, one_line, release_phase,
};
use super::{RequestArgs, fail};
use crate::api::{
    FORCE_REQUEST_ANNOTATION, RECONCILE_REQUEST_ANNOTATION, ROLLBACK_REQUEST_ANNOTATION,
    ROLLBACK_REVISION_ANNOTATION, ReleasePhase, SequencedRelease, SequencedReleaseStatus,
    TEST_REQUEST_ANNOTATION, TEST_SUCCESS, TestPhase,
};
use crate::readiness::format_duration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// How often the release is read while waiting.
const POLL: Duration = Duration::from_millis(250);

/// Failed reads in a row before the wait gives up: one is survived, as when the API server
/// restarts, a cluster that stays away is reported.
const READ_ATTEMPTS: u32 = 3;

/// What is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    Reconcile { force: bool },
    Rollback { revision: Option<u32> },
    Test,
}

impl Request {
    /// The request as the messages name it: `a forced reconcile of apps/shop`, `a rollback of
    /// apps/shop to revision 3`.
    fn describe(self, target: &Target) -> String {
        let release = format!("{}/{}", target.namespace, target.name);
        match self {
            Request::Reconcile { force: false } => format!("a reconcile of {release}"),
            Request::Reconcile { force: true } => format!("a forced reconcile of {release}"),
            Request::Rollback { revision: None } => format!("a rollback of {release}"),
            Request::Rollback {
                revision: Some(revision),
            } => format!("a rollback of {release} to revision {revision}"),
            Request::Test => format!("a test run of {release}"),
        }
    }

    /// The status field the operator writes the token it acted on to.
    fn handled(self, status: &SequencedReleaseStatus) -> Option<&str> {
        match self {
            Request::Reconcile { .. } => status.last_handled_reconcile_at.as_deref(),
            Request::Rollback { .. } => status.last_handled_rollback_at.as_deref(),
            Request::Test => status.last_handled_test_at.as_deref(),
        }
    }

    fn handled_field(self) -> &'static str {
        match self {
            Request::Reconcile { .. } => "status.lastHandledReconcileAt",
            Request::Rollback { .. } => "status.lastHandledRollbackAt",
            Request::Test => "status.lastHandledTestAt",
        }
    }
}

/// The JSON merge patch that makes the request. An annotation the request does not want is set
/// to null, which removes it: a `forceAt` or `revision` left from an earlier request must not
/// change what this one means.
pub fn patch(request: Request, token: &str) -> Value {
    let annotations = match request {
        Request::Reconcile { force } => json!({
            RECONCILE_REQUEST_ANNOTATION: token,
            FORCE_REQUEST_ANNOTATION: if force { Value::from(token) } else { Value::Null },
        }),
        Request::Rollback { revision } => json!({
            ROLLBACK_REQUEST_ANNOTATION: token,
            ROLLBACK_REVISION_ANNOTATION: revision.map(|r| Value::from(r.to_string())),
        }),
        Request::Test => json!({ TEST_REQUEST_ANNOTATION: token }),
    };
    json!({"metadata": {"annotations": annotations}})
}

/// A fresh token: the current time in RFC 3339 with nanoseconds, as the operator and a reader
/// of the annotation see it (`2026-11-24T10:11:12.123456789Z`).
fn token() -> String {
    format!("{:.9}", k8s_openapi::jiff::Timestamp::now())
}

/// Where a requested operation is, judged from one look at the status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// The operator has not yet written this request's token.
    Unhandled,
    /// It has, and the operation it started (or found under way) has not ended.
    InProgress,
    Ended(Outcome),
}

/// How a requested operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ready,
    Failed,
    /// The operator refused the rollback (a revision that does not exist, a record without its
    /// plan); the release is as it was.
    Refused,
}

impl Outcome {
    fn exit_code(self) -> ExitCode {
        match self {
            Outcome::Ready => ExitCode::SUCCESS,
            Outcome::Failed | Outcome::Refused => ExitCode::from(EXIT_FAILED),
        }
    }
}

/// Whether an operation is under way in this phase. Every phase is named so that a new one has
/// to be decided on here.
fn in_progress(phase: ReleasePhase) -> bool {
    match phase {
        ReleasePhase::Pending
        | ReleasePhase::Rendering
        | ReleasePhase::Deploying
        | ReleasePhase::RollingBack
        | ReleasePhase::Uninstalling
        | ReleasePhase::Testing => true,
        ReleasePhase::Ready | ReleasePhase::Failed | ReleasePhase::Superseded => false,
    }
}

/// Where the request with `token` is, given the status now and the revision the release was at
/// when the request was made (`before`).
///
/// The operator writes the token in the same status write that starts the operation (or says
/// why there is none), so a status with the token and a phase that is not in progress is the
/// outcome of this request, never a phase left from before it. A rollback that was done made a
/// new revision that rolls back on request; one that ended Ready without making one was refused,
/// and the release is as it was.
pub fn judge(
    request: Request,
    token: &str,
    before: Option<i64>,
    status: &SequencedReleaseStatus,
) -> Wait {
    if request.handled(status) != Some(token) {
        return Wait::Unhandled;
    }
    if request == Request::Test && status.test_refused.is_some() {
        return Wait::Ended(Outcome::Refused);
    }
    match status.phase {
        None => Wait::InProgress,
        Some(phase) if in_progress(phase) => Wait::InProgress,
        Some(ReleasePhase::Failed) => Wait::Ended(Outcome::Failed),
        Some(_) => match request {
            Request::Rollback { .. } => {
                let rolled_back = status
                    .rollback
                    .as_ref()
                    .is_some_and(|r| r.requested && Some(r.revision) > before);
                Wait::Ended(if rolled_back {
                    Outcome::Ready
                } else {
                    Outcome::Refused
                })
            }
            Request::Reconcile { .. } => Wait::Ended(Outcome::Ready),
            // The run ended: every test passed, or one failed (the release stays Ready).
            Request::Test => Wait::Ended(if tests_passed(status) {
                Outcome::Ready
            } else {
                Outcome::Failed
            }),
        },
    }
}

/// Whether the `TestSuccess` condition says the last test run passed.
fn tests_passed(status: &SequencedReleaseStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == TEST_SUCCESS && c.status == "True")
}

/// What `sequenced test` prints once the run ended: the refusal, or the release's line and
/// each test as `helm test` prints it (`TEST SUITE`, `Last Started`, `Last Completed`,
/// `Phase`), with a failed test's message and log lines indented under it.
pub fn test_report(name: &str, status: &SequencedReleaseStatus) -> String {
    if let Some(refused) = &status.test_refused {
        return format!("{name}: {}\n", one_line(refused));
    }
    let mut out = format!("{}\n", summary(name, status));
    if status.tests.is_empty()
        && let Some(c) = status.conditions.iter().find(|c| c.type_ == TEST_SUCCESS)
    {
        out.push_str(&format!("TEST SUITE: None ({})\n", c.message));
    }
    let time = |t: &Option<Time>| {
        t.as_ref()
            .map_or_else(|| "-".to_string(), |t| t.0.to_string())
    };
    for test in &status.tests {
        let phase = match test.phase {
            TestPhase::Running => "Running",
            TestPhase::Succeeded => "Succeeded",
            TestPhase::Failed => "Failed",
        };
        let took = test
            .duration
            .as_deref()
            .map(|d| format!(" ({d})"))
            .unwrap_or_default();
        out.push_str(&format!(
            "TEST SUITE:     {} ({})\nLast Started:   {}\nLast Completed: {}\nPhase:          {phase}{took}\n",
            test.name,
            test.kind,
            time(&test.started_at),
            time(&test.finished_at),
        ));
        if let Some(message) = test
            .message
            .as_deref()
            .filter(|_| test.phase == TestPhase::Failed)
        {
            for line in message.lines() {
                out.push_str(&format!("  {line}\n"));
            }
        }
    }
    out
}

/// The line printed when the wait has ended: `shop: Ready at revision 5: rolled back to
/// revision 3; spec generation 7 not applied`.
pub fn summary(name: &str, status: &SequencedReleaseStatus) -> String {
    format!("{name}: {}", state(status))
}

/// The phase, revision and message on one line: `RollingBack at revision 4: rolling back to
/// revision 3, as requested`, `Failed: ...`, `no phase`.
fn state(status: &SequencedReleaseStatus) -> String {
    let phase = status.phase.map_or("no phase", release_phase);
    let mut state = match status.revision {
        Some(revision) => format!("{phase} at revision {revision}"),
        None => phase.to_string(),
    };
    if let Some(message) = status.message.as_deref().map(one_line)
        && !message.is_empty()
    {
        state.push_str(": ");
        state.push_str(&message);
    }
    state
}

/// What went wrong asking or waiting.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("no cluster to talk to (kubeconfig or in-cluster config): {0}")]
    NoCluster(String),
    #[error("SequencedRelease {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    #[error(
        "the cluster at {url} does not serve SequencedRelease (sequenced.dev/v1alpha1): install the CRD with `sequenced crd | kubectl apply --server-side -f -`"
    )]
    CrdMissing { url: String },
    #[error("cannot request {request} on {url}: {message}")]
    Patch {
        request: String,
        url: String,
        message: String,
    },
    #[error("cannot read SequencedRelease {namespace}/{name} from {url}: {message}")]
    Read {
        namespace: String,
        name: String,
        url: String,
        message: String,
    },
    #[error("SequencedRelease {namespace}/{name} was deleted while waiting for the operator")]
    Deleted { namespace: String, name: String },
    #[error(
        "gave up after {timeout} waiting for the operator to act on {request} ({field} is not yet {token}); is the operator running?"
    )]
    NotHandled {
        timeout: String,
        request: String,
        field: &'static str,
        token: String,
    },
    #[error("gave up after {timeout} waiting for the end of {request}: the release is {state}")]
    NotEnded {
        timeout: String,
        request: String,
        state: String,
    },
}

pub fn run(args: &RequestArgs, request: Request) -> ExitCode {
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(RequestError::Runtime)
        .and_then(|runtime| runtime.block_on(ask(args, request)));
    match result {
        Ok(code) => code,
        Err(e) => fail(&one_line(&e.to_string())),
    }
}

impl Target {
    /// The error for a 404 on the release: the object missing, or the CRD not installed.
    fn missing(&self, status: &kube::core::Status) -> RequestError {
        if object_missing(status) {
            RequestError::NotFound {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
            }
        } else {
            RequestError::CrdMissing {
                url: self.url.clone(),
            }
        }
    }
}

async fn ask(args: &RequestArgs, request: Request) -> Result<ExitCode, RequestError> {
    let (api, target) = connect(&args.name, args.namespace.as_deref())
        .await
        .map_err(RequestError::NoCluster)?;

    let token = token();
    let patched = match api
        .patch(
            &target.name,
            &PatchParams::default(),
            &Patch::Merge(&patch(request, &token)),
        )
        .await
    {
        Ok(release) => release,
        Err(kube::Error::Api(status)) if status.is_not_found() => {
            return Err(target.missing(&status));
        }
        Err(e) => {
            return Err(RequestError::Patch {
                request: request.describe(&target),
                url: target.url,
                message: error_chain(&e),
            });
        }
    };
    if args.no_wait {
        println!("requested {} (token {token})", request.describe(&target));
        return Ok(ExitCode::SUCCESS);
    }
    // The patch answers with the release as it was when asked: the operator cannot have acted
    // on a token it had not seen.
    let before = patched.status.and_then(|s| s.revision);
    let (outcome, status) = wait(&api, &target, request, &token, before, args.timeout).await?;
    match request {
        Request::Test => print!("{}", test_report(&target.name, &status)),
        _ => println!("{}", summary(&target.name, &status)),
    }
    Ok(outcome.exit_code())
}

/// Reads the release every [`POLL`] until the request has ended; its outcome and the status
/// that says so.
async fn wait(
    api: &Api<SequencedRelease>,
    target: &Target,
    request: Request,
    token: &str,
    before: Option<i64>,
    timeout: Duration,
) -> Result<(Outcome, SequencedReleaseStatus), RequestError> {
    let deadline = Instant::now() + timeout;
    let mut last = (Wait::Unhandled, SequencedReleaseStatus::default());
    let mut failures = 0;
    loop {
        // A read that hangs is cut off at the deadline too.
        let read = tokio::time::timeout_at(deadline, api.get(&target.name)).await;
        match read {
            Err(_elapsed) => {}
            Ok(Ok(release)) => {
                failures = 0;
                let status = release.status.unwrap_or_default();
                match judge(request, token, before, &status) {
                    Wait::Ended(outcome) => return Ok((outcome, status)),
                    wait => last = (wait, status),
                }
            }
            Ok(Err(kube::Error::Api(status))) if status.is_not_found() => {
                return Err(if object_missing(&status) {
                    RequestError::Deleted {
                        namespace: target.namespace.clone(),
                        name: target.name.clone(),
                    }
                } else {
                    target.missing(&status)
                });
            }
            Ok(Err(e)) => {
                failures += 1;
                if failures >= READ_ATTEMPTS {
                    return Err(RequestError::Read {
                        namespace: target.namespace.clone(),
                        name: target.name.clone(),
                        url: target.url.clone(),
                        message: error_chain(&e),
                    });
                }
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(timed_out(target, request, token, timeout, &last));
        }
        tokio::time::sleep_until((now + POLL).min(deadline)).await;
    }
}

/// The error for a wait that ran out, naming what it waited for from the last look.
fn timed_out(
    target: &Target,
    request: Request,
    token: &str,
    timeout: Duration,
    (wait, status): &(Wait, SequencedReleaseStatus),
) -> RequestError {
    let timeout = format_duration(timeout);
    match wait {
        Wait::Unhandled => RequestError::NotHandled {
            timeout,
            request: request.describe(target),
            field: request.handled_field(),
            token: token.to_string(),
        },
        Wait::InProgress | Wait::Ended(_) => RequestError::NotEnded {
            timeout,
            request: request.describe(target),
            state: state(status),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha1::RollbackStatus;

    const TOKEN: &str = "2026-11-24T10:11:12.123456789Z";

    fn status(phase: ReleasePhase, revision: i64, message: &str) -> SequencedReleaseStatus {
        SequencedReleaseStatus {
            phase: Some(phase),
            revision: Some(revision),
            message: Some(message.to_string()),
            ..SequencedReleaseStatus::default()
        }
    }

    fn handled(mut status: SequencedReleaseStatus, request: Request) -> SequencedReleaseStatus {
        match request {
            Request::Reconcile { .. } => status.last_handled_reconcile_at = Some(TOKEN.into()),
            Request::Rollback { .. } => status.last_handled_rollback_at = Some(TOKEN.into()),
            Request::Test => status.last_handled_test_at = Some(TOKEN.into()),
        }
        status
    }

    fn rolled_back(mut status: SequencedReleaseStatus, revision: i64) -> SequencedReleaseStatus {
        status.rollback = Some(RollbackStatus {
            revision,
            to: 1,
            from: None,
            requested: true,
            generation: None,
            digest: None,
        });
        status
    }

    #[test]
    fn a_patch_sets_the_token_and_removes_what_the_request_does_not_want() {
        assert_eq!(
            patch(Request::Reconcile { force: false }, TOKEN),
            json!({"metadata": {"annotations": {
                "reconcile.sequenced.dev/requestedAt": TOKEN,
                "reconcile.sequenced.dev/forceAt": null,
            }}})
        );
        assert_eq!(
            patch(Request::Reconcile { force: true }, TOKEN),
            json!({"metadata": {"annotations": {
                "reconcile.sequenced.dev/requestedAt": TOKEN,
                "reconcile.sequenced.dev/forceAt": TOKEN,
            }}})
        );
        assert_eq!(
            patch(Request::Rollback { revision: Some(3) }, TOKEN),
            json!({"metadata": {"annotations": {
                "rollback.sequenced.dev/requestedAt": TOKEN,
                "rollback.sequenced.dev/revision": "3",
            }}})
        );
        assert_eq!(
            patch(Request::Rollback { revision: None }, TOKEN),
            json!({"metadata": {"annotations": {
                "rollback.sequenced.dev/requestedAt": TOKEN,
                "rollback.sequenced.dev/revision": null,
            }}})
        );
    }

    #[test]
    fn a_test_run_ends_by_its_test_success_and_a_refusal_is_its_own_outcome() {
        assert_eq!(
            patch(Request::Test, TOKEN),
            json!({"metadata": {"annotations": {"test.sequenced.dev/requestedAt": TOKEN}}})
        );
        let test = Request::Test;
        let ready = status(ReleasePhase::Ready, 2, "revision 2 is ready");
        assert_eq!(judge(test, TOKEN, Some(2), &ready), Wait::Unhandled);
        let running = handled(status(ReleasePhase::Testing, 2, "running"), test);
        assert_eq!(judge(test, TOKEN, Some(2), &running), Wait::InProgress);
        let condition = |value: &str| k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: TEST_SUCCESS.into(),
            status: value.into(),
            reason: "TestFailed".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        };
        let mut passed = handled(ready.clone(), test);
        passed.conditions.push(condition("True"));
        assert_eq!(
            judge(test, TOKEN, Some(2), &passed),
            Wait::Ended(Outcome::Ready)
        );
        let mut failed = handled(ready.clone(), test);
        failed.conditions.push(condition("False"));
        assert_eq!(
            judge(test, TOKEN, Some(2), &failed),
            Wait::Ended(Outcome::Failed)
        );
        let mut refused = handled(status(ReleasePhase::Failed, 3, "boom"), test);
        refused.test_refused = Some("tests not run: the release is Failed".into());
        assert_eq!(
            judge(test, TOKEN, Some(3), &refused),
            Wait::Ended(Outcome::Refused)
        );
        assert_eq!(
            test_report("shop", &refused),
            "shop: tests not run: the release is Failed\n"
        );
    }

    #[test]
    fn a_test_report_prints_each_test_as_helm_test_with_a_failed_ones_log_lines() {
        let at = |s: i64| Some(Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap()));
        let mut st = status(
            ReleasePhase::Ready,
            2,
            "revision 2 is ready; test Job/smoke failed (run on request)",
        );
        st.tests = vec![
            crate::api::TestStatus {
                name: "connection".into(),
                kind: "Pod".into(),
                phase: TestPhase::Succeeded,
                started_at: at(0),
                finished_at: at(3),
                duration: Some("3s".into()),
                message: None,
            },
            crate::api::TestStatus {
                name: "smoke".into(),
                kind: "Job".into(),
                phase: TestPhase::Failed,
                started_at: at(3),
                finished_at: at(7),
                duration: Some("4s".into()),
                message: Some("test hook Job/smoke failed\nlast 1 log line of pod smoke-x (container c):\nFAIL".into()),
            },
        ];
        assert_eq!(
            test_report("shop", &st),
            "shop: Ready at revision 2: revision 2 is ready; test Job/smoke failed (run on request)\n\
             TEST SUITE:     connection (Pod)\n\
             Last Started:   1970-01-01T00:00:00Z\n\
             Last Completed: 1970-01-01T00:00:03Z\n\
             Phase:          Succeeded (3s)\n\
             TEST SUITE:     smoke (Job)\n\
             Last Started:   1970-01-01T00:00:03Z\n\
             Last Completed: 1970-01-01T00:00:07Z\n\
             Phase:          Failed (4s)\n\
             \x20 test hook Job/smoke failed\n\
             \x20 last 1 log line of pod smoke-x (container c):\n\
             \x20 FAIL\n"
        );
    }

    #[test]
    fn a_token_has_nanoseconds() {
        let token = token();
        assert_eq!(token.len(), TOKEN.len(), "{token}");
        assert!(
            token.parse::<k8s_openapi::jiff::Timestamp>().is_ok(),
            "{token}"
        );
    }

    #[test]
    fn the_wait_ends_only_when_this_token_is_handled_and_nothing_is_in_progress() {
        let reconcile = Request::Reconcile { force: false };
        let ready = status(ReleasePhase::Ready, 2, "revision 2 is ready");
        // A Ready phase from before the request is not its outcome.
        assert_eq!(judge(reconcile, TOKEN, Some(2), &ready), Wait::Unhandled);
        let mut older = ready.clone();
        older.last_handled_reconcile_at = Some("2026-11-24T10:00:00.000000000Z".into());
        assert_eq!(judge(reconcile, TOKEN, Some(2), &older), Wait::Unhandled);
        // The other kind of request's field does not count.
        let other = handled(ready.clone(), Request::Rollback { revision: None });
        assert_eq!(judge(reconcile, TOKEN, Some(2), &other), Wait::Unhandled);
        for phase in [
            ReleasePhase::Pending,
            ReleasePhase::Rendering,
            ReleasePhase::Deploying,
            ReleasePhase::RollingBack,
            ReleasePhase::Uninstalling,
        ] {
            let busy = handled(status(phase, 3, ""), reconcile);
            assert_eq!(judge(reconcile, TOKEN, Some(2), &busy), Wait::InProgress);
        }
        assert_eq!(
            judge(
                reconcile,
                TOKEN,
                Some(2),
                &handled(ready.clone(), reconcile)
            ),
            Wait::Ended(Outcome::Ready)
        );
        let failed = handled(status(ReleasePhase::Failed, 3, "boom"), reconcile);
        assert_eq!(
            judge(reconcile, TOKEN, Some(2), &failed),
            Wait::Ended(Outcome::Failed)
        );
    }

    #[test]
    fn a_rollback_that_made_no_new_revision_was_refused() {
        let rollback = Request::Rollback { revision: Some(7) };
        let done = rolled_back(handled(status(ReleasePhase::Ready, 3, ""), rollback), 3);
        assert_eq!(
            judge(rollback, TOKEN, Some(2), &done),
            Wait::Ended(Outcome::Ready)
        );
        // Still held on an earlier rollback (revision 3) when this one was refused.
        assert_eq!(
            judge(rollback, TOKEN, Some(3), &done),
            Wait::Ended(Outcome::Refused)
        );
        let never = handled(status(ReleasePhase::Ready, 2, ""), rollback);
        assert_eq!(
            judge(rollback, TOKEN, Some(2), &never),
            Wait::Ended(Outcome::Refused)
        );
        let failed = rolled_back(handled(status(ReleasePhase::Failed, 3, ""), rollback), 3);
        assert_eq!(
            judge(rollback, TOKEN, Some(2), &failed),
            Wait::Ended(Outcome::Failed)
        );
    }

    #[test]
    fn a_timeout_names_what_it_waited_for() {
        let target = Target {
            namespace: "apps".into(),
            name: "shop".into(),
            url: "https://k8s.example".into(),
        };
        let request = Request::Rollback { revision: Some(3) };
        let unhandled = (Wait::Unhandled, status(ReleasePhase::Ready, 4, "ready"));
        assert_eq!(
            timed_out(
                &target,
                request,
                TOKEN,
                Duration::from_secs(300),
                &unhandled
            )
            .to_string(),
            "gave up after 5m waiting for the operator to act on a rollback of apps/shop to \
             revision 3 (status.lastHandledRollbackAt is not yet 2026-11-24T10:11:12.123456789Z); \
             is the operator running?"
        );
        let busy = (
            Wait::InProgress,
            status(
                ReleasePhase::RollingBack,
                5,
                "rolling back to revision 3, as requested",
            ),
        );
        assert_eq!(
            timed_out(&target, request, TOKEN, Duration::from_secs(90), &busy).to_string(),
            "gave up after 1m30s waiting for the end of a rollback of apps/shop to revision 3: \
             the release is RollingBack at revision 5: rolling back to revision 3, as requested"
        );
    }

    #[test]
    fn the_summary_is_one_line_of_phase_revision_and_message() {
        let ready = status(
            ReleasePhase::Ready,
            5,
            "rolled back to revision 3; spec generation 7 not applied",
        );
        assert_eq!(
            summary("shop", &ready),
            "shop: Ready at revision 5: rolled back to revision 3; spec generation 7 not applied"
        );
        let failed = SequencedReleaseStatus {
            phase: Some(ReleasePhase::Failed),
            message: Some("chart shop: render failed:\n  templates/a.yaml: bad".into()),
            ..SequencedReleaseStatus::default()
        };
        assert_eq!(
            summary("shop", &failed),
            "shop: Failed: chart shop: render failed: templates/a.yaml: bad"
        );
        assert_eq!(
            summary("shop", &SequencedReleaseStatus::default()),
            "shop: no phase"
        );
    }
}
