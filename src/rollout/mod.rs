//! The per-release lifecycle, pure: from the spec, the status the controller wrote last time,
//! the release record, the lock's standing, what it observed in the cluster, the states of the
//! `dependsOn` releases and the time (passed in), decide the one next step. No I/O and no clock.
//!
//! - [`lifecycle`] chooses what to do next for a release: add the finalizer, suspend, stall with
//!   a reason, wait for dependencies, begin a revision, step it, uninstall, finish uninstalling,
//!   or ask the controller for a fact it has not gathered yet ([`lifecycle::Need`]).
//! - [`install`] steps one revision of an install or upgrade through `status.layers`:
//!   - `(crds)`: the CRDs of every chart's `crds/` directory, created (`spec.crds: Create`) or
//!     also updated (`CreateReplace`, after judging whose they are) and waited on until
//!     Established (only when the chart has CRDs and the revision's policy is not `Skip`);
//!   - every layer of the plan: a layer starts when the layers and charts it depends on are
//!     ready (or, for KOTS phases, applied) and its external dependencies are ready; layers with
//!     no relation start together; the owners of a starting layer's objects are observed first,
//!     and an object of someone else is refused before anything of the layer is written;
//!   - `(prune)`: the objects of the previous revision that this one no longer renders, deleted
//!     in the reverse order of that revision's plan (only when there are any).
//! - [`uninstall`] walks the uninstall steps of the revision's inventory the same way.
//! - [`dependencies`] judges the `dependsOn` releases and finds cycles among them.
//! - [`status`] holds the status transitions they share (conditions, Failed, Stalled, retries).

pub mod dependencies;
pub mod drift;
pub mod hooks;
pub mod ignore;
pub mod install;
pub mod lifecycle;
pub mod outages;
pub mod recovery;
pub mod status;
pub mod takeover;
pub mod uninstall;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::api::{
    Claim, CrdPolicy, DriftDetection, EventReason, Identity, ObjectKey, OnFailure,
    SequencedReleaseSpec, Sequencing,
};
use crate::history::{Content, HelmStatus, HookRecord, Inventory, Record, StoredPlan};
use crate::plan::{ExternalDependency, Plan};
use crate::readiness::cel::HealthCheckText;
use crate::readiness::parse_duration;
use crate::readiness::{self, Cel, HealthCheck, HealthChecks, Rules, Verdict};

pub use install::{InstallAction, InstallStep, begin, layout, step};
pub use lifecycle::{Facts, LockView, Need, Next, Requeue, next, requeue};
pub use status::{
    failed, holds_lock, interrupted, pending, progressing, retry_delay, retry_due, seconds,
    set_condition, stalled,
};
pub use uninstall::{Uninstall, UninstallStep, uninstall_step};

/// What the spec says about how to deploy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// `sequencing: ordered`; false applies everything at once.
    pub sequenced: bool,
    /// `wait`: every resource must be ready, not only those something waits on.
    pub wait: bool,
    /// `readinessTimeout`, unless a resource says otherwise.
    pub readiness_timeout: Duration,
    /// `maxHistory` (0 keeps every entry).
    pub max_history: usize,
    /// `retries`: how many times a failed operation is tried again.
    pub retries: u32,
    /// `adopt`: objects that no release owns may be taken over.
    pub adopt: bool,
    /// `timeout`: the bound of an operation and the duration of the release's lease.
    pub timeout: Duration,
    /// `interval`: how often a Ready release is looked at again.
    pub interval: Duration,
    /// `disableHooks`: no hook stage runs.
    pub disable_hooks: bool,
    /// `crds`: what an install or upgrade does with the charts' CRDs (unset: by operation, see
    /// [`Settings::crd_policy`]).
    pub crds: Option<CrdPolicy>,
    /// `onFailure`: what is done once a failed operation's retries are spent.
    pub on_failure: OnFailure,
    /// `driftDetection`: whether a Ready release's objects are compared with what it applied,
    /// and whether a difference is corrected.
    pub drift: DriftDetection,
}

/// `spec.timeout` and `spec.readinessTimeout` when they cannot be read.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// `spec.interval` when it cannot be read.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(600);

