//! YAML decoding with the semantics Helm and kubectl use.
//!
//! Helm reads `Chart.yaml`, values files and rendered manifests with `sigs.k8s.io/yaml`, which
//! decodes with go-yaml **v2** and then converts the result to JSON. go-yaml v2 resolves plain
//! scalars by the YAML 1.1 rules, so `enabled: no` is the boolean `false`, `mode: 0755` is the
//! integer 493 and a key written `on:` becomes the JSON key `"true"`. Rust YAML libraries follow
//! YAML 1.2, under which all three are something else. This module reads YAML the way Helm does,
//! so that values, chart metadata and manifests mean the same thing here as they do in Helm.
//!
//! The syntax is parsed by libyaml itself: the `unsafe-libyaml` translation of libyaml 0.2.5,
//! behind a safe wrapper (`yaml/libyaml.rs`). go-yaml's parser is a Go translation of
//! libyaml, so the text accepted, and how it splits into scalars, sequences and mappings, is
//! libyaml's here as in Helm. Everything above the syntax is done here, following go-yaml v2
//! (`resolve.go`, `decode.go`) and `sigs.k8s.io/yaml` (`yaml.go`):
//!
//! * **Plain scalars** resolve as in go-yaml v2: null (empty, `~`, `null`, `Null`, `NULL`),
//!   booleans (`y`, `yes`, `on`, `true` and their `n`/`no`/`off`/`false` counterparts, in lower,
//!   capitalised and upper case), integers (optional sign, `_` separators, `0x`, `0o`, `0b` and
//!   leading-zero octal; too big for `i64` becomes `u64`, too big for that a float), floats
//!   (go-yaml's float pattern; a float that overflows `f64` stays a string) and everything else a
//!   string. Timestamps stay strings. `.inf` and `.nan` resolve to floats that JSON cannot hold,
//!   so, as in Helm, a document that keeps one of them as a value is an error.
//! * **Quoted and block scalars** are strings, unless they carry an explicit tag.
//! * **Tags**: `!!str`, `!!int`, `!!float`, `!!bool`, `!!null` and `!!timestamp` force the type
//!   and fail when the text does not fit (`!!float` also accepts an integer); `!!binary` decodes
//!   base64 as Go's `base64.StdEncoding` does; any other tag, including the non-specific `!`,
//!   makes the scalar a string. Tags on sequences and mappings are ignored.
//! * **Mapping keys** resolve like values and are then turned into JSON keys as
//!   `sigs.k8s.io/yaml` does: booleans become `"true"`/`"false"`, integers their decimal form and
//!   floats Go's `FormatFloat(f, 'g', -1, 32)` form (`1e+06`, `.inf`, `.nan`). Null keys and
//!   integers above `i64::MAX` are errors; sequence and mapping keys are errors.
//! * **Anchors and aliases** are expanded (each alias is a copy), and merge keys (`<<`) merge a
//!   mapping, an alias of one or a sequence of them with go-yaml v2's precedence: entries are
//!   written in document order, so a merge overrides the keys written before it and is overridden
//!   by the keys after it, and within a merged sequence the earlier mappings win. A repeated key
//!   keeps its last value.
//! * **Limits**: alias expansion is bounded by go-yaml v2's ratio rule ("document contains
//!   excessive aliasing"), and collections may nest at most [`MAX_DEPTH`] levels deep.
//!
//! Every error carries the 1-based line and column where it was found. A syntax error has
//! libyaml's words for the problem (`did not find expected key`, as go-yaml reports it) and what
//! libyaml was reading; it is placed where the token libyaml was reading starts (a scanner error)
//! or where the token it did not expect starts (a parser error).
//!
//! go-yaml v2 was translated from an older libyaml, and the two have drifted apart in a few
//! places. Where go-yaml rejects what libyaml 0.2.5 accepts, this module rejects it too: a
//! `%YAML` directive other than 1.1, the escape `\/` in double-quoted scalars, and `?` inside a
//! plain scalar in a flow collection (go-yaml ends the scalar there and fails). go-yaml accepts
//! the escape `\'` in double-quoted scalars, which libyaml has rejected since 0.2.1: such escapes
//! are spelled `\x27` and the text read again (the one place where the text is changed). Known
//! remaining differences, all on text that libyaml rejects or reads otherwise than go-yaml:
//!
//! * in a flow collection, a plain scalar with a `:` followed by `,`, `[`, `]`, `{` or `}`
//!   (`{a:}`): go-yaml keeps the `:` in the scalar, libyaml fails;
//! * a tag written `!handle!suffix` or `!suffix` with `,`, `[` or `]` in it (`!a[1]`): go-yaml
//!   keeps those in the tag, libyaml fails (or, in a flow collection, ends the tag at a `,`);
//! * a byte order mark at the start of a line after the first: libyaml skips it, go-yaml (whose
//!   `is_bom` looks at the wrong place) reads it as text, so a key starts with U+FEFF or the
//!   document fails;
//! * a character YAML does not allow (a control character) after the first document: go-yaml's
//!   reader checks up to 512 bytes ahead, libyaml's 16 KiB, so [`parse`] may fail on one that
//!   Helm never reads.

mod libyaml;

use std::collections::{HashMap, HashSet};

use base64::Engine as _;
use base64::alphabet;
use base64::engine::{GeneralPurpose, GeneralPurposeConfig};
use libyaml::{Event, Located, Mark, ScalarStyle, Stage, SyntaxError};
use serde_json::{Map, Number, Value};

/// The deepest nesting of sequences and mappings a document may have.
///
/// go-yaml allows 10,000 levels, but a `serde_json::Value` nested that deep overflows a 2 MiB
/// thread stack (Tokio's default) when it is dropped, cloned or serialised in a debug build.
/// Aliases count with the depth of what they expand to.
pub const MAX_DEPTH: usize = 1000;

