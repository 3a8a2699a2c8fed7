//! Helm's `--set` value syntax ("strvals"), merged into a values map exactly as Helm merges it.
//!
//! `sequenced template CHART --set …` has to arrive at the same merged values as
//! `helm template CHART --set …`, because subchart conditions (`bar.enabled`) and tags are
//! evaluated against them. This module is a from-scratch reimplementation of the behaviour of
//! Helm's `pkg/strvals` (checked against the real `helm` binary), covering the four flags:
//!
//! | flag             | function              | values                                         |
//! |------------------|-----------------------|------------------------------------------------|
//! | `--set`          | [`parse_set`]         | typed: `true`/`false`/`null`, integers, strings |
//! | `--set-string`   | [`parse_set_string`]  | always strings                                 |
//! | `--set-json`     | [`parse_set_json`]    | JSON documents                                 |
//! | `--set-literal`  | [`parse_set_literal`] | the whole rest of the argument, verbatim       |
//!
//! Helm applies them after the `-f` files, flag by flag in this order: every `--set-json`, then
//! every `--set`, then every `--set-string`, (`--set-file`,) then every `--set-literal`; each
//! occurrence is parsed into the same map. Callers should do the same, and prefix errors the
//! way Helm does (`failed parsing --set data: {error}`).
//!
//! # Syntax
//!
//! An argument is a comma-separated list of `name=value` assignments:
//!
//! * `a.b.c=v` nests maps (at most [`MAX_NESTED_NAME_LEVEL`] dots per name); an existing map is
//!   updated in place, anything else under that name is an error.
//! * `a[2]=v` sets a list element, growing the list with `null`s (index at most [`MAX_INDEX`]);
//!   `a[0].b=v`, `a[0][1]=v` nest maps and lists inside lists.
//! * `a={x,y}` is a list value; `a=` is the empty string.
//! * A backslash makes the next character literal, in names, indexes and values:
//!   `a\.b=x\,y` sets the key `a.b` to `x,y`.
//! * `--set` converts `true`, `false`, `null` (any case), `0`, and integers that do not start
//!   with `0` (an optional sign is allowed) to booleans, null and `i64` numbers; everything
//!   else, including `00009` and numbers that overflow `i64`, stays a string.
//! * `--set-json` reads a JSON document after each `=` (nothing, or only blanks, means `null`);
//!   a whole argument that starts with `{` is a JSON object deep-merged into the values.
//!   Numbers are `f64` as in Go, and become `i64` when integral and in range.
//! * `--set-literal` has no escapes and no commas: after the first `=` the rest of the argument
//!   is the value.
//!
//! Helm's quirks are reproduced too, so that sequenced accepts and rejects exactly what helm
//! does: input that ends in the middle of an assignment (`a[0`, `a[1].`, `a.`) is silently
//! accepted, keeping what was built so far, and a key of `""` (as in `.a=1` or `[0]=1`) is
//! parsed but not stored.
//!
//! Where this differs from helm: type-conflict messages call every integer `int64` (helm says
//! `float64` for numbers read from values files); JSON nested deeper than serde_json's limit of
//! 128 and assignments nested deeper than [`MAX_NESTING_DEPTH`] are rejected (helm accepts
//! them).
//!
//! On error, `dest` may already hold the assignments that came before the bad one.

use serde_json::{Map, Number, Value};

/// The largest list index an assignment may use.
pub const MAX_INDEX: i64 = 65_536;

/// The largest number of dots in one name (`a.b.c` has two).
pub const MAX_NESTED_NAME_LEVEL: usize = 30;

/// How deeply maps and lists may nest in one assignment. Helm has no such limit; here the
/// parser recurses, so it needs one. It is serde_json's own recursion limit: values nested
/// deeper could not be read back from JSON anyway.
pub const MAX_NESTING_DEPTH: usize = 128;

/// Why an argument was rejected. Messages follow Helm's own where Helm has one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The argument ends after a name, as in `a` or `a.b`.
    #[error("key {} has no value", go_quote(.key))]
    KeyWithoutValue { key: String },
    /// A name is followed by a comma, as in `a,b=1` or `a=1,,b=2`.
    #[error("key {} has no value (cannot end with ,)", go_quote(.key))]
    KeyWithoutValueBeforeComma { key: String },
    /// A map name is followed by a dot but sets nothing, as in `a.=1`.
    #[error("key map {} has no value", go_quote(.key))]
    EmptyKeyMap { key: String },
    /// A name has more than [`MAX_NESTED_NAME_LEVEL`] dots.
    #[error(
        "value name nested level is greater than maximum supported nested level of {MAX_NESTED_NAME_LEVEL}"
    )]
    NameTooDeep,
    /// The text between `[` and `]` is not a decimal integer that fits an `i64`.
    #[error(
        "error parsing index: strconv.Atoi: parsing {}: {}",
        go_quote(.index),
        if *.out_of_range { "value out of range" } else { "invalid syntax" }
    )]
    InvalidIndex { index: String, out_of_range: bool },
    /// A list index below zero.
    #[error("negative {index} index not allowed")]
    NegativeIndex { index: i64 },
    /// A list index above [`MAX_INDEX`].
    #[error("index of {index} is greater than maximum supported index of {MAX_INDEX}")]
    IndexTooLarge { index: i64 },
    /// Something other than `[`, `.` or `=` follows `]`, as in `a[0]b=1`.
    #[error("unexpected data at end of array index: {}", go_quote_chars(.data))]
    UnexpectedIndexData { data: String },
    /// A `{` list value without its `}`.
    #[error("list must terminate with '}}'")]
    UnterminatedList,
    /// `name[…]` where `name` already holds something other than a list.
    #[error(
        "unable to parse key: interface conversion: interface {{}} is {found}, not []interface {{}}"
    )]
    NotAList { found: &'static str },
    /// `name.…` where `name` already holds something other than a map.
    #[error(
        "unable to parse key: interface conversion: interface {{}} is {found}, not map[string]interface {{}}"
    )]
    NotAMap { found: &'static str },
    /// Maps and lists nest deeper than [`MAX_NESTING_DEPTH`] in one assignment.
    #[error("values nest deeper than the supported maximum of {MAX_NESTING_DEPTH} levels")]
    TooDeep,
    /// A `--set-json` value is not JSON; `value` is the argument from that value on.
    #[error("invalid JSON value {}: {reason}", go_quote(.value))]
    InvalidJson { value: String, reason: String },
    /// A `--set-json` argument starting with `{` is not a JSON object.
    #[error("invalid JSON object {}: {reason}", go_quote(.input))]
    InvalidJsonObject { input: String, reason: String },
}

impl Error {
    /// A fixed short category, usable as a metrics label.
    pub fn category(&self) -> &'static str {
        match self {
            Error::KeyWithoutValue { .. }
            | Error::KeyWithoutValueBeforeComma { .. }
            | Error::EmptyKeyMap { .. } => "missing_value",
            Error::InvalidIndex { .. }
            | Error::NegativeIndex { .. }
            | Error::IndexTooLarge { .. }
            | Error::UnexpectedIndexData { .. } => "bad_index",
            Error::UnterminatedList => "bad_list",
            Error::NotAList { .. } | Error::NotAMap { .. } => "type_conflict",
            Error::NameTooDeep | Error::TooDeep => "too_deep",
            Error::InvalidJson { .. } | Error::InvalidJsonObject { .. } => "bad_json",
        }
    }
}

/// Merges a `--set` argument into `dest`: values are typed (booleans, null, integers, strings).
pub fn parse_set(s: &str, dest: &mut Map<String, Value>) -> Result<(), Error> {
    Parser::new(s, Mode::Typed).run(dest)
}

/// Merges a `--set-string` argument into `dest`: every value is a string.
pub fn parse_set_string(s: &str, dest: &mut Map<String, Value>) -> Result<(), Error> {
    Parser::new(s, Mode::Text).run(dest)
}

/// Merges a `--set-json` argument into `dest`: either `name=JSON,…` assignments, or (when the
/// trimmed argument starts with `{`) one JSON object that is deep-merged into `dest`.
pub fn parse_set_json(s: &str, dest: &mut Map<String, Value>) -> Result<(), Error> {
    let trimmed = s.trim();
    if trimmed.starts_with('{') {
        let object: Map<String, Value> =
            serde_json::from_str(trimmed).map_err(|e| Error::InvalidJsonObject {
                input: s.to_owned(),
                reason: e.to_string(),
            })?;
        let object = object
            .into_iter()
            .map(|(key, value)| (key, go_numbers(value)))
            .collect();
        merge_maps(dest, object);
        return Ok(());
    }
    Parser::new(s, Mode::Json).run(dest)
}

/// Merges a `--set-literal` argument into `dest`: after the name's `=`, the whole rest of the
/// argument (commas and backslashes included) is one string value.
pub fn parse_set_literal(s: &str, dest: &mut Map<String, Value>) -> Result<(), Error> {
    Parser::new(s, Mode::Literal).run(dest)
}

/// Deep merge in the manner of Helm's `MergeMaps`: maps merge key by key, anything else
/// (including `null`) replaces what was there.
fn merge_maps(dest: &mut Map<String, Value>, src: Map<String, Value>) {
    for (key, value) in src {
        match (dest.get_mut(&key), value) {
            (Some(Value::Object(existing)), Value::Object(incoming)) => {
                merge_maps(existing, incoming)
            }
            (_, value) => {
                dest.insert(key, value);
            }
        }
    }
}

/// How values are read after `=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `--set`: lists and typed scalars.
    Typed,
    /// `--set-string`: lists and string scalars.
    Text,
    /// `--set-json`: JSON documents.
    Json,
    /// `--set-literal`: no escapes, no commas, no lists.
    Literal,
}

/// Why parsing of one assignment stopped early.
#[derive(Debug)]
enum Halt {
    /// The input ran out. Helm treats this as success, keeping what was stored so far.
    End,
    /// A real error.
    Fail(Error),
}

impl From<Error> for Halt {
    fn from(e: Error) -> Self {
        Halt::Fail(e)
    }
}

type Step = Result<(), Halt>;

/// What follows a `=` when it might be a `{…}` list.
enum ListValue {
    List(Vec<Value>),
    NotAList,
}

