//! The values of `-f`, `--set`, `--set-string`, `--set-json`, `--set-file` and `--set-literal`,
//! merged as Helm merges them, by Helm: a chart of one template that prints `.Values` is rendered
//! with the flags, and what it prints becomes the release's `spec.values` (so the digest, the
//! record's `config` and `helm get values` all hold the user's values, as Helm's do).

use std::ffi::OsString;
use std::path::PathBuf;

use serde_json::Value;

use crate::helm::Helm;

/// The value flags of a command, as given.
#[derive(Debug, Clone, Default)]
pub struct ValueArgs {
    pub files: Vec<PathBuf>,
    pub set: Vec<String>,
    pub set_string: Vec<String>,
    pub set_json: Vec<String>,
    pub set_file: Vec<String>,
    pub set_literal: Vec<String>,
}

impl ValueArgs {
    fn is_empty(&self) -> bool {
        self.files.is_empty()
            && self.set.is_empty()
            && self.set_string.is_empty()
            && self.set_json.is_empty()
            && self.set_file.is_empty()
            && self.set_literal.is_empty()
    }
}

/// The merged values; an error names the file or flag, in helm's words.
pub async fn merged(
    helm: &Helm,
    args: &ValueArgs,
) -> Result<serde_json::Map<String, Value>, String> {
    if args.is_empty() {
        return Ok(serde_json::Map::new());
    }
    let io = |e: std::io::Error| format!("preparing the values: {}", crate::chart::io_message(&e));
    let chart = crate::pipeline::values_chart("sequenced-values-").map_err(io)?;
    let mut argv: Vec<OsString> = vec!["template".into(), "values".into(), chart.path().into()];
    for file in &args.files {
        argv.push("--values".into());
        argv.push(file.into());
    }
    // In the order Helm applies them whatever the order on the command line.
    let flags = [
        ("--set-json", &args.set_json),
        ("--set", &args.set),
        ("--set-string", &args.set_string),
        ("--set-file", &args.set_file),
        ("--set-literal", &args.set_literal),
    ];
    for (flag, values) in flags {
        for value in values {
            argv.push(flag.into());
            argv.push(value.into());
        }
    }
    let output = helm
        .run("helm template (values)", &argv, helm.timeouts().template)
        .await
        .map_err(|e| match e {
            crate::helm::HelmError::Failed { stderr, .. } => crate::helm::gist(&stderr),
            e => e.to_string(),
        })?;
    let printed = output
        .lines()
        .filter(|l| !l.starts_with("---") && !l.starts_with("# Source:"))
        .collect::<Vec<_>>()
        .join("\n");
    match serde_json::from_str::<Value>(printed.trim()) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(Value::Null) => Ok(serde_json::Map::new()),
        _ => Err("helm printed no values object".to_string()),
    }
}
