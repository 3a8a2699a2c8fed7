//! `sequenced ready`: judge objects read from a file or stdin, as the operator would.

use std::io::Read as _;
use std::path::Path;
use std::process::ExitCode;

use serde_json::Value;

use super::{EXIT_ERROR, ReadyArgs};
use crate::readiness::{self, Rules, Verdict};

/// Exit code when some object is still in progress (and none failed).
pub const EXIT_IN_PROGRESS: u8 = 1;

/// One object of the input and what became of it.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A judged object.
    Judged {
        namespace: Option<String>,
        /// `Deployment/web`.
        object: String,
        verdict: Verdict,
    },
    /// A document that is not a usable object: where it is, and why.
    Bad { place: String, message: String },
}

/// Runs the command: prints the table on stdout, bad documents on stderr.
pub fn run(args: &ReadyArgs) -> ExitCode {
    let text = match read_input(&args.file) {
        Ok(text) => text,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let outcomes = match judge_text(&text) {
        Ok(outcomes) => outcomes,
        Err(message) => {
            eprintln!("error: {}: {message}", display_name(&args.file));
            return ExitCode::from(EXIT_ERROR);
        }
    };
    if outcomes.is_empty() {
        eprintln!(
            "error: {}: no Kubernetes objects in the input",
            display_name(&args.file)
        );
        return ExitCode::from(EXIT_ERROR);
    }
    print!("{}", format_table(&outcomes));
    for outcome in &outcomes {
        if let Outcome::Bad { place, message } = outcome {
            eprintln!("error: {place}: {message}");
        }
    }
    ExitCode::from(exit_code(&outcomes))
}

fn display_name(file: &Path) -> String {
    if file == Path::new("-") {
        "stdin".to_string()
    } else {
        file.display().to_string()
    }
}

fn read_input(file: &Path) -> Result<String, String> {
    if file == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| format!("cannot read stdin: {e}"))?;
        Ok(text)
    } else {
        std::fs::read_to_string(file).map_err(|e| format!("cannot read {}: {e}", file.display()))
    }
}

/// 0 when every object is ready, 1 when any is in progress, 2 when any failed or is bad.
pub fn exit_code(outcomes: &[Outcome]) -> u8 {
    let mut code = 0;
    for outcome in outcomes {
        match outcome {
            Outcome::Bad { .. }
            | Outcome::Judged {
                verdict: Verdict::Failed(_),
                ..
            } => return EXIT_ERROR,
            Outcome::Judged {
                verdict: Verdict::InProgress(_),
                ..
            } => code = EXIT_IN_PROGRESS,
            Outcome::Judged { .. } => {}
        }
    }
    code
}

/// Reads every object of a multi-document YAML or JSON text (Lists flattened) and judges each
/// with the rules of its own annotations, without timeouts.
///
/// # Errors
///
/// Returns the parse error when the text is neither YAML nor a stream of JSON values.
pub fn judge_text(text: &str) -> Result<Vec<Outcome>, String> {
    let documents = parse_input(text)?;
    let mut outcomes = Vec::new();
    for (index, document) in documents.into_iter().enumerate() {
        let place = format!("document {}", index + 1);
        if document.is_null() {
            continue;
        }
        let is_list = document.get("kind").and_then(Value::as_str) == Some("List");
        if is_list {
            match document.get("items") {
                Some(Value::Array(items)) => {
                    for (item_index, item) in items.iter().enumerate() {
                        outcomes.push(judge(
                            item,
                            format!("{place}, List item {}", item_index + 1),
                        ));
                    }
                }
                Some(Value::Null) | None => {}
                Some(_) => outcomes.push(Outcome::Bad {
                    place,
                    message: "kind List whose items is not a list".to_string(),
                }),
            }
        } else {
            outcomes.push(judge(&document, place));
        }
    }
    Ok(outcomes)
}

/// A stream of JSON values (`kubectl get -o json`), else YAML documents with Kubernetes'
/// YAML rules.
fn parse_input(text: &str) -> Result<Vec<Value>, String> {
    let trimmed = text.trim_start_matches('\u{feff}').trim_start();
    if trimmed.starts_with('{') {
        let json: Result<Vec<Value>, _> = serde_json::Deserializer::from_str(trimmed)
            .into_iter::<Value>()
            .collect();
        if let Ok(values) = json {
            return Ok(values);
        }
    }
    crate::yaml::parse_documents(text).map_err(|e| format!("invalid YAML at {e}"))
}

fn judge(object: &Value, place: String) -> Outcome {
    let bad = |message: String| Outcome::Bad {
        place: place.clone(),
        message,
    };
    if !object.is_object() {
        return bad(format!(
            "{}, not a Kubernetes object",
            crate::chart::describe(object)
        ));
    }
    let field = |pointer: &str| {
        object
            .pointer(pointer)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let Some(kind) = field("/kind") else {
        return bad("the object has no kind".to_string());
    };
    let Some(name) = field("/metadata/name") else {
        return bad(format!("the {kind} has no metadata.name"));
    };
    let rules = match Rules::from_object(object) {
        Ok(rules) => rules,
        Err(e) => return bad(format!("{kind}/{name}: {e}")),
    };
    Outcome::Judged {
        namespace: field("/metadata/namespace").map(str::to_string),
        object: format!("{kind}/{name}"),
        verdict: readiness::assess(object, &rules),
    }
}

/// The judged objects as aligned columns under a header; a NAMESPACE column when any object
/// has a namespace.
pub fn format_table(outcomes: &[Outcome]) -> String {
    let rows: Vec<[&str; 4]> = outcomes
        .iter()
        .filter_map(|outcome| match outcome {
            Outcome::Judged {
                namespace,
                object,
                verdict,
            } => Some([
                namespace.as_deref().unwrap_or(""),
                object.as_str(),
                verdict.name(),
                verdict.reason().unwrap_or(""),
            ]),
            Outcome::Bad { .. } => None,
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let with_namespace = rows.iter().any(|row| !row[0].is_empty());
    let header = ["NAMESPACE", "OBJECT", "VERDICT", "REASON"];
    let first = if with_namespace { 0 } else { 1 };
    let mut widths = [0usize; 4];
    for row in std::iter::once(&header).chain(&rows) {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for column in first..4 {
            let cell = if row[column].is_empty() && column == 0 {
                "-"
            } else {
                row[column]
            };
            line.push_str(cell);
            if column < 3 {
                let pad = widths[column].max(1) - cell.chars().count();
                line.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_column_only_when_some_object_has_one() {
        let without = vec![Outcome::Judged {
            namespace: None,
            object: "Deployment/web".into(),
            verdict: Verdict::InProgress("1 of 3 replicas available".into()),
        }];
        assert_eq!(
            format_table(&without),
            "OBJECT          VERDICT     REASON\n\
             Deployment/web  InProgress  1 of 3 replicas available\n"
        );
        let with = vec![
            Outcome::Judged {
                namespace: Some("shop".into()),
                object: "Job/migrate".into(),
                verdict: Verdict::Ready,
            },
            Outcome::Judged {
                namespace: None,
                object: "CustomResourceDefinition/widgets.example.com".into(),
                verdict: Verdict::Ready,
            },
        ];
        assert_eq!(
            format_table(&with),
            "NAMESPACE  OBJECT                                        VERDICT  REASON\n\
             shop       Job/migrate                                   Ready\n\
             -          CustomResourceDefinition/widgets.example.com  Ready\n"
        );
    }
}
