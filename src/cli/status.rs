//! `sequenced status`: the layer progress of a live SequencedRelease, drawn once, or on every
//! change until the release is Ready or Failed.
//!
//! Reading the object is I/O ([`run`]); drawing it is pure ([`format_status`], [`format_json`])
//! and uses no clock, so tests compare exact text.

use std::fmt::Write as _;
use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;

use futures::StreamExt as _;
use kube::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event, watcher};

use super::{StatusArgs, StatusOutput, fail};
use crate::api::v1alpha1::{LayerPhase, LayerStatus, ReleasePhase, SequencedRelease};
use crate::api::{READY, SHARD_LABEL, SHARD_LEASE_LABEL, SHARDS_ANNOTATION, STALLED, shard_of};
use crate::plan::DEFAULT_LAYER;

/// Exit code of `--watch` when the release ends Failed.
pub const EXIT_FAILED: u8 = 1;

/// Cells of a layer's progress bar.
const BAR_CELLS: usize = 8;

/// Watch errors in a row (each after kube-runtime's backoff) before `--watch` gives up: one is
/// survived, as when the API server restarts, a cluster that stays away is reported.
const WATCH_ATTEMPTS: u32 = 3;

/// Width of the keys of the header (`LOCKED TILL` and two spaces).
const KEY_WIDTH: usize = 13;

/// What went wrong reading the release.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("no cluster to talk to (kubeconfig or in-cluster config): {0}")]
    NoCluster(String),
    #[error("SequencedRelease {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    #[error(
        "the cluster at {url} does not serve SequencedRelease (sequenced.dev/v1alpha1): install the CRD with `sequenced crd | kubectl apply --server-side -f -`"
    )]
    CrdMissing { url: String },
    #[error("cannot read SequencedRelease {namespace}/{name} from {url}: {message}")]
    Read {
        namespace: String,
        name: String,
        url: String,
        message: String,
    },
    #[error("SequencedRelease {namespace}/{name} was deleted")]
    Deleted { namespace: String, name: String },
    #[error("watching SequencedRelease {namespace}/{name} on {url} failed: {message}")]
    Watch {
        namespace: String,
        name: String,
        url: String,
        message: String,
    },
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("cannot write to stdout: {0}")]
    Output(#[source] std::io::Error),
}

/// How a release ended, as far as `--watch` is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ready,
    Failed,
}

impl Outcome {
    fn exit_code(self) -> u8 {
        match self {
            Outcome::Ready => 0,
            Outcome::Failed => EXIT_FAILED,
        }
    }
}

/// Whether the release has ended Ready or Failed for its current spec. A status written for an
/// older generation has not ended: the operator has yet to act on the newest spec.
pub fn outcome(release: &SequencedRelease) -> Option<Outcome> {
    let status = release.status.as_ref()?;
    if let Some(generation) = release.metadata.generation
        && status.observed_generation != Some(generation)
    {
        return None;
    }
    match status.phase? {
        ReleasePhase::Ready => Some(Outcome::Ready),
        ReleasePhase::Failed => Some(Outcome::Failed),
        _ => None,
    }
}

/// How the tree is drawn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Style {
    /// Colour the phases with ANSI escapes (for a terminal).
    pub colour: bool,
}

/// The release's status as pretty JSON, `{}` when the operator has not written one yet.
pub fn format_json(release: &SequencedRelease) -> String {
    let status = release.status.clone().unwrap_or_default();
    let mut text = serde_json::to_string_pretty(&status).unwrap_or_else(|_| "{}".to_string());
    text.push('\n');
    text
}