/// Why YAML text could not be turned into JSON, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {message}")]
pub struct Error {
    /// 1-based line of the offending text.
    pub line: usize,
    /// 1-based column (in characters) of the offending text.
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

/// Parses the first YAML document of `text` into JSON, as `sigs.k8s.io/yaml.Unmarshal` does.
///
/// Later documents are not read at all, so an error in them goes unnoticed, as in Helm. Text with
/// no document (empty, or only comments) and an empty document both give `Value::Null`.
///
/// # Errors
///
/// Returns an [`Error`] when the text is not YAML, when a tag does not fit its scalar, when a
/// key cannot be a JSON key, when a value is infinite or NaN, or when a limit is exceeded.
pub fn parse(text: &str) -> Result<Value, Error> {
    Ok(run(text, true)?.into_iter().next().unwrap_or(Value::Null))
}

/// Parses every document of a YAML stream into JSON, one value per document.
///
/// Text with no document gives an empty list; an empty document (`---` alone) gives
/// `Value::Null`. Anchors do not reach from one document into the next.
///
/// # Errors
///
/// Returns the first [`Error`] of any document, as [`parse`] does for the first one.
pub fn parse_documents(text: &str) -> Result<Vec<Value>, Error> {
    run(text, false)
}

// ---------------------------------------------------------------------------------------------
// Driver

/// Reads `text` (only its first document if `first_only`) and decodes each document.
fn run(text: &str, first_only: bool) -> Result<Vec<Value>, Error> {
    // libyaml drops a byte order mark at the start of the stream, as go-yaml does. Dropping it
    // here keeps libyaml's byte offsets offsets into `text`.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let first = read(text, &[], first_only);
    if first.quote_escape_at.is_none() {
        return first.result;
    }
    // go-yaml accepts the escape `\'` in double-quoted scalars, which libyaml has rejected since
    // 0.2.1, so such escapes are spelled `\x27` (the same character to both) and the text read
    // again. Which `\'` are escapes only a reading can tell: start with all of them, drop those
    // the reading finds outside double-quoted scalars, add those of a double-quoted scalar
    // libyaml still stops at, until a reading needs no change.
    let mut escapes = quote_escapes(text);
    for _ in 0..MAX_RESPELLINGS {
        let (respelled, at) = respell(text, &escapes);
        let outcome = read(&respelled, &at, first_only);
        if !outcome.stray.is_empty() {
            let mut stray = outcome.stray.iter().peekable();
            escapes.retain(|escape| stray.next_if_eq(&escape).is_none());
            continue;
        }
        let Some(quote) = outcome.quote_escape_at else {
            return outcome.result;
        };
        let quote = quote.saturating_sub(2 * at.partition_point(|&a| a < quote));
        let known = escapes.len();
        escapes.extend(
            text.get(quote..)
                .map(double_quoted_escapes)
                .into_iter()
                .flatten()
                .filter(|&(_, escape)| escape == '\'')
                .map(|(offset, _)| quote + offset),
        );
        escapes.sort_unstable();
        escapes.dedup();
        if escapes.len() == known {
            break;
        }
    }
    first.result
}

/// How many times a text may be read again with `\'` escapes respelled.
const MAX_RESPELLINGS: usize = 8;

/// What one reading of a text gave.
struct Outcome {
    result: Result<Vec<Value>, Error>,
    /// If libyaml stopped at a `\'` escape: the byte offset of the scalar's opening quote.
    quote_escape_at: Option<usize>,
    /// The byte offsets in the original text of the respelled escapes that the reading found
    /// outside double-quoted scalars (so they were not escapes).
    stray: Vec<usize>,
}

/// Reads `text` with libyaml and decodes its documents. `respelled` holds the byte offsets (in
/// `text`, increasing) where `\x27` stands for a `\'` of the original text.
fn read(text: &str, respelled: &[usize], first_only: bool) -> Outcome {
    let mut stream = Stream {
        source: Source { text, respelled },
        parser: libyaml::Parser::new(text),
        read_to: 0,
        double_quoted: Vec::new(),
        quote_escape_at: None,
    };
    let mut values = Vec::new();
    let result = loop {
        let document = match stream.next_document() {
            Ok(Some(document)) => document,
            Ok(None) => break Ok(()),
            Err(error) => break Err(error),
        };
        match Decoder::new(&document).run() {
            Ok(value) => values.push(value),
            Err(error) => break Err(error),
        }
        if first_only {
            break Ok(());
        }
    };
    Outcome {
        result: result.map(|()| values),
        quote_escape_at: stream.quote_escape_at,
        stray: stream.stray(),
    }
}

/// The byte offsets of the backslashes of `\'` in `text`, leaving out escaped backslashes.
fn quote_escapes(text: &str) -> Vec<usize> {
    let mut escapes = Vec::new();
    let mut backslashes = 0usize;
    for (at, byte) in text.bytes().enumerate() {
        if byte == b'\'' && backslashes % 2 == 1 {
            escapes.push(at - 1);
        }
        backslashes = if byte == b'\\' { backslashes + 1 } else { 0 };
    }
    escapes
}

/// `text` with the `\'` at each of `escapes` spelled `\x27`, and where those now are.
fn respell(text: &str, escapes: &[usize]) -> (String, Vec<usize>) {
    let mut out = String::with_capacity(text.len() + 2 * escapes.len());
    let mut at = Vec::with_capacity(escapes.len());
    let mut copied = 0;
    for &escape in escapes {
        out.push_str(text.get(copied..escape).unwrap_or_default());
        at.push(out.len());
        out.push_str("\\x27");
        copied = escape + 2;
    }
    out.push_str(text.get(copied..).unwrap_or_default());
    (out, at)
}

/// The escapes of the double-quoted scalar opening at the start of `text`: the byte offset of
/// each backslash and the character after it.
fn double_quoted_escapes(text: &str) -> impl Iterator<Item = (usize, char)> + '_ {
    let mut chars = text.char_indices().skip(1);
    std::iter::from_fn(move || {
        loop {
            match chars.next()? {
                (_, '"') => return None,
                (at, '\\') => return chars.next().map(|(_, escape)| (at, escape)),
                _ => {}
            }
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Positions

/// Where a node or an error is: 1-based line and column (in characters).
#[derive(Debug, Clone, Copy)]
struct Pos {
    line: usize,
    column: usize,
}

impl Pos {
    fn error(self, message: impl Into<String>) -> Error {
        Error {
            line: self.line,
            column: self.column,
            message: message.into(),
        }
    }
}

fn is_line_break(c: char) -> bool {
    matches!(c, '\n' | '\r' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

/// Moves `mark` past `c` as libyaml counts (`next` is the character after `c`).
fn advance(mark: &mut Mark, c: char, next: Option<char>) {
    mark.index += c.len_utf8();
    if c == '\r' && next == Some('\n') {
        // `\r\n` is one line break, counted at the `\n`.
    } else if is_line_break(c) {
        mark.line += 1;
        mark.column = 0;
    } else {
        mark.column += 1;
    }
}

/// The text libyaml reads, and where `\x27` stands in it for `\'` (see [`run`]).
struct Source<'a> {
    text: &'a str,
    respelled: &'a [usize],
}

impl Source<'_> {
    /// The position of a mark, as it is in the original text.
    fn pos(&self, mark: Mark) -> Pos {
        let mut column = mark.column + 1;
        if !self.respelled.is_empty() {
            let before = self.text.get(..mark.index).unwrap_or_default();
            let line_start = before
                .char_indices()
                .rfind(|&(_, c)| is_line_break(c))
                .map_or(0, |(at, c)| at + c.len_utf8());
            let longer = self.respelled.partition_point(|&a| a < mark.index)
                - self.respelled.partition_point(|&a| a < line_start);
            column = column.saturating_sub(2 * longer).max(1);
        }
        Pos {
            line: mark.line + 1,
            column,
        }
    }

    /// Where a node whose event starts at `start` has its content: past its anchor and tag, if
    /// it has them, and the blanks, comments and line breaks after them. For an empty node,
    /// that is where the next token starts. (libyaml starts a node's event at its first
    /// property, and an empty node's where the token before it ends.)
    fn content(&self, start: Mark, anchor: bool, tag: bool) -> Mark {
        let mut properties = usize::from(anchor) + usize::from(tag);
        let mut mark = start;
        let mut chars = self
            .text
            .get(start.index..)
            .unwrap_or_default()
            .chars()
            .peekable();
        // Inside an anchor (`&`), a tag (`!`) or a comment (`#`).
        let mut inside = None;
        while let Some(&c) = chars.peek() {
            let skip = match inside {
                Some('#') => !is_line_break(c),
                Some('!') => !(is_line_break(c) || c == ' ' || c == '\t'),
                Some(_) => c.is_ascii_alphanumeric() || c == '-' || c == '_',
                None if matches!(c, '&' | '!') && properties > 0 => {
                    properties -= 1;
                    inside = Some(c);
                    true
                }
                None if c == '#' => {
                    inside = Some(c);
                    true
                }
                None => c == ' ' || c == '\t' || is_line_break(c),
            };
            if !skip && inside.take().is_none() {
                break;
            }
            if skip {
                chars.next();
                advance(&mut mark, c, chars.peek().copied());
            }
        }
        mark
    }

    /// Our error for libyaml's: its problem, and what it was reading. A scanner error is placed
    /// where the token it was reading starts, other errors where libyaml found the problem (for
    /// a parser error, where the token it did not expect starts).
    fn syntax_error(&self, error: SyntaxError) -> Error {
        let problem = error.problem;
        let (mark, message) = match (error.stage, error.context) {
            (Stage::Reader, _) => {
                // libyaml gives the byte offset only.
                let mut mark = Mark {
                    index: 0,
                    line: 0,
                    column: 0,
                };
                let mut chars = self.text.chars().peekable();
                while mark.index < error.problem_mark.index
                    && let Some(c) = chars.next()
                {
                    advance(&mut mark, c, chars.peek().copied());
                }
                let found = chars.next().map(u32::from).unwrap_or_default();
                (mark, format!("{problem} (found U+{found:04X})"))
            }
            (stage, Some((context, start))) => {
                let mut message = format!("{problem} {context}");
                if context.ends_with("an anchor") || context.ends_with("an alias") {
                    message.push_str(
                        " (an anchor name may contain only ASCII letters, digits, `-` and `_`)",
                    );
                }
                let mark = if stage == Stage::Scanner {
                    start
                } else {
                    error.problem_mark
                };
                (mark, message)
            }
            (_, None) => (error.problem_mark, problem),
        };
        self.pos(mark).error(message)
    }
}

// ---------------------------------------------------------------------------------------------
// Documents as node trees

type NodeId = usize;

/// One document, as go-yaml's parser builds it before decoding: every node, with aliases
/// pointing at the node their anchor names.
struct Document {
    nodes: Vec<Node>,
    root: NodeId,
}

struct Node {
    pos: Pos,
    kind: NodeKind,
}

enum NodeKind {
    Scalar {
        value: String,
        /// The full tag (`tag:yaml.org,2002:str`, `!local`, `!`), if one was written.
        tag: Option<String>,
        /// Whether the scalar was written plain (not quoted, not a block scalar).
        plain: bool,
    },
    Sequence(Vec<NodeId>),
    /// Keys and values, alternating.
    Mapping(Vec<NodeId>),
    Alias {
        target: NodeId,
        anchor: String,
    },
}

const YAML_TAG_PREFIX: &str = "tag:yaml.org,2002:";

/// Reads a YAML stream document by document.
struct Stream<'a> {
    source: Source<'a>,
    parser: libyaml::Parser<'a>,
    /// The byte offset up to which libyaml has read.
    read_to: usize,
    /// Where the double-quoted scalars read so far are (start and end byte offsets), kept only
    /// when escapes were respelled.
    double_quoted: Vec<(usize, usize)>,
    /// See [`Outcome::quote_escape_at`].
    quote_escape_at: Option<usize>,
}

impl Stream<'_> {
    fn next_event(&mut self) -> Result<Located, Error> {
        match self.parser.next_event() {
            Ok(located) => {
                self.read_to = self.read_to.max(located.end.index);
                Ok(located)
            }
            Err(error) => {
                let at = error.problem_mark.index;
                self.read_to = self.read_to.max(at);
                let text = self.source.text.get(at..).unwrap_or_default();
                if error.problem == "found unknown escape character" && text.starts_with("\\'") {
                    self.quote_escape_at = error.context.as_ref().map(|(_, start)| start.index);
                }
                Err(self.source.syntax_error(error))
            }
        }
    }

    /// Builds the node tree of the next document, or returns `None` at the end of the stream.
    fn next_document(&mut self) -> Result<Option<Document>, Error> {
        loop {
            let located = self.next_event()?;
            let pos = self.source.pos(located.start);
            return match located.event {
                Event::StreamStart => continue,
                Event::StreamEnd => Ok(None),
                Event::DocumentStart {
                    version: Some(version),
                } if version != (1, 1) => Err(pos.error(
                    "found incompatible YAML document: go-yaml reads YAML 1.1 only (write \
                     `%YAML 1.1` or no %YAML directive)",
                )),
                Event::DocumentStart { .. } => self.build().map(Some),
                other => Err(pos.error(format!("unexpected YAML event {other:?}"))),
            };
        }
    }

    fn build(&mut self) -> Result<Document, Error> {
        let mut builder = TreeBuilder {
            nodes: Vec::new(),
            open: Vec::new(),
            anchors: HashMap::new(),
            root: None,
        };
        loop {
            let Located { event, start, end } = self.next_event()?;
            match event {
                Event::Scalar {
                    value,
                    anchor,
                    tag,
                    style,
                } => {
                    let content = self.source.content(start, anchor.is_some(), tag.is_some());
                    let pos = self.source.pos(content);
                    if style == ScalarStyle::DoubleQuoted {
                        self.check_double_quoted(content.index, end.index, pos)?;
                    }
                    let plain = style == ScalarStyle::Plain;
                    if plain && builder.in_flow() && value.contains('?') {
                        return Err(pos.error(
                            "found `?` in a plain scalar in a flow collection: go-yaml (YAML \
                             1.1) ends the scalar there and rejects the rest (quote the scalar)",
                        ));
                    }
                    let node = NodeKind::Scalar { value, tag, plain };
                    builder.add(pos, anchor, node, None)?;
                }
                Event::Alias { anchor } => {
                    let pos = self.source.pos(start);
                    let Some(&target) = builder.anchors.get(&anchor) else {
                        return Err(pos.error(format!("unknown anchor '{anchor}' referenced")));
                    };
                    builder.add(pos, None, NodeKind::Alias { target, anchor }, None)?;
                }
                Event::SequenceStart { anchor, tag, flow } => {
                    let content = self.source.content(start, anchor.is_some(), tag.is_some());
                    let node = NodeKind::Sequence(Vec::new());
                    builder.add(self.source.pos(content), anchor, node, Some(flow))?;
                }
                Event::MappingStart { anchor, tag, flow } => {
                    let content = self.source.content(start, anchor.is_some(), tag.is_some());
                    let node = NodeKind::Mapping(Vec::new());
                    builder.add(self.source.pos(content), anchor, node, Some(flow))?;
                }
                Event::SequenceEnd | Event::MappingEnd => {
                    builder.open.pop();
                }
                Event::DocumentEnd => break,
                other => {
                    let pos = self.source.pos(start);
                    return Err(pos.error(format!("unexpected YAML event {other:?}")));
                }
            }
        }
        match builder.root {
            Some(root) => Ok(Document {
                nodes: builder.nodes,
                root,
            }),
            None => {
                Err(Pos { line: 1, column: 1 }.error("the YAML parser gave a document no root"))
            }
        }
    }

    /// Rejects `\/`, which libyaml accepts in double-quoted scalars but go-yaml (YAML 1.1)
    /// does not, and notes where the scalar is (for [`Stream::stray`]).
    fn check_double_quoted(&mut self, start: usize, end: usize, pos: Pos) -> Result<(), Error> {
        if !self.source.respelled.is_empty() {
            self.double_quoted.push((start, end));
        }
        let scalar = self.source.text.get(start..end).unwrap_or_default();
        if scalar.contains("\\/") && double_quoted_escapes(scalar).any(|(_, c)| c == '/') {
            return Err(pos.error(
                "found unknown escape character `\\/` while parsing a quoted scalar (YAML 1.1 \
                 has no such escape; write `/`)",
            ));
        }
        Ok(())
    }

    /// The original offsets of the respelled escapes read outside double-quoted scalars.
    fn stray(&self) -> Vec<usize> {
        let mut spans = self.double_quoted.iter().peekable();
        let mut stray = Vec::new();
        for (n, &at) in self.source.respelled.iter().enumerate() {
            if at >= self.read_to {
                break;
            }
            while spans.next_if(|&&(_, end)| end <= at).is_some() {}
            if spans.peek().is_none_or(|&&(start, _)| start > at) {
                stray.push(at - 2 * n);
            }
        }
        stray
    }
}

struct TreeBuilder {
    nodes: Vec<Node>,
    /// The sequences and mappings still open, innermost last, and whether each is a flow one.
    open: Vec<(NodeId, bool)>,
    /// The anchors defined so far in this document, and the nodes they name.
    anchors: HashMap<String, NodeId>,
    root: Option<NodeId>,
}

impl TreeBuilder {
    /// Adds a node; `flow` is `Some` for a sequence or mapping, which stays open until its end.
    fn add(
        &mut self,
        pos: Pos,
        anchor: Option<String>,
        kind: NodeKind,
        flow: Option<bool>,
    ) -> Result<(), Error> {
        let id = self.nodes.len();
        self.nodes.push(Node { pos, kind });
        if let Some(anchor) = anchor {
            self.anchors.insert(anchor, id);
        }
        match self.open.last() {
            Some(&(parent, _)) => match &mut self.nodes[parent].kind {
                NodeKind::Sequence(children) | NodeKind::Mapping(children) => children.push(id),
                _ => return Err(pos.error("the YAML parser nested a node in a scalar")),
            },
            None if self.root.is_none() => self.root = Some(id),
            None => return Err(pos.error("the YAML parser produced two roots for a document")),
        }
        if let Some(flow) = flow {
            self.open.push((id, flow));
        }
        Ok(())
    }

    fn in_flow(&self) -> bool {
        self.open.last().is_some_and(|&(_, flow)| flow)
    }
}
// ---------------------------------------------------------------------------------------------
// Decoding node trees, as go-yaml v2 decodes into `interface{}` and sigs.k8s.io/yaml converts

/// A scalar as go-yaml v2 resolves it: the dynamic Go type matters for map keys.
#[derive(Debug, Clone)]
enum GoScalar {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Str(String),
}

/// Errors that only surface when the decoded document is converted to JSON, after go-yaml has
/// finished: they count only if the value that causes them survives into the result (a later
/// duplicate key can replace it).
#[derive(Debug, Default)]
struct Deferred {
    /// A key that cannot be a JSON key (sigs.k8s.io/yaml's conversion fails first).
    key: Option<Error>,
    /// An infinite or NaN value (json.Marshal fails afterwards).
    value: Option<Error>,
}

impl Deferred {
    fn absorb(&mut self, other: Deferred) {
        if self.key.is_none() {
            self.key = other.key;
        }
        if self.value.is_none() {
            self.value = other.value;
        }
    }
}

/// A decoded node waiting on the value stack.
enum Item {
    Scalar(GoScalar, Pos),
    Collection(Value, Deferred),
}

impl Item {
    fn into_json(self) -> (Value, Deferred) {
        match self {
            Item::Collection(value, deferred) => (value, deferred),
            Item::Scalar(scalar, pos) => {
                let mut deferred = Deferred::default();
                let value = match scalar {
                    GoScalar::Null => Value::Null,
                    GoScalar::Bool(b) => Value::Bool(b),
                    GoScalar::Int(i) => Value::Number(i.into()),
                    GoScalar::Uint(u) => Value::Number(u.into()),
                    GoScalar::Str(s) => Value::String(s),
                    GoScalar::Float(f) => match Number::from_f64(f) {
                        Some(n) => Value::Number(n),
                        None => {
                            let name = if f.is_nan() {
                                "NaN"
                            } else if f > 0.0 {
                                "+Inf"
                            } else {
                                "-Inf"
                            };
                            deferred.value = Some(pos.error(format!(
                                "unsupported value {name}: JSON cannot represent infinity or NaN \
                                 (quote the value to keep it as a string)"
                            )));
                            Value::Null
                        }
                    },
                };
                (value, deferred)
            }
        }
    }
}

/// A Go map key's identity: equal identities are the same key in a `map[interface{}]interface{}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum KeyId {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    /// The bits of a float, with -0 folded into +0. NaN has no identity (NaN != NaN).
    Float(u64),
    Str(String),
}

fn key_id(key: &GoScalar) -> Option<KeyId> {
    Some(match key {
        GoScalar::Null => KeyId::Null,
        GoScalar::Bool(b) => KeyId::Bool(*b),
        GoScalar::Int(i) => KeyId::Int(*i),
        GoScalar::Uint(u) => KeyId::Uint(*u),
        GoScalar::Float(f) if f.is_nan() => return None,
        GoScalar::Float(f) => KeyId::Float(if *f == 0.0 { 0 } else { f.to_bits() }),
        GoScalar::Str(s) => KeyId::Str(s.clone()),
    })
}

struct Entry {
    key: GoScalar,
    key_pos: Pos,
    value: Value,
    deferred: Deferred,
    /// When the entry was last written, to settle keys that only collide as strings.
    written: usize,
}

/// A mapping being decoded: Go map semantics, then sigs.k8s.io/yaml's key conversion.
struct MapBuilder {
    entries: Vec<Entry>,
    index: HashMap<KeyId, usize>,
    writes: usize,
}

impl MapBuilder {
    fn new() -> Self {
        MapBuilder {
            entries: Vec::new(),
            index: HashMap::new(),
            writes: 0,
        }
    }

