//! `sequenced lint`: every error and warning of a chart's sequencing at once.

use std::fmt::Write as _;

use super::LintArgs;
use super::template::load_and_render;
use crate::pipeline;
use crate::plan::Severity;

/// What the command prints and whether it found errors.
pub struct Report {
    pub output: String,
    pub errors: usize,
}

/// Runs the command. A chart that cannot be loaded or rendered is one error.
pub fn run(args: &LintArgs) -> Report {
    let mut output = String::new();
    let _ = writeln!(output, "==> Linting {}", args.chart.chart);
    let planned = load_and_render(&args.chart).and_then(|loaded| {
        let rendered = pipeline::Rendered {
            tree: loaded.tree,
            documents: loaded.rendered,
        };
        match pipeline::plan(rendered) {
            Ok(plan) => Ok(Ok(plan)),
            Err(pipeline::Error::Plan(e)) => Ok(Err(e)),
            Err(e) => Err(e.into()),
        }
    });
    let diagnostics = match planned {
        Ok(outcome) => crate::plan::diagnostics(outcome),
        Err(e) => {
            let _ = writeln!(output, "[ERROR] {e}");
            let _ = writeln!(output, "\nError: 1 error, 0 warnings");
            return Report { output, errors: 1 };
        }
    };
    let errors = diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .count();
    let warnings = diagnostics.len() - errors;
    for diagnostic in &diagnostics {
        let label = match diagnostic.severity {
            Severity::Error => "[ERROR]",
            Severity::Warning => "[WARNING]",
        };
        let _ = writeln!(output, "{label} {diagnostic}");
    }
    let verdict = if errors > 0 { "Error" } else { "OK" };
    let _ = writeln!(
        output,
        "\n{verdict}: {errors} error{}, {warnings} warning{}",
        if errors == 1 { "" } else { "s" },
        if warnings == 1 { "" } else { "s" }
    );
    Report { output, errors }
}