/// The release as a header and a tree of its layers grouped by chart path.
///
/// The header names the release and shows its phase, revision, Ready condition, progress and
/// message, and the lock when one is held. Below it every entry of `status.layers`: the stages
/// (`(crds)`, `(prune)`) at the top level where they run, before or after the layers; the layers
/// under their chart, each chart's own layers first, then its subcharts, in deploy order. Each
/// layer has a bar of ready (or, while deleting, deleted) resources, its phase, and on the line
/// below what it waits for or why it failed.
pub fn format_status(release: &SequencedRelease, style: Style) -> String {
    let mut out = String::new();
    let namespace = release.metadata.namespace.as_deref().unwrap_or("");
    let name = release.metadata.name.as_deref().unwrap_or("");
    let _ = writeln!(out, "SequencedRelease {namespace}/{name}");
    let field = |out: &mut String, key: &str, value: &str| {
        let _ = writeln!(out, "{key:<KEY_WIDTH$}{value}");
    };
    let Some(status) = &release.status else {
        field(
            &mut out,
            "PHASE",
            "- (no status yet: is the operator running?)",
        );
        return out;
    };
    let phase = match status.phase {
        Some(phase) => paint(release_phase(phase), release_colour(phase), style),
        None => "-".to_string(),
    };
    field(&mut out, "PHASE", &phase);
    let revision = status
        .revision
        .map_or_else(|| "-".to_string(), |r| r.to_string());
    field(&mut out, "REVISION", &revision);
    let acting_as = status.acting_as.clone().or_else(|| {
        let account = release.spec.service_account_name.as_deref()?;
        Some(format!("serviceaccount {namespace}:{account}"))
    });
    if let Some(acting_as) = acting_as {
        let acting_as = if acting_as == "controller" {
            "the controller's own service account".to_string()
        } else {
            acting_as
        };
        field(&mut out, "ACTS AS", &acting_as);
    }
    if let Some(generation) = release.metadata.generation
        && let Some(observed) = status.observed_generation
        && observed < generation
    {
        field(
            &mut out,
            "OBSERVED",
            &format!(
                "generation {observed} of {generation}: the operator has not acted on the newest spec yet"
            ),
        );
    }
    let condition = |type_: &str| status.conditions.iter().find(|c| c.type_ == type_);
    let ready = match condition(READY) {
        Some(c) if c.reason.is_empty() => c.status.clone(),
        Some(c) => format!("{} ({})", c.status, c.reason),
        None => "Unknown".to_string(),
    };
    field(&mut out, "READY", &ready);
    if let Some(c) = condition(STALLED).filter(|c| c.status == "True") {
        let stalled = if c.reason.is_empty() {
            "True".to_string()
        } else {
            format!("True ({})", c.reason)
        };
        field(&mut out, "STALLED", &stalled);
    }
    let progress = status
        .progress
        .as_deref()
        .map_or_else(|| "-".to_string(), |p| format!("{p} layers ready"));
    field(&mut out, "PROGRESS", &progress);
    if let Some(message) = status.message.as_deref().filter(|m| !m.is_empty()) {
        let (first, rest) = split_message(message);
        field(&mut out, "MESSAGE", &first);
        for line in rest {
            field(&mut out, "", &format!("  {line}"));
        }
    }
    if let Some(lock) = &status.lock {
        if let Some(holder) = lock.holder.as_deref().filter(|h| !h.is_empty()) {
            let holder = match lock.session_id.as_deref().filter(|s| !s.is_empty()) {
                Some(session) => format!("{holder} (session {session})"),
                None => holder.to_string(),
            };
            field(&mut out, "LOCK HOLDER", &holder);
        }
        if let Some(until) = &lock.locked_until {
            field(&mut out, "LOCKED TILL", &until.0.to_string());
        }
    }
    // How revisions began when that was more than an install or upgrade (a Helm release gone
    // on from, a pending record taken over): said for as long as the history keeps them.
    let began = status.history.iter().filter_map(|entry| {
        let description = entry.description.as_deref().filter(|d| !d.is_empty())?;
        Some(format!(
            "revision {}: {}",
            entry.revision,
            one_line(description)
        ))
    });
    for (i, line) in began.enumerate() {
        field(&mut out, if i == 0 { "HISTORY" } else { "" }, &line);
    }
    // What the release waits for before its revision starts, and why each is not ready.
    for (i, dependency) in status.dependencies.iter().enumerate() {
        let key = if i == 0 { "DEPENDS ON" } else { "" };
        let name = match &dependency.namespace {
            Some(ns) => format!("{} {ns}/{}", dependency.kind, dependency.name),
            None => format!("{} {}", dependency.kind, dependency.name),
        };
        let state = if dependency.ready {
            paint("ready", GREEN, style)
        } else {
            let why = dependency
                .message
                .as_deref()
                .map(one_line)
                .unwrap_or_default();
            format!("{}: {why}", paint("waiting", YELLOW, style))
        };
        field(&mut out, key, &format!("{name}: {state}"));
    }
    if status.layers.is_empty() {
        field(&mut out, "LAYERS", "none yet");
        return out;
    }
    out.push('\n');
    draw_layers(&mut out, &status.layers, style);
    out
}

/// One line of the layer tree.
enum Row<'a> {
    /// A chart: its tree prefix and name.
    Chart(String),
    /// A layer or stage: its tree prefix and name, the entry, and the prefix of the line below
    /// it that tells what it waits for.
    Layer {
        label: String,
        layer: &'a LayerStatus,
        note_prefix: String,
    },
}

/// A chart of the tree: its own layers, then its subcharts.
struct ChartNode<'a> {
    name: &'a str,
    layers: Vec<&'a LayerStatus>,
    children: Vec<usize>,
}

/// Whether a `status.layers` entry is a stage (`(crds)`, `(pre-install)`, `(prune)`, ...) rather
/// than a layer of a chart.
fn is_stage(layer: &LayerStatus) -> bool {
    layer.name.starts_with('(') && layer.name.ends_with(')') && layer.name != DEFAULT_LAYER
}