struct Parser<'a> {
    input: &'a str,
    /// Byte offset of the next unread character.
    pos: usize,
    mode: Mode,
}

impl<'a> Parser<'a> {
    fn new(input: &'a str, mode: Mode) -> Self {
        Parser {
            input,
            pos: 0,
            mode,
        }
    }

    fn run(mut self, dest: &mut Map<String, Value>) -> Result<(), Error> {
        loop {
            match self.key(dest, 0, 0) {
                Ok(()) => {}
                Err(Halt::End) => return Ok(()),
                Err(Halt::Fail(e)) => return Err(e),
            }
        }
    }

    // ----- the cursor -----

    fn rest(&self) -> &'a str {
        self.input.get(self.pos..).unwrap_or_default()
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    /// Reads up to and including the first unescaped character of `stops`, which is returned
    /// (`None` at the end of the input). Backslash escapes apply except in literal mode.
    fn read_until(&mut self, stops: &[char]) -> (String, Option<char>) {
        let escapes = self.mode != Mode::Literal;
        let mut text = String::new();
        loop {
            match self.bump() {
                None => return (text, None),
                Some(c) if stops.contains(&c) => return (text, Some(c)),
                Some('\\') if escapes => match self.bump() {
                    None => return (text, None),
                    Some(c) => text.push(c),
                },
                Some(c) => text.push(c),
            }
        }
    }

    /// Reads the rest of the input (literal mode values).
    fn read_rest(&mut self) -> String {
        let rest = self.rest().to_owned();
        self.pos = self.input.len();
        rest
    }

    /// Reads a scalar value up to the next unescaped comma (or the end of the input).
    fn read_scalar(&mut self) -> Value {
        let (raw, _) = self.read_until(&[',']);
        self.scalar(raw)
    }

    /// Reads the index after a `[`, through the `]`.
    fn read_index(&mut self) -> Result<i64, Halt> {
        let (raw, stop) = self.read_until(&[']']);
        if stop.is_none() {
            return Err(Halt::End);
        }
        raw.parse::<i64>().map_err(|e| {
            let out_of_range = matches!(
                e.kind(),
                std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow
            );
            Halt::Fail(Error::InvalidIndex {
                index: raw,
                out_of_range,
            })
        })
    }

    /// Skips blanks, then a comma. True when that leaves nothing of the value (the input
    /// ended or a comma was consumed); otherwise the next character stays unread.
    fn skip_blank_value(&mut self) -> bool {
        loop {
            match self.peek() {
                None => return true,
                Some(',') => {
                    self.pos += 1;
                    return true;
                }
                Some(c) if c.is_whitespace() => self.pos += c.len_utf8(),
                Some(_) => return false,
            }
        }
    }

    // ----- values -----

    fn scalar(&self, raw: String) -> Value {
        match self.mode {
            Mode::Typed => typed_value(raw),
            Mode::Text | Mode::Json | Mode::Literal => Value::String(raw),
        }
    }

    /// After `=`: a `{a,b}` list, or `NotAList` with nothing consumed. `Halt::End` when the
    /// input ends right after the `=`.
    fn list_value(&mut self) -> Result<ListValue, Halt> {
        match self.peek() {
            None => return Err(Halt::End),
            Some('{') => self.pos += 1,
            Some(_) => return Ok(ListValue::NotAList),
        }
        let mut items = Vec::new();
        loop {
            let (raw, stop) = self.read_until(&[',', '}']);
            match stop {
                None => return Err(Error::UnterminatedList.into()),
                Some(',') => items.push(self.scalar(raw)),
                Some(_) => {
                    if self.peek() == Some(',') {
                        self.pos += 1;
                    }
                    items.push(self.scalar(raw));
                    return Ok(ListValue::List(items));
                }
            }
        }
    }

    /// Reads one JSON document (after blanks were skipped) and consumes exactly its text.
    fn json_value(&mut self) -> Result<Value, Halt> {
        let rest = self.rest();
        let body = rest.trim_start_matches([' ', '\t', '\n', '\r']);
        let lead = rest.len() - body.len();
        let invalid = |reason: String| Error::InvalidJson {
            value: body.to_owned(),
            reason,
        };
        let len = json_extent(body).map_err(invalid)?;
        let text = body.get(..len).unwrap_or(body);
        let text = replace_lone_surrogates(text);
        let value: Value = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        self.pos += lead + len;
        Ok(go_numbers(value))
    }

    // ----- names -----

    /// Parses one name and what follows it into `data`. `level` counts the dots of the name so
    /// far; `depth` counts the maps and lists entered.
    fn key(&mut self, data: &mut Map<String, Value>, level: usize, depth: usize) -> Step {
        if depth > MAX_NESTING_DEPTH {
            return Err(Error::TooDeep.into());
        }
        let stops: &[char] = match self.mode {
            Mode::Literal => &['=', '[', '.'],
            _ => &['=', '[', ',', '.'],
        };
        let (name, stop) = self.read_until(stops);
        match stop {
            None if name.is_empty() => Err(Halt::End),
            None => Err(Error::KeyWithoutValue { key: name }.into()),
            Some('=') => self.assign(data, name),
            Some('[') => self.key_list(data, name, level, depth),
            Some(',') => Err(Error::KeyWithoutValueBeforeComma { key: name }.into()),
            Some(_) => self.key_map(data, name, level, depth),
        }
    }

    /// `name=value`.
    fn assign(&mut self, data: &mut Map<String, Value>, name: String) -> Step {
        match self.mode {
            Mode::Literal => {
                let value = self.read_rest();
                store(data, name, Value::String(value));
                Ok(())
            }
            Mode::Json => {
                if self.skip_blank_value() {
                    store(data, name, Value::Null);
                    return Ok(());
                }
                let value = self.json_value()?;
                store(data, name, value);
                self.skip_blank_value();
                Ok(())
            }
            Mode::Typed | Mode::Text => match self.list_value() {
                Ok(ListValue::List(items)) => {
                    store(data, name, Value::Array(items));
                    Ok(())
                }
                Ok(ListValue::NotAList) => {
                    let value = self.read_scalar();
                    store(data, name, value);
                    Ok(())
                }
                Err(Halt::End) => {
                    store(data, name, Value::String(String::new()));
                    Err(Halt::End)
                }
                Err(fail) => Err(fail),
            },
        }
    }

    /// `name.rest`: descends into (or creates) the map under `name`.
    fn key_map(
        &mut self,
        data: &mut Map<String, Value>,
        name: String,
        level: usize,
        depth: usize,
    ) -> Step {
        let level = level + 1;
        if level > MAX_NESTED_NAME_LEVEL {
            return Err(Error::NameTooDeep.into());
        }
        match data.get_mut(&name) {
            Some(Value::Object(inner)) => {
                let step = self.key(inner, level, depth + 1);
                if step.is_ok() && inner.is_empty() {
                    return Err(Error::EmptyKeyMap { key: name }.into());
                }
                step
            }
            Some(other) => Err(Error::NotAMap {
                found: go_type(other),
            }
            .into()),
            None => {
                let mut inner = Map::new();
                let step = self.key(&mut inner, level, depth + 1);
                if inner.is_empty() {
                    return match step {
                        Ok(()) => Err(Error::EmptyKeyMap { key: name }.into()),
                        halt => halt,
                    };
                }
                store(data, name, Value::Object(inner));
                step
            }
        }
    }

    /// `name[index]rest`: works on (or creates) the list under `name`. The list is stored
    /// back even when the input ends early, as Helm does.
    fn key_list(
        &mut self,
        data: &mut Map<String, Value>,
        name: String,
        level: usize,
        depth: usize,
    ) -> Step {
        let index = self.read_index()?;
        let (list, original_len) = match data.get_mut(&name) {
            None => (Vec::new(), 0),
            Some(Value::Array(items)) => {
                let items = std::mem::take(items);
                let len = items.len();
                (items, len)
            }
            Some(other) => {
                return Err(Error::NotAList {
                    found: go_type(other),
                }
                .into());
            }
        };
        let (mut list, step) = self.list_item(list, index, level, depth + 1);
        if name.is_empty() {
            // The empty name is never stored. A list that was already there (only possible
            // through values files) keeps Helm's in-place edits but not any growth.
            if let Some(Value::Array(slot)) = data.get_mut(&name) {
                list.truncate(original_len);
                *slot = list;
            }
        } else {
            data.insert(name, Value::Array(list));
        }
        step
    }

    /// What follows `[index]`: `=value`, `.name…` or another `[index]…`. Returns the list to
    /// store; on a halt it is the input list, possibly with elements edited in place.
    fn list_item(
        &mut self,
        mut list: Vec<Value>,
        index: i64,
        level: usize,
        depth: usize,
    ) -> (Vec<Value>, Step) {
        if depth > MAX_NESTING_DEPTH {
            return (list, Err(Error::TooDeep.into()));
        }
        if index < 0 {
            return (list, Err(Error::NegativeIndex { index }.into()));
        }
        let (junk, stop) = self.read_until(&['[', '.', '=']);
        if !junk.is_empty() {
            return (list, Err(Error::UnexpectedIndexData { data: junk }.into()));
        }
        let slot = usize::try_from(index).ok().filter(|&i| i < list.len());
        match stop {
            None => (list, Err(Halt::End)),
            Some('=') => self.assign_item(list, index),
            Some('[') => {
                let next = match self.read_index() {
                    Ok(next) => next,
                    Err(halt) => return (list, Err(halt)),
                };
                let (inner, taken) = match slot.and_then(|i| list.get_mut(i)) {
                    Some(Value::Array(items)) => (std::mem::take(items), true),
                    Some(Value::Null) | None => (Vec::new(), false),
                    Some(other) => {
                        let found = go_type(other);
                        return (list, Err(Error::NotAList { found }.into()));
                    }
                };
                let (inner, step) = self.list_item(inner, next, level, depth + 1);
                if let Err(halt) = step {
                    // Put back the inner list Helm edits in place; growth is discarded.
                    if let Some(slot) = slot.filter(|_| taken).and_then(|i| list.get_mut(i)) {
                        *slot = Value::Array(inner);
                    }
                    return (list, Err(halt));
                }
                set_index(list, index, Value::Array(inner))
            }
            Some(_) => match slot.and_then(|i| list.get_mut(i)) {
                Some(slot) => {
                    // An existing element that is not a map is replaced by an empty map before
                    // the name is even parsed.
                    let mut inner = match std::mem::take(slot) {
                        Value::Object(inner) => inner,
                        _ => Map::new(),
                    };
                    let step = self.key(&mut inner, level, depth + 1);
                    *slot = Value::Object(inner);
                    (list, step)
                }
                None => {
                    let mut inner = Map::new();
                    let step = self.key(&mut inner, level, depth + 1);
                    if let Err(halt) = step {
                        return (list, Err(halt));
                    }
                    set_index(list, index, Value::Object(inner))
                }
            },
        }
    }