    fn insert(&mut self, key: GoScalar, key_pos: Pos, item: Item) {
        let (value, deferred) = item.into_json();
        let id = key_id(&key);
        let entry = Entry {
            key,
            key_pos,
            value,
            deferred,
            written: self.writes,
        };
        self.writes += 1;
        match id {
            Some(id) => match self.index.get(&id) {
                // Go replaces the value, and for float keys the key too (+0 vs -0).
                Some(&at) => self.entries[at] = entry,
                None => {
                    self.index.insert(id, self.entries.len());
                    self.entries.push(entry);
                }
            },
            None => self.entries.push(entry),
        }
    }

    fn finish(self) -> Item {
        let mut deferred = Deferred::default();
        let mut pairs = Vec::with_capacity(self.entries.len());
        for entry in self.entries {
            match json_key(&entry.key) {
                Ok(key) => pairs.push((key, entry.written, entry.value, entry.deferred)),
                Err(message) => {
                    if deferred.key.is_none() {
                        deferred.key = Some(entry.key_pos.error(message));
                    }
                }
            }
        }
        // Sorted like json.Marshal. For keys that only collide as strings (`1` and `"1"`) Go keeps
        // whichever its randomised map iteration sees last; here, the one written last.
        pairs.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut map = Map::new();
        let mut pairs = pairs.into_iter().peekable();
        while let Some((key, _, value, entry_deferred)) = pairs.next() {
            if pairs.peek().is_some_and(|next| next.0 == key) {
                continue;
            }
            deferred.absorb(entry_deferred);
            map.insert(key, value);
        }
        Item::Collection(Value::Object(map), deferred)
    }
}

/// The JSON key sigs.k8s.io/yaml makes of a decoded YAML key.
fn json_key(key: &GoScalar) -> Result<String, String> {
    match key {
        GoScalar::Str(s) => Ok(s.clone()),
        GoScalar::Int(i) => Ok(i.to_string()),
        GoScalar::Bool(b) => Ok(b.to_string()),
        GoScalar::Float(f) => Ok(format_float32(*f)),
        GoScalar::Null => Err(
            "unsupported map key: a null key (empty, `~` or `null`) cannot \
                               become a JSON key; quote it to make it a string"
                .to_owned(),
        ),
        GoScalar::Uint(u) => Err(format!(
            "unsupported map key {u}: sigs.k8s.io/yaml cannot turn an integer above \
             9223372036854775807 into a JSON key; quote it to make it a string"
        )),
    }
}

/// Go's `strconv.FormatFloat(f, 'g', -1, 32)`, with sigs.k8s.io/yaml's names for the specials:
/// how sigs.k8s.io/yaml turns a float key into a JSON key, and how Go's YAML-to-JSON decoding
/// turns a float into a string field (Chart.yaml's `version: 1.10` is `1.1`).
pub(crate) fn format_float32(f: f64) -> String {
    // Narrowing to f32 rounds to nearest, overflowing to infinity, as Go's float32() does.
    let narrow = f as f32;
    if narrow.is_nan() {
        return ".nan".to_owned();
    }
    if narrow.is_infinite() {
        return if narrow > 0.0 { ".inf" } else { "-.inf" }.to_owned();
    }
    if narrow == 0.0 {
        return if narrow.is_sign_negative() { "-0" } else { "0" }.to_owned();
    }
    // Rust's `{:e}` prints the shortest digits that read back as the same f32, as Go does.
    let scientific = format!("{narrow:e}");
    let (negative, unsigned) = match scientific.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, scientific.as_str()),
    };
    let (mantissa, exponent) = unsigned.split_once('e').unwrap_or((unsigned, "0"));
    let digits: Vec<u8> = mantissa.bytes().filter(u8::is_ascii_digit).collect();
    let exponent: i64 = exponent.parse().unwrap_or(0);
    let nd = i64::try_from(digits.len()).unwrap_or(i64::MAX);
    let dp = exponent + 1; // the decimal point sits after `dp` digits
    let digit = |i: i64| -> char {
        usize::try_from(i)
            .ok()
            .and_then(|i| digits.get(i))
            .map_or('0', |&d| char::from(d))
    };
    let mut out = String::new();
    if negative {
        out.push('-');
    }
    if !(-4..6).contains(&exponent) {
        out.push(digit(0));
        if nd > 1 {
            out.push('.');
            (1..nd).for_each(|i| out.push(digit(i)));
        }
        out.push('e');
        out.push(if exponent < 0 { '-' } else { '+' });
        let magnitude = exponent.unsigned_abs();
        if magnitude < 10 {
            out.push('0');
        }
        out.push_str(&magnitude.to_string());
    } else {
        if dp > 0 {
            (0..dp).for_each(|i| out.push(digit(i)));
        } else {
            out.push('0');
        }
        let precision = (nd - dp).max(0);
        if precision > 0 {
            out.push('.');
            (1..=precision).for_each(|i| out.push(digit(dp + i - 1)));
        }
    }
    out
}

/// The steps of the (iterative, so stack-safe) decoder.
enum Task {
    /// Decode a node and push its value onto the value stack.
    Eval(NodeId),
    /// Leave the alias node entered by `Eval` or a merge.
    EndAlias(NodeId),
    /// Pop `len` values into a sequence.
    FinishSeq { len: usize },
    /// Pop the innermost map builder into a mapping value.
    FinishMap,
    /// Decode the pairs of a mapping node, from pair `pair` on, into the innermost builder.
    Fill { map: NodeId, pair: usize },
    /// Move the decoded key on the value stack to the key stack, checking it is a scalar.
    CheckKey(NodeId),
    /// Store the decoded value under the innermost key in the innermost builder.
    SetEntry,
    /// Merge a `<<` value into the innermost builder.
    Merge(NodeId),
    /// Merge one element of a `<<` sequence into the innermost builder.
    MergeItem(NodeId),
}

/// go-yaml v2's alias expansion limit: the share of decode steps that may come from aliases,
/// 99% for small documents, falling to 10% for large ones.
fn allowed_alias_ratio(decode_count: u64) -> f64 {
    const LOW: u64 = 400_000;
    const HIGH: u64 = 4_000_000;
    if decode_count <= LOW {
        0.99
    } else if decode_count >= HIGH {
        0.10
    } else {
        let progress = (decode_count - LOW) as f64 / (HIGH - LOW) as f64;
        0.99 - 0.89 * progress
    }
}