impl Settings {
    /// The settings of a spec. An unreadable duration (which the CRD's schema refuses) counts as
    /// its default; [`Settings::problem`] says whether the spec has one the release must stall on.
    pub fn of(spec: &SequencedReleaseSpec) -> Settings {
        Settings {
            sequenced: spec.sequencing == Sequencing::Ordered,
            wait: spec.wait,
            readiness_timeout: parse_duration(&spec.readiness_timeout).unwrap_or(DEFAULT_TIMEOUT),
            max_history: usize::try_from(spec.max_history).unwrap_or(0),
            // A negative number, which the CRD refuses, counts as none.
            retries: u32::try_from(spec.retries).unwrap_or(0),
            adopt: spec.adopt,
            timeout: parse_duration(&spec.timeout).unwrap_or(DEFAULT_TIMEOUT),
            interval: parse_duration(&spec.interval).unwrap_or(DEFAULT_INTERVAL),
            disable_hooks: spec.disable_hooks,
            crds: spec.crds,
            on_failure: spec.on_failure,
            drift: spec.drift_detection.mode(),
        }
    }

    /// The CRD policy of a revision that is an `upgrade` or an install: `spec.crds`, else
    /// Flux's and Helm's defaults, `Create` on install and `Skip` on upgrade.
    pub fn crd_policy(&self, upgrade: bool) -> CrdPolicy {
        match self.crds {
            Some(policy) => policy,
            None if upgrade => CrdPolicy::Skip,
            None => CrdPolicy::Create,
        }
    }

    /// What makes the spec unusable as it is, naming the field: a `readinessTimeout` that is not
    /// a duration; a `driftDetection` that is neither a mode nor Flux's object (which the CRD
    /// cannot check: see [`crate::api::DriftDetectionSpec`]). Ignore rules with a malformed JSON
    /// pointer or target are told by reading them ([`ignore::IgnoreRules::read`], once per
    /// reconcile, in the facts).
    pub fn problem(spec: &SequencedReleaseSpec) -> Option<String> {
        parse_duration(&spec.readiness_timeout)
            .err()
            .map(|e| format!("spec.readinessTimeout: {e}"))
            .or_else(|| spec.drift_detection.problem())
            .or_else(|| spec.chart.problem())
    }
}

/// The CEL of a spec, compiled: `spec.healthCheckExprs` and each `dependsOn[].readyExpr`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Expressions {
    pub health: HealthChecks,
    /// By index into `dependsOn`.
    pub ready: BTreeMap<usize, Cel>,
}

impl Expressions {
    /// Compiles the spec's CEL.
    ///
    /// # Errors
    ///
    /// The first expression that does not compile, naming its field:
    /// `spec.healthCheckExprs[0].current: "status.ready ==": Syntax error ...`.
    pub fn compile(spec: &SequencedReleaseSpec) -> Result<Expressions, String> {
        let mut checks = Vec::new();
        for (i, entry) in spec.health_check_exprs.iter().enumerate() {
            let check = HealthCheck::compile(HealthCheckText {
                api_version: &entry.api_version,
                kind: &entry.kind,
                current: &entry.current,
                in_progress: entry.in_progress.as_deref(),
                failed: entry.failed.as_deref(),
            })
            .map_err(|(field, e)| format!("spec.healthCheckExprs[{i}].{field}: {e}"))?;
            checks.push(check);
        }
        let mut ready = BTreeMap::new();
        for (i, entry) in spec.depends_on.iter().enumerate() {
            if let Some(text) = &entry.ready_expr {
                let compiled = Cel::compile(text)
                    .map_err(|e| format!("spec.dependsOn[{i}].readyExpr: {e}"))?;
                ready.insert(i, compiled);
            }
        }
        Ok(Expressions {
            health: HealthChecks::new(checks),
            ready,
        })
    }
}

/// The readiness rules of each resource of a plan (by index into `plan.resources`), read from
/// their annotations once, when the plan is made: CEL is compiled here, not at every check.
pub fn rules_of_plan(plan: &Plan) -> Arc<[Rules]> {
    plan.resources
        .iter()
        // The planner refused objects with bad rules, so this cannot fail for planned objects.
        .map(|r| Rules::from_object(&r.object).unwrap_or_default())
        .collect()
}

