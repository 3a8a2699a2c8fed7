//! What a command that deploys prints while it runs: on a terminal the live layer tree of
//! `sequenced status --watch`; otherwise (a CI log) one plain line per note (a stage or layer
//! started, ready or failed, a hook, a rollback), each with its time. With `-o json` the lines
//! go to stderr and stdout holds only the final summary.

use std::io::Write as _;
use std::sync::Mutex;

use serde::Serialize;

use crate::api::{LayerStatus, ReleasePhase, SequencedRelease};
use crate::cli::status::{Style, format_status};
use crate::rollout::Note;

/// How progress is shown.
pub struct Output {
    /// Redraw the layer tree (a terminal, without `-o json`).
    tree: bool,
    /// Lines to stderr (with `-o json`).
    to_stderr: bool,
    /// The tree last drawn, and how many lines it took.
    drawn: Mutex<Option<(String, usize)>>,
}

impl Output {
    pub fn new(terminal: bool, json: bool) -> Output {
        Output {
            tree: terminal && !json,
            to_stderr: json,
            drawn: Mutex::new(None),
        }
    }

    /// One line, with the time.
    pub fn line(&self, text: &str) {
        if self.tree {
            return;
        }
        let now = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ");
        let line = format!("{now} {text}\n");
        if self.to_stderr {
            let _ = std::io::stderr().write_all(line.as_bytes());
        } else {
            let mut out = std::io::stdout();
            let _ = out.write_all(line.as_bytes());
            let _ = out.flush();
        }
    }

    /// Something to say even on a terminal (waiting for the lock).
    pub fn say(&self, text: &str) {
        if self.tree {
            let _ = writeln!(std::io::stderr(), "{text}");
        } else {
            self.line(text);
        }
    }

    /// A note of the executor (an Event, for the operator).
    pub fn note(&self, note: &Note) {
        self.line(&format!("{} {}", note.reason, note.message));
    }

    /// The release's status changed: the tree is drawn again on a terminal.
    pub fn status(&self, release: &SequencedRelease) {
        if !self.tree {
            return;
        }
        let text = format_status(release, Style { colour: true });
        let mut drawn = self.drawn.lock().unwrap_or_else(|e| e.into_inner());
        if drawn.as_ref().is_some_and(|(last, _)| *last == text) {
            return;
        }
        let mut out = std::io::stdout();
        if let Some((_, lines)) = drawn.as_ref() {
            // Up over the last drawing, and clear to the end of the screen.
            let _ = write!(out, "\x1b[{lines}F\x1b[J");
        }
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
        let lines = text.lines().count();
        *drawn = Some((text, lines));
    }
}

/// One layer in the `-o json` summary.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LayerSummary {
    pub chart: String,
    pub name: String,
    pub phase: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
}

/// The `-o json` summary of a command.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub name: String,
    pub namespace: String,
    /// `deployed`, `failed`, `uninstalled`, `interrupted`.
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub layers: Vec<LayerSummary>,
}

impl Summary {
    pub fn of(release: &SequencedRelease, outcome: &str) -> Summary {
        let status = release.status.clone().unwrap_or_default();
        let reason = ["Stalled", "Ready"].iter().find_map(|kind| {
            status
                .conditions
                .iter()
                .find(|c| {
                    c.type_ == *kind && c.status == if *kind == "Ready" { "False" } else { "True" }
                })
                .map(|c| c.reason.clone())
        });
        Summary {
            name: release.metadata.name.clone().unwrap_or_default(),
            namespace: release.metadata.namespace.clone().unwrap_or_default(),
            outcome: outcome.to_string(),
            revision: status.revision,
            phase: status.phase.map(phase_name),
            reason: if outcome == "deployed" { None } else { reason },
            message: status.message.clone(),
            layers: status.layers.iter().map(layer).collect(),
        }
    }
}

fn layer(layer: &LayerStatus) -> LayerSummary {
    let time = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| {
        t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    };
    LayerSummary {
        chart: layer.chart.clone(),
        name: layer.name.clone(),
        phase: format!("{:?}", layer.phase),
        started_at: layer.started_at.as_ref().map(time),
        finished_at: layer.finished_at.as_ref().map(time),
    }
}

pub fn phase_name(phase: ReleasePhase) -> String {
    format!("{phase:?}")
}