struct Decoder<'a> {
    doc: &'a Document,
    tasks: Vec<Task>,
    items: Vec<Item>,
    keys: Vec<(GoScalar, Pos)>,
    builders: Vec<MapBuilder>,
    /// Alias nodes being expanded, to catch an anchor that contains its own alias.
    active_aliases: HashSet<NodeId>,
    alias_depth: usize,
    decode_count: u64,
    alias_count: u64,
    depth: usize,
}

impl<'a> Decoder<'a> {
    fn new(doc: &'a Document) -> Self {
        Decoder {
            doc,
            tasks: Vec::new(),
            items: Vec::new(),
            keys: Vec::new(),
            builders: Vec::new(),
            active_aliases: HashSet::new(),
            alias_depth: 0,
            decode_count: 0,
            alias_count: 0,
            depth: 0,
        }
    }

    fn node(&self, id: NodeId) -> &'a Node {
        &self.doc.nodes[id]
    }

    fn run(mut self) -> Result<Value, Error> {
        let root = self.doc.root;
        let root_pos = self.node(root).pos;
        self.tick(root_pos)?; // go-yaml counts the document node too
        self.tasks.push(Task::Eval(root));
        while let Some(task) = self.tasks.pop() {
            self.step(task)?;
        }
        let Some(item) = self.items.pop() else {
            return Err(root_pos.error("internal error: the document decoded to nothing"));
        };
        let (value, deferred) = item.into_json();
        if let Some(error) = deferred.key {
            return Err(error);
        }
        if let Some(error) = deferred.value {
            return Err(error);
        }
        Ok(value)
    }

    /// Counts one decode step, as go-yaml's `unmarshal` does, and enforces its alias limit.
    fn tick(&mut self, pos: Pos) -> Result<(), Error> {
        self.decode_count += 1;
        if self.alias_depth > 0 {
            self.alias_count += 1;
        }
        let ratio = self.alias_count as f64 / self.decode_count as f64;
        if self.alias_count > 100
            && self.decode_count > 1000
            && ratio > allowed_alias_ratio(self.decode_count)
        {
            return Err(pos.error(format!(
                "document contains excessive aliasing: {} of {} decoded nodes come from \
                 expanding aliases",
                self.alias_count, self.decode_count
            )));
        }
        Ok(())
    }

    fn enter_alias(&mut self, alias: NodeId) -> Result<(), Error> {
        if !self.active_aliases.insert(alias) {
            let node = self.node(alias);
            let name = match &node.kind {
                NodeKind::Alias { anchor, .. } => anchor.as_str(),
                _ => "",
            };
            return Err(node
                .pos
                .error(format!("anchor '{name}' value contains itself")));
        }
        self.alias_depth += 1;
        Ok(())
    }

    fn open_collection(&mut self, pos: Pos) -> Result<(), Error> {
        if self.depth >= MAX_DEPTH {
            return Err(pos.error(format!(
                "exceeded max depth of {MAX_DEPTH} nested collections"
            )));
        }
        self.depth += 1;
        Ok(())
    }

    fn step(&mut self, task: Task) -> Result<(), Error> {
        match task {
            Task::Eval(id) => self.eval(id),
            Task::EndAlias(alias) => {
                self.active_aliases.remove(&alias);
                self.alias_depth = self.alias_depth.saturating_sub(1);
                Ok(())
            }
            Task::FinishSeq { len } => {
                self.depth = self.depth.saturating_sub(1);
                let start = self.items.len().saturating_sub(len);
                let mut deferred = Deferred::default();
                let values = self
                    .items
                    .drain(start..)
                    .map(|item| {
                        let (value, item_deferred) = item.into_json();
                        deferred.absorb(item_deferred);
                        value
                    })
                    .collect();
                self.items
                    .push(Item::Collection(Value::Array(values), deferred));
                Ok(())
            }
            Task::FinishMap => {
                self.depth = self.depth.saturating_sub(1);
                match self.builders.pop() {
                    Some(builder) => {
                        self.items.push(builder.finish());
                        Ok(())
                    }
                    None => Err(Error {
                        line: 1,
                        column: 1,
                        message: "internal error: no mapping to finish".to_owned(),
                    }),
                }
            }
            Task::Fill { map, pair } => {
                let NodeKind::Mapping(children) = &self.node(map).kind else {
                    return Ok(());
                };
                let (Some(&key), Some(&value)) =
                    (children.get(2 * pair), children.get(2 * pair + 1))
                else {
                    return Ok(());
                };
                self.tasks.push(Task::Fill {
                    map,
                    pair: pair + 1,
                });
                if self.is_merge_key(key) {
                    self.tasks.push(Task::Merge(value));
                } else {
                    self.tasks.push(Task::SetEntry);
                    self.tasks.push(Task::Eval(value));
                    self.tasks.push(Task::CheckKey(key));
                    self.tasks.push(Task::Eval(key));
                }
                Ok(())
            }
            Task::CheckKey(key) => {
                let pos = self.node(key).pos;
                match self.items.pop() {
                    Some(Item::Scalar(scalar, _)) => {
                        self.keys.push((scalar, pos));
                        Ok(())
                    }
                    Some(Item::Collection(value, _)) => {
                        let what = if value.is_array() {
                            "a sequence"
                        } else {
                            "a mapping"
                        };
                        Err(pos.error(format!(
                            "invalid map key: {what} cannot be a mapping key ({})",
                            abbreviate(&value)
                        )))
                    }
                    None => Err(pos.error("internal error: missing mapping key")),
                }
            }
            Task::SetEntry => {
                let (Some(item), Some((key, key_pos)), Some(builder)) =
                    (self.items.pop(), self.keys.pop(), self.builders.last_mut())
                else {
                    return Err(Error {
                        line: 1,
                        column: 1,
                        message: "internal error: incomplete mapping entry".to_owned(),
                    });
                };
                builder.insert(key, key_pos, item);
                Ok(())
            }
            Task::Merge(value) => self.merge(value),
            Task::MergeItem(item) => {
                let node = self.node(item);
                match &node.kind {
                    NodeKind::Mapping(_) => self.merge_mapping(item),
                    NodeKind::Alias { target, .. }
                        if matches!(self.node(*target).kind, NodeKind::Mapping(_)) =>
                    {
                        self.merge_mapping(item)
                    }
                    _ => Err(merge_error(node.pos)),
                }
            }
        }
    }

    fn eval(&mut self, id: NodeId) -> Result<(), Error> {
        let node = self.node(id);
        self.tick(node.pos)?;
        match &node.kind {
            NodeKind::Alias { target, .. } => {
                self.enter_alias(id)?;
                self.tasks.push(Task::EndAlias(id));
                self.tasks.push(Task::Eval(*target));
            }
            NodeKind::Scalar { value, tag, plain } => {
                let scalar = decode_scalar(value, tag.as_deref(), *plain)
                    .map_err(|message| node.pos.error(message))?;
                self.items.push(Item::Scalar(scalar, node.pos));
            }
            NodeKind::Sequence(children) => {
                self.open_collection(node.pos)?;
                self.tasks.push(Task::FinishSeq {
                    len: children.len(),
                });
                self.tasks
                    .extend(children.iter().rev().map(|&child| Task::Eval(child)));
            }
            NodeKind::Mapping(_) => {
                self.open_collection(node.pos)?;
                self.builders.push(MapBuilder::new());
                self.tasks.push(Task::FinishMap);
                self.tasks.push(Task::Fill { map: id, pair: 0 });
            }
        }
        Ok(())
    }

    /// go-yaml's `isMerge`: a scalar `<<` that is plain and untagged (or tagged `!`), or tagged
    /// `!!merge`.
    fn is_merge_key(&self, key: NodeId) -> bool {
        match &self.node(key).kind {
            NodeKind::Scalar { value, tag, plain } if value == "<<" => match tag.as_deref() {
                None => *plain,
                Some("!") => true,
                Some(tag) => tag.strip_prefix(YAML_TAG_PREFIX) == Some("merge"),
            },
            _ => false,
        }
    }

    /// go-yaml's `merge`: the value of a `<<` key.
    fn merge(&mut self, value: NodeId) -> Result<(), Error> {
        let node = self.node(value);
        match &node.kind {
            NodeKind::Mapping(_) => self.merge_mapping(value),
            NodeKind::Alias { target, .. }
                if matches!(self.node(*target).kind, NodeKind::Mapping(_)) =>
            {
                self.merge_mapping(value)
            }
            NodeKind::Sequence(children) => {
                // The last element is merged first, so the earlier ones win.
                self.tasks
                    .extend(children.iter().map(|&child| Task::MergeItem(child)));
                Ok(())
            }
            _ => Err(merge_error(node.pos)),
        }
    }

    /// Decodes a mapping node, or an alias of one, into the innermost builder.
    fn merge_mapping(&mut self, id: NodeId) -> Result<(), Error> {
        let node = self.node(id);
        self.tick(node.pos)?;
        match &node.kind {
            NodeKind::Alias { target, .. } => {
                self.enter_alias(id)?;
                self.tasks.push(Task::EndAlias(id));
                self.tick(self.node(*target).pos)?;
                self.tasks.push(Task::Fill {
                    map: *target,
                    pair: 0,
                });
            }
            _ => self.tasks.push(Task::Fill { map: id, pair: 0 }),
        }
        Ok(())
    }
}

/// The JSON text of `value`, cut short for an error message.
fn abbreviate(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= 60 {
        return text;
    }
    let mut short: String = text.chars().take(57).collect();
    short.push_str("...");
    short
}

fn merge_error(pos: Pos) -> Error {
    pos.error("map merge requires map or sequence of maps as the value")
}

// ---------------------------------------------------------------------------------------------
// Scalars (go-yaml v2 resolve.go and decode.go)

/// The tags `resolve` knows about, by their suffix after `tag:yaml.org,2002:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Str,
    Bool,
    Int,
    Float,
    Null,
    Timestamp,
}

impl Kind {
    fn short(self) -> &'static str {
        match self {
            Kind::Str => "!!str",
            Kind::Bool => "!!bool",
            Kind::Int => "!!int",
            Kind::Float => "!!float",
            Kind::Null => "!!null",
            Kind::Timestamp => "!!timestamp",
        }
    }
}

/// Decodes a scalar node into the value go-yaml v2 stores in an `interface{}`.
fn decode_scalar(value: &str, tag: Option<&str>, plain: bool) -> Result<GoScalar, String> {
    let Some(tag) = tag else {
        return Ok(if plain {
            resolve(None, value).1
        } else {
            GoScalar::Str(value.to_owned())
        });
    };
    let kind = match tag.strip_prefix(YAML_TAG_PREFIX) {
        Some("str") => Kind::Str,
        Some("bool") => Kind::Bool,
        Some("int") => Kind::Int,
        Some("float") => Kind::Float,
        Some("null") => Kind::Null,
        Some("timestamp") => Kind::Timestamp,
        Some("binary") => {
            let bytes =
                decode_base64(value).ok_or("!!binary value contains invalid base64 data")?;
            return Ok(GoScalar::Str(go_string_from_bytes(&bytes)));
        }
        // Any other tag, the non-specific `!` included: go-yaml keeps the text as a string.
        _ => return Ok(GoScalar::Str(value.to_owned())),
    };
    let (resolved, scalar) = resolve(Some(kind), value);
    if resolved == kind || kind == Kind::Str {
        return Ok(scalar);
    }
    if let (Kind::Float, GoScalar::Int(i)) = (kind, &scalar) {
        return Ok(GoScalar::Float(*i as f64));
    }
    Err(format!(
        "cannot decode {} `{value}` as a {}",
        resolved.short(),
        kind.short()
    ))
}

