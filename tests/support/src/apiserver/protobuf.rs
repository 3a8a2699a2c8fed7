//! Request bodies in Kubernetes' protobuf encoding (`application/vnd.kubernetes.protobuf`), as
//! client-go's generated clients send them for built-in kinds: the 4-byte magic `k8s\0`, then a
//! `runtime.Unknown` whose `raw` is the object's generated message. Decoded here to the JSON the
//! same object would have been sent as, so the rest of the server sees no difference.
//!
//! Only the messages a client of this server sends are known: `v1.Secret` (Helm's release
//! storage driver writes its records through the typed clientset) and `meta/v1.DeleteOptions`
//! (the body of its deletes). A protobuf body of any other kind is answered 415 as before, where
//! a real server would take it: a known difference (never kinder). Field numbers are those of
//! k8s.io/api/core/v1/generated.proto and k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto.

use base64::Engine;
use serde_json::{Map, Value, json};

/// The media type.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

const MAGIC: &[u8] = b"k8s\0";

/// How a field is shown in JSON.
#[derive(Clone, Copy)]
enum Shape {
    /// A string; an empty one is left out (Go's `omitempty`).
    Str,
    /// Bytes, shown in base64.
    Bytes,
    /// An integer; `true`: a pointer field, kept when zero.
    Int(bool),
    Bool,
    /// A `metav1.Time`: RFC 3339 in whole seconds; Go's zero time is left out.
    Time,
    /// `FieldsV1`: its raw JSON.
    RawJson,
    Message(&'static [Field]),
    RepeatedStr,
    RepeatedMessage(&'static [Field]),
    MapStr,
    MapBytes,
}

struct Field {
    number: u64,
    name: &'static str,
    shape: Shape,
}

const fn f(number: u64, name: &'static str, shape: Shape) -> Field {
    Field {
        number,
        name,
        shape,
    }
}

const OWNER_REFERENCE: &[Field] = &[
    f(5, "apiVersion", Shape::Str),
    f(1, "kind", Shape::Str),
    f(3, "name", Shape::Str),
    f(4, "uid", Shape::Str),
    f(6, "controller", Shape::Bool),
    f(7, "blockOwnerDeletion", Shape::Bool),
];

const MANAGED_FIELDS_ENTRY: &[Field] = &[
    f(1, "manager", Shape::Str),
    f(2, "operation", Shape::Str),
    f(3, "apiVersion", Shape::Str),
    f(4, "time", Shape::Time),
    f(6, "fieldsType", Shape::Str),
    f(7, "fieldsV1", Shape::RawJson),
    f(8, "subresource", Shape::Str),
];

const OBJECT_META: &[Field] = &[
    f(1, "name", Shape::Str),
    f(2, "generateName", Shape::Str),
    f(3, "namespace", Shape::Str),
    f(4, "selfLink", Shape::Str),
    f(5, "uid", Shape::Str),
    f(6, "resourceVersion", Shape::Str),
    f(7, "generation", Shape::Int(false)),
    f(8, "creationTimestamp", Shape::Time),
    f(9, "deletionTimestamp", Shape::Time),
    f(10, "deletionGracePeriodSeconds", Shape::Int(true)),
    f(11, "labels", Shape::MapStr),
    f(12, "annotations", Shape::MapStr),
    f(
        13,
        "ownerReferences",
        Shape::RepeatedMessage(OWNER_REFERENCE),
    ),
    f(14, "finalizers", Shape::RepeatedStr),
    f(
        17,
        "managedFields",
        Shape::RepeatedMessage(MANAGED_FIELDS_ENTRY),
    ),
];

const SECRET: &[Field] = &[
    f(1, "metadata", Shape::Message(OBJECT_META)),
    f(5, "immutable", Shape::Bool),
    f(2, "data", Shape::MapBytes),
    f(4, "stringData", Shape::MapStr),
    f(3, "type", Shape::Str),
];

const PRECONDITIONS: &[Field] = &[f(1, "uid", Shape::Str), f(2, "resourceVersion", Shape::Str)];

const DELETE_OPTIONS: &[Field] = &[
    f(1, "gracePeriodSeconds", Shape::Int(true)),
    f(2, "preconditions", Shape::Message(PRECONDITIONS)),
    f(3, "orphanDependents", Shape::Bool),
    f(4, "propagationPolicy", Shape::Str),
    f(5, "dryRun", Shape::RepeatedStr),
    f(
        6,
        "ignoreStoreReadErrorWithClusterBreakingPotential",
        Shape::Bool,
    ),
];

const TYPE_META: &[Field] = &[f(1, "apiVersion", Shape::Str), f(2, "kind", Shape::Str)];

const UNKNOWN: &[Field] = &[
    f(1, "typeMeta", Shape::Message(TYPE_META)),
    f(2, "raw", Shape::Bytes),
    f(3, "contentEncoding", Shape::Str),
    f(4, "contentType", Shape::Str),
];

/// Why a body could not be read.
#[derive(Debug)]
pub enum Error {
    /// A kind this server does not decode from protobuf.
    Unsupported(String),
    /// Not a valid protobuf envelope or message.
    Invalid(String),
}

/// The message of `kind` this server decodes.
fn schema(kind: &str) -> Option<&'static [Field]> {
    match kind {
        "Secret" => Some(SECRET),
        "DeleteOptions" => Some(DELETE_OPTIONS),
        _ => None,
    }
}

/// The envelope's apiVersion, kind and raw message.
fn envelope(body: &[u8]) -> Result<(String, String, Vec<u8>), Error> {
    let rest = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| Error::Invalid("provided data does not appear to be a protobuf message, expected prefix [107 56 115 0]".into()))?;
    let unknown = message(rest, UNKNOWN)?;
    let text = |p: &str| {
        unknown
            .pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let raw = base64::engine::general_purpose::STANDARD
        .decode(text("/raw"))
        .map_err(|e| Error::Invalid(e.to_string()))?;
    Ok((text("/typeMeta/apiVersion"), text("/typeMeta/kind"), raw))
}

/// Whether `body` is an envelope of a kind this server decodes.
pub fn decodable(body: &[u8]) -> bool {
    envelope(body).is_ok_and(|(_, kind, _)| schema(&kind).is_some())
}

/// The JSON of the object in a protobuf body, with its apiVersion and kind.
pub fn decode(body: &[u8]) -> Result<Value, Error> {
    let (api_version, kind, raw) = envelope(body)?;
    let fields = schema(&kind).ok_or_else(|| Error::Unsupported(kind.clone()))?;
    let mut object = message(&raw, fields)?;
    if let Value::Object(m) = &mut object {
        m.insert("apiVersion".into(), json!(api_version));
        m.insert("kind".into(), json!(kind));
    }
    Ok(object)
}

fn invalid(what: &str) -> Error {
    Error::Invalid(format!("unable to decode protobuf: {what}"))
}

fn varint(data: &[u8], at: &mut usize) -> Result<u64, Error> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *data
            .get(*at)
            .ok_or_else(|| invalid("unexpected end of varint"))?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(invalid("varint overflow"))
}