fn draw_layers(out: &mut String, layers: &[LayerStatus], style: Style) {
    let first_layer = layers
        .iter()
        .position(|l| !is_stage(l))
        .unwrap_or(layers.len());
    let mut rows: Vec<Row> = layers[..first_layer].iter().map(stage_row).collect();

    let mut nodes: Vec<ChartNode> = Vec::new();
    let mut roots: Vec<usize> = Vec::new();
    for layer in layers[first_layer..].iter().filter(|l| !is_stage(l)) {
        let mut parent: Option<usize> = None;
        for segment in layer.chart.split('/') {
            let siblings = parent.map_or(&roots, |p| &nodes[p].children);
            let found = siblings.iter().copied().find(|&i| nodes[i].name == segment);
            let index = found.unwrap_or_else(|| {
                nodes.push(ChartNode {
                    name: segment,
                    layers: Vec::new(),
                    children: Vec::new(),
                });
                let index = nodes.len() - 1;
                match parent {
                    Some(p) => nodes[p].children.push(index),
                    None => roots.push(index),
                }
                index
            });
            parent = Some(index);
        }
        if let Some(index) = parent {
            nodes[index].layers.push(layer);
        }
    }
    for &root in &roots {
        chart_rows(&nodes, root, "", "", &mut rows);
    }
    rows.extend(
        layers[first_layer..]
            .iter()
            .filter(|l| is_stage(l))
            .map(stage_row),
    );

    let width = |row: &Row| match row {
        Row::Layer { label, .. } => label.chars().count(),
        Row::Chart(_) => 0,
    };
    let label_width = rows.iter().map(width).max().unwrap_or(0);
    let count_width = rows
        .iter()
        .map(|row| match row {
            Row::Layer { layer, .. } => count(layer).len(),
            Row::Chart(_) => 0,
        })
        .max()
        .unwrap_or(0);
    for row in &rows {
        match row {
            Row::Chart(label) => {
                let _ = writeln!(out, "{label}");
            }
            Row::Layer {
                label,
                layer,
                note_prefix,
            } => {
                let _ = writeln!(
                    out,
                    "{label:<label_width$}  {} {:>count_width$}  {}",
                    bar(layer),
                    count(layer),
                    paint(layer_phase(layer.phase), layer_colour(layer.phase), style),
                );
                if let Some(message) = layer.message.as_deref().filter(|m| !m.is_empty()) {
                    let (first, rest) = split_message(message);
                    let _ = writeln!(out, "{note_prefix}{first}");
                    for line in rest {
                        let _ = writeln!(out, "{note_prefix}  {line}");
                    }
                }
            }
        }
    }
}

/// A stage's row: at the top level, not under a chart.
fn stage_row(layer: &LayerStatus) -> Row<'_> {
    Row::Layer {
        label: layer.name.clone(),
        layer,
        note_prefix: "  ".to_string(),
    }
}

/// Adds the rows of chart `index` and everything below it. `prefix` and `connector` draw the
/// chart's own line; `child_prefix` starts the lines of its layers and subcharts.
fn chart_rows<'a>(
    nodes: &[ChartNode<'a>],
    index: usize,
    prefix: &str,
    connector: &str,
    rows: &mut Vec<Row<'a>>,
) {
    let node = &nodes[index];
    rows.push(Row::Chart(format!("{prefix}{connector}{}", node.name)));
    let child_prefix = match connector {
        "" => prefix.to_string(),
        "└── " => format!("{prefix}    "),
        _ => format!("{prefix}│   "),
    };
    let items = node.layers.len() + node.children.len();
    for position in 0..items {
        let last = position + 1 == items;
        let (connector, continuation) = if last {
            ("└── ", "    ")
        } else {
            ("├── ", "│   ")
        };
        if let Some(layer) = node.layers.get(position) {
            rows.push(Row::Layer {
                label: format!("{child_prefix}{connector}{}", layer.name),
                layer,
                note_prefix: format!("{child_prefix}{continuation}  "),
            });
        } else if let Some(&child) = node.children.get(position - node.layers.len()) {
            chart_rows(nodes, child, &child_prefix, connector, rows);
        }
    }
}

/// `[████░░░░]`: the share of the layer's resources that are ready (deleted, while deleting),
/// rounded down so that a full bar means all of them.
fn bar(layer: &LayerStatus) -> String {
    let filled = if layer.resources <= 0 {
        if matches!(layer.phase, LayerPhase::Ready | LayerPhase::Deleted) {
            BAR_CELLS
        } else {
            0
        }
    } else {
        let resources = usize::try_from(layer.resources).unwrap_or(0);
        let ready = usize::try_from(layer.ready.clamp(0, layer.resources)).unwrap_or(0);
        ready * BAR_CELLS / resources
    };
    format!("[{}{}]", "█".repeat(filled), "░".repeat(BAR_CELLS - filled))
}

fn count(layer: &LayerStatus) -> String {
    format!("{}/{}", layer.ready, layer.resources)
}

/// Messages are shown on one line each.
pub(super) fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A status message as it is shown: its first line on one line, and when it goes on with the
/// last lines of a hook's log (`last N log lines of pod ...:`), those lines as they are, each on
/// its own (without control characters). Other messages are shown on one line.
fn split_message(message: &str) -> (String, Vec<String>) {
    let mut lines = message.lines();
    let first = lines.next().unwrap_or_default();
    let rest: Vec<&str> = lines.collect();
    let is_log = rest
        .first()
        .is_some_and(|l| l.starts_with("last ") && l.contains(" log line") && l.ends_with(':'));
    if !is_log {
        return (one_line(message), Vec::new());
    }
    let clean = |line: &str| line.chars().filter(|c| !c.is_control()).collect::<String>();
    (one_line(first), rest.into_iter().map(clean).collect())
}

pub(super) fn release_phase(phase: ReleasePhase) -> &'static str {
    match phase {
        ReleasePhase::Pending => "Pending",
        ReleasePhase::Rendering => "Rendering",
        ReleasePhase::Deploying => "Deploying",
        ReleasePhase::Ready => "Ready",
        ReleasePhase::Failed => "Failed",
        ReleasePhase::RollingBack => "RollingBack",
        ReleasePhase::Uninstalling => "Uninstalling",
        ReleasePhase::Superseded => "Superseded",
        ReleasePhase::Testing => "Testing",
    }
}