    /// `[index]=value`.
    fn assign_item(&mut self, list: Vec<Value>, index: i64) -> (Vec<Value>, Step) {
        match self.mode {
            Mode::Literal => {
                let value = self.read_rest();
                set_index(list, index, Value::String(value))
            }
            Mode::Json => {
                if self.skip_blank_value() {
                    return set_index(list, index, Value::Null);
                }
                let value = match self.json_value() {
                    Ok(value) => value,
                    Err(halt) => return (list, Err(halt)),
                };
                let (list, step) = set_index(list, index, value);
                if step.is_ok() {
                    self.skip_blank_value();
                }
                (list, step)
            }
            Mode::Typed | Mode::Text => match self.list_value() {
                Ok(ListValue::List(items)) => set_index(list, index, Value::Array(items)),
                Ok(ListValue::NotAList) => {
                    let value = self.read_scalar();
                    set_index(list, index, value)
                }
                Err(Halt::End) => set_index(list, index, Value::String(String::new())),
                Err(fail) => (list, Err(fail)),
            },
        }
    }
}

/// Stores `value` under `name`, unless the name is empty.
fn store(data: &mut Map<String, Value>, name: String, value: Value) {
    if !name.is_empty() {
        data.insert(name, value);
    }
}

/// Sets `list[index]`, growing the list with nulls.
fn set_index(mut list: Vec<Value>, index: i64, value: Value) -> (Vec<Value>, Step) {
    if index < 0 {
        return (list, Err(Error::NegativeIndex { index }.into()));
    }
    let position = match usize::try_from(index) {
        Ok(position) if index <= MAX_INDEX => position,
        _ => return (list, Err(Error::IndexTooLarge { index }.into())),
    };
    if list.len() <= position {
        list.resize(position + 1, Value::Null);
    }
    if let Some(slot) = list.get_mut(position) {
        *slot = value;
    }
    (list, Ok(()))
}

/// `--set` typing: `true`/`false`/`null` in any case, `0`, integers that do not start with `0`.
fn typed_value(raw: String) -> Value {
    if fold_eq(&raw, "true") {
        return Value::Bool(true);
    }
    if fold_eq(&raw, "false") {
        return Value::Bool(false);
    }
    if fold_eq(&raw, "null") {
        return Value::Null;
    }
    if raw == "0" {
        return Value::from(0_i64);
    }
    if !raw.is_empty()
        && !raw.starts_with('0')
        && let Ok(n) = raw.parse::<i64>()
    {
        return Value::from(n);
    }
    Value::String(raw)
}

/// Case-insensitive comparison with an ASCII lowercase word, by Unicode simple case folding
/// (as Go's `strings.EqualFold` does: `ſ` is an `s`, `K` (Kelvin) is a `k`).
fn fold_eq(s: &str, word: &str) -> bool {
    let mut chars = s.chars();
    for w in word.chars() {
        let matched = match chars.next() {
            Some(c) => {
                c.to_ascii_lowercase() == w
                    || (w == 's' && c == '\u{17F}')
                    || (w == 'k' && c == '\u{212A}')
            }
            None => false,
        };
        if !matched {
            return false;
        }
    }
    chars.next().is_none()
}

/// The byte length of the JSON document at the start of `s`, found the way Go's streaming
/// decoder finds it: a number, string or literal ends at the first character that cannot
/// continue it, a container at its closing bracket. The text is validated separately.
fn json_extent(s: &str) -> Result<usize, String> {
    let bytes = s.as_bytes();
    let end_of_input = || "unexpected end of JSON input".to_owned();
    let Some(&first) = bytes.first() else {
        return Err(end_of_input());
    };
    match first {
        b'{' | b'[' => {
            let mut depth = 0_usize;
            let mut in_string = false;
            let mut escaped = false;
            for (i, &b) in bytes.iter().enumerate() {
                if in_string {
                    if escaped {
                        escaped = false;
                    } else if b == b'\\' {
                        escaped = true;
                    } else if b == b'"' {
                        in_string = false;
                    }
                    continue;
                }
                match b {
                    b'"' => in_string = true,
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth = depth.saturating_sub(1);
                        if depth == 0 {
                            return Ok(i + 1);
                        }
                    }
                    _ => {}
                }
            }
            Err(end_of_input())
        }
        b'"' => {
            let mut escaped = false;
            for (i, &b) in bytes.iter().enumerate().skip(1) {
                if escaped {
                    escaped = false;
                } else if b == b'\\' {
                    escaped = true;
                } else if b == b'"' {
                    return Ok(i + 1);
                }
            }
            Err(end_of_input())
        }
        b't' | b'f' | b'n' => {
            let word = match first {
                b't' => "true",
                b'f' => "false",
                _ => "null",
            };
            if s.starts_with(word) {
                Ok(word.len())
            } else {
                Err(format!("invalid literal, expected {word}"))
            }
        }
        b'-' | b'0'..=b'9' => number_extent(bytes).ok_or_else(|| "invalid number".to_owned()),
        _ => {
            let c = s.chars().next().unwrap_or_default();
            Err(format!(
                "invalid character {} looking for beginning of value",
                go_quote_char(c)
            ))
        }
    }
}

/// Rewrites `\\u` escapes of unpaired UTF-16 surrogates in JSON text to `\\ufffd`, which is
/// how Go decodes them (serde_json rejects them instead).
fn replace_lone_surrogates(text: &str) -> std::borrow::Cow<'_, str> {
    fn escape_at(text: &str, at: usize) -> Option<u32> {
        let hex = text.get(at..at + 6)?.strip_prefix("\\u")?;
        if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u32::from_str_radix(hex, 16).ok()
    }
    if !text.contains("\\u") {
        return text.into();
    }
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut copied = 0;
    let mut i = 0;
    let bytes = text.as_bytes();
    while let Some(&b) = bytes.get(i) {
        match b {
            b'"' => {
                in_string = !in_string;
                i += 1;
            }
            b'\\' if in_string => match escape_at(text, i) {
                Some(0xD800..=0xDBFF)
                    if matches!(escape_at(text, i + 6), Some(0xDC00..=0xDFFF)) =>
                {
                    i += 12;
                }
                Some(0xD800..=0xDFFF) => {
                    out.push_str(text.get(copied..i).unwrap_or_default());
                    out.push_str("\\ufffd");
                    i += 6;
                    copied = i;
                }
                _ => i += 2,
            },
            _ => i += 1,
        }
    }
    if copied == 0 {
        return text.into();
    }
    out.push_str(text.get(copied..).unwrap_or_default());
    out.into()
}

/// The length of the JSON number at the start of `bytes`, by the JSON grammar.
fn number_extent(bytes: &[u8]) -> Option<usize> {
    let digit = |i: usize| bytes.get(i).is_some_and(u8::is_ascii_digit);
    let digits_from = |mut i: usize| {
        while digit(i) {
            i += 1;
        }
        i
    };
    let mut i = usize::from(bytes.first() == Some(&b'-'));
    match bytes.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => i = digits_from(i + 1),
        _ => return None,
    }
    if bytes.get(i) == Some(&b'.') {
        if !digit(i + 1) {
            return None;
        }
        i = digits_from(i + 1);
    }
    if matches!(bytes.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(bytes.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if !digit(i) {
            return None;
        }
        i = digits_from(i);
    }
    Some(i)
}

/// Gives JSON numbers Go's meaning: every number is an `f64` (so large integers lose
/// precision); integral ones in `i64` range are stored as `i64`.
fn go_numbers(value: Value) -> Value {
    match value {
        Value::Number(n) => Value::Number(go_number(n)),
        Value::Array(items) => Value::Array(items.into_iter().map(go_numbers).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, go_numbers(v))).collect())
        }
        other => other,
    }
}

fn go_number(n: Number) -> Number {
    let Some(f) = n.as_f64() else {
        return n;
    };
    // 2^63: every f64 below it in magnitude converts to i64 exactly.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    let negative_zero = f == 0.0 && f.is_sign_negative();
    if f.fract() == 0.0 && (-LIMIT..LIMIT).contains(&f) && !negative_zero {
        return Number::from(f as i64);
    }
    Number::from_f64(f).unwrap_or(n)
}

/// The Go type Helm would name in a type-conflict message for this value. Helm reads
/// numbers from values files as `float64`; integers here are named `int64`, as Helm names
/// the ones `--set` produces.
fn go_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "nil",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float64",
        Value::Number(_) => "int64",
        Value::String(_) => "string",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
    }
}

/// Quotes a string as Go's `%q` does (double quotes, Go escapes).
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        push_go_escaped(&mut out, c, '"');
    }
    out.push('"');
    out
}

/// Quotes one character as Go's `%q` does for a rune.
fn go_quote_char(c: char) -> String {
    let mut out = String::from('\'');
    push_go_escaped(&mut out, c, '\'');
    out.push('\'');
    out
}

/// Quotes characters as Go's `%q` does for a `[]rune`: `['a' 'b']`.
fn go_quote_chars(s: &str) -> String {
    let quoted: Vec<String> = s.chars().map(go_quote_char).collect();
    format!("[{}]", quoted.join(" "))
}