/// One field's number and value: a varint, a fixed-width number, or bytes.
enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

fn fields(data: &[u8]) -> Result<Vec<(u64, Wire<'_>)>, Error> {
    let mut at = 0;
    let mut out = Vec::new();
    while at < data.len() {
        let key = varint(data, &mut at)?;
        let (number, wire) = (key >> 3, key & 7);
        let value = match wire {
            0 => Wire::Varint(varint(data, &mut at)?),
            1 | 5 => {
                at += if wire == 1 { 8 } else { 4 };
                Wire::Fixed
            }
            2 => {
                let len = usize::try_from(varint(data, &mut at)?)
                    .map_err(|_| invalid("length out of range"))?;
                let end = at
                    .checked_add(len)
                    .filter(|end| *end <= data.len())
                    .ok_or_else(|| invalid("length past the end"))?;
                let bytes = &data[at..end];
                at = end;
                Wire::Bytes(bytes)
            }
            _ => return Err(invalid("unsupported wire type")),
        };
        if at > data.len() {
            return Err(invalid("unexpected end of message"));
        }
        out.push((number, value));
    }
    Ok(out)
}

fn string(bytes: &[u8]) -> Result<String, Error> {
    String::from_utf8(bytes.to_vec()).map_err(|_| invalid("invalid UTF-8"))
}