fn layer_phase(phase: LayerPhase) -> &'static str {
    match phase {
        LayerPhase::Pending => "Pending",
        LayerPhase::Applying => "Applying",
        LayerPhase::Waiting => "Waiting",
        LayerPhase::Ready => "Ready",
        LayerPhase::Failed => "Failed",
        LayerPhase::Deleting => "Deleting",
        LayerPhase::Deleted => "Deleted",
        LayerPhase::CleaningUp => "CleaningUp",
    }
}

/// ANSI SGR codes.
const GREEN: &str = "32";
const YELLOW: &str = "33";
const RED: &str = "31";
const DIM: &str = "2";

fn release_colour(phase: ReleasePhase) -> &'static str {
    match phase {
        ReleasePhase::Ready => GREEN,
        ReleasePhase::Failed => RED,
        ReleasePhase::Pending => DIM,
        _ => YELLOW,
    }
}

fn layer_colour(phase: LayerPhase) -> &'static str {
    match phase {
        LayerPhase::Ready | LayerPhase::Deleted => GREEN,
        LayerPhase::Failed => RED,
        LayerPhase::Pending => DIM,
        LayerPhase::Applying
        | LayerPhase::Waiting
        | LayerPhase::Deleting
        | LayerPhase::CleaningUp => YELLOW,
    }
}

fn paint(text: &str, colour: &str, style: Style) -> String {
    if style.colour {
        format!("\x1b[{colour}m{text}\x1b[0m")
    } else {
        text.to_string()
    }
}

/// Runs the command: prints the release, and with `--watch` every change of it until it is Ready
/// (exit 0) or Failed (exit 1). Errors: one line, exit 2.
pub fn run(args: &StatusArgs) -> ExitCode {
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(StatusError::Runtime)
        .and_then(|runtime| runtime.block_on(show(args)));
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => fail(&one_line(&e.to_string())),
    }
}

/// The release a command looks at, and where.
pub(super) struct Target {
    pub(super) namespace: String,
    pub(super) name: String,
    pub(super) url: String,
}

/// The SequencedReleases of `namespace` (default: the kubeconfig context's) in the cluster of
/// the kubeconfig (or in-cluster config), and the release `name` there; the error is why there is
/// no cluster to talk to.
pub(super) async fn connect(
    name: &str,
    namespace: Option<&str>,
) -> Result<(Api<SequencedRelease>, Target), String> {
    let config = kube::Config::infer().await.map_err(|e| error_chain(&e))?;
    let target = Target {
        namespace: namespace.map_or_else(|| config.default_namespace.clone(), str::to_string),
        name: name.to_string(),
        url: config.cluster_url.to_string(),
    };
    let client = kube::Client::try_from(config).map_err(|e| error_chain(&e))?;
    Ok((Api::namespaced(client, &target.namespace), target))
}

async fn show(args: &StatusArgs) -> Result<u8, StatusError> {
    let (api, target) = connect(&args.name, args.namespace.as_deref())
        .await
        .map_err(StatusError::NoCluster)?;
    let release = get(&api, &target).await?;

    let terminal = std::io::stdout().is_terminal();
    let shard = shard_of_release(api.clone().into_client(), &release).await;
    let mut printer = Printer {
        output: args.output,
        colour: terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        clear: args.watch && terminal,
        last: None,
        shard,
    };
    printer.print(&release)?;
    if !args.watch {
        return Ok(0);
    }
    if let Some(outcome) = outcome(&release) {
        return Ok(outcome.exit_code());
    }
    watch(api, &target, &mut printer).await
}

async fn get(
    api: &Api<SequencedRelease>,
    target: &Target,
) -> Result<SequencedRelease, StatusError> {
    match api.get(&target.name).await {
        Ok(release) => Ok(release),
        Err(kube::Error::Api(status)) if status.is_not_found() => {
            if object_missing(&status) {
                Err(StatusError::NotFound {
                    namespace: target.namespace.clone(),
                    name: target.name.clone(),
                })
            } else {
                Err(StatusError::CrdMissing {
                    url: target.url.clone(),
                })
            }
        }
        Err(e) => Err(StatusError::Read {
            namespace: target.namespace.clone(),
            name: target.name.clone(),
            url: target.url.clone(),
            message: error_chain(&e),
        }),
    }
}

/// Whether a 404 says the object is missing, rather than the resource type: a missing object
/// names itself in the details, a missing resource type (the CRD not installed) does not.
pub(super) fn object_missing(status: &kube::core::Status) -> bool {
    status.details.as_ref().is_some_and(|d| !d.name.is_empty())
}

/// Follows the one object until it is Ready or Failed.
async fn watch(
    api: Api<SequencedRelease>,
    target: &Target,
    printer: &mut Printer,
) -> Result<u8, StatusError> {
    let config = watcher::Config::default().fields(&format!("metadata.name={}", target.name));
    let mut events = watcher(api, config).default_backoff().boxed();
    let deleted = || StatusError::Deleted {
        namespace: target.namespace.clone(),
        name: target.name.clone(),
    };
    let watch_failed = |message: String| StatusError::Watch {
        namespace: target.namespace.clone(),
        name: target.name.clone(),
        url: target.url.clone(),
        message,
    };
    let mut listed = false;
    let mut failures = 0;
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init) => listed = false,
            Ok(Event::InitApply(release) | Event::Apply(release)) => {
                failures = 0;
                listed = true;
                printer.print(&release)?;
                if let Some(outcome) = outcome(&release) {
                    return Ok(outcome.exit_code());
                }
            }
            Ok(Event::InitDone) => {
                failures = 0;
                if !listed {
                    return Err(deleted());
                }
            }
            Ok(Event::Delete(_)) => return Err(deleted()),
            Err(e) => {
                failures += 1;
                if failures >= WATCH_ATTEMPTS {
                    return Err(watch_failed(error_chain(&e)));
                }
            }
        }
    }
    Err(watch_failed("the watch ended".to_string()))
}