/// A planned chart with every object's identity resolved against the cluster (its namespace as
/// the cluster scopes its kind): what a revision deploys.
#[derive(Debug, Clone, PartialEq)]
pub struct Deployable {
    pub plan: Plan,
    /// The chart version that was rendered.
    pub chart_version: Option<String>,
    /// By index into `plan.resources`.
    pub keys: Vec<ObjectKey>,
    /// By index into `plan.crds`.
    pub crd_keys: Vec<ObjectKey>,
    /// The chart's hooks, in run order: those of `helm test` too, which run only in a
    /// revision's `(test)` stage.
    pub hooks: Vec<HookRecord>,
    /// What the revision applies, in uninstall order.
    pub inventory: Inventory,
    /// What Helm's readers show of it (`helm get manifest|values`).
    pub content: Content,
    /// The objects of `plan.resources` are cut to their readiness annotations and `content`
    /// is empty (the cached plan of a Ready release): enough to observe and judge the objects,
    /// not to apply, compare or record them. The controller makes it whole before it does.
    pub slim: bool,
    /// The readiness rules of `plan.resources`, compiled once ([`rules_of_plan`]); empty when
    /// not read (each object's annotations are then read when it is judged).
    pub rules: Arc<[Rules]>,
}

impl Deployable {
    /// What the record of a revision that deploys it keeps, for a rollback to it.
    pub fn stored(&self) -> StoredPlan {
        let mut plan = self.plan.clone();
        plan.hooks.clear();
        plan.warnings.clear();
        StoredPlan {
            plan,
            keys: self.keys.clone(),
            crd_keys: self.crd_keys.clone(),
        }
    }

    /// What revision `record` deployed, from its stored plan: what a rollback to it applies
    /// (its CRDs are kept, but a rollback's record says `Skip`: it never touches them).
    /// None when the record has no plan (written before rollbacks).
    pub fn from_record(record: &Record) -> Option<Deployable> {
        let stored = record.plan.as_ref()?;
        Some(Deployable {
            plan: stored.plan.clone(),
            chart_version: record.chart_version.clone(),
            keys: stored.keys.clone(),
            crd_keys: stored.crd_keys.clone(),
            hooks: record.hooks.clone(),
            inventory: record.inventory.clone(),
            content: record.content.clone(),
            slim: false,
            rules: rules_of_plan(&stored.plan),
        })
    }
}

/// What the current revision deploys.
#[derive(Debug, Clone)]
pub struct Revision<'a> {
    pub plan: &'a Plan,
    /// Every resource's identity, by index into `plan.resources`.
    pub keys: &'a [ObjectKey],
    /// Objects of the previous revision to delete at the end, in delete order.
    pub prune: &'a [ObjectKey],
    /// The hooks that may run (none with `spec.disableHooks`), in run order.
    pub hooks: &'a [HookRecord],
    /// An upgrade (an earlier revision was Ready) runs the `pre-upgrade`/`post-upgrade` hooks,
    /// anything else the `pre-install`/`post-install` ones.
    pub upgrade: bool,
    /// A rollback: it runs the `pre-rollback`/`post-rollback` hooks, and is not retried.
    pub rollback: bool,
    /// What the `(crds)` stage does, as the record says: nothing (`Skip`: the revision has no
    /// such stage), create the missing CRDs, or also update the changed ones.
    pub crds: CrdPolicy,
    /// `<release uid>/<revision>`: what the hook objects of this revision are marked with.
    pub run: String,
    pub settings: Settings,
    /// The release, to judge whose the objects are.
    pub me: &'a Identity,
    /// The Helm tests this revision runs after its last stage (`spec.test.enable`, or asked for
    /// with `sequenced test`); None when it has no `(test)` stage.
    pub test: Option<TestRun<'a>>,
    /// The readiness rules of `plan.resources`, compiled with the plan; empty when they are to
    /// be read from each object as it is judged.
    pub rules: &'a [Rules],
    /// `spec.healthCheckExprs`, compiled.
    pub health: &'a HealthChecks,
}