/// Go's zero `time.Time` as protobuf seconds (0001-01-01T00:00:00Z).
const ZERO_TIME: i64 = -62_135_596_800;

fn time(bytes: &[u8]) -> Result<Option<String>, Error> {
    let mut seconds = 0i64;
    for (number, value) in fields(bytes)? {
        if let (1, Wire::Varint(v)) = (number, value) {
            seconds = v as i64;
        }
    }
    if seconds == ZERO_TIME {
        return Ok(None);
    }
    Ok(k8s_openapi::jiff::Timestamp::from_second(seconds)
        .ok()
        .map(|t| t.to_string()))
}

/// A map entry's key and value (fields 1 and 2).
fn entry(bytes: &[u8]) -> Result<(String, &[u8]), Error> {
    let mut key = String::new();
    let mut value: &[u8] = &[];
    for (number, wire) in fields(bytes)? {
        match (number, wire) {
            (1, Wire::Bytes(b)) => key = string(b)?,
            (2, Wire::Bytes(b)) => value = b,
            _ => {}
        }
    }
    Ok((key, value))
}

fn message(data: &[u8], schema: &[Field]) -> Result<Value, Error> {
    let mut out = Map::new();
    for (number, wire) in fields(data)? {
        let Some(field) = schema.iter().find(|f| f.number == number) else {
            continue;
        };
        let name = field.name;
        match (field.shape, wire) {
            (Shape::Str, Wire::Bytes(b)) => {
                let s = string(b)?;
                if !s.is_empty() {
                    out.insert(name.into(), json!(s));
                }
            }
            (Shape::Bytes, Wire::Bytes(b)) => {
                out.insert(
                    name.into(),
                    json!(base64::engine::general_purpose::STANDARD.encode(b)),
                );
            }
            (Shape::Int(pointer), Wire::Varint(v)) => {
                if pointer || v != 0 {
                    out.insert(name.into(), json!(v as i64));
                }
            }
            (Shape::Bool, Wire::Varint(v)) => {
                out.insert(name.into(), json!(v != 0));
            }
            (Shape::Time, Wire::Bytes(b)) => {
                if let Some(t) = time(b)? {
                    out.insert(name.into(), json!(t));
                }
            }
            (Shape::RawJson, Wire::Bytes(b)) => {
                let mut raw: &[u8] = &[];
                for (n, w) in fields(b)? {
                    if let (1, Wire::Bytes(r)) = (n, w) {
                        raw = r;
                    }
                }
                let value: Value =
                    serde_json::from_slice(raw).map_err(|e| invalid(&format!("fieldsV1: {e}")))?;
                out.insert(name.into(), value);
            }
            (Shape::Message(inner), Wire::Bytes(b)) => {
                out.insert(name.into(), message(b, inner)?);
            }
            (Shape::RepeatedStr, Wire::Bytes(b)) => {
                let list = out.entry(name).or_insert_with(|| json!([]));
                if let Value::Array(a) = list {
                    a.push(json!(string(b)?));
                }
            }
            (Shape::RepeatedMessage(inner), Wire::Bytes(b)) => {
                let item = message(b, inner)?;
                let list = out.entry(name).or_insert_with(|| json!([]));
                if let Value::Array(a) = list {
                    a.push(item);
                }
            }
            (Shape::MapStr, Wire::Bytes(b)) => {
                let (k, v) = entry(b)?;
                let map = out.entry(name).or_insert_with(|| json!({}));
                map[k] = json!(string(v)?);
            }
            (Shape::MapBytes, Wire::Bytes(b)) => {
                let (k, v) = entry(b)?;
                let map = out.entry(name).or_insert_with(|| json!({}));
                map[k] = json!(base64::engine::general_purpose::STANDARD.encode(v));
            }
            _ => return Err(invalid(&format!("field {name} has the wrong wire type"))),
        }
    }
    Ok(Value::Object(out))
}