/// go-yaml v2's `resolve` for an untagged plain scalar (`tag` = `None`) or an explicit tag.
fn resolve(tag: Option<Kind>, input: &str) -> (Kind, GoScalar) {
    let string = || (Kind::Str, GoScalar::Str(input.to_owned()));
    if tag == Some(Kind::Str) {
        return string();
    }
    // The first character hints at what the scalar may be.
    let hint = match input.as_bytes().first() {
        None => b'N',
        Some(b'+' | b'-') => b'S',
        Some(b'0'..=b'9') => b'D',
        Some(b'y' | b'Y' | b'n' | b'N' | b't' | b'T' | b'f' | b'F' | b'o' | b'O' | b'~') => b'M',
        Some(b'.') => b'.',
        Some(_) => return string(),
    };
    if let Some(found) = resolve_table(input) {
        return found;
    }
    match hint {
        b'.' => {
            if let Some(f) = go_parse_float(input) {
                return (Kind::Float, GoScalar::Float(f));
            }
        }
        b'D' | b'S' => {
            if matches!(tag, None | Some(Kind::Timestamp)) && is_timestamp(input) {
                // Decoded into interface{}, go-yaml v2 keeps a timestamp as its text.
                return (Kind::Timestamp, GoScalar::Str(input.to_owned()));
            }
            let plain = input.replace('_', "");
            if let Some(i) = go_parse_int(&plain) {
                return (Kind::Int, GoScalar::Int(i));
            }
            if let Some(u) = go_parse_uint(&plain) {
                return (Kind::Int, GoScalar::Uint(u));
            }
            if is_yaml_style_float(&plain)
                && let Some(f) = go_parse_float(&plain)
            {
                return (Kind::Float, GoScalar::Float(f));
            }
            // Leftovers of go-yaml's pre-Go-1.13 binary literal support; reachable only by odd
            // forms such as `0b-101`.
            if let Some(digits) = plain.strip_prefix("0b") {
                if let Some(i) = parse_int_radix(digits, 2) {
                    return (Kind::Int, GoScalar::Int(i));
                }
                if let Some(u) = parse_uint_radix(digits, 2) {
                    return (Kind::Int, GoScalar::Uint(u));
                }
            } else if let Some(digits) = plain.strip_prefix("-0b")
                && let Some(i) = parse_int_radix(&format!("-{digits}"), 2)
            {
                return (Kind::Int, GoScalar::Int(i));
            }
        }
        _ => {}
    }
    string()
}

/// go-yaml v2's table of exact spellings.
fn resolve_table(input: &str) -> Option<(Kind, GoScalar)> {
    Some(match input {
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            (Kind::Bool, GoScalar::Bool(true))
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            (Kind::Bool, GoScalar::Bool(false))
        }
        "" | "~" | "null" | "Null" | "NULL" => (Kind::Null, GoScalar::Null),
        ".nan" | ".NaN" | ".NAN" => (Kind::Float, GoScalar::Float(f64::NAN)),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            (Kind::Float, GoScalar::Float(f64::INFINITY))
        }
        "-.inf" | "-.Inf" | "-.INF" => (Kind::Float, GoScalar::Float(f64::NEG_INFINITY)),
        _ => return None,
    })
}

/// The value of an ASCII digit or letter as a digit in bases up to 36.
fn digit_value(byte: u8) -> Option<u64> {
    match byte {
        b'0'..=b'9' => Some(u64::from(byte - b'0')),
        b'a'..=b'z' => Some(u64::from(byte - b'a') + 10),
        b'A'..=b'Z' => Some(u64::from(byte - b'A') + 10),
        _ => None,
    }
}

/// Accumulates `digits` in `base`; `None` on a bad digit or overflow. Empty gives 0.
fn accumulate(digits: &[u8], base: u64) -> Option<u64> {
    digits.iter().try_fold(0u64, |n, &byte| {
        let d = digit_value(byte).filter(|&d| d < base)?;
        n.checked_mul(base)?.checked_add(d)
    })
}

/// Go's `strconv.ParseUint(s, 0, 64)` for text without underscores.
fn go_parse_uint(s: &str) -> Option<u64> {
    let bytes = s.as_bytes();
    match bytes {
        [] => None,
        [b'0', prefix, rest @ ..] if !rest.is_empty() && matches!(prefix, b'b' | b'B') => {
            accumulate(rest, 2)
        }
        [b'0', prefix, rest @ ..] if !rest.is_empty() && matches!(prefix, b'o' | b'O') => {
            accumulate(rest, 8)
        }
        [b'0', prefix, rest @ ..] if !rest.is_empty() && matches!(prefix, b'x' | b'X') => {
            accumulate(rest, 16)
        }
        [b'0', rest @ ..] => accumulate(rest, 8),
        _ => accumulate(bytes, 10),
    }
}

/// Applies a sign to a magnitude within `i64`'s range.
fn signed(negative: bool, magnitude: u64) -> Option<i64> {
    if negative {
        0i64.checked_sub_unsigned(magnitude)
    } else {
        i64::try_from(magnitude).ok()
    }
}

fn split_sign(s: &str) -> (bool, &str) {
    match s.as_bytes().first() {
        Some(b'+') => (false, &s[1..]),
        Some(b'-') => (true, &s[1..]),
        _ => (false, s),
    }
}

/// Go's `strconv.ParseInt(s, 0, 64)` for text without underscores.
fn go_parse_int(s: &str) -> Option<i64> {
    let (negative, rest) = split_sign(s);
    signed(negative, go_parse_uint(rest)?)
}

/// Go's `strconv.ParseInt(s, base, 64)` with an explicit base.
fn parse_int_radix(s: &str, base: u64) -> Option<i64> {
    let (negative, rest) = split_sign(s);
    signed(negative, parse_uint_radix(rest, base)?)
}

/// Go's `strconv.ParseUint(s, base, 64)` with an explicit base.
fn parse_uint_radix(s: &str, base: u64) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    accumulate(s.as_bytes(), base)
}

/// go-yaml v2's float pattern `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`.
fn is_yaml_style_float(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = usize::from(matches!(b.first(), Some(b'+' | b'-')));
    let digits_from = |mut i: usize| {
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        i
    };
    if b.get(i) == Some(&b'.') {
        let end = digits_from(i + 1);
        if end == i + 1 {
            return false;
        }
        i = end;
    } else {
        let end = digits_from(i);
        if end == i {
            return false;
        }
        i = end;
        if b.get(i) == Some(&b'.') {
            i = digits_from(i + 1);
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let end = digits_from(i);
        if end == i {
            return false;
        }
        i = end;
    }
    i == b.len()
}

/// Go's `strconv.ParseFloat(s, 64)` for decimal text (what go-yaml can hand it: text starting
/// with `.`, or text matching its float pattern). Overflow is an error, as in Go.
fn go_parse_float(s: &str) -> Option<f64> {
    let b = s.as_bytes();
    let mut i = usize::from(matches!(b.first(), Some(b'+' | b'-')));
    let (mut saw_dot, mut saw_digits, mut underscores) = (false, false, false);
    while let Some(&c) = b.get(i) {
        match c {
            b'_' => underscores = true,
            b'.' if !saw_dot => saw_dot = true,
            b'0'..=b'9' => saw_digits = true,
            _ => break,
        }
        i += 1;
    }
    if !saw_digits {
        return None;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if !b.get(i).is_some_and(u8::is_ascii_digit) {
            return None;
        }
        while let Some(&c) = b.get(i) {
            match c {
                b'_' => underscores = true,
                b'0'..=b'9' => {}
                _ => break,
            }
            i += 1;
        }
    }
    if i != b.len() || (underscores && !underscores_ok(s)) {
        return None;
    }
    let f: f64 = if underscores {
        s.replace('_', "").parse().ok()?
    } else {
        s.parse().ok()?
    };
    f.is_finite().then_some(f)
}

/// Go's `underscoreOK`: underscores only between digits (or after a base prefix).
fn underscores_ok(s: &str) -> bool {
    let mut b = s.as_bytes();
    if let Some(b'+' | b'-') = b.first() {
        b = &b[1..];
    }
    let mut saw = b'^';
    let mut i = 0;
    let mut hex = false;
    if b.len() >= 2 && b[0] == b'0' && matches!(b[1] | 0x20, b'b' | b'o' | b'x') {
        i = 2;
        saw = b'0';
        hex = b[1] | 0x20 == b'x';
    }
    while let Some(&c) = b.get(i) {
        i += 1;
        if c.is_ascii_digit() || (hex && (c | 0x20).is_ascii_hexdigit()) {
            saw = b'0';
            continue;
        }
        if c == b'_' {
            if saw != b'0' {
                return false;
            }
            saw = b'_';
            continue;
        }
        if saw == b'_' {
            return false;
        }
        saw = b'!';
    }
    saw != b'_'
}

/// Whether go-yaml v2 reads `s` as a timestamp: Go's `time.Parse` with one of the layouts
/// `2006-1-2T15:4:5.999999999Z07:00`, the same with `t`, `2006-1-2 15:4:5.999999999` and
/// `2006-1-2`.
fn is_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    let leading = b.iter().take_while(|c| c.is_ascii_digit()).count();
    if leading != 4 || b.get(4) != Some(&b'-') {
        return false;
    }
    let Some((year, month, day, rest)) = timestamp_date(b) else {
        return false;
    };
    let valid_date = (1..=12).contains(&month) && day >= 1 && day <= days_in(month, year);
    if !valid_date {
        return false;
    }
    if rest.is_empty() {
        return true; // 2006-1-2
    }
    match rest[0] {
        b'T' | b't' => timestamp_time(&rest[1..], true),
        b' ' => {
            let spaces = rest.iter().take_while(|&&c| c == b' ').count();
            timestamp_time(&rest[spaces..], false)
        }
        _ => false,
    }
}

/// Go's `getnum(s, false)`: one or two digits.
fn go_getnum(b: &[u8]) -> Option<(u32, &[u8])> {
    let first = u32::from(*b.first().filter(|c| c.is_ascii_digit())? - b'0');
    match b.get(1) {
        Some(&c) if c.is_ascii_digit() => Some((first * 10 + u32::from(c - b'0'), &b[2..])),
        _ => Some((first, &b[1..])),
    }
}

fn timestamp_date(b: &[u8]) -> Option<(u32, u32, u32, &[u8])> {
    let year = b[..4]
        .iter()
        .fold(0u32, |n, &c| n * 10 + u32::from(c - b'0'));
    let (month, rest) = go_getnum(&b[5..])?;
    let rest = rest.strip_prefix(b"-")?;
    let (day, rest) = go_getnum(rest)?;
    Some((year, month, day, rest))
}