/// The Helm tests of a revision: its `(test)` stage.
#[derive(Debug, Clone, PartialEq)]
pub struct TestRun<'a> {
    /// The tests `spec.test.filters` selects; None when the chart has none (the run passes at
    /// once, as Flux says "no test hooks").
    pub stage: Option<hooks::Stage<'a>>,
    /// `spec.test.ignoreFailures`: a failed test does not fail the revision.
    pub ignore_failures: bool,
    /// The token of the `sequenced test` request being run: a failed test is told, never a
    /// failure of the release (as `helm test`).
    pub on_demand: Option<String>,
}

impl<'a> Revision<'a> {
    /// The revision that deploys `deployable`, pruning what `record` says, sequenced or not as
    /// the record says (a rollback applies as the revision it goes back to did).
    pub fn of(
        deployable: &'a Deployable,
        record: &'a crate::history::Record,
        settings: Settings,
        me: &'a Identity,
        upgrade: bool,
        health: &'a HealthChecks,
    ) -> Revision<'a> {
        let rollback = record.rollback_to.is_some();
        let settings = Settings {
            sequenced: record.sequenced,
            // A failed rollback is not tried again: the release stays Failed on it.
            retries: if rollback { 0 } else { settings.retries },
            ..settings
        };
        Revision {
            plan: &deployable.plan,
            keys: &deployable.keys,
            prune: &record.prune,
            hooks: if settings.disable_hooks {
                &[]
            } else {
                &deployable.hooks
            },
            upgrade,
            rollback,
            // Records written before the policy was kept created the missing CRDs.
            crds: record.crds.unwrap_or(CrdPolicy::Create),
            run: format!("{}/{}", me.uid, record.revision),
            settings,
            me,
            test: None,
            rules: &deployable.rules,
            health,
        }
    }

    /// The readiness rules of resource `r`: compiled with the plan, else read from `object`.
    pub fn rules(&self, r: usize, object: &Value) -> Cow<'_, Rules> {
        match self.rules.get(r) {
            Some(rules) => Cow::Borrowed(rules),
            // The planner refused objects with bad rules, so this cannot fail for planned objects.
            None => Cow::Owned(Rules::from_object(object).unwrap_or_default()),
        }
    }

    /// The health check of `spec.healthCheckExprs` for a resource's group and kind.
    pub fn health_check(&self, group: &str, kind: &str) -> Option<&'a HealthCheck> {
        self.health.for_kind(group, kind)
    }

    /// The revision with a `(test)` stage running the tests of `hooks` (the revision's, test
    /// hooks included; they run even with `spec.disableHooks`, as `helm test` does) that
    /// `spec.test` selects, each within `spec.test.timeout` (else `spec.timeout`). `on_demand`
    /// is the token of a `sequenced test` request: its run is named after it, so that the
    /// tests of an earlier run are created again.
    pub fn with_tests(
        mut self,
        hooks: &'a [HookRecord],
        spec: &SequencedReleaseSpec,
        on_demand: Option<String>,
    ) -> Revision<'a> {
        let test = spec.test.clone().unwrap_or_default();
        let timeout = test
            .timeout
            .as_deref()
            .and_then(|t| parse_duration(t).ok())
            .unwrap_or(self.settings.timeout);
        let run = match &on_demand {
            Some(token) => format!("{}/{}/{token}", self.run, crate::api::TEST_EVENT),
            None => format!("{}/{}", self.run, crate::api::TEST_EVENT),
        };
        self.test = Some(TestRun {
            stage: hooks::Stage::tests(hooks, |name| test.selects(name), run, timeout),
            ignore_failures: test.ignore_failures,
            on_demand,
        });
        self
    }
}

/// What the controller read from the cluster. A key that is missing was not looked at; `None`
/// means the object does not exist.
#[derive(Debug, Clone, Default)]
pub struct Observations {
    /// By index into [`Plan::crds`].
    pub crds: HashMap<usize, Option<Value>>,
    /// By index into [`Plan::resources`]: the objects of layers waited on (readiness) and of
    /// layers about to start (whose they are).
    pub resources: HashMap<usize, Option<Value>>,
    /// By (layer, index into its `external`).
    pub external: HashMap<(usize, usize), Option<Value>>,
    /// By index into the revision's hooks: the running hook of a stage.
    pub hooks: HashMap<usize, Option<Value>>,
    /// By (hook, index into its `external`).
    pub hook_external: HashMap<(usize, usize), Option<Value>>,
    /// By index into the revision's hooks: the end of the log of a hook Job's or Pod's pod
    /// ([`HookLog`]), None when it has none to read.
    pub hook_logs: HashMap<usize, Option<HookLog>>,
    /// Objects to delete, or waited on until they are gone: whose they say they are.
    pub present: HashMap<ObjectKey, Option<Claim>>,
    /// When the API servers the release uses did not answer or were starting: not counted
    /// against `spec.timeout` and the readiness timeouts.
    pub outages: outages::Outages,
    /// Owners named by observed objects (as [`crate::api::Owner::Other`] names them) that no
    /// longer exist: no SequencedRelease, no Helm record of the name. Their objects are orphans.
    pub gone: BTreeSet<String>,
    /// Owners named by observed objects that were looked for and exist.
    pub alive: BTreeSet<String>,
}

