//! TEMPORARY stand-in until the strvals port lands.
use serde_json::{Map, Value};
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Invalid(String),
}
pub fn parse_set(s: &str, dest: &mut Map<String, Value>) -> Result<(), Error> {
    for pair in s.split(',') {
        let (k, v) = pair.split_once('=').ok_or_else(|| Error::Invalid(format!("key {pair:?} has no value")))?;
        let v = match v { "true" => Value::Bool(true), "false" => Value::Bool(false), _ => Value::String(v.into()) };
        let mut cur = &mut *dest;
        let parts: Vec<&str> = k.split('.').collect();
        for p in &parts[..parts.len() - 1] {
            let e = cur.entry(p.to_string()).or_insert_with(|| Value::Object(Map::new()));
            if !e.is_object() { *e = Value::Object(Map::new()); }
            cur = e.as_object_mut().unwrap();
        }
        cur.insert(parts[parts.len() - 1].to_string(), v);
    }
    Ok(())
}
pub fn parse_set_string(s: &str, dest: &mut Map<String, Value>) -> Result<(), Error> { parse_set(s, dest) }