/// `15:4:5`, optional fraction, then a `Z07:00` zone if `zoned`, and nothing else.
fn timestamp_time(b: &[u8], zoned: bool) -> bool {
    let parse = || -> Option<()> {
        let (hour, rest) = go_getnum(b)?;
        let rest = rest.strip_prefix(b":")?;
        let (minute, rest) = go_getnum(rest)?;
        let rest = rest.strip_prefix(b":")?;
        let (second, mut rest) = go_getnum(rest)?;
        if hour >= 24 || minute >= 60 || second >= 60 {
            return None;
        }
        if rest.len() >= 2 && matches!(rest[0], b'.' | b',') && rest[1].is_ascii_digit() {
            let digits = rest[1..].iter().take_while(|c| c.is_ascii_digit()).count();
            rest = &rest[1 + digits..];
        }
        if zoned {
            rest = match rest.first() {
                Some(b'Z') => &rest[1..],
                Some(b'+' | b'-') if rest.len() >= 6 && rest[3] == b':' => {
                    let two = |p: &[u8]| -> Option<u32> {
                        p.iter()
                            .all(u8::is_ascii_digit)
                            .then(|| p.iter().fold(0u32, |n, &c| n * 10 + u32::from(c - b'0')))
                    };
                    if two(&rest[1..3])? > 24 || two(&rest[4..6])? > 60 {
                        return None;
                    }
                    &rest[6..]
                }
                _ => return None,
            };
        }
        rest.is_empty().then_some(())
    };
    parse().is_some()
}

fn days_in(month: u32, year: u32) -> u32 {
    match month {
        2 if year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400)) => {
            29
        }
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Go's `base64.StdEncoding.DecodeString`, which go-yaml decodes `!!binary` with: the padded
/// standard alphabet, `\r` and `\n` ignored (no other white space), and unused bits of the last
/// symbol need not be zero.
fn decode_base64(text: &str) -> Option<Vec<u8>> {
    const GO_STD_ENCODING: GeneralPurpose = GeneralPurpose::new(
        &alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
    );
    let symbols: Vec<u8> = text.bytes().filter(|&c| c != b'\r' && c != b'\n').collect();
    GO_STD_ENCODING.decode(symbols).ok()
}