/// The last lines of a hook's pod's log.
#[derive(Debug, Clone, PartialEq)]
pub struct HookLog {
    /// The pod and container it is read from.
    pub pod: String,
    pub container: String,
    /// At most [`HookLog::MAX_LINES`] lines and [`HookLog::MAX_BYTES`] bytes, the last ones.
    pub lines: Vec<String>,
    /// Why the log could not be read (the release's account may not read pods' logs): told in
    /// its place.
    pub unreadable: Option<String>,
}

impl HookLog {
    pub const MAX_LINES: usize = 20;
    pub const MAX_BYTES: usize = 1024;

    /// The end of `text`: its last lines, at most [`HookLog::MAX_LINES`] of them and
    /// [`HookLog::MAX_BYTES`] bytes in all (a longer last line keeps its end).
    pub fn tail(pod: &str, container: &str, text: &str) -> HookLog {
        let mut lines: Vec<String> = Vec::new();
        let mut bytes = 0;
        for line in text.trim_end_matches('\n').rsplit('\n') {
            if lines.len() == Self::MAX_LINES {
                break;
            }
            let line = line.trim_end_matches('\r');
            let left = Self::MAX_BYTES.saturating_sub(bytes);
            if left == 0 {
                break;
            }
            if line.len() >= left {
                let mut start = line.len() - left;
                while !line.is_char_boundary(start) {
                    start += 1;
                }
                lines.push(line[start..].to_string());
                break;
            }
            bytes += line.len() + 1;
            lines.push(line.to_string());
        }
        lines.reverse();
        if lines.iter().all(String::is_empty) {
            lines.clear();
        }
        HookLog {
            pod: pod.to_string(),
            container: container.to_string(),
            lines,
            unreadable: None,
        }
    }

    /// A log that could not be read, and why.
    pub fn unreadable(pod: &str, container: &str, why: &str) -> HookLog {
        HookLog {
            pod: pod.to_string(),
            container: container.to_string(),
            lines: Vec::new(),
            unreadable: Some(why.to_string()),
        }
    }

    /// `last 3 log lines of pod migrate-x7k2p (container main):` and the lines, one a line;
    /// at most `budget` bytes (the first lines go first).
    pub fn told(&self, budget: usize) -> Option<String> {
        if let Some(why) = &self.unreadable {
            let text = match self.pod.as_str() {
                "" => format!("its log could not be read: {why}"),
                pod => format!("the log of pod {pod} could not be read: {why}"),
            };
            return (text.len() <= budget).then_some(text);
        }
        if self.lines.is_empty() {
            return None;
        }
        let mut start = 0;
        loop {
            let lines = &self.lines[start..];
            let head = format!(
                "last {} log line{} of pod {} (container {}):",
                lines.len(),
                if lines.len() == 1 { "" } else { "s" },
                self.pod,
                self.container
            );
            let text = format!("{head}\n{}", lines.join("\n"));
            if text.len() <= budget || lines.len() == 1 {
                return (text.len() <= budget).then_some(text);
            }
            start += 1;
        }
    }
}

impl Observations {
    /// Adds what `more` saw.
    pub fn extend(&mut self, more: Observations) {
        self.crds.extend(more.crds);
        self.resources.extend(more.resources);
        self.external.extend(more.external);
        self.hooks.extend(more.hooks);
        self.hook_external.extend(more.hook_external);
        self.hook_logs.extend(more.hook_logs);
        self.present.extend(more.present);
        self.gone.extend(more.gone);
        self.alive.extend(more.alive);
        if !more.outages.is_empty() {
            self.outages = more.outages;
        }
    }