fn push_go_escaped(out: &mut String, c: char, quote: char) {
    use std::fmt::Write as _;
    if c == quote || c == '\\' {
        out.push('\\');
        out.push(c);
        return;
    }
    if go_printable(c) {
        out.push(c);
        return;
    }
    let _ = match c {
        '\u{7}' => write!(out, "\\a"),
        '\u{8}' => write!(out, "\\b"),
        '\u{c}' => write!(out, "\\f"),
        '\n' => write!(out, "\\n"),
        '\r' => write!(out, "\\r"),
        '\t' => write!(out, "\\t"),
        '\u{b}' => write!(out, "\\v"),
        c if c < ' ' || c == '\u{7f}' => write!(out, "\\x{:02x}", u32::from(c)),
        c if u32::from(c) < 0x10000 => write!(out, "\\u{:04x}", u32::from(c)),
        c => write!(out, "\\U{:08x}", u32::from(c)),
    };
}

/// An approximation of Go's `unicode.IsPrint` (without tables of unassigned code points):
/// graphic characters and the ASCII space are printable; controls, other spaces, format
/// characters, private-use characters and noncharacters are not.
fn go_printable(c: char) -> bool {
    let u = u32::from(c);
    if c.is_ascii() {
        return (' '..='~').contains(&c);
    }
    if c.is_control() || c.is_whitespace() {
        return false;
    }
    let format = matches!(
        u,
        0xAD | 0x600..=0x605
            | 0x61C
            | 0x6DD
            | 0x70F
            | 0x890..=0x891
            | 0x8E2
            | 0x180E
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x2064
            | 0x2066..=0x206F
            | 0xFEFF
            | 0xFFF9..=0xFFFB
            | 0x110BD
            | 0x110CD
            | 0x13430..=0x1343F
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0001
            | 0xE0020..=0xE007F
    );
    let private_use = matches!(u, 0xE000..=0xF8FF | 0xF0000..=0x10FFFF);
    let noncharacter = matches!(u, 0xFDD0..=0xFDEF) || (u & 0xFFFE) == 0xFFFE;
    !(format || private_use || noncharacter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[derive(Debug, Clone, Copy)]
    enum Flag {
        Set,
        SetString,
        SetJson,
        SetLiteral,
    }
    use Flag::*;

    fn apply(flag: Flag, input: &str, dest: &mut Map<String, Value>) -> Result<(), Error> {
        match flag {
            Set => parse_set(input, dest),
            SetString => parse_set_string(input, dest),
            SetJson => parse_set_json(input, dest),
            SetLiteral => parse_set_literal(input, dest),
        }
    }

    /// JSON equality with numbers compared by value (`1` and `1.0` are the same), as Helm's
    /// `toJson` does not tell an integral `float64` from an `int64`.
    fn same(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
            (Value::Array(x), Value::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
            }
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
            }
            _ => a == b,
        }
    }

    struct Case {
        /// Values already merged (what Helm read from `-f`), as JSON; empty for none.
        init: &'static str,
        /// Flags in the order Helm applies them.
        ops: &'static [(Flag, &'static str)],
        /// The merged values Helm rendered, or Helm's error message after its
        /// `failed parsing --set data: ` prefix (empty: Helm hides the reason for --set-json).
        expect: Result<&'static str, &'static str>,
    }

    fn case(
        init: &'static str,
        ops: &'static [(Flag, &'static str)],
        expect: Result<&'static str, &'static str>,
    ) -> Case {
        Case { init, ops, expect }
    }

    /// Every row was run through `helm template` (v4.1.4) with the same flags; `expect` is what
    /// helm printed. Includes the applicable cases of Helm's `parser_test.go` and
    /// `literal_parser_test.go`.
    fn helm_table() -> Vec<Case> {
        vec![
            case(
                r"",
                &[(Set, r"name1=null,f=false,t=true")],
                Ok(r#"{"f":false,"name1":null,"t":true}"#),
            ),
            case(r"", &[(Set, r"name1=value1")], Ok(r#"{"name1":"value1"}"#)),
            case(
                r"",
                &[(Set, r"name1=value1,name2=value2")],
                Ok(r#"{"name1":"value1","name2":"value2"}"#),
            ),
            case(
                r"",
                &[(Set, r"name1=value1,name2=value2,")],
                Ok(r#"{"name1":"value1","name2":"value2"}"#),
            ),
            case(
                r"",
                &[(Set, r"name1=value1,,,,name2=value2,")],
                Err(r#"key "" has no value (cannot end with ,)"#),
            ),
            case(
                r"",
                &[(Set, r"name1=,name2=value2")],
                Ok(r#"{"name1":"","name2":"value2"}"#),
            ),
            case(
                r"",
                &[(Set, r"leading_zeros=00009")],
                Ok(r#"{"leading_zeros":"00009"}"#),
            ),
            case(r"", &[(Set, r"zero_int=0")], Ok(r#"{"zero_int":0}"#)),
            case(
                r"",
                &[(Set, r"long_int=1234567890")],
                Ok(r#"{"long_int":1234567890}"#),
            ),
            case(r"", &[(Set, r"boolean=true")], Ok(r#"{"boolean":true}"#)),
            case(r"", &[(Set, r"is_null=null")], Ok(r#"{"is_null":null}"#)),
            case(
                r"",
                &[(Set, r"name1,name2=")],
                Err(r#"key "name1" has no value (cannot end with ,)"#),
            ),
            case(
                r"",
                &[(Set, r"name1,name2=value2")],
                Err(r#"key "name1" has no value (cannot end with ,)"#),
            ),
            case(
                r"",
                &[(Set, r"name1,name2=value2\")],
                Err(r#"key "name1" has no value (cannot end with ,)"#),
            ),
            case(
                r"",
                &[(Set, r"name1,name2")],
                Err(r#"key "name1" has no value (cannot end with ,)"#),
            ),
            case(
                r"",
                &[(Set, r"name1=one\,two,name2=three\,four")],
                Ok(r#"{"name1":"one,two","name2":"three,four"}"#),
            ),
            case(
                r"",
                &[(Set, r"name1=one\=two,name2=three\=four")],
                Ok(r#"{"name1":"one=two","name2":"three=four"}"#),
            ),
            case(
                r"",
                &[(Set, r"name1=one two three,name2=three two one")],
                Ok(r#"{"name1":"one two three","name2":"three two one"}"#),
            ),
            case(
                r"",
                &[(Set, r"outer.inner=value")],
                Ok(r#"{"outer":{"inner":"value"}}"#),
            ),
            case(
                r"",
                &[(Set, r"outer.middle.inner=value")],
                Ok(r#"{"outer":{"middle":{"inner":"value"}}}"#),
            ),
            case(
                r"",
                &[(Set, r"outer.inner1=value,outer.inner2=value2")],
                Ok(r#"{"outer":{"inner1":"value","inner2":"value2"}}"#),
            ),
            case(
                r"",
                &[(Set, r"outer.inner1=value,outer.middle.inner=value")],
                Ok(r#"{"outer":{"inner1":"value","middle":{"inner":"value"}}}"#),
            ),
            case(
                r"",
                &[(Set, r"name1.name2")],
                Err(r#"key "name2" has no value"#),
            ),
            case(
                r"",
                &[(Set, r"name1.name2,name1.name3")],
                Err(r#"key "name2" has no value (cannot end with ,)"#),
            ),
            case(
                r"",
                &[(Set, r"name1.name2=")],
                Ok(r#"{"name1":{"name2":""}}"#),
            ),
            case(
                r"",
                &[(Set, r"name1.=name2")],
                Err(r#"key map "name1" has no value"#),
            ),
            case(
                r"",
                &[(Set, r"name1.,name2")],
                Err(r#"key "" has no value (cannot end with ,)"#),
            ),
            case(
                r"",
                &[(Set, r"name1={value1,value2}")],
                Ok(r#"{"name1":["value1","value2"]}"#),
            ),
            case(
                r"",
                &[(Set, r"name1={value1,value2},name2={value1,value2}")],
                Ok(r#"{"name1":["value1","value2"],"name2":["value1","value2"]}"#),
            ),
            case(
                r"",
                &[(Set, r"name1={1021,902}")],
                Ok(r#"{"name1":[1021,902]}"#),
            ),
            case(
                r"",
                &[(Set, r"name1.name2={value1,value2}")],
                Ok(r#"{"name1":{"name2":["value1","value2"]}}"#),
            ),
            case(
                r"",
                &[(Set, r"name1={1021,902")],
                Err(r"list must terminate with '}'"),
            ),
            case(r"", &[(Set, r"list[0]=foo")], Ok(r#"{"list":["foo"]}"#)),
            case(
                r"",
                &[(Set, r"list[0].foo=bar")],
                Ok(r#"{"list":[{"foo":"bar"}]}"#),
            ),
            case(
                r"",
                &[(Set, r"list[0].foo=bar,list[0].hello=world")],
                Ok(r#"{"list":[{"foo":"bar","hello":"world"}]}"#),
            ),
            case(
                r"",
                &[(Set, r"list[0].foo=bar,list[-30].hello=world")],
                Err(r"negative -30 index not allowed"),
            ),
            case(
                r"",
                &[(Set, r"list[0]=foo,list[1]=bar")],
                Ok(r#"{"list":["foo","bar"]}"#),
            ),
            case(
                r"",
                &[(Set, r"list[0]=foo,list[1]=bar,")],
                Ok(r#"{"list":["foo","bar"]}"#),
            ),
            case(
                r"",
                &[(Set, r"list[0]=foo,list[3]=bar")],
                Ok(r#"{"list":["foo",null,null,"bar"]}"#),
            ),
            case(
                r"",
                &[(Set, r"list[0]=foo,list[-20]=bar")],
                Err(r"negative -20 index not allowed"),
            ),
            case(
                r"",
                &[(Set, r"illegal[0]name.foo=bar")],
                Err(r"unexpected data at end of array index: ['n' 'a' 'm' 'e']"),
            ),
            case(r"", &[(Set, r"noval[0]")], Ok(r#"{"noval":[]}"#)),
            case(r"", &[(Set, r"noval[0]=")], Ok(r#"{"noval":[""]}"#)),
            case(r"", &[(Set, r"nested[0][0]=1")], Ok(r#"{"nested":[[1]]}"#)),
            case(
                r"",
                &[(Set, r"nested[1][1]=1")],
                Ok(r#"{"nested":[null,[null,1]]}"#),
            ),
            case(
                r"",
                &[(Set, r"name1.name2[0].foo=bar,name1.name2[1].foo=bar")],
                Ok(r#"{"name1":{"name2":[{"foo":"bar"},{"foo":"bar"}]}}"#),
            ),
            case(
                r"",
                &[(Set, r"name1.name2[1].foo=bar,name1.name2[0].foo=bar")],
                Ok(r#"{"name1":{"name2":[{"foo":"bar"},{"foo":"bar"}]}}"#),
            ),
            case(
                r"",
                &[(Set, r"name1.name2[1].foo=bar")],
                Ok(r#"{"name1":{"name2":[null,{"foo":"bar"}]}}"#),
            ),
            case(
                r"",
                &[(Set, r"]={}].")],
                Err(
                    r"unable to parse key: interface conversion: interface {} is []interface {}, not map[string]interface {}",
                ),
            ),
            case(
                r"",
                &[(
                    Set,
                    r"name1.name2.name3.name4.name5.name6.name7.name8.name9.name10.name11.name12.name13.name14.name15.name16.name17.name18.name19.name20.name21.name22.name23.name24.name25.name26.name27.name28.name29.name30.name31.name32=value",
                )],
                Err(
                    r"value name nested level is greater than maximum supported nested level of 30",
                ),
            ),
            case(
                r"",
                &[(
                    Set,
                    r"n1.n2.n3.n4.n5.n6.n7.n8.n9.n10.n11.n12.n13.n14.n15.n16.n17.n18.n19.n20.n21.n22.n23.n24.n25.n26.n27.n28.n29.n30.n31=value",
                )],
                Ok(
                    r#"{"n1":{"n2":{"n3":{"n4":{"n5":{"n6":{"n7":{"n8":{"n9":{"n10":{"n11":{"n12":{"n13":{"n14":{"n15":{"n16":{"n17":{"n18":{"n19":{"n20":{"n21":{"n22":{"n23":{"n24":{"n25":{"n26":{"n27":{"n28":{"n29":{"n30":{"n31":"value"}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}"#,
                ),
            ),
            case(
                r"",
                &[(
                    Set,
                    r"n1.n2.n3.n4.n5.n6.n7.n8.n9.n10.n11.n12.n13.n14.n15.n16.n17.n18.n19.n20.n21.n22.n23.n24.n25.n26.n27.n28.n29.n30=value",
                )],
                Ok(
                    r#"{"n1":{"n2":{"n3":{"n4":{"n5":{"n6":{"n7":{"n8":{"n9":{"n10":{"n11":{"n12":{"n13":{"n14":{"n15":{"n16":{"n17":{"n18":{"n19":{"n20":{"n21":{"n22":{"n23":{"n24":{"n25":{"n26":{"n27":{"n28":{"n29":{"n30":"value"}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}"#,
                ),
            ),
            case(
                r"",
                &[(SetString, r"long_int_string=1234567890")],
                Ok(r#"{"long_int_string":"1234567890"}"#),
            ),
            case(
                r"",
                &[(SetString, r"boolean=true")],
                Ok(r#"{"boolean":"true"}"#),
            ),
            case(
                r"",
                &[(SetString, r"is_null=null")],
                Ok(r#"{"is_null":"null"}"#),
            ),
            case(r"", &[(SetString, r"zero=0")], Ok(r#"{"zero":"0"}"#)),
            case(
                r"",
                &[(SetString, r"a={1,true,x}")],
                Ok(r#"{"a":["1","true","x"]}"#),
            ),
            case(r"", &[(SetString, r"a=")], Ok(r#"{"a":""}"#)),
            case(
                r"",
                &[(SetString, r"a[0]={x,null}")],
                Ok(r#"{"a":[["x","null"]]}"#),
            ),
            case(
                r#"{"outer":{"inner1":"overwrite","inner2":"value2"}}"#,
                &[(
                    Set,
                    r"outer.inner1=value1,outer.inner3=value3,outer.inner4=4",
                )],
                Ok(
                    r#"{"outer":{"inner1":"value1","inner2":"value2","inner3":"value3","inner4":4}}"#,
                ),
            ),
            case(
                r"",
                &[
                    (Set, r"listOuter[0][0].type=listValue"),
                    (Set, r"listOuter[0][0].status=alive"),
                ],
                Ok(r#"{"listOuter":[[{"status":"alive","type":"listValue"}]]}"#),
            ),
            case(
                r"",
                &[
                    (Set, r"listOuter[0][0].type=listValue"),
                    (Set, r"listOuter[1][0].status=alive"),
                ],
                Ok(r#"{"listOuter":[[{"type":"listValue"}],[{"status":"alive"}]]}"#),
            ),
            case(
                r#"{"listOuter":[[[{"exited":"old"}]]]}"#,
                &[
                    (Set, r"listOuter[0][1][0].type=listValue"),
                    (Set, r"listOuter[0][0][1].status=alive"),
                ],
                Ok(
                    r#"{"listOuter":[[[{"exited":"old"},{"status":"alive"}],[{"type":"listValue"}]]]}"#,
                ),
            ),
            case(
                r#"{"outer":{"inner1":"overwrite","inner2":"value2"}}"#,
                &[(SetString, r"outer.inner1=1,outer.inner3=3")],
                Ok(r#"{"outer":{"inner1":"1","inner2":"value2","inner3":"3"}}"#),
            ),
            case(
                r#"{"outer":{"inner1":"overwrite","inner2":"value2"}}"#,
                &[(
                    SetJson,
                    r#"outer.inner1="1",outer.inner3=3,outer.inner4=true,outer.inner5="true""#,
                )],
                Ok(
                    r#"{"outer":{"inner1":"1","inner2":"value2","inner3":3,"inner4":true,"inner5":"true"}}"#,
                ),
            ),
            case(
                r#"{"outer":{"inner1":{"x":"overwrite"},"inner2":"value2","inner3":["overwrite"]}}"#,
                &[(
                    SetJson,
                    r#"outer.inner1={"a":"1","b":2,"c":[1,2,3]},outer.inner3=["new value 1","new value 2"],outer.inner4={"aa":"1","bb":2,"cc":[1,2,3]},outer.inner5=[{"A":"1","B":2,"C":[1,2,3]}]"#,
                )],
                Ok(
                    r#"{"outer":{"inner1":{"a":"1","b":2,"c":[1,2,3]},"inner2":"value2","inner3":["new value 1","new value 2"],"inner4":{"aa":"1","bb":2,"cc":[1,2,3]},"inner5":[{"A":"1","B":2,"C":[1,2,3]}]}}"#,
                ),
            ),
            case(
                r#"{"outer":{"inner1":{"x":"overwrite"},"inner2":"value2","inner3":["overwrite"]}}"#,
                &[(
                    SetJson,
                    r#"outer.inner1=,outer.inner3={"aa":"1","bb":2,"cc":[1,2,3]},outer.inner3.cc[1]=null"#,
                )],
                Ok(
                    r#"{"outer":{"inner1":null,"inner2":"value2","inner3":{"aa":"1","bb":2,"cc":[1,null,3]}}}"#,
                ),
            ),
            case(
                r"",
                &[(
                    SetJson,
                    r#"outer.inner1={"a":"1","b":2,"c":[1,2,3]},outer.inner3=["new value 1","new value 2"],outer.inner4={"aa":"1","bb":2,"cc":[1,2,3]},outer.inner5={"A":"1","B":2,"C":[1,2,3]}]"#,
                )],
                Err(r""),
            ),
            case(
                r"",
                &[(SetLiteral, r"name")],
                Err(r#"key "name" has no value"#),
            ),
            case(r"", &[(SetLiteral, r"name=")], Ok(r#"{"name":""}"#)),
            case(
                r"",
                &[(SetLiteral, r"name=value")],
                Ok(r#"{"name":"value"}"#),
            ),
            case(
                r"",
                &[(SetLiteral, r"long_int_string=1234567890")],
                Ok(r#"{"long_int_string":"1234567890"}"#),
            ),
            case(
                r"",
                &[(SetLiteral, r"boolean=true")],
                Ok(r#"{"boolean":"true"}"#),
            ),
            case(
                r"",
                &[(SetLiteral, r"is_null=null")],
                Ok(r#"{"is_null":"null"}"#),
            ),
            case(r"", &[(SetLiteral, r"zero=0")], Ok(r#"{"zero":"0"}"#)),
            case(
                r"",
                &[(SetLiteral, r"name1=null,name2=value2")],
                Ok(r#"{"name1":"null,name2=value2"}"#),
            ),
            case(
                r"",
                &[(SetLiteral, r"name1=value,,,tail")],
                Ok(r#"{"name1":"value,,,tail"}"#),
            ),
            case(
                r"",
                &[(SetLiteral, r"leading_zeros=00009")],
                Ok(r#"{"leading_zeros":"00009"}"#),
            ),
            case(
                r"",
                &[(SetLiteral, r"name=one two three")],
                Ok(r#"{"name":"one two three"}"#),
            ),
            case(
                r"",
                &[(SetLiteral, r"outer.inner=value")],
                Ok(r#"{"outer":{"inner":"value"}}"#),
            ),
            case(
                r"",
                &[(SetLiteral, r"outer.middle.inner=value")],
                Ok(r#"{"outer":{"middle":{"inner":"value"}}}"#),
            ),
            case(
                r"",
                &[(SetLiteral, r"name1.name2")],
                Err(r#"key "name2" has no value"#),
            ),
            case(
                r"",
                &[(SetLiteral, r"name1.name2=")],
                Ok(r#"{"name1":{"name2":""}}"#),
            ),
            case(
                r"",
                &[(SetLiteral, r"name1.=name2")],
                Err(r#"key map "name1" has no value"#),
            ),
            case(
                r"",
                &[(SetLiteral, r"name1.,name2")],
                Err(r#"key ",name2" has no value"#),
            ),
            case(
                r"",
                &[(SetLiteral, r"name1={value1,value2}")],
                Ok(r#"{"name1":"{value1,value2}"}"#),
            ),
            case(
                r"",
                &[(SetLiteral, r"list[0]=foo")],
                Ok(r#"{"list":["foo"]}"#),
            ),
            case(
                r"",
                &[(SetLiteral, r"list[0].foo=bar")],
                Ok(r#"{"list":[{"foo":"bar"}]}"#),
            ),
            case(
                r"",
                &[(SetLiteral, r"list[-30].hello=world")],
                Err(r"negative -30 index not allowed"),
            ),
            case(
                r"",
                &[(SetLiteral, r"list[3]=bar")],
                Ok(r#"{"list":[null,null,null,"bar"]}"#),
            ),
            case(
                r"",
                &[(SetLiteral, r"illegal[0]name.foo=bar")],
                Err(r"unexpected data at end of array index: ['n' 'a' 'm' 'e']"),
            ),
            case(r"", &[(SetLiteral, r"noval[0]")], Ok(r#"{"noval":[]}"#)),
            case(r"", &[(SetLiteral, r"noval[0]=")], Ok(r#"{"noval":[""]}"#)),
            case(
                r"",
                &[(SetLiteral, r"nested[0][0]=1")],
                Ok(r#"{"nested":[["1"]]}"#),
            ),
            case(
                r"",
                &[(SetLiteral, r"nested[1][1]=1")],
                Ok(r#"{"nested":[null,[null,"1"]]}"#),
            ),
            case(
                r"",
                &[(SetLiteral, r"name1.name2[0].foo=bar")],
                Ok(r#"{"name1":{"name2":[{"foo":"bar"}]}}"#),
            ),
            case(
                r"",
                &[(SetLiteral, r"name1.name2[1].foo=bar")],
                Ok(r#"{"name1":{"name2":[null,{"foo":"bar"}]}}"#),
            ),
            case(r"", &[(SetLiteral, r"a\b=c\,d")], Ok(r#"{"a\\b":"c\\,d"}"#)),
            case(
                r"",
                &[(SetLiteral, r"a.b=c,d=e\,")],
                Ok(r#"{"a":{"b":"c,d=e\\,"}}"#),
            ),
            case(
                r"",
                &[(SetLiteral, r"a[\1]=x")],
                Err(r#"error parsing index: strconv.Atoi: parsing "\\1": invalid syntax"#),
            ),
            case(r"", &[(Set, r"a[0")], Ok(r"{}")),
            case(r"", &[(Set, r"x=1,a[0")], Ok(r#"{"x":1}"#)),
            case(
                r"",
                &[(Set, r"a[x]=1")],
                Err(r#"error parsing index: strconv.Atoi: parsing "x": invalid syntax"#),
            ),
            case(r"", &[(Set, r"a[+1]=1")], Ok(r#"{"a":[null,1]}"#)),
            case(
                r"",
                &[(Set, r"a[99999999999999999999]=1")],
                Err(
                    r#"error parsing index: strconv.Atoi: parsing "99999999999999999999": value out of range"#,
                ),
            ),
            case(
                r"",
                &[(Set, r"a[-1]")],
                Err(r"negative -1 index not allowed"),
            ),
            case(
                r"",
                &[(Set, r"a[0]x")],
                Err(r"unexpected data at end of array index: ['x']"),
            ),
            case(
                r"",
                &[(Set, r#"a[0]xy'"é"#)],
                Err(r#"unexpected data at end of array index: ['x' 'y' '\'' '"' 'é']"#),
            ),
            case(r"", &[(Set, r"a[70000]")], Ok(r#"{"a":[]}"#)),
            case(
                r"",
                &[(Set, r"a[70000]=1")],
                Err(r"index of 70000 is greater than maximum supported index of 65536"),
            ),
            case(r"", &[(Set, r"a[1].")], Ok(r#"{"a":[]}"#)),
            case(
                r"",
                &[(
                    Set,
                    r"a=+5,b=-05,c=-0,d=1_0,e=0x1,f=TRUE,g=Null,h=9223372036854775808,i=-9223372036854775808,j=falſe,k=1.5,l= 1",
                )],
                Ok(
                    r#"{"a":5,"b":-5,"c":0,"d":"1_0","e":"0x1","f":true,"g":null,"h":"9223372036854775808","i":-9223372036854775808,"j":false,"k":"1.5","l":" 1"}"#,
                ),
            ),
            case(r"", &[(Set, r"\")], Ok(r"{}")),
            case(r"", &[(Set, r"a\")], Err(r#"key "a" has no value"#)),
            case(r"", &[(Set, r"a=b\")], Ok(r#"{"a":"b"}"#)),
            case(r"", &[(Set, r"[0]=1")], Ok(r"{}")),
            case(r"", &[(Set, r".a=1")], Ok(r"{}")),
            case(r"", &[(Set, r"a.=1")], Err(r#"key map "a" has no value"#)),
            case(r"", &[(Set, r"a=1 b=2")], Ok(r#"{"a":"1 b=2"}"#)),
            case(r"", &[(Set, r"a={}")], Ok(r#"{"a":[""]}"#)),
            case(r"", &[(Set, r"a={x}.b=1")], Ok(r#"{"a":["x"]}"#)),
            case(r"", &[(Set, r"a={x}y")], Err(r#"key "y" has no value"#)),
            case(r"", &[(Set, r"a={,}")], Ok(r#"{"a":["",""]}"#)),
            case(r"", &[(Set, r"a={x,,y}")], Ok(r#"{"a":["x","","y"]}"#)),
            case(r"", &[(Set, r"a={x\,y,z\}}")], Ok(r#"{"a":["x,y","z}"]}"#)),
            case(r"", &[(Set, r"a= {x}")], Ok(r#"{"a":" {x}"}"#)),
            case(r"", &[(Set, r"a\.b=c")], Ok(r#"{"a.b":"c"}"#)),
            case(r"", &[(Set, r"a\[0]=1")], Ok(r#"{"a[0]":1}"#)),
            case(r"", &[(Set, r"a=x=y")], Ok(r#"{"a":"x=y"}"#)),
            case(r"", &[(Set, r"a==")], Ok(r#"{"a":"="}"#)),
            case(r"", &[(Set, r"=a")], Ok(r"{}")),
            case(r"", &[(Set, r"=")], Ok(r"{}")),
            case(r"", &[(Set, r"a[0][0]")], Ok(r#"{"a":[]}"#)),
            case(r"", &[(Set, r"a[0][")], Ok(r#"{"a":[]}"#)),
            case(r"", &[(Set, r"a[0][1")], Ok(r#"{"a":[]}"#)),
            case(r"", &[(Set, r"a[0].")], Ok(r#"{"a":[]}"#)),
            case(
                r"",
                &[(Set, r"a[]=1")],
                Err(r#"error parsing index: strconv.Atoi: parsing "": invalid syntax"#),
            ),
            case(
                r"",
                &[(Set, r"a[ 1]=1")],
                Err(r#"error parsing index: strconv.Atoi: parsing " 1": invalid syntax"#),
            ),
            case(
                r"",
                &[(Set, r"a[1]]=1")],
                Err(r"unexpected data at end of array index: [']']"),
            ),
            case(r"", &[(Set, r"a.b[0")], Ok(r"{}")),
            case(
                r"",
                &[(Set, r"a[0].b[1]=2,a[0].c=3")],
                Ok(r#"{"a":[{"b":[null,2],"c":3}]}"#),
            ),
            case(
                r"",
                &[(Set, r"a[0][0].b=1,a[0][1][0]=2")],
                Ok(r#"{"a":[[{"b":1},[2]]]}"#),
            ),
            case(
                r"",
                &[(Set, r"a[1][0]=x,a[0][1]=y")],
                Ok(r#"{"a":[[null,"y"],["x"]]}"#),
            ),
            case(r"", &[(Set, r"a.b.c=1,a.b=2")], Ok(r#"{"a":{"b":2}}"#)),
            case(
                r"",
                &[(Set, r"a.b=2,a.b.c=1")],
                Err(
                    r"unable to parse key: interface conversion: interface {} is int64, not map[string]interface {}",
                ),
            ),
            case(
                r"",
                &[(Set, r"a=1,a[0]=2")],
                Err(
                    r"unable to parse key: interface conversion: interface {} is int64, not []interface {}",
                ),
            ),
            case(
                r"",
                &[(Set, r"a=null,a.b=1")],
                Err(
                    r"unable to parse key: interface conversion: interface {} is nil, not map[string]interface {}",
                ),
            ),
            case(
                r"",
                &[(Set, r"a=null,a[0]=1")],
                Err(
                    r"unable to parse key: interface conversion: interface {} is nil, not []interface {}",
                ),
            ),
            case(r"", &[(Set, r"a[0]=1,a[0].b=2")], Ok(r#"{"a":[{"b":2}]}"#)),
            case(
                r"",
                &[(Set, r"a[0].b=1,a[0][0]=2")],
                Err(
                    r"unable to parse key: interface conversion: interface {} is map[string]interface {}, not []interface {}",
                ),
            ),
            case(
                r"",
                &[(Set, r"a[0]=1,a[0][0]=2")],
                Err(
                    r"unable to parse key: interface conversion: interface {} is int64, not []interface {}",
                ),
            ),
            case(r"", &[(Set, r"a[1]=x,a[0][0]=2")], Ok(r#"{"a":[[2],"x"]}"#)),
            case(r"", &[(Set, r"a=1,b")], Err(r#"key "b" has no value"#)),
            case(
                r"",
                &[(Set, "a\u{9}b\u{1}é\u{a0}")],
                Err(r#"key "a\tb\x01é\u00a0" has no value"#),
            ),
            case(r"", &[(Set, r#"a"b"#)], Err(r#"key "a\"b" has no value"#)),
            case(r"", &[(Set, r"ü.ö=ä")], Ok(r#"{"ü":{"ö":"ä"}}"#)),
            case(r"", &[(Set, r"a=é,b=😀")], Ok(r#"{"a":"é","b":"😀"}"#)),
            case(r"", &[(Set, r"a=1\")], Ok(r#"{"a":1}"#)),
            case(r"", &[(Set, r"a=\\")], Ok(r#"{"a":"\\"}"#)),
            case(r"", &[(Set, r"a\=b=c")], Ok(r#"{"a=b":"c"}"#)),
            case(r"", &[(Set, r"a[0]=\{x}")], Ok(r#"{"a":["{x}"]}"#)),
            case(
                r"",
                &[(Set, r"a[0]={x")],
                Err(r"list must terminate with '}'"),
            ),
            case(
                r"",
                &[(Set, r"a.b,c=1")],
                Err(r#"key "b" has no value (cannot end with ,)"#),
            ),
            case(
                r"",
                &[(Set, r"a[0],b=1")],
                Err(r"unexpected data at end of array index: [',' 'b']"),
            ),
            case(r"", &[(Set, r"a[0]=1,a[0]")], Ok(r#"{"a":[1]}"#)),
            case(r"", &[(Set, r"a[0].b")], Err(r#"key "b" has no value"#)),
            case(
                r"",
                &[(Set, r"a[0].b,c=1")],
                Err(r#"key "b" has no value (cannot end with ,)"#),
            ),
            case(
                r"",
                &[(Set, r",")],
                Err(r#"key "" has no value (cannot end with ,)"#),
            ),
            case(
                r"",
                &[(Set, r"a=1,,")],
                Err(r#"key "" has no value (cannot end with ,)"#),
            ),
            case(r"", &[(Set, r"a=1,=2")], Ok(r#"{"a":1}"#)),
            case(
                r"",
                &[(Set, r"a=1,b=TrUe,c=nULL,d=00,e=-,f=+")],
                Ok(r#"{"a":1,"b":true,"c":null,"d":"00","e":"-","f":"+"}"#),
            ),
            case(
                r"",
                &[(Set, r"a=0x10,b=1e3,c=007,d=-0,e=+0")],
                Ok(r#"{"a":"0x10","b":"1e3","c":"007","d":0,"e":0}"#),
            ),
            case(
                r"",
                &[(Set, r"a=9223372036854775807,b=-9223372036854775809")],
                Ok(r#"{"a":9223372036854775807,"b":"-9223372036854775809"}"#),
            ),
            case(
                r#"{"a":[1,2],"m":{"x":1}}"#,
                &[(Set, r"a=1,a[0]")],
                Err(
                    r"unable to parse key: interface conversion: interface {} is int64, not []interface {}",
                ),
            ),
            case(
                r#"{"a":[1,2],"m":{"x":1}}"#,
                &[(Set, r"a[0]")],
                Ok(r#"{"a":[1,2],"m":{"x":1}}"#),
            ),
            case(
                r#"{"a":[1,2],"m":{"x":1}}"#,
                &[(Set, r"a.b")],
                Err(
                    r"unable to parse key: interface conversion: interface {} is []interface {}, not map[string]interface {}",
                ),
            ),
            case(
                r#"{"a":[1,2],"m":{"x":1}}"#,
                &[(Set, r"a.b[0]=1")],
                Err(
                    r"unable to parse key: interface conversion: interface {} is []interface {}, not map[string]interface {}",
                ),
            ),
            case(
                r#"{"a":[1,2],"m":{"x":1}}"#,
                &[(Set, r"a")],
                Err(r#"key "a" has no value"#),
            ),
            case(r"", &[(SetJson, r"a=1 b=2")], Ok(r#"{"a":1,"b":2}"#)),
            case(r"", &[(SetJson, r"a=truex=1")], Ok(r#"{"a":true,"x":1}"#)),
            case(r"", &[(SetJson, r"a=01")], Err(r"")),
            case(r"", &[(SetJson, r"a=01=2")], Ok(r#"{"1":2,"a":0}"#)),
            case(r"", &[(SetJson, r"a=1x")], Err(r"")),
            case(
                r"",
                &[(SetJson, r#"a= , b=[1,2.5,1e2],c={"x":null}"#)],
                Ok(r#"{" b":[1,2.5,100],"a":null,"c":{"x":null}}"#),
            ),
            case(r"", &[(SetJson, r"a=[1,2]x")], Err(r"")),
            case(r"", &[(SetJson, r#"a="x"y=1"#)], Ok(r#"{"a":"x","y":1}"#)),
            case(r"", &[(SetJson, r"a=nul")], Err(r"")),
            case(r"", &[(SetJson, r"a=-")], Err(r"")),
            case(r"", &[(SetJson, r"a=1.")], Err(r"")),
            case(r"", &[(SetJson, r"a=1e")], Err(r"")),
            case(r"", &[(SetJson, r"a=1e400")], Err(r"")),
            case(r"", &[(SetJson, r#"a="\u00e9\n""#)], Ok(r#"{"a":"é\n"}"#)),
            case(
                r"",
                &[(SetJson, r#"a={"b":{"c":[1,{"d":null}]}}"#)],
                Ok(r#"{"a":{"b":{"c":[1,{"d":null}]}}}"#),
            ),
            case(
                r"",
                &[(SetJson, r#"a[2]={"x":1}"#)],
                Ok(r#"{"a":[null,null,{"x":1}]}"#),
            ),
            case(
                r"",
                &[(SetJson, r"a[0]=,a[2]=")],
                Ok(r#"{"a":[null,null,null]}"#),
            ),
            case(r"", &[(SetJson, r"a")], Err(r"")),
            case(
                r"",
                &[(SetJson, r"a.b=1,a.c=[1,2.5,-0,1e21,12345678901234567890]")],
                Ok(r#"{"a":{"b":1,"c":[1,2.5,0,1e+21,12345678901234567000]}}"#),
            ),
            case(
                r"",
                &[(SetJson, r#"{"a":{"b":1}}"#)],
                Ok(r#"{"a":{"b":1}}"#),
            ),
            case(r"", &[(SetJson, r#" {"a":1} "#)], Ok(r#"{"a":1}"#)),
            case(r"", &[(SetJson, r#"{"a":1}x"#)], Err(r"")),
            case(r"", &[(SetJson, r"{bad}")], Err(r"")),
            case(
                r"",
                &[(SetJson, r"a=9007199254740993")],
                Ok(r#"{"a":9007199254740992}"#),
            ),
            case(
                r"",
                &[(SetJson, r#"a=  "sp"  ,b=2"#)],
                Ok(r#"{"a":"sp","b":2}"#),
            ),
            case(r"", &[(SetJson, r"a='x'")], Err(r"")),
            case(r"", &[(SetJson, r"a=[1,2")], Err(r"")),
            case(
                r"",
                &[(SetJson, r#"a={"x":"}"}"#)],
                Ok(r#"{"a":{"x":"}"}}"#),
            ),
            case(r"", &[(SetJson, r"a=tru")], Err(r"")),
            case(r"", &[(SetJson, r"a=truee")], Err(r"")),
            case(
                r"",
                &[(SetJson, r#"{"a":{"b":1}}"#), (SetJson, r#"{"a":{"c":2}}"#)],
                Ok(r#"{"a":{"b":1,"c":2}}"#),
            ),
            case(
                r"",
                &[
                    (SetJson, r#"a={"b":1}"#),
                    (SetJson, r#"{"a":{"c":2},"d":null}"#),
                ],
                Ok(r#"{"a":{"b":1,"c":2},"d":null}"#),
            ),
            case(
                r"",
                &[(SetJson, r#"a={"b":1}"#), (Set, r"a.c=2")],
                Ok(r#"{"a":{"b":1,"c":2}}"#),
            ),
            case(
                r"",
                &[(SetJson, r"a=[1]"), (Set, r"a[2]=x")],
                Ok(r#"{"a":[1,null,"x"]}"#),
            ),
            case(
                r"",
                &[
                    (Set, r"a.b=1"),
                    (SetString, r"a.c=2"),
                    (SetLiteral, r"a.d=3,x"),
                ],
                Ok(r#"{"a":{"b":1,"c":"2","d":"3,x"}}"#),
            ),
            case(r"", &[(Set, r"a=1"), (Set, r"a=2")], Ok(r#"{"a":2}"#)),
            case(
                r"",
                &[(Set, r"a.b=1"), (Set, r"a=null")],
                Ok(r#"{"a":null}"#),
            ),
            case(r"", &[(SetJson, r#"a="\ud800""#)], Ok(r#"{"a":"�"}"#)),
            case(
                r"",
                &[(SetJson, r#"a="x\udc00\ud83d\ude00\ud800\ud800\ude00y""#)],
                Ok(r#"{"a":"x�😀�𐈀y"}"#),
            ),
            case(
                r"",
                &[(SetJson, r#"a=["\ud800",{"\udc00":1}]"#)],
                Ok(r#"{"a":["�",{"�":1}]}"#),
            ),
            case(
                r"",
                &[(SetJson, "a=\u{a0}1,b=\u{3000}1")],
                Ok(r#"{"a":1,"b":1}"#),
            ),
            case(
                r"",
                &[(SetJson, r#"a={"a":1,"a":2}"#)],
                Ok(r#"{"a":{"a":2}}"#),
            ),
            case(r"", &[(SetJson, r"a=[1,2,] ")], Err(r"")),
        ]
    }

    #[test]
    fn matches_helm_on_the_recorded_table() {
        let mut failures = Vec::new();
        let table = helm_table();
        for case in &table {
            let mut dest = if case.init.is_empty() {
                Map::new()
            } else {
                serde_json::from_str(case.init).expect("table init is JSON")
            };
            let got = case
                .ops
                .iter()
                .try_for_each(|&(flag, input)| apply(flag, input, &mut dest));
            let ok = match (&got, case.expect) {
                (Ok(()), Ok(json)) => {
                    let want: Value = serde_json::from_str(json).expect("table JSON");
                    same(&Value::Object(dest.clone()), &want)
                }
                (Err(_), Err("")) => true,
                (Err(e), Err(message)) => e.to_string() == message,
                _ => false,
            };
            if !ok {
                failures.push(format!(
                    "{:?}: got {:?} / {}, want {:?}",
                    case.ops,
                    got,
                    Value::Object(dest),
                    case.expect
                ));
            }
        }
        assert!(table.len() >= 200, "table shrank to {}", table.len());
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    fn set(input: &str) -> Result<Value, Error> {
        let mut dest = Map::new();
        parse_set(input, &mut dest).map(|()| Value::Object(dest))
    }

    #[test]
    fn index_limit_is_inclusive() {
        let Ok(Value::Object(values)) = set("a[65536]=x") else {
            panic!("MAX_INDEX itself is allowed");
        };
        let list = values["a"].as_array().expect("a list");
        assert_eq!(list.len(), 65_537);
        assert_eq!(list[65_536], json!("x"));
        assert!(list[..65_536].iter().all(Value::is_null));
        assert_eq!(
            set("a[65537]=x"),
            Err(Error::IndexTooLarge { index: 65_537 })
        );
    }

    #[test]
    fn typed_values() {
        let values = set("a=true,b=FaLsE,c=NULL,d=0,e=-12,f=+7,g=007,h=1.5,i=9223372036854775807,j=9223372036854775808,k=,l=0x1f,m=falſe")
            .expect("valid");
        assert_eq!(
            values,
            json!({"a": true, "b": false, "c": null, "d": 0, "e": -12, "f": 7, "g": "007",
                   "h": "1.5", "i": i64::MAX, "j": "9223372036854775808", "k": "", "l": "0x1f",
                   "m": false})
        );
        assert_eq!(values["i"].as_i64(), Some(i64::MAX));
    }

    #[test]
    fn set_string_keeps_text() {
        let mut dest = Map::new();
        parse_set_string("a=true,b=1,c={null,2},d=", &mut dest).expect("valid");
        assert_eq!(
            Value::Object(dest),
            json!({"a": "true", "b": "1", "c": ["null", "2"], "d": ""})
        );
    }

    #[test]
    fn set_json_numbers_follow_go() {
        let mut dest = Map::new();
        parse_set_json("a=1,b=2.0,c=1e2,d=2.5,e=9007199254740993,f=-0", &mut dest).expect("valid");
        assert_eq!(dest["a"].as_i64(), Some(1));
        assert_eq!(dest["b"].as_i64(), Some(2));
        assert_eq!(dest["c"].as_i64(), Some(100));
        assert_eq!(dest["d"].as_f64(), Some(2.5));
        // Go decodes every JSON number as a float64.
        assert_eq!(dest["e"].as_i64(), Some(9_007_199_254_740_992));
        assert!(
            dest["f"]
                .as_f64()
                .is_some_and(|f| f == 0.0 && f.is_sign_negative())
        );
    }

    #[test]
    fn set_json_object_form_deep_merges() {
        let mut dest =
            serde_json::from_value(json!({"a": {"b": 1, "c": [1]}, "d": 1})).expect("object");
        parse_set_json(
            r#" {"a": {"c": {"x": 1}, "e": null}, "f": 1.5} "#,
            &mut dest,
        )
        .expect("valid");
        assert_eq!(
            Value::Object(dest),
            json!({"a": {"b": 1, "c": {"x": 1}, "e": null}, "d": 1, "f": 1.5})
        );
        let err = parse_set_json("{nope", &mut Map::new()).expect_err("invalid");
        assert!(matches!(err, Error::InvalidJsonObject { ref input, .. } if input == "{nope"));
    }

    #[test]
    fn set_json_reports_the_bad_value() {
        let err = parse_set_json("a=1,b=[1,", &mut Map::new()).expect_err("invalid");
        assert!(
            matches!(err, Error::InvalidJson { ref value, .. } if value == "[1,"),
            "{err}"
        );
        assert_eq!(err.category(), "bad_json");
    }

    #[test]
    fn messages_quote_like_go() {
        assert_eq!(
            set("a\\\"b\\\\c").expect_err("no value").to_string(),
            r#"key "a\"b\\c" has no value"#
        );
        assert_eq!(
            set("a[0]'\u{7f}\u{1F600}\u{E000}")
                .expect_err("junk")
                .to_string(),
            r"unexpected data at end of array index: ['\'' '\x7f' '😀' '\ue000']"
        );
        assert_eq!(
            set("a[x]=1").expect_err("bad index").to_string(),
            r#"error parsing index: strconv.Atoi: parsing "x": invalid syntax"#
        );
        assert_eq!(go_quote("\u{10FFFF}\u{FEFF}"), r#""\U0010ffff\ufeff""#);
    }

    #[test]
    fn type_conflicts_name_go_types() {
        let mut dest =
            serde_json::from_value(json!({"f": 1.5, "s": "x", "l": [], "m": {}})).expect("object");
        for (input, want) in [
            ("f[0]=1", "interface {} is float64, not []interface {}"),
            (
                "s.x=1",
                "interface {} is string, not map[string]interface {}",
            ),
            (
                "l.x=1",
                "interface {} is []interface {}, not map[string]interface {}",
            ),
            (
                "m[0]=1",
                "interface {} is map[string]interface {}, not []interface {}",
            ),
        ] {
            let err = parse_set(input, &mut dest).expect_err(input);
            assert_eq!(err.category(), "type_conflict");
            assert_eq!(
                err.to_string(),
                format!("unable to parse key: interface conversion: {want}")
            );
        }
    }

    #[test]
    fn merges_into_existing_values() {
        let mut dest = serde_json::from_value(json!({
            "keep": 1,
            "m": {"a": 1, "b": {"c": 2}},
            "l": [1, {"x": 1}, 3]
        }))
        .expect("object");
        parse_set("m.b.d=3,m.a=null,l[1].y=2,l[4]=5,l[0]=", &mut dest).expect("valid");
        assert_eq!(
            Value::Object(dest),
            json!({
                "keep": 1,
                "m": {"a": null, "b": {"c": 2, "d": 3}},
                "l": ["", {"x": 1, "y": 2}, 3, null, 5]
            })
        );
    }

    /// Helm stops at the end of the input without complaint, keeping what it built.
    #[test]
    fn truncated_input_keeps_partial_lists() {
        let mut dest = serde_json::from_value(json!({"l": [5, [7]]})).expect("object");
        parse_set("l[0].", &mut dest).expect("helm accepts this");
        parse_set("l[1][0].", &mut dest).expect("helm accepts this");
        parse_set("n[3][", &mut dest).expect("helm accepts this");
        assert_eq!(Value::Object(dest), json!({"l": [{}, [{}]], "n": []}));
    }

    #[test]
    fn literal_takes_the_rest_verbatim() {
        let mut dest = Map::new();
        parse_set_literal(r"a.b[1]=x,y=z\,{q}", &mut dest).expect("valid");
        assert_eq!(
            Value::Object(dest),
            json!({"a": {"b": [null, r"x,y=z\,{q}"]}})
        );
    }

    #[test]
    fn nesting_limits() {
        let names: Vec<String> = (0..=MAX_NESTED_NAME_LEVEL)
            .map(|i| format!("n{i}"))
            .collect();
        assert!(set(&format!("{}=1", names.join("."))).is_ok());
        let too_many = format!("{}.x=1", names.join("."));
        assert_eq!(set(&too_many), Err(Error::NameTooDeep));

        // Deep list nesting must end in an error, not a stack overflow, even on a small stack.
        let deep = |n: usize| format!("a{}=1", "[0]".repeat(n));
        let run = move || {
            let ok = set(&deep(MAX_NESTING_DEPTH - 1)).is_ok();
            let too_deep = set(&deep(MAX_NESTING_DEPTH + 1));
            let mixed = set(&format!("{}=1", "a[0].".repeat(MAX_NESTING_DEPTH)));
            (ok, too_deep, mixed)
        };
        let (ok, too_deep, mixed) = std::thread::Builder::new()
            .stack_size(1 << 20)
            .spawn(run)
            .expect("thread")
            .join()
            .expect("no overflow");
        assert!(ok);
        assert_eq!(too_deep, Err(Error::TooDeep));
        assert_eq!(mixed, Err(Error::TooDeep));
    }

    #[test]
    fn categories_are_fixed() {
        assert_eq!(set("a").expect_err("x").category(), "missing_value");
        assert_eq!(set("a[-1]=1").expect_err("x").category(), "bad_index");
        assert_eq!(set("a={x").expect_err("x").category(), "bad_list");
        assert_eq!(Error::NameTooDeep.category(), "too_deep");
    }

    fn arbitrary_values() -> impl Strategy<Value = Map<String, Value>> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (-1e6f64..1e6).prop_map(Value::from),
            "[a-c0-9]{0,3}".prop_map(Value::String),
        ];
        let tree = leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-c0]{0,2}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        });
        prop::collection::btree_map("[a-c0]{0,2}", tree, 0..4).prop_map(|m| m.into_iter().collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Whatever the command line holds, parsing returns instead of panicking.
        #[test]
        fn never_panics(
            input in r#"([a-c0-9 .=,\[\]{}\\"':-]|true|null|\[0\]|\[1\]|65537|é){0,24}"#,
            mut dest in arbitrary_values(),
        ) {
            let mut d1 = dest.clone();
            let mut d2 = dest.clone();
            let mut d3 = dest.clone();
            let _ = parse_set(&input, &mut dest);
            let _ = parse_set_string(&input, &mut d1);
            let _ = parse_set_json(&input, &mut d2);
            let _ = parse_set_literal(&input, &mut d3);
        }

        #[test]
        fn never_panics_on_any_text(input in any::<String>()) {
            let mut dest = Map::new();
            let _ = parse_set(&input, &mut dest);
            let _ = parse_set_json(&input, &mut dest);
            let _ = parse_set_literal(&input, &mut dest);
        }

        /// A plain dotted name set by --set-string ends up at exactly that path, and nothing
        /// else changes.
        #[test]
        fn dotted_names_nest(
            path in prop::collection::vec("[a-z][a-z0-9_-]{0,5}", 1..6),
            value in "[a-zA-Z0-9 _-]{0,8}",
        ) {
            let mut dest = Map::new();
            parse_set_string(&format!("{}={}", path.join("."), value), &mut dest).expect("valid");
            let mut want = Value::String(value);
            for name in path.iter().rev() {
                want = json!({ name.as_str(): want });
            }
            prop_assert_eq!(Value::Object(dest), want);
        }

        /// Escaping every special character yields the text back as one key and one value.
        #[test]
        fn escapes_round_trip(key in "[a-z.=,\\[\\]{}\\\\]{1,8}", value in "[a-z.=,\\[\\]\\\\]{0,8}") {
            let escape = |s: &str| s.chars().flat_map(|c| {
                let escaped = matches!(c, '.' | '=' | ',' | '[' | ']' | '{' | '}' | '\\');
                escaped.then_some('\\').into_iter().chain(std::iter::once(c))
            }).collect::<String>();
            let mut dest = Map::new();
            parse_set_string(&format!("{}={}", escape(&key), escape(&value)), &mut dest)
                .expect("valid");
            prop_assert_eq!(Value::Object(dest), json!({ key: value }));
        }
    }
}