/// A Go string made of arbitrary bytes, as json.Marshal writes it: each byte that is not part of
/// valid UTF-8 becomes U+FFFD.
fn go_string_from_bytes(mut bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    loop {
        match std::str::from_utf8(bytes) {
            Ok(valid) => {
                out.push_str(valid);
                return out;
            }
            Err(error) => {
                let (valid, rest) = bytes.split_at(error.valid_up_to());
                out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                out.push('\u{fffd}');
                bytes = rest.get(1..).unwrap_or_default();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// What a case must give: JSON (integers and floats told apart), or an error at a line and
    /// column whose message contains a text.
    enum Expect {
        Json(&'static str),
        Error(usize, usize, &'static str),
    }

    /// Every expectation was checked against helm v4.1.4 (`fromYaml` then `toJson`). Helm's
    /// numbers are all float64, so only values were compared there; whether a number is an
    /// integer or a float here follows go-yaml's resolution.
    const CASES: &[(&str, &str, Expect)] = &[
        (
            "helm_brief_example",
            "a: yes\nb: \"yes\"\nc: on\nd: 0755\ne: 1_000\nf: 0x1F\ng: 2001-12-14\nh: ~\ni: 1e3\nk: y\nl: 0b101\nm: +12\nn: 12.50\no: 123456789012345678901\np: -0o17\n",
            Expect::Json(
                r#"{"a":true,"b":"yes","c":true,"d":493,"e":1000,"f":31,"false":12.5,"g":"2001-12-14","h":null,"i":1000.0,"k":true,"l":5,"m":12,"o":1.2345678901234568e20,"p":-15}"#,
            ),
        ),
        (
            "booleans_true_forms",
            "a: y\nb: Y\nc: yes\nd: Yes\ne: YES\nf: true\ng: True\nh: TRUE\ni: on\nj: On\nk: ON\n",
            Expect::Json(
                r#"{"a":true,"b":true,"c":true,"d":true,"e":true,"f":true,"g":true,"h":true,"i":true,"j":true,"k":true}"#,
            ),
        ),
        (
            "booleans_false_forms",
            "a: n\nb: N\nc: no\nd: No\ne: NO\nf: false\ng: False\nh: FALSE\ni: off\nj: Off\nk: OFF\n",
            Expect::Json(
                r#"{"a":false,"b":false,"c":false,"d":false,"e":false,"f":false,"g":false,"h":false,"i":false,"j":false,"k":false}"#,
            ),
        ),
        (
            "not_booleans",
            "a: yEs\nb: oN\nc: nO\nd: tRUE\ne: \"no\"\nf: 'off'\n",
            Expect::Json(r#"{"a":"yEs","b":"oN","c":"nO","d":"tRUE","e":"no","f":"off"}"#),
        ),
        (
            "nulls",
            "a:\nb: ~\nc: null\nd: Null\ne: NULL\nf: nULL\ng: \"~\"\nh: ''\n",
            Expect::Json(
                r#"{"a":null,"b":null,"c":null,"d":null,"e":null,"f":"nULL","g":"~","h":""}"#,
            ),
        ),
        (
            "decimal_integers",
            "a: 0\nb: -0\nc: +7\nd: -12\ne: 1_000_000\nf: 1__0\ng: 1_\nh: _1\n",
            Expect::Json(r#"{"a":0,"b":0,"c":7,"d":-12,"e":1000000,"f":10,"g":1,"h":"_1"}"#),
        ),
        (
            "prefixed_integers",
            "a: 0x1F\nb: 0X1f\nc: 0o17\nd: 0O17\ne: -0o17\nf: 0b101\ng: 0B11\nh: -0b101\ni: 0755\nj: 00\nk: 0x\nl: 0b2\n",
            Expect::Json(
                r#"{"a":31,"b":31,"c":15,"d":15,"e":-15,"f":5,"g":3,"h":-5,"i":493,"j":0,"k":"0x","l":"0b2"}"#,
            ),
        ),
        (
            "go_yaml_binary_quirk",
            "a: 0b-101\nb: 0b+101\nc: -0b-101\n",
            Expect::Json(r#"{"a":-5,"b":5,"c":"-0b-101"}"#),
        ),
        (
            "leading_zero_non_octal_is_float",
            "a: 08\nb: 09.5\n",
            Expect::Json(r#"{"a":8.0,"b":9.5}"#),
        ),
        (
            "integer_limits",
            "a: 9223372036854775807\nb: 9223372036854775808\nc: -9223372036854775808\nd: -9223372036854775809\ne: 18446744073709551615\nf: 18446744073709551616\ng: 0xFFFFFFFFFFFFFFFFFF\n",
            Expect::Json(
                r#"{"a":9223372036854775807,"b":9223372036854775808,"c":-9223372036854775808,"d":-9.223372036854776e18,"e":18446744073709551615,"f":1.8446744073709552e19,"g":"0xFFFFFFFFFFFFFFFFFF"}"#,
            ),
        ),
        (
            "floats",
            "a: 1.5\nb: -1.5\nc: +.5\nd: .5\ne: 5.\nf: 1e3\ng: 1E-3\nh: 1.5e+3\ni: 6.02e23\nj: -0.0\nk: 12.50\n",
            Expect::Json(
                r#"{"a":1.5,"b":-1.5,"c":0.5,"d":0.5,"e":5.0,"f":1000.0,"g":0.001,"h":1500.0,"i":6.02e23,"j":-0.0,"k":12.5}"#,
            ),
        ),
        (
            "float_edge_forms",
            "a: .5_5\nb: ._5\nc: 1e400\nd: -1e400\ne: 1e-400\nf: 1.5.5\ng: 1e\nh: .\n",
            Expect::Json(
                r#"{"a":0.55,"b":"._5","c":"1e400","d":"-1e400","e":0.0,"f":"1.5.5","g":"1e","h":"."}"#,
            ),
        ),
        (
            "not_numbers",
            "a: 1:20\nb: 1,000\nc: 0x1G\nd: 12abc\ne: '12'\nf: \"0x1F\"\ng: 1 2\n",
            Expect::Json(
                r#"{"a":"1:20","b":"1,000","c":"0x1G","d":"12abc","e":"12","f":"0x1F","g":"1 2"}"#,
            ),
        ),
        (
            "infinity_value_is_an_error",
            "a: 1\nb: .inf\n",
            Expect::Error(2, 4, "+Inf"),
        ),
        (
            "negative_infinity_value_is_an_error",
            "b: -.Inf\n",
            Expect::Error(1, 4, "-Inf"),
        ),
        (
            "nan_value_is_an_error",
            "b: [1, .NaN]\n",
            Expect::Error(1, 8, "NaN"),
        ),
        (
            "quoted_specials_are_strings",
            "a: '.inf'\nb: \".nan\"\nc: .iNf\nd: +.inf1\n",
            Expect::Json(r#"{"a":".inf","b":".nan","c":".iNf","d":"+.inf1"}"#),
        ),
        (
            "overwritten_nan_is_not_an_error",
            "a: .nan\na: 1\n",
            Expect::Json(r#"{"a":1}"#),
        ),
        (
            "timestamps_stay_strings",
            "a: 2001-12-14\nb: 2001-12-14T21:59:43.10-05:00\nc: 2001-12-14 21:59:43.10\nd: 2001-13-14\n",
            Expect::Json(
                r#"{"a":"2001-12-14","b":"2001-12-14T21:59:43.10-05:00","c":"2001-12-14 21:59:43.10","d":"2001-13-14"}"#,
            ),
        ),
        (
            "quoted_and_block_scalars_are_strings",
            "a: \"true\"\nb: '1'\nc: |\n  1\nd: >-\n  yes\n",
            Expect::Json(r#"{"a":"true","b":"1","c":"1\n","d":"yes"}"#),
        ),
        (
            "double_quoted_escapes",
            "a: \"\\x41\\u263A\\U0001F600\\t\\\\\\\"\\0\\e\\N\\_\\L\\P\"\n",
            Expect::Json(
                r#"{"a":"A\u263a\ud83d\ude00\t\\\"\u0000\u001b\u0085\u00a0\u2028\u2029"}"#,
            ),
        ),
        (
            "escaped_single_quote_in_double_quotes",
            "a: \"it\\'s\"\nb: \"\\'\\'\"\nc: it\\'s\n",
            Expect::Json(r#"{"a":"it's","b":"''","c":"it\\'s"}"#),
        ),
        (
            "quote_escapes_only_in_double_quotes",
            "a: 'x\\'\nb: \"y\\'z\"\nc: |\n  it\\'s\n# don\\'t\n",
            Expect::Json(r#"{"a":"x\\","b":"y'z","c":"it\\'s\n"}"#),
        ),
        (
            "quote_escapes_keep_columns",
            "a: [\"it\\'s\", .inf]\n",
            Expect::Error(1, 14, "+Inf"),
        ),
        (
            "escaped_slash_is_rejected",
            "a: \"x\\/y\"\n",
            Expect::Error(1, 4, "unknown escape"),
        ),
        (
            "single_quotes_and_folding",
            "a: 'it''s'\nb: \"multi\n  line\"\nc: plain\n  folded\n\n  para\n",
            Expect::Json(r#"{"a":"it's","b":"multi line","c":"plain folded\npara"}"#),
        ),
        (
            "block_scalar_chomping",
            "a: |\n  x\n\nb: |-\n  x\n\nc: |+\n  x\n\nd: >\n  one\n  two\n\n  three\ne: |2\n    x\n",
            Expect::Json(r#"{"a":"x\n","b":"x","c":"x\n\n","d":"one two\nthree\n","e":"  x\n"}"#),
        ),
        (
            "block_scalar_at_unterminated_end",
            "a: >\n  x\n  z",
            Expect::Json(r#"{"a":"x z"}"#),
        ),
        (
            "empty_block_scalar_at_end",
            "a: |\n",
            Expect::Json(r#"{"a":""}"#),
        ),
        (
            "tags_force_types",
            "a: !!str 12\nb: !!int \"12\"\nc: !!float 1\nd: !!float '2.5'\ne: !!bool \"yes\"\nf: !!null ''\ng: !!str\nh: !!timestamp 2001-12-14\ni: !<tag:yaml.org,2002:int> \"3\"\n",
            Expect::Json(
                r#"{"a":"12","b":12,"c":1.0,"d":2.5,"e":true,"f":null,"g":"","h":"2001-12-14","i":3}"#,
            ),
        ),
        (
            "other_tags_make_strings",
            "a: ! 12\nb: !foo 13\nc: !!map 14\nd: !!str {e: 1}\n",
            Expect::Json(r#"{"a":"12","b":"13","c":"14","d":{"e":1}}"#),
        ),
        (
            "binary_tag_decodes_base64",
            "a: !!binary aGVsbG8=\nb: !!binary |\n  aGVs\n  bG8=\n",
            Expect::Json(r#"{"a":"hello","b":"hello"}"#),
        ),
        (
            "binary_keeps_invalid_utf8_as_replacement_characters",
            "a: !!binary 4oI=\nb: !!binary gA==\n",
            Expect::Json(r#"{"a":"\ufffd\ufffd","b":"\ufffd"}"#),
        ),
        (
            "binary_follows_go_base64",
            "a: !!binary \"aGVs\\rbG9=\"\nb: !!binary \"YR==\\n\"\nc: !!binary \"\"\n",
            Expect::Json(r#"{"a":"hello","b":"a","c":""}"#),
        ),
        (
            "binary_rejects_spaces",
            "a: !!binary aGVs\n  bG8=\n",
            Expect::Error(1, 13, "invalid base64"),
        ),
        (
            "bad_binary",
            "a: !!binary aGVsbG8\n",
            Expect::Error(1, 13, "invalid base64"),
        ),
        (
            "int_tag_on_float",
            "a: !!int 1.5\n",
            Expect::Error(1, 10, "cannot decode !!float `1.5` as a !!int"),
        ),
        (
            "int_tag_on_empty",
            "a: !!int\n",
            Expect::Error(2, 1, "cannot decode !!null `` as a !!int"),
        ),
        (
            "float_tag_on_uint",
            "a: !!float 18446744073709551615\n",
            Expect::Error(
                1,
                12,
                "cannot decode !!int `18446744073709551615` as a !!float",
            ),
        ),
        (
            "timestamp_tag_accepts_go_layouts",
            "a: !!timestamp 2001-12-14t21:59:43.10-05:00\nb: !!timestamp 2001-12-14  21:59:43\nc: !!timestamp 2000-02-29\nd: !!timestamp 2001-12-14T1:2:3,5Z\n",
            Expect::Json(
                r#"{"a":"2001-12-14t21:59:43.10-05:00","b":"2001-12-14  21:59:43","c":"2000-02-29","d":"2001-12-14T1:2:3,5Z"}"#,
            ),
        ),
        (
            "timestamp_tag_rejects_invalid_dates",
            "a: !!timestamp 2001-02-29\n",
            Expect::Error(1, 16, "cannot decode !!str `2001-02-29` as a !!timestamp"),
        ),
        (
            "timestamp_tag_on_text",
            "a: !!timestamp foo\n",
            Expect::Error(1, 16, "cannot decode !!str `foo` as a !!timestamp"),
        ),
        (
            "keys_are_resolved_then_stringified",
            "yes: a\nno: b\n1: c\n0x10: d\n-1: e\n2.5: f\n1e20: g\n123456789.0: h\n0.00001: i\n1000000.0: j\n123456.0: k\n-0.0: l\n.inf: m\n-.inf: n\n.nan: o\n~x: p\n",
            Expect::Json(
                r#"{"true":"a","false":"b","1":"c","16":"d","-1":"e","2.5":"f","1e+20":"g","1.2345679e+08":"h","1e-05":"i","1e+06":"j","123456":"k","-0":"l",".inf":"m","-.inf":false,".nan":"o","~x":"p"}"#,
            ),
        ),
        (
            "null_key_is_an_error",
            "a: 1\n~: 2\n",
            Expect::Error(2, 1, "null key"),
        ),
        (
            "empty_key_is_an_error",
            "? \n: 1\n",
            Expect::Error(2, 1, "null key"),
        ),
        (
            "uint_key_is_an_error",
            "18446744073709551615: 1\n",
            Expect::Error(1, 1, "18446744073709551615"),
        ),
        (
            "sequence_key_is_an_error",
            "[1, 2]: a\n",
            Expect::Error(1, 1, "invalid map key"),
        ),
        (
            "mapping_key_is_an_error",
            "? {a: 1}\n: b\n",
            Expect::Error(1, 3, "invalid map key"),
        ),
        (
            "discarded_bad_key_is_not_an_error",
            "a: {~: 1}\na: 2\n",
            Expect::Json(r#"{"a":2}"#),
        ),
        (
            "duplicate_keys_last_wins",
            "a: 1\nb: 2\na: 3\n",
            Expect::Json(r#"{"a":3,"b":2}"#),
        ),
        (
            "equal_go_keys_last_wins",
            "true: c\nyes: d\nTrue: e\n0x1: f\n1: g\n",
            Expect::Json(r#"{"1":"g","true":"e"}"#),
        ),
        (
            "anchors_and_aliases",
            "a: &x {b: [1, 2]}\nc: *x\nd: &y 3\ne: [*y, *y]\n&k key: v\nref: *k\n",
            Expect::Json(
                r#"{"a":{"b":[1,2]},"c":{"b":[1,2]},"d":3,"e":[3,3],"key":"v","ref":"key"}"#,
            ),
        ),
        (
            "redefined_anchor_uses_latest",
            "a: &x 1\nb: &x 2\nc: *x\n",
            Expect::Json(r#"{"a":1,"b":2,"c":2}"#),
        ),
        (
            "merge_key_position_decides",
            "b: &b {a: 1, c: 3}\nx:\n  a: 2\n  <<: *b\n  c: 4\n",
            Expect::Json(r#"{"b":{"a":1,"c":3},"x":{"a":1,"c":4}}"#),
        ),
        (
            "merge_sequence_earlier_wins",
            "b1: &b1 {a: 1}\nb2: &b2 {a: 2, z: 2}\nx:\n  <<: [*b1, *b2]\n  w: 0\n",
            Expect::Json(r#"{"b1":{"a":1},"b2":{"a":2,"z":2},"x":{"a":1,"w":0,"z":2}}"#),
        ),
        (
            "merge_inline_and_tagged",
            "x:\n  <<: {a: 1}\n  !!merge <<: {b: 2}\n  ! <<: {c: 3}\nz:\n  \"<<\": {a: 1}\n",
            Expect::Json(r#"{"x":{"a":1,"b":2,"c":3},"z":{"<<":{"a":1}}}"#),
        ),
        (
            "merge_of_a_scalar_is_an_error",
            "b: &b [1]\nx:\n  <<: *b\n",
            Expect::Error(3, 7, "map merge requires map or sequence of maps"),
        ),
        (
            "self_containing_anchor",
            "a: &a [1, *a]\n",
            Expect::Error(1, 11, "anchor 'a' value contains itself"),
        ),
        (
            "unknown_alias",
            "a: *nope\n",
            Expect::Error(1, 4, "unknown anchor"),
        ),
        (
            "anchor_names_end_like_libyaml",
            "- &x:\n    b: 1\n",
            Expect::Error(1, 5, "null key"),
        ),
        (
            "invalid_anchor_name",
            "a: &x. 1\n",
            Expect::Error(1, 4, "anchor name"),
        ),
        (
            "only_first_document",
            "a: 1\n---\nb: [\n",
            Expect::Json(r#"{"a":1}"#),
        ),
        ("empty_document_is_null", "", Expect::Json(r#"null"#)),
        (
            "comment_only_document_is_null",
            "# nothing here\n",
            Expect::Json(r#"null"#),
        ),
        (
            "byte_order_mark_is_dropped",
            "\u{feff}a: 1\n",
            Expect::Json(r#"{"a":1}"#),
        ),
        (
            "control_characters_are_rejected",
            "a: 1\nb: x\u{1}y\n",
            Expect::Error(2, 5, "control characters"),
        ),
        (
            "tab_after_colon",
            "a:\tb\nc:\t-1\n",
            Expect::Json(r#"{"a":"b","c":-1}"#),
        ),
        (
            "flow_collection_closing_at_column_zero",
            "args: [\n  \"a\",\n  \"b\"\n]\nmap: {\nk: v\n}\n",
            Expect::Json(r#"{"args":["a","b"],"map":{"k":"v"}}"#),
        ),
        (
            "quoted_continuation_less_indented",
            "a:\n  b: \"x\ny\"\n  c: 'p\n\tq'\n",
            Expect::Json(r#"{"a":{"b":"x y","c":"p q"}}"#),
        ),
        (
            "comment_right_after_quote",
            "a: \"x\"# note\n",
            Expect::Json(r#"{"a":"x"}"#),
        ),
        (
            "libyaml_line_breaks",
            "a: b\u{85}c: d\u{2028}e: f\r\ng: h\ri: j\n",
            Expect::Json(r#"{"a":"b","c":"d","e":"f","g":"h","i":"j"}"#),
        ),
        (
            "tab_indentation_is_rejected",
            "a:\n\tb: 1\n",
            Expect::Error(2, 1, "cannot start any token"),
        ),
        (
            "only_yaml_1_1_directives",
            "%YAML 1.2\n---\na: 1\n",
            Expect::Error(1, 1, "incompatible YAML document"),
        ),
        (
            "question_mark_in_flow_plain_scalar",
            "a: [b, c?d]\n",
            Expect::Error(1, 8, "`?`"),
        ),
        (
            "flow_sequences_and_mappings",
            "s: [a, 'b', \"c\", 1, 1.5, true, ~, ]\nm: {a: 1, b, c: }\np: [a: 1, b]\n",
            Expect::Json(
                r#"{"s":["a","b","c",1,1.5,true,null],"m":{"a":1,"b":null,"c":null},"p":[{"a":1},"b"]}"#,
            ),
        ),
        (
            "syntax_error_position",
            "a: b: c\n",
            Expect::Error(1, 5, "mapping values are not allowed"),
        ),
    ];

    #[test]
    fn helm_checked_cases() {
        let mut failures = Vec::new();
        for (name, yaml, expect) in CASES {
            let got = parse(yaml);
            let ok = match (expect, &got) {
                (Expect::Json(text), Ok(value)) => {
                    let want: Value = serde_json::from_str(text).expect("expectation is JSON");
                    *value == want
                }
                (Expect::Error(line, column, needle), Err(error)) => {
                    error.line == *line && error.column == *column && error.message.contains(needle)
                }
                _ => false,
            };
            if !ok {
                failures.push(format!("{name}: got {got:?}"));
            }
        }
        assert!(CASES.len() >= 40);
        assert!(
            failures.is_empty(),
            "{} failing cases:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }

    #[test]
    fn integers_and_floats_are_told_apart() {
        let value = parse("a: 1000\nb: 1e3\nc: 18446744073709551615\nd: -5\n").unwrap();
        assert!(value["a"].is_u64());
        assert!(value["b"].is_f64());
        assert_eq!(value["c"].as_u64(), Some(u64::MAX));
        assert_eq!(value["d"].as_i64(), Some(-5));
    }

    #[test]
    fn parse_documents_reads_every_document() {
        let text = "a: 1\n---\n- b\n---\n...\n---\nc\n";
        let documents = parse_documents(text).unwrap();
        assert_eq!(
            documents,
            vec![json!({"a": 1}), json!(["b"]), Value::Null, json!("c")]
        );
        assert_eq!(parse(text).unwrap(), json!({"a": 1}));
    }

    #[test]
    fn no_documents() {
        assert_eq!(parse_documents("").unwrap(), Vec::<Value>::new());
        assert_eq!(
            parse_documents("# just a comment\n").unwrap(),
            Vec::<Value>::new()
        );
        assert_eq!(parse_documents("---\n").unwrap(), vec![Value::Null]);
        assert_eq!(parse("").unwrap(), Value::Null);
    }

    #[test]
    fn roots_need_not_be_mappings() {
        assert_eq!(parse("- 1\n- x\n").unwrap(), json!([1, "x"]));
        assert_eq!(parse("0x10\n").unwrap(), json!(16));
        assert_eq!(parse("'quoted'").unwrap(), json!("quoted"));
    }

    #[test]
    fn later_documents_are_only_read_by_parse_documents() {
        let text = "a: 1\n---\nb: [\n";
        assert_eq!(parse(text).unwrap(), json!({"a": 1}));
        let error = parse_documents(text).unwrap_err();
        assert_eq!(error.line, 4);
    }

    #[test]
    fn anchors_stay_in_their_document() {
        let text = "a: &x 1\n---\nb: *x\n";
        assert_eq!(parse(text).unwrap(), json!({"a": 1}));
        let error = parse_documents(text).unwrap_err();
        assert_eq!((error.line, error.column), (3, 4));
        assert!(error.message.contains("unknown anchor 'x'"), "{error}");
    }

    #[test]
    fn error_display_has_the_position() {
        let error = parse("a: [1, 2\n").unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with(&format!("line {}, column {}: ", error.line, error.column))
        );
        assert!(error.line >= 1 && error.column >= 1);
    }

    #[test]
    fn alias_bombs_are_refused() {
        let mut text = String::from(
            "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
        );
        for (previous, name) in "abcdefgh".chars().zip("bcdefghi".chars()) {
            let items = vec![format!("*{previous}"); 9].join(",");
            text.push_str(&format!("{name}: &{name} [{items}]\n"));
        }
        let error = parse(&text).unwrap_err();
        assert!(error.message.contains("excessive aliasing"), "{error}");
    }

    #[test]
    fn moderate_aliasing_is_fine() {
        let mut text =
            String::from("base: &base {image: nginx, tag: '1.25', pull: IfNotPresent}\n");
        for i in 0..500 {
            text.push_str(&format!(
                "svc{i}:\n  <<: *base\n  name: svc{i}\n  copy: *base\n"
            ));
        }
        let value = parse(&text).unwrap();
        assert_eq!(value["svc499"]["tag"], json!("1.25"));
        assert_eq!(value["svc7"]["copy"]["pull"], json!("IfNotPresent"));
    }

    #[test]
    fn nesting_is_limited() {
        let nested = |depth: usize| format!("{}x\n", "- ".repeat(depth));
        assert!(parse(&nested(MAX_DEPTH)).is_ok());
        let error = parse(&nested(MAX_DEPTH + 1)).unwrap_err();
        assert!(error.message.contains("max depth"), "{error}");
    }

    #[test]
    fn nesting_through_aliases_is_limited() {
        // No node is deeper than 602 levels, but `*a` expands 600 levels deep at depth 501.
        let text = format!(
            "a: &a\n  {}x\nb:\n  {}*a\n",
            "- ".repeat(600),
            "- ".repeat(500)
        );
        let error = parse(&text).unwrap_err();
        assert!(error.message.contains("max depth"), "{error}");
    }

    #[test]
    fn deep_documents_fit_a_small_stack() {
        // Tokio's worker threads have 2 MiB of stack; the decoder itself is iterative.
        let worker = std::thread::Builder::new()
            .stack_size(2 * 1024 * 1024)
            .spawn(|| {
                let text = format!("{}x\n", "- ".repeat(MAX_DEPTH));
                let value = parse(&text).unwrap();
                serde_json::to_string(&value).unwrap().len()
            });
        let length = worker.unwrap().join().unwrap();
        assert_eq!(length, 2 * MAX_DEPTH + 3);
    }

    #[test]
    fn many_rewrites_stay_fast() {
        let quotes: String = (0..2000).map(|i| format!("k{i}: \"it\\'s\"\n")).collect();
        assert_eq!(parse(&quotes).unwrap()["k1999"], json!("it's"));
        let flow: String = (0..2000).map(|i| format!("\"v{i}\",\n")).collect();
        let value = parse(&format!("a: [\n{flow}]\nb:\n  c: [\n1,\n2]\n")).unwrap();
        assert_eq!(value["a"][1999], json!("v1999"));
        assert_eq!(value["b"]["c"], json!([1, 2]));
    }

    #[test]
    fn float_keys_use_go_float32_formatting() {
        let cases = [
            (1e20, "1e+20"),
            (123_456_789.0, "1.2345679e+08"),
            (0.00001, "1e-05"),
            (0.0001, "0.0001"),
            (1e6, "1e+06"),
            (123_456.0, "123456"),
            (-2.5, "-2.5"),
            (0.1, "0.1"),
            (100.0, "100"),
            (1e-45, "1e-45"),
            (3.4e38, "3.4e+38"),
            (1e39, ".inf"),
            (-1e39, "-.inf"),
            (-0.0, "-0"),
            (f64::NAN, ".nan"),
        ];
        for (value, want) in cases {
            assert_eq!(format_float32(value), want, "{value}");
        }
    }

    #[test]
    fn timestamps_follow_go_time_parse() {
        // The verdicts helm gives these under an explicit !!timestamp tag.
        let cases = [
            ("2001-12-14t21:59:43.10-05:00", true),
            ("2001-12-14 21:59:43.10", true),
            ("2001-12-14  21:59:43", true),
            ("2001-02-29", false),
            ("2000-02-29", true),
            ("2001-12-14T24:00:00Z", false),
            ("2001-12-14T21:59:43+25:00", false),
            ("2001-12-14T21:59:43", false),
            ("2001-1-2", true),
            ("2001-12-14T21:59:43,5Z", true),
            ("2001-12-14T1:2:3Z", true),
            ("2001-12-14 21:59:43 +5", false),
            ("12001-12-14", false),
            ("2001-12-14T21:59:60Z", false),
            ("2001-12-14T21:59:43+24:00", true),
        ];
        for (text, want) in cases {
            assert_eq!(is_timestamp(text), want, "{text}");
        }
    }

    #[test]
    fn go_integer_parsing() {
        assert_eq!(go_parse_int("-9223372036854775808"), Some(i64::MIN));
        assert_eq!(go_parse_int("9223372036854775808"), None);
        assert_eq!(go_parse_uint("0"), Some(0));
        assert_eq!(go_parse_uint("0x"), None);
        assert_eq!(go_parse_uint("0b"), None);
        assert_eq!(go_parse_uint("0o"), None);
        assert_eq!(go_parse_int("+-1"), None);
        assert_eq!(parse_int_radix("-101", 2), Some(-5));
        assert!(underscores_ok("1_000.5"));
        assert!(!underscores_ok("1__0"));
        assert!(!underscores_ok("_1"));
    }

    /// A tiny deterministic generator for the fuzz loop (no extra dependency).
    fn xorshift(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn mutated_inputs_never_panic() {
        let alphabet: Vec<char> =
            " \t\n\r:-?,[]{}#&*!|>'\"%@`\\~.0123456789abexyzn<=+_/\u{85}\u{feff}é\u{2028}"
                .chars()
                .collect();
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        for (_, yaml, _) in CASES {
            for _ in 0..150 {
                let mut chars: Vec<char> = yaml.chars().collect();
                for _ in 0..1 + xorshift(&mut state) % 6 {
                    let at = (xorshift(&mut state) % (chars.len() as u64 + 1)) as usize;
                    let pick = alphabet[(xorshift(&mut state) % alphabet.len() as u64) as usize];
                    match xorshift(&mut state) % 3 {
                        0 => chars.insert(at, pick),
                        1 if at < chars.len() => {
                            chars.remove(at);
                        }
                        _ if at < chars.len() => chars[at] = pick,
                        _ => chars.push(pick),
                    }
                }
                let text: String = chars.into_iter().collect();
                for result in [parse(&text).map(|_| ()), parse_documents(&text).map(|_| ())] {
                    if let Err(error) = result {
                        assert!(error.line >= 1 && error.column >= 1, "{text:?}: {error}");
                    }
                }
            }
        }
    }

    /// Text that JSON writes as is and YAML 1.1 reads as is: not DEL, the C1 controls (U+0085 is
    /// a line break to libyaml), the line and paragraph separators, the byte order mark and the
    /// non-characters U+FFFE and U+FFFF, which libyaml rejects or reads otherwise.
    const JSON_STRING: &str =
        "[^\\x{7f}-\\x{9f}\\x{2028}\\x{2029}\\x{feff}\\x{fffe}\\x{ffff}]{0,16}";
    const JSON_KEY: &str = "[^\\x{7f}-\\x{9f}\\x{2028}\\x{2029}\\x{feff}\\x{fffe}\\x{ffff}]{0,8}";

    /// JSON values, whose text is YAML that means the same (for go-yaml as for JSON).
    fn json_values() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|i| json!(i)),
            any::<u64>().prop_map(|u| json!(u)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f)),
            JSON_STRING.prop_map(Value::String),
            "[a-z0-9 ._:#'\"-]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(JSON_KEY, inner, 0..6)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn arbitrary_text_never_panics(text in "[ \\t\\n:\\-?,\\[\\]{}#&*!|>'\"%@`\\\\~.0-9a-z<+_/é]{0,80}") {
            let _ = parse(&text);
            let _ = parse_documents(&text);
        }

        #[test]
        fn any_unicode_never_panics(text in "\\PC{0,60}") {
            let _ = parse(&text);
            let _ = parse_documents(&text);
        }

        #[test]
        fn json_text_reads_back_as_the_same_value(value in json_values()) {
            let compact = serde_json::to_string(&value).unwrap();
            prop_assert_eq!(parse(&compact).unwrap(), value.clone());
            let pretty = serde_json::to_string_pretty(&value).unwrap();
            prop_assert_eq!(parse(&pretty).unwrap(), value);
        }
    }
}