    /// What of `wanted` has not been looked at yet.
    pub fn missing(&self, wanted: &Wanted) -> Wanted {
        Wanted {
            crds: wanted.crds && self.crds.is_empty(),
            resources: wanted
                .resources
                .iter()
                .copied()
                .filter(|r| !self.resources.contains_key(r))
                .collect(),
            external: wanted
                .external
                .iter()
                .copied()
                .filter(|e| !self.external.contains_key(e))
                .collect(),
            hooks: wanted
                .hooks
                .iter()
                .copied()
                .filter(|h| !self.hooks.contains_key(h))
                .collect(),
            hook_external: wanted
                .hook_external
                .iter()
                .copied()
                .filter(|e| !self.hook_external.contains_key(e))
                .collect(),
            hook_logs: wanted
                .hook_logs
                .iter()
                .copied()
                .filter(|h| !self.hook_logs.contains_key(h))
                .collect(),
            present: wanted
                .present
                .iter()
                .filter(|k| !self.present.contains_key(*k))
                .cloned()
                .collect(),
        }
    }

    /// Whether `key` still exists as an object of `me` (an object someone else owns is not ours
    /// to wait for).
    pub fn ours(&self, key: &ObjectKey, me: &Identity) -> bool {
        match self.present.get(key) {
            Some(Some(claim)) => claim.judge(me) == crate::api::Owner::Us,
            Some(None) => false,
            // Not looked at: assume it is still there.
            None => true,
        }
    }
}

/// What the controller must read before the lifecycle can decide.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Wanted {
    pub crds: bool,
    pub resources: BTreeSet<usize>,
    pub external: Vec<(usize, usize)>,
    pub hooks: BTreeSet<usize>,
    pub hook_external: BTreeSet<(usize, usize)>,
    /// Hooks whose pod's log must be read (a Job or Pod that failed, or succeeded with
    /// `helm.sh/hook-output-log-policy: hook-succeeded`).
    pub hook_logs: BTreeSet<usize>,
    pub present: Vec<ObjectKey>,
}

impl Wanted {
    pub fn is_empty(&self) -> bool {
        !self.crds
            && self.resources.is_empty()
            && self.external.is_empty()
            && self.hooks.is_empty()
            && self.hook_external.is_empty()
            && self.hook_logs.is_empty()
            && self.present.is_empty()
    }

    /// Adds what `more` wants.
    pub fn extend(&mut self, more: Wanted) {
        self.crds |= more.crds;
        self.resources.extend(more.resources);
        self.external.extend(more.external);
        self.hooks.extend(more.hooks);
        self.hook_external.extend(more.hook_external);
        self.hook_logs.extend(more.hook_logs);
        self.present.extend(more.present);
    }
}

/// Why a layer or hook must still wait for an object outside the release (werf's
/// `<id>.external-dependency.werf.io/resource`), or None once it exists and is ready.
pub fn external_blocker(external: &ExternalDependency, seen: Option<&Value>) -> Option<String> {
    let kind = match &external.group {
        Some(g) if !g.is_empty() => format!("{}.{g}", external.kind),
        _ => external.kind.clone(),
    };
    let name = match &external.namespace {
        Some(ns) => format!("{ns}/{}", external.name),
        None => external.name.clone(),
    };
    let verdict = match seen {
        Some(object) => readiness::check(object, &Rules::default(), None, Duration::MAX),
        None => Verdict::InProgress(format!("{kind} {name}: not found")),
    };
    verdict
        .reason()
        .filter(|_| !verdict.is_ready())
        .map(|reason| format!("waiting for external dependency {kind} {name}: {reason}"))
}

/// The outcome of a stepping function: a decision, or what must be observed before it.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome<T> {
    Need(Wanted),
    Decided(T),
}

/// A Kubernetes Event to record on the SequencedRelease.
#[derive(Debug, Clone, PartialEq)]
pub struct Note {
    pub warning: bool,
    pub reason: EventReason,
    pub message: String,
}

impl Note {
    pub fn normal(reason: EventReason, message: String) -> Note {
        Note {
            warning: false,
            reason,
            message,
        }
    }