/// Prints each new look of the release: cleared and redrawn on a terminal in `--watch`, else
/// separated by a blank line. A look identical to the last one is not printed again.
struct Printer {
    output: StatusOutput,
    colour: bool,
    clear: bool,
    last: Option<String>,
    /// The release's shard and the replica that owns it, when the shard Leases can be read.
    shard: Option<String>,
}

/// `text` (a [`format_status`] header, then the layers after a blank line) with the field
/// `key` added at the end of the header.
fn with_field(text: &str, key: &str, value: &str) -> String {
    let line = format!("{key:<KEY_WIDTH$}{value}\n");
    match text.find("\n\n") {
        Some(at) => format!("{}{line}{}", &text[..=at], &text[at + 1..]),
        None => format!("{text}{line}"),
    }
}

/// `7 of 32, owned by sequenced-7d4b9c-x2l8q`: the shard of `release` and who holds its Lease,
/// from the shard Leases (labelled `sequenced.dev/lease=shard`, in the operator's namespace);
/// None when they cannot be read (no rights to list Leases, or an operator without shards).
async fn shard_of_release(client: kube::Client, release: &SequencedRelease) -> Option<String> {
    use k8s_openapi::api::coordination::v1::Lease;
    let uid = release.metadata.uid.as_deref()?;
    let leases: Api<Lease> = Api::all(client);
    let listed = leases
        .list(&kube::api::ListParams::default().labels(&format!("{SHARD_LEASE_LABEL}=shard")))
        .await
        .ok()?;
    let count: u32 = listed.items.iter().find_map(|l| {
        l.metadata
            .annotations
            .as_ref()?
            .get(SHARDS_ANNOTATION)?
            .parse()
            .ok()
    })?;
    let shard = shard_of(uid, count);
    let holder = listed
        .items
        .iter()
        .find(|l| {
            l.metadata.labels.as_ref().and_then(|m| m.get(SHARD_LABEL)) == Some(&shard.to_string())
        })
        .and_then(|l| l.spec.as_ref()?.holder_identity.clone())
        .filter(|h| !h.is_empty());
    Some(match holder {
        Some(holder) => format!("{shard} of {count}, owned by {holder}"),
        None => format!("{shard} of {count}, not owned yet"),
    })
}

impl Printer {
    fn print(&mut self, release: &SequencedRelease) -> Result<(), StatusError> {
        let text = match self.output {
            StatusOutput::Tree => {
                let text = format_status(
                    release,
                    Style {
                        colour: self.colour,
                    },
                );
                match &self.shard {
                    Some(shard) => with_field(&text, "SHARD", shard),
                    None => text,
                }
            }
            StatusOutput::Json => format_json(release),
        };
        if self.last.as_deref() == Some(text.as_str()) {
            return Ok(());
        }
        let mut stdout = std::io::stdout().lock();
        let separator = if self.clear {
            "\x1b[H\x1b[2J"
        } else if self.last.is_some() {
            "\n"
        } else {
            ""
        };
        stdout
            .write_all(separator.as_bytes())
            .and_then(|()| stdout.write_all(text.as_bytes()))
            .and_then(|()| stdout.flush())
            .map_err(StatusError::Output)?;
        self.last = Some(text);
        Ok(())
    }
}

