//! `sequenced graph`: the layer DAG of a chart as text, Graphviz dot or Mermaid.

use super::template::{CommandError, load_and_render};
use super::{GraphArgs, GraphFormat};
use crate::pipeline;
use crate::plan::draw;

/// Runs the command and returns what it prints.
pub fn run(args: &GraphArgs) -> Result<String, CommandError> {
    let loaded = load_and_render(&args.chart)?;
    let plan = pipeline::plan(pipeline::Rendered {
        tree: loaded.tree,
        documents: loaded.rendered,
    })?;
    Ok(match args.format {
        GraphFormat::Text => draw::text(&plan),
        GraphFormat::Dot => draw::dot(&plan),
        GraphFormat::Mermaid => draw::mermaid(&plan),
    })
}