    pub fn warning(reason: EventReason, message: String) -> Note {
        Note {
            warning: true,
            reason,
            message,
        }
    }
}

/// The events of one step, with the layers that became ready told in the event of what that
/// step goes on to do, so that a chained release writes one event per layer rather than two: a
/// `LayerReady` note leads the next `LayerStarted` note of the step (`Layer a of chart shop is
/// ready (2 resources); applying layer b of chart shop (1 resources)`), and is dropped when
/// nothing starts after it but the release becomes ready (its `ReleaseReady` says so). A layer
/// that becomes ready while nothing starts keeps its own `LayerReady`.
pub fn fold_ready(events: Vec<Note>) -> Vec<Note> {
    let release_ready = events.iter().any(|n| n.reason == EventReason::ReleaseReady);
    let mut folded = Vec::with_capacity(events.len());
    let mut ready: Vec<Note> = Vec::new();
    for note in events {
        match note.reason {
            EventReason::LayerReady => ready.push(note),
            EventReason::LayerStarted if !ready.is_empty() => {
                let mut rest = note.message.chars();
                let started: String = rest
                    .next()
                    .map(|c| c.to_lowercase().chain(rest).collect())
                    .unwrap_or_default();
                let mut told: Vec<String> = ready.drain(..).map(|n| n.message).collect();
                told.push(started);
                folded.push(Note {
                    message: told.join("; "),
                    ..note
                });
            }
            _ => folded.push(note),
        }
    }
    if !release_ready {
        folded.extend(ready);
    }
    folded
}

/// A change of one release record's status, as Helm spells it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordUpdate {
    pub revision: i64,
    pub status: HelmStatus,
    pub description: String,
    /// Only when the record has this status now (a `deployed` one becomes `superseded`).
    pub only_from: Option<HelmStatus>,
    /// The revision's last test run, when this update records one ([`Record::tests`]).
    pub tests: Option<Vec<crate::api::TestStatus>>,
}

impl RecordUpdate {
    pub(crate) fn new(revision: i64, status: HelmStatus, description: String) -> RecordUpdate {
        RecordUpdate {
            revision,
            status,
            description,
            only_from: None,
            tests: None,
        }
    }
}

/// How a failed action failed: a refusal a retry does not change, or a transient error.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionFailure {
    /// A transient error (the API server busy or unreachable): backed off, not counted.
    pub transient: bool,
    pub reason: crate::api::Reason,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(reason: EventReason, message: &str) -> Note {
        Note::normal(reason, message.to_string())
    }

    #[test]
    fn a_ready_layer_is_told_in_the_event_of_what_starts_next() {
        let folded = fold_ready(vec![
            note(
                EventReason::LayerReady,
                "Layer a of chart x is ready (2 resources)",
            ),
            note(
                EventReason::LayerStarted,
                "Applying layer b of chart x (1 resources)",
            ),
            note(
                EventReason::LayerStarted,
                "Applying layer c of chart x (1 resources)",
            ),
        ]);
        assert_eq!(
            folded,
            [
                note(
                    EventReason::LayerStarted,
                    "Layer a of chart x is ready (2 resources); applying layer b of chart x (1 resources)"
                ),
                note(
                    EventReason::LayerStarted,
                    "Applying layer c of chart x (1 resources)"
                ),
            ]
        );
    }

    #[test]
    fn a_layer_is_not_told_ready_in_its_own_start() {
        let started = note(
            EventReason::LayerStarted,
            "Applying layer a of chart x (1 resources)",
        );
        let ready = note(
            EventReason::LayerReady,
            "Layer a of chart x is ready (1 resources)",
        );
        assert_eq!(
            fold_ready(vec![started.clone(), ready.clone()]),
            [started, ready]
        );
    }

    #[test]
    fn the_last_layer_is_told_by_release_ready_and_a_lone_ready_layer_keeps_its_event() {
        let ready = note(
            EventReason::LayerReady,
            "Layer c of chart x is ready (1 resources)",
        );
        let release = note(EventReason::ReleaseReady, "revision 1 is ready: 3 layers");
        assert_eq!(fold_ready(vec![ready.clone(), release.clone()]), [release]);
        assert_eq!(fold_ready(vec![ready.clone()]), [ready]);
    }
}