/// An error and its sources, `: `-separated, without repeating a source that its parent already
/// quoted.
pub(super) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    one_line(&text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha1::{HistoryEntry, LockStatus, SequencedReleaseStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn time(text: &str) -> Time {
        Time(text.parse().expect("timestamp"))
    }

    fn condition(type_: &str, status: &str, reason: &str) -> Condition {
        Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message: String::new(),
            last_transition_time: time("2025-06-01T12:00:00Z"),
            observed_generation: None,
        }
    }

    fn layer(
        chart: &str,
        name: &str,
        phase: LayerPhase,
        ready: i32,
        resources: i32,
    ) -> LayerStatus {
        LayerStatus {
            chart: chart.to_string(),
            name: name.to_string(),
            phase,
            resources,
            ready,
            ..LayerStatus::default()
        }
    }

    fn waiting(mut layer: LayerStatus, message: &str) -> LayerStatus {
        layer.message = Some(message.to_string());
        layer
    }

    fn release(generation: i64, status: Option<SequencedReleaseStatus>) -> SequencedRelease {
        let mut release = SequencedRelease::new(
            "web",
            serde_json::from_value(serde_json::json!({"chart": {"path": "/charts/shop"}}))
                .expect("spec"),
        );
        release.metadata.namespace = Some("apps".to_string());
        release.metadata.generation = Some(generation);
        release.status = status;
        release
    }

    fn deploying() -> SequencedReleaseStatus {
        SequencedReleaseStatus {
            observed_generation: Some(2),
            phase: Some(ReleasePhase::Deploying),
            revision: Some(2),
            message: Some("deploying revision 2".to_string()),
            progress: Some("3/6".to_string()),
            conditions: vec![
                condition("Ready", "False", "Progressing"),
                condition("Reconciling", "True", "Progressing"),
                condition("Stalled", "False", "Progressing"),
            ],
            layers: vec![
                layer("shop", "(crds)", LayerPhase::Ready, 1, 1),
                layer("shop/postgres", DEFAULT_LAYER, LayerPhase::Ready, 2, 2),
                layer(
                    "shop/payments/ledger",
                    DEFAULT_LAYER,
                    LayerPhase::Ready,
                    1,
                    1,
                ),
                waiting(
                    layer("shop/payments", "api", LayerPhase::Waiting, 1, 3),
                    "waiting for Deployment payments-api: 0 of 2 replicas available",
                ),
                layer("shop", "database", LayerPhase::Ready, 2, 2),
                waiting(
                    layer("shop", "queue", LayerPhase::Waiting, 2, 4),
                    "waiting for Deployment queue-processor: 0 of 1 replicas available",
                ),
                waiting(
                    layer("shop", "app", LayerPhase::Pending, 0, 2),
                    "waiting for layer queue of chart shop",
                ),
                layer("shop", "(prune)", LayerPhase::Pending, 0, 3),
            ],
            lock: Some(LockStatus {
                holder: Some("sequenced-6d8f9".to_string()),
                session_id: Some("4c1e0a".to_string()),
                locked_until: Some(time("2025-06-01T12:05:00Z")),
            }),
            ..SequencedReleaseStatus::default()
        }
    }

    #[test]
    fn draws_charts_as_a_tree_with_stages_around_it() {
        let text = format_status(&release(2, Some(deploying())), Style::default());
        assert_eq!(
            text,
            "SequencedRelease apps/web
PHASE        Deploying
REVISION     2
READY        False (Progressing)
PROGRESS     3/6 layers ready
MESSAGE      deploying revision 2
LOCK HOLDER  sequenced-6d8f9 (session 4c1e0a)
LOCKED TILL  2025-06-01T12:05:00Z

(crds)                 [████████] 1/1  Ready
shop
├── database           [████████] 2/2  Ready
├── queue              [████░░░░] 2/4  Waiting
│     waiting for Deployment queue-processor: 0 of 1 replicas available
├── app                [░░░░░░░░] 0/2  Pending
│     waiting for layer queue of chart shop
├── postgres
│   └── (default)      [████████] 2/2  Ready
└── payments
    ├── api            [██░░░░░░] 1/3  Waiting
    │     waiting for Deployment payments-api: 0 of 2 replicas available
    └── ledger
        └── (default)  [████████] 1/1  Ready
(prune)                [░░░░░░░░] 0/3  Pending
"
        );
    }

    #[test]
    fn hook_stages_are_drawn_in_run_order_with_the_hook_that_blocks() {
        let mut status = deploying();
        status.layers = vec![
            layer("shop", "(crds)", LayerPhase::Ready, 1, 1),
            layer("shop", "(pre-install)", LayerPhase::Ready, 2, 2),
            layer("shop", "app", LayerPhase::Ready, 2, 2),
            layer("shop", "(prune)", LayerPhase::Deleted, 1, 1),
            waiting(
                layer("shop", "(post-install)", LayerPhase::Waiting, 0, 1),
                "hook 1 of 1: waiting for Job notify: running: 0 pods succeeded (1 active)",
            ),
        ];
        let text = format_status(&release(2, Some(status)), Style::default());
        let tree = &text[text.find("(crds)").unwrap()..];
        assert_eq!(
            tree,
            "(crds)          [████████] 1/1  Ready
(pre-install)   [████████] 2/2  Ready
shop
└── app         [████████] 2/2  Ready
(prune)         [████████] 1/1  Deleted
(post-install)  [░░░░░░░░] 0/1  Waiting
  hook 1 of 1: waiting for Job notify: running: 0 pods succeeded (1 active)
"
        );
    }

    #[test]
    fn a_failed_layer_shows_why_and_a_stalled_release_says_so() {
        let mut status = deploying();
        status.phase = Some(ReleasePhase::Failed);
        status.lock = None;
        status.conditions = vec![
            condition("Ready", "False", "ReadinessFailed"),
            condition("Stalled", "True", "ReadinessFailed"),
        ];
        status.message = Some(
            "layer migrate of chart shop failed: Job migrate: failed (BackoffLimitExceeded)"
                .to_string(),
        );
        status.layers = vec![waiting(
            layer("shop", "migrate", LayerPhase::Failed, 0, 1),
            "Job migrate: failed (BackoffLimitExceeded)",
        )];
        let text = format_status(&release(2, Some(status)), Style::default());
        assert_eq!(
            text,
            "SequencedRelease apps/web
PHASE        Failed
REVISION     2
READY        False (ReadinessFailed)
STALLED      True (ReadinessFailed)
PROGRESS     3/6 layers ready
MESSAGE      layer migrate of chart shop failed: Job migrate: failed (BackoffLimitExceeded)

shop
└── migrate  [░░░░░░░░] 0/1  Failed
      Job migrate: failed (BackoffLimitExceeded)
"
        );
    }

    #[test]
    fn a_release_without_status_says_the_operator_has_not_written_one() {
        let text = format_status(&release(1, None), Style::default());
        assert_eq!(
            text,
            "SequencedRelease apps/web\nPHASE        - (no status yet: is the operator running?)\n"
        );
        assert_eq!(format_json(&release(1, None)), "{}\n");
    }

    #[test]
    fn a_release_waiting_for_its_dependencies_says_what_each_waits_for() {
        use crate::api::DependencyStatus;
        let status = SequencedReleaseStatus {
            observed_generation: Some(1),
            phase: Some(ReleasePhase::Pending),
            message: Some("waiting for Deployment apps/db: 1 of 2 replicas available".to_string()),
            conditions: vec![condition(READY, "False", "DependencyNotReady")],
            dependencies: vec![
                DependencyStatus {
                    kind: "SequencedRelease".to_string(),
                    namespace: Some("apps".to_string()),
                    name: "queue".to_string(),
                    ready: true,
                    ..Default::default()
                },
                DependencyStatus {
                    kind: "Deployment".to_string(),
                    api_version: Some("apps/v1".to_string()),
                    namespace: Some("apps".to_string()),
                    name: "db".to_string(),
                    ready: false,
                    message: Some("1 of 2 replicas available".to_string()),
                    owner: None,
                },
                DependencyStatus {
                    kind: "CustomResourceDefinition".to_string(),
                    api_version: Some("apiextensions.k8s.io/v1".to_string()),
                    name: "databases.example.com".to_string(),
                    ready: false,
                    message: Some("does not exist".to_string()),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let text = format_status(&release(1, Some(status)), Style::default());
        assert_eq!(
            text,
            "SequencedRelease apps/web
PHASE        Pending
REVISION     -
READY        False (DependencyNotReady)
PROGRESS     -
MESSAGE      waiting for Deployment apps/db: 1 of 2 replicas available
DEPENDS ON   SequencedRelease apps/queue: ready
             Deployment apps/db: waiting: 1 of 2 replicas available
             CustomResourceDefinition databases.example.com: waiting: does not exist
LAYERS       none yet
"
        );
    }

    #[test]
    fn how_a_revision_began_from_helm_is_shown_while_the_history_keeps_it() {
        let entry = |revision: i64, description: Option<&str>| HistoryEntry {
            revision,
            chart_version: None,
            digest: None,
            chart_digest: None,
            phase: ReleasePhase::Ready,
            started_at: None,
            finished_at: None,
            sequenced: true,
            description: description.map(str::to_string),
        };
        let mut status = deploying();
        status.history = vec![
            entry(4, None),
            entry(
                3,
                Some(
                    "went on from Helm release web at revision 3 (its revision 2 was pending-upgrade; this one is an upgrade); took over a pending-upgrade record of revision 2 (Secret sh.helm.release.v1.web.v2): not finished by the helm process that began it; taken over by sequenced; marked failed",
                ),
            ),
        ];
        let text = format_status(&release(1, Some(status.clone())), Style::default());
        assert!(
            text.contains("\nHISTORY      revision 3: went on from Helm release web at revision 3 (its revision 2 was pending-upgrade; this one is an upgrade); took over a pending-upgrade record of revision 2"),
            "{text}"
        );
        assert!(!text.contains("revision 4:"), "{text}");
        status.history.truncate(1);
        let text = format_status(&release(1, Some(status)), Style::default());
        assert!(!text.contains("HISTORY"), "{text}");
    }

    #[test]
    fn the_account_a_release_acts_as_is_shown() {
        let mut status = deploying();
        status.acting_as = Some("serviceaccount apps:deployer".to_string());
        let text = format_status(&release(1, Some(status.clone())), Style::default());
        assert!(
            text.contains("\nACTS AS      serviceaccount apps:deployer\n"),
            "{text}"
        );
        status.acting_as = Some("controller".to_string());
        let text = format_status(&release(1, Some(status.clone())), Style::default());
        assert!(
            text.contains("\nACTS AS      the controller's own service account\n"),
            "{text}"
        );
        // Before the controller has written it, the spec says which account it will be.
        status.acting_as = None;
        let mut sr = release(1, Some(status));
        sr.spec.service_account_name = Some("deployer".to_string());
        let text = format_status(&sr, Style::default());
        assert!(
            text.contains("\nACTS AS      serviceaccount apps:deployer\n"),
            "{text}"
        );
    }

    #[test]
    fn a_status_of_an_older_generation_is_marked_and_has_not_ended() {
        let mut status = deploying();
        status.phase = Some(ReleasePhase::Ready);
        status.layers.clear();
        status.lock = None;
        let old = release(3, Some(status.clone()));
        let text = format_status(&old, Style::default());
        assert!(
            text.contains(
                "OBSERVED     generation 2 of 3: the operator has not acted on the newest spec yet\n"
            ),
            "{text}"
        );
        assert!(text.ends_with("LAYERS       none yet\n"), "{text}");
        assert_eq!(outcome(&old), None);
        assert_eq!(
            outcome(&release(2, Some(status.clone()))),
            Some(Outcome::Ready)
        );
        status.phase = Some(ReleasePhase::Failed);
        assert_eq!(
            outcome(&release(2, Some(status.clone()))),
            Some(Outcome::Failed)
        );
        status.phase = Some(ReleasePhase::Uninstalling);
        assert_eq!(outcome(&release(2, Some(status))), None);
        assert_eq!(outcome(&release(1, None)), None);
    }

    #[test]
    fn bars_fill_only_when_every_resource_is_ready() {
        let bar_of = |ready, resources, phase| bar(&layer("c", "l", phase, ready, resources));
        assert_eq!(bar_of(0, 4, LayerPhase::Waiting), "[░░░░░░░░]");
        assert_eq!(bar_of(2, 4, LayerPhase::Waiting), "[████░░░░]");
        assert_eq!(bar_of(2, 3, LayerPhase::Waiting), "[█████░░░]");
        assert_eq!(bar_of(99, 100, LayerPhase::Waiting), "[███████░]");
        assert_eq!(bar_of(4, 4, LayerPhase::Ready), "[████████]");
        assert_eq!(bar_of(7, 4, LayerPhase::Ready), "[████████]");
        assert_eq!(bar_of(-1, 4, LayerPhase::Waiting), "[░░░░░░░░]");
        assert_eq!(bar_of(0, 0, LayerPhase::Ready), "[████████]");
        assert_eq!(bar_of(0, 0, LayerPhase::Pending), "[░░░░░░░░]");
    }

    #[test]
    fn a_parent_chart_without_layers_of_its_own_still_holds_its_subcharts() {
        let mut status = deploying();
        status.lock = None;
        status.layers = vec![
            layer("foo/nginx", DEFAULT_LAYER, LayerPhase::Deleting, 1, 2),
            layer("foo/rabbitmq", DEFAULT_LAYER, LayerPhase::Deleted, 2, 2),
        ];
        let text = format_status(&release(2, Some(status)), Style::default());
        assert!(
            text.ends_with(
                "\nfoo\n├── nginx\n│   └── (default)  [████░░░░] 1/2  Deleting\n└── rabbitmq\n    └── (default)  [████████] 2/2  Deleted\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn colours_only_the_phases_and_only_when_asked() {
        let plain = format_status(&release(2, Some(deploying())), Style::default());
        assert!(!plain.contains('\x1b'));
        let coloured = format_status(&release(2, Some(deploying())), Style { colour: true });
        assert!(
            coloured.contains("PHASE        \x1b[33mDeploying\x1b[0m\n"),
            "{coloured}"
        );
        assert!(
            coloured.contains("1/1  \x1b[32mReady\x1b[0m\n"),
            "{coloured}"
        );
        assert!(
            coloured.contains("0/2  \x1b[2mPending\x1b[0m\n"),
            "{coloured}"
        );
        // Without the escapes the text is the same.
        let stripped = coloured
            .replace("\x1b[33m", "")
            .replace("\x1b[32m", "")
            .replace("\x1b[2m", "")
            .replace("\x1b[0m", "");
        assert_eq!(stripped, plain);
    }

    #[test]
    fn messages_stay_on_one_line_but_a_hooks_log_keeps_its_lines() {
        let mut status = deploying();
        status.message = Some("two\nlines".to_string());
        let text = format_status(&release(2, Some(status.clone())), Style::default());
        assert!(text.contains("MESSAGE      two lines\n"), "{text}");
        let failed = "pre-install hook Job/migrate (chart shop, templates/migrate.yaml) failed: Job migrate: failed\nlast 2 log lines of pod migrate-x1 (container main):\nmigrating\nERROR: \u{1b}[31mno\u{1b}[0m table";
        status.message = Some(failed.to_string());
        status.layers[0].message = Some(failed.to_string());
        let text = format_status(&release(2, Some(status)), Style::default());
        assert!(
            text.contains("MESSAGE      pre-install hook Job/migrate (chart shop, templates/migrate.yaml) failed: Job migrate: failed\n               last 2 log lines of pod migrate-x1 (container main):\n               migrating\n               ERROR: [31mno[0m table\n"),
            "{text}"
        );
        assert!(
            text.contains("      last 2 log lines of pod migrate-x1 (container main):\n"),
            "{text}"
        );
    }

    #[test]
    fn a_hook_stage_cleaning_up_says_what_it_deletes() {
        let mut status = deploying();
        status.layers[0].name = "(pre-install)".into();
        status.layers[0].phase = LayerPhase::CleaningUp;
        status.layers[0].ready = status.layers[0].resources;
        status.layers[0].message =
            Some("all 2 hooks succeeded; deleting Job/migrate (hook-succeeded, 1 of 2)".into());
        let text = format_status(&release(2, Some(status)), Style::default());
        assert!(text.contains(" CleaningUp\n"), "{text}");
        assert!(
            text.contains("all 2 hooks succeeded; deleting Job/migrate (hook-succeeded, 1 of 2)\n"),
            "{text}"
        );
    }

    #[test]
    fn json_is_the_status_as_written() {
        let status = deploying();
        let json = format_json(&release(2, Some(status.clone())));
        let parsed: SequencedReleaseStatus = serde_json::from_str(&json).expect("JSON");
        assert_eq!(parsed, status);
        assert!(json.contains("\n  \"phase\": \"Deploying\",\n"), "{json}");
    }

    #[test]
    fn the_shard_line_ends_the_header_before_the_layers() {
        let text = "SequencedRelease a/b\nPHASE        Ready\n\n(crds) ...\n";
        assert_eq!(
            with_field(text, "SHARD", "7 of 32, owned by r-1"),
            "SequencedRelease a/b\nPHASE        Ready\nSHARD        7 of 32, owned by r-1\n\n(crds) ...\n"
        );
        assert_eq!(
            with_field(
                "SequencedRelease a/b\nLAYERS       none yet\n",
                "SHARD",
                "1 of 2"
            ),
            "SequencedRelease a/b\nLAYERS       none yet\nSHARD        1 of 2\n"
        );
    }
}
