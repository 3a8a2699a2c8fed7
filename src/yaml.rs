//! TEMPORARY stand-in until the go-yaml v2 compatible module lands.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {message}")]
pub struct Error {
    pub line: usize,
    pub column: usize,
    pub message: String,
}
fn conv(e: serde_yaml_ng::Error) -> Error {
    let (line, column) = e
        .location()
        .map(|l| (l.line(), l.column()))
        .unwrap_or((0, 0));
    Error {
        line,
        column,
        message: e.to_string(),
    }
}
pub fn parse(text: &str) -> Result<serde_json::Value, Error> {
    Ok(parse_documents(text)?
        .into_iter()
        .next()
        .unwrap_or(serde_json::Value::Null))
}
pub fn parse_documents(text: &str) -> Result<Vec<serde_json::Value>, Error> {
    use serde::Deserialize;
    let mut out = Vec::new();
    for d in serde_yaml_ng::Deserializer::from_str(text) {
        out.push(serde_json::Value::deserialize(d).map_err(conv)?);
    }
    Ok(out)
}
