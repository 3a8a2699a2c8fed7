//! The small expression language of the readiness annotations.
//!
//! `helm.sh/readiness-success` and `helm.sh/readiness-failure` hold expressions
//! `PATH OP VALUE`, spaces optional:
//!
//! * `PATH` is relative to the object's `.status`, written `succeeded` (the sequencing proposal),
//!   `.succeeded`, or `{.succeeded}` (HIP-0025, JSONPath in braces). Segments are `.name`,
//!   `['name']` (for names with dots), `[2]` (an index, negative from the end) and
//!   `[?(@.type=="Ready")]` (the first element for which the comparison holds). A path that
//!   starts with `status` and is not found under `.status` is looked up from the object root,
//!   so `{.status.succeeded}` works too.
//! * `OP` is one of `== != < <= > >=`.
//! * `VALUE` is a number (`1`, `-2`, `0.5`), `true` or `false`, a quoted string (`"Running"`,
//!   `'Running'`) or an unquoted word (`Running`). Ordering operators need a number.
//!
//! Comparison: numbers compare numerically (an integer equals the same float); a string that
//! reads as a number compares as one. A boolean also matches the strings `true`/`True`/`TRUE`
//! (and the `false` forms), so `{.conditions[?(@.type=="Ready")].status} == true` works on
//! condition statuses. A string matches a number or boolean written the same way. A path that
//! is missing (or null) makes the expression false, whatever the operator.
//!
//! `kots.io/wait-for-properties` holds `PATH=VALUE` pairs separated by commas, with paths from
//! the object root (`.status.phase=Running`).

use std::cmp::Ordering;
use std::fmt;

use serde_json::{Number, Value};

/// How deeply filters may nest inside filters.
pub const MAX_FILTER_DEPTH: usize = 8;

/// Why an expression could not be read. The message quotes the offending text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ExpressionError {
    pub message: String,
}

impl ExpressionError {
    fn new(message: impl Into<String>) -> Self {
        ExpressionError {
            message: message.into(),
        }
    }
}

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Operator {
    /// The operator as written: `==`, `!=`, `<`, `<=`, `>`, `>=`.
    pub fn symbol(self) -> &'static str {
        match self {
            Operator::Eq => "==",
            Operator::Ne => "!=",
            Operator::Lt => "<",
            Operator::Le => "<=",
            Operator::Gt => ">",
            Operator::Ge => ">=",
        }
    }

    fn from_symbol(symbol: &str) -> Option<Operator> {
        Some(match symbol {
            "==" => Operator::Eq,
            "!=" => Operator::Ne,
            "<" => Operator::Lt,
            "<=" => Operator::Le,
            ">" => Operator::Gt,
            ">=" => Operator::Ge,
            _ => return None,
        })
    }

    fn is_ordering(self) -> bool {
        !matches!(self, Operator::Eq | Operator::Ne)
    }
}

/// The value an expression compares with.
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    Number(Number),
    String(String),
    Bool(bool),
}

impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Literal::Number(n) => write!(f, "{n}"),
            Literal::Bool(b) => write!(f, "{b}"),
            Literal::String(s) => write!(f, "{}", Value::String(s.clone())),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Segment {
    Field(String),
    Index(i64),
    Filter(Box<Comparison>),
}

/// A path into an object: `.a.b`, `.conditions[0].status`, `.conditions[?(@.type=="Ready")]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Path {
    segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq)]
struct Comparison {
    path: Path,
    operator: Operator,
    value: Literal,
}

/// One parsed `PATH OP VALUE` expression of `helm.sh/readiness-success` or `-failure`.
#[derive(Debug, Clone, PartialEq)]
pub struct Expression {
    text: String,
    comparison: Comparison,
}

/// One parsed `PATH=VALUE` pair of `kots.io/wait-for-properties`.
#[derive(Debug, Clone, PartialEq)]
pub struct Property {
    text: String,
    path: Path,
    value: Literal,
}

/// The outcome of evaluating an expression or property against an object.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation<'v> {
    /// Whether the expression is true.
    pub holds: bool,
    /// Where the path was looked up, for messages: `status.succeeded`.
    pub location: String,
    /// The value found there; `None` when the path is missing or null.
    pub actual: Option<&'v Value>,
}

impl Evaluation<'_> {
    /// `status.succeeded is 0`, `status.phase is missing`.
    pub fn observed(&self) -> String {
        match self.actual {
            None => format!("{} is missing", self.location),
            Some(value) => format!("{} is {}", self.location, short(value)),
        }
    }
}

/// A value in a message: JSON, cut short when long.
fn short(value: &Value) -> String {
    const MAX: usize = 80;
    let text = value.to_string();
    if text.chars().count() <= MAX {
        text
    } else {
        let cut: String = text.chars().take(MAX).collect();
        format!("{cut}...")
    }
}

impl Path {
    /// Parses a path on its own: `.a.b`, `a.b`, `{.a.b}`.
    ///
    /// # Errors
    ///
    /// Returns an [`ExpressionError`] when the text is not a path.
    pub fn parse(text: &str) -> Result<Path, ExpressionError> {
        let mut parser = Parser::new(text);
        let path = parser.top_path()?;
        parser.skip_ws();
        parser.end("after the path")?;
        Ok(path)
    }

    /// The value at this path below `root`; `None` when a step is missing or the value is null.
    pub fn resolve<'v>(&self, root: &'v Value) -> Option<&'v Value> {
        let mut value = root;
        for segment in &self.segments {
            value = match segment {
                Segment::Field(name) => value.as_object()?.get(name)?,
                Segment::Index(index) => {
                    let items = value.as_array()?;
                    let position = if *index < 0 {
                        items
                            .len()
                            .checked_sub(usize::try_from(index.unsigned_abs()).ok()?)?
                    } else {
                        usize::try_from(*index).ok()?
                    };
                    items.get(position)?
                }
                Segment::Filter(filter) => {
                    value.as_array()?.iter().find(|item| filter.holds(item))?
                }
            };
        }
        (!value.is_null()).then_some(value)
    }

    fn starts_with_field(&self, name: &str) -> bool {
        matches!(self.segments.first(), Some(Segment::Field(first)) if first == name)
    }
}

impl fmt::Display for Path {
    /// The path in JSONPath form: `.conditions[?(@.type=="Ready")].status`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for segment in &self.segments {
            match segment {
                Segment::Field(name) if !name.is_empty() && name.chars().all(is_name_char) => {
                    write!(f, ".{name}")?
                }
                Segment::Field(name) => write!(f, "[{}]", Value::String(name.clone()))?,
                Segment::Index(index) => write!(f, "[{index}]")?,
                Segment::Filter(filter) => write!(
                    f,
                    "[?(@{}{}{})]",
                    filter.path,
                    filter.operator.symbol(),
                    filter.value
                )?,
            }
        }
        Ok(())
    }
}

impl Comparison {
    fn holds(&self, root: &Value) -> bool {
        self.path
            .resolve(root)
            .is_some_and(|actual| compare(actual, self.operator, &self.value))
    }
}

impl Expression {
    /// Parses one expression: `succeeded==1`, `{.succeeded} == 1`, `.phase != "Failed"`.
    ///
    /// # Errors
    ///
    /// Returns an [`ExpressionError`] quoting the text when it is not an expression.
    pub fn parse(text: &str) -> Result<Expression, ExpressionError> {
        let comparison = parse_comparison(text)
            .map_err(|e| ExpressionError::new(format!("{}: {}", quote(text), e.message)))?;
        Ok(Expression {
            text: text.trim().to_string(),
            comparison,
        })
    }

    /// The expression as written (trimmed).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Evaluates the expression against an object: its path is looked up under `.status`
    /// (or, for a path starting with `status` that is not found there, from the root).
    pub fn evaluate<'v>(&self, object: &'v Value) -> Evaluation<'v> {
        let path = &self.comparison.path;
        let under_status = object.get("status").and_then(|status| path.resolve(status));
        let (location, actual) = match under_status {
            None if path.starts_with_field("status") => {
                let text = path.to_string();
                (
                    text.strip_prefix('.').unwrap_or(&text).to_string(),
                    path.resolve(object),
                )
            }
            found => (format!("status{path}"), found),
        };
        Evaluation {
            holds: actual
                .is_some_and(|a| compare(a, self.comparison.operator, &self.comparison.value)),
            location,
            actual,
        }
    }
}

impl Property {
    /// Parses one `PATH=VALUE` pair: `.status.phase=Running`, `.status.ready=true`.
    ///
    /// # Errors
    ///
    /// Returns an [`ExpressionError`] quoting the text when it is not such a pair.
    pub fn parse(text: &str) -> Result<Property, ExpressionError> {
        let fail = |e: ExpressionError| ExpressionError::new(format!("{}: {}", quote(text), e));
        let mut parser = Parser::new(text);
        let path = parser.top_path().map_err(fail)?;
        parser.skip_ws();
        if !parser.eat('=') {
            return Err(fail(ExpressionError::new(format!(
                "expected = after the path {}, found {}",
                cut(&path.to_string()),
                parser.describe_next()
            ))));
        }
        // `==` is forgiven: it means the same here.
        parser.eat('=');
        parser.skip_ws();
        let rest = parser.rest().trim_end();
        let value = if rest.starts_with(['"', '\'']) {
            let value = parser.quoted().map_err(fail)?;
            parser.skip_ws();
            parser.end("after the value").map_err(fail)?;
            Literal::String(value)
        } else {
            classify(rest)
        };
        Ok(Property {
            text: text.trim().to_string(),
            path,
            value,
        })
    }

    /// The pair as written (trimmed).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Evaluates the pair against an object, its path taken from the object root.
    pub fn evaluate<'v>(&self, object: &'v Value) -> Evaluation<'v> {
        let actual = self.path.resolve(object);
        let text = self.path.to_string();
        Evaluation {
            holds: actual.is_some_and(|a| compare(a, Operator::Eq, &self.value)),
            location: text.strip_prefix('.').unwrap_or(&text).to_string(),
            actual,
        }
    }
}

/// Parses the text of `helm.sh/readiness-success` or `-failure`: a YAML/JSON list of expressions
/// (`["succeeded==1"]`, `['{.succeeded} == 1', "failed == 0"]`) or a bare expression
/// (`succeeded==1`). Commas outside quotes and brackets separate expressions too. Blank text and
/// an empty list give no expressions.
///
/// # Errors
///
/// Returns an [`ExpressionError`] naming the expression that is malformed.
pub fn parse_expressions(text: &str) -> Result<Vec<Expression>, ExpressionError> {
    let trimmed = text.trim();
    let elements: Vec<String> = if trimmed.starts_with('[') {
        let value = crate::yaml::parse(trimmed).map_err(|e| {
            ExpressionError::new(format!(
                "not a valid list of expressions ({e}); write a list of quoted strings \
                     such as [\"{{.succeeded}} == 1\"]"
            ))
        })?;
        let Value::Array(items) = value else {
            return Err(ExpressionError::new(
                "not a valid list of expressions; write a list of quoted strings such as \
                 [\"{.succeeded} == 1\"]",
            ));
        };
        let mut elements = Vec::new();
        for (index, item) in items.into_iter().enumerate() {
            match item {
                Value::String(s) => elements.push(s),
                other => {
                    return Err(ExpressionError::new(format!(
                        "list element {} is {}, not an expression string{}",
                        index + 1,
                        short(&other),
                        if other.is_object() {
                            " (quote expressions that use {.path} in a YAML list)"
                        } else {
                            ""
                        }
                    )));
                }
            }
        }
        elements
    } else if trimmed.is_empty() {
        Vec::new()
    } else {
        vec![trimmed.to_string()]
    };
    let mut expressions = Vec::new();
    for element in &elements {
        for piece in split_top_level(element) {
            if piece.trim().is_empty() {
                return Err(ExpressionError::new(format!(
                    "{}: empty expression (a stray comma?)",
                    quote(element)
                )));
            }
            expressions.push(Expression::parse(piece)?);
        }
    }
    Ok(expressions)
}

/// Parses the text of `kots.io/wait-for-properties`: `PATH=VALUE` pairs separated by commas.
///
/// # Errors
///
/// Returns an [`ExpressionError`] naming the pair that is malformed, or when there is none.
pub fn parse_properties(text: &str) -> Result<Vec<Property>, ExpressionError> {
    let properties = split_top_level(text)
        .into_iter()
        .filter(|piece| !piece.trim().is_empty())
        .map(Property::parse)
        .collect::<Result<Vec<_>, _>>()?;
    if properties.is_empty() {
        return Err(ExpressionError::new(
            "no properties; write PATH=VALUE pairs such as .status.phase=Running",
        ));
    }
    Ok(properties)
}

/// Splits on commas that are outside quotes and brackets.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut start = 0;
    for (index, c) in text.char_indices() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' => quote = Some(c),
            '[' | '(' | '{' => depth += 1,
            ']' | ')' | '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                pieces.push(&text[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    pieces.push(&text[start..]);
    pieces
}

/// How much of a text an error message quotes.
const MAX_QUOTED: usize = 120;

/// The text, trimmed, in quotes; a long text is cut after [`MAX_QUOTED`] characters (an
/// annotation may hold up to 256 KiB, and messages end up in status and events).
pub(crate) fn quote(text: &str) -> String {
    let text = text.trim();
    if text.chars().count() <= MAX_QUOTED {
        format!("{text:?}")
    } else {
        let cut: String = text.chars().take(MAX_QUOTED).collect();
        format!("{cut:?}...")
    }
}

/// The text as it is, cut short like [`quote`] does.
pub(crate) fn cut(text: &str) -> String {
    if text.chars().count() <= MAX_QUOTED {
        text.to_string()
    } else {
        let cut: String = text.chars().take(MAX_QUOTED).collect();
        format!("{cut}...")
    }
}

fn parse_comparison(text: &str) -> Result<Comparison, ExpressionError> {
    let mut parser = Parser::new(text);
    let comparison = parser.comparison(false)?;
    parser.skip_ws();
    if !parser.at_end() {
        return Err(ExpressionError::new(format!(
            "unexpected {} after the value (quote a value that contains spaces)",
            quote(parser.rest())
        )));
    }
    Ok(comparison)
}

/// Characters that may appear in an unbracketed field name.
fn is_name_char(c: char) -> bool {
    !c.is_whitespace() && !".[]{}()'\"=!<>~,@?*$&|".contains(c)
}

/// Numbers, booleans and everything else, for an unquoted value.
fn classify(word: &str) -> Literal {
    match word {
        "true" => Literal::Bool(true),
        "false" => Literal::Bool(false),
        _ => parse_number(word).map_or_else(|| Literal::String(word.to_string()), Literal::Number),
    }
}

fn parse_number(text: &str) -> Option<Number> {
    if !text.bytes().any(|b| b.is_ascii_digit())
        || !text
            .bytes()
            .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b))
    {
        return None;
    }
    if let Ok(i) = text.parse::<i64>() {
        return Some(Number::from(i));
    }
    if let Ok(u) = text.parse::<u64>() {
        return Some(Number::from(u));
    }
    text.parse::<f64>()
        .ok()
        .filter(|f| f.is_finite())
        .and_then(Number::from_f64)
}

fn as_number(value: &Value) -> Option<Number> {
    match value {
        Value::Number(n) => Some(n.clone()),
        Value::String(s) => parse_number(s.trim()),
        _ => None,
    }
}

fn compare_numbers(a: &Number, b: &Number) -> Option<Ordering> {
    let exact = |n: &Number| {
        n.as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from))
    };
    if let (Some(x), Some(y)) = (exact(a), exact(b)) {
        return Some(x.cmp(&y));
    }
    a.as_f64()?.partial_cmp(&b.as_f64()?)
}

fn equals(actual: &Value, literal: &Literal) -> bool {
    match literal {
        Literal::Number(n) => as_number(actual)
            .and_then(|a| compare_numbers(&a, n))
            .is_some_and(Ordering::is_eq),
        Literal::Bool(b) => match actual {
            Value::Bool(a) => a == b,
            Value::String(s) => match s.as_str() {
                "true" | "True" | "TRUE" => *b,
                "false" | "False" | "FALSE" => !*b,
                _ => false,
            },
            _ => false,
        },
        Literal::String(s) => match actual {
            Value::String(a) => a == s,
            Value::Number(a) => {
                a.to_string() == *s
                    || parse_number(s)
                        .and_then(|n| compare_numbers(a, &n))
                        .is_some_and(Ordering::is_eq)
            }
            Value::Bool(a) => a.to_string() == *s,
            _ => false,
        },
    }
}

/// Whether `actual OP literal` holds.
fn compare(actual: &Value, operator: Operator, literal: &Literal) -> bool {
    match operator {
        Operator::Eq => equals(actual, literal),
        Operator::Ne => !equals(actual, literal),
        _ => {
            let (Some(a), Some(b)) = (as_number(actual), literal_number(literal)) else {
                return false;
            };
            compare_numbers(&a, &b).is_some_and(|ordering| match operator {
                Operator::Lt => ordering.is_lt(),
                Operator::Le => ordering.is_le(),
                Operator::Gt => ordering.is_gt(),
                _ => ordering.is_ge(),
            })
        }
    }
}

fn literal_number(literal: &Literal) -> Option<Number> {
    match literal {
        Literal::Number(n) => Some(n.clone()),
        Literal::String(s) => parse_number(s.trim()),
        Literal::Bool(_) => None,
    }
}

/// A cursor over the text of one expression.
struct Parser<'a> {
    text: &'a str,
    position: usize,
    depth: usize,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Self {
        Parser {
            text,
            position: 0,
            depth: 0,
        }
    }

    fn rest(&self) -> &'a str {
        &self.text[self.position..]
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.position += c.len_utf8();
        Some(c)
    }

    fn eat(&mut self, expected: char) -> bool {
        if self.peek() == Some(expected) {
            self.position += expected.len_utf8();
            true
        } else {
            false
        }
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.bump();
        }
    }

    fn at_end(&self) -> bool {
        self.position >= self.text.len()
    }

    fn take_while(&mut self, keep: impl Fn(char) -> bool) -> &'a str {
        let start = self.position;
        while self.peek().is_some_and(&keep) {
            self.bump();
        }
        &self.text[start..self.position]
    }

    fn describe_next(&self) -> String {
        match self.peek() {
            None => "the end of the text".to_string(),
            Some(_) => quote(self.rest()),
        }
    }

    fn end(&self, place: &str) -> Result<(), ExpressionError> {
        if self.at_end() {
            Ok(())
        } else {
            Err(ExpressionError::new(format!(
                "unexpected {} {place}",
                quote(self.rest())
            )))
        }
    }

    fn expect(&mut self, expected: char, context: &str) -> Result<(), ExpressionError> {
        if self.eat(expected) {
            Ok(())
        } else {
            Err(ExpressionError::new(format!(
                "expected {expected:?} {context}, found {}",
                self.describe_next()
            )))
        }
    }

    /// `PATH OP VALUE`; inside a filter the path starts with `@` and the value ends at `)`.
    fn comparison(&mut self, in_filter: bool) -> Result<Comparison, ExpressionError> {
        self.skip_ws();
        let path = if in_filter {
            self.expect(
                '@',
                "at the start of a filter such as [?(@.type==\"Ready\")]",
            )?;
            self.segments(false)?
        } else {
            self.top_path()?
        };
        self.skip_ws();
        let symbol = self.take_while(|c| "=!<>~".contains(c));
        let operator = match Operator::from_symbol(symbol) {
            Some(operator) => operator,
            None if symbol.is_empty() => {
                let shown = cut(&if in_filter {
                    format!("@{path}")
                } else {
                    path.to_string()
                });
                return Err(ExpressionError::new(format!(
                    "expected an operator (== != < <= > >=) after the path {shown}, found {}",
                    self.describe_next()
                )));
            }
            None if symbol == "=" => {
                return Err(ExpressionError::new(
                    "unknown operator \"=\" (did you mean ==?)",
                ));
            }
            None => {
                return Err(ExpressionError::new(format!(
                    "unknown operator {} (use one of == != < <= > >=)",
                    quote(symbol)
                )));
            }
        };
        self.skip_ws();
        let value = self.literal(operator, in_filter)?;
        if operator.is_ordering() && literal_number(&value).is_none() {
            return Err(ExpressionError::new(format!(
                "operator {} compares numbers, and {} is not a number",
                operator.symbol(),
                cut(&value.to_string())
            )));
        }
        Ok(Comparison {
            path,
            operator,
            value,
        })
    }

    /// A path at the top of an expression: `{.a.b}`, `.a.b` or `a.b`.
    fn top_path(&mut self) -> Result<Path, ExpressionError> {
        self.skip_ws();
        if self.eat('{') {
            self.skip_ws();
            let path = self.segments(true)?;
            if path.segments.is_empty() {
                return Err(ExpressionError::new("empty path in {}"));
            }
            self.skip_ws();
            self.expect('}', "to close the path")?;
            return Ok(path);
        }
        let path = self.segments(true)?;
        if path.segments.is_empty() {
            return Err(ExpressionError::new(format!(
                "expected a path such as succeeded or {{.succeeded}}, found {}",
                self.describe_next()
            )));
        }
        Ok(path)
    }

    /// `.name`, `['name']`, `[0]` and `[?(...)]` segments; the first may be a bare name.
    fn segments(&mut self, bare_first: bool) -> Result<Path, ExpressionError> {
        let mut segments = Vec::new();
        if bare_first && self.peek().is_some_and(is_name_char) {
            segments.push(Segment::Field(self.take_while(is_name_char).to_string()));
        }
        loop {
            match self.peek() {
                Some('.') => {
                    self.bump();
                    if self.peek() == Some('*') {
                        return Err(wildcard());
                    }
                    let name = self.take_while(is_name_char);
                    if name.is_empty() {
                        return Err(ExpressionError::new(format!(
                            "expected a field name after \".\", found {}",
                            self.describe_next()
                        )));
                    }
                    segments.push(Segment::Field(name.to_string()));
                }
                Some('[') => {
                    self.bump();
                    segments.push(self.bracket()?);
                }
                _ => break,
            }
        }
        Ok(Path { segments })
    }

    /// After `[`: an index, a quoted name or a filter, and the closing `]`.
    fn bracket(&mut self) -> Result<Segment, ExpressionError> {
        self.skip_ws();
        let segment = match self.peek() {
            Some('"' | '\'') => Segment::Field(self.quoted()?),
            Some('?') => {
                self.bump();
                self.skip_ws();
                self.expect('(', "after [?")?;
                if self.depth >= MAX_FILTER_DEPTH {
                    return Err(ExpressionError::new(format!(
                        "filters nested more than {MAX_FILTER_DEPTH} deep"
                    )));
                }
                self.depth += 1;
                let comparison = self.comparison(true)?;
                self.depth -= 1;
                self.skip_ws();
                self.expect(')', "to close the filter")?;
                Segment::Filter(Box::new(comparison))
            }
            Some('*') => return Err(wildcard()),
            Some(c) if c == '-' || c.is_ascii_digit() => {
                let digits = self.take_while(|c| c == '-' || c.is_ascii_digit());
                let index = digits.parse::<i64>().map_err(|_| {
                    ExpressionError::new(format!("{} is not an index such as [0]", quote(digits)))
                })?;
                Segment::Index(index)
            }
            _ => {
                return Err(ExpressionError::new(format!(
                    "expected an index, a quoted name or a filter after \"[\", found {}",
                    self.describe_next()
                )));
            }
        };
        self.skip_ws();
        self.expect(']', "to close the bracket")?;
        Ok(segment)
    }

    /// A quoted string, `"..."` or `'...'`, with backslash escapes.
    fn quoted(&mut self) -> Result<String, ExpressionError> {
        let start = self.position;
        let Some(quote_char) = self.bump() else {
            return Err(ExpressionError::new("expected a quoted string"));
        };
        let mut value = String::new();
        loop {
            match self.bump() {
                None => {
                    return Err(ExpressionError::new(format!(
                        "unterminated string {} (missing closing {quote_char})",
                        cut(&self.text[start..])
                    )));
                }
                Some('\\') => match self.bump() {
                    None => {
                        return Err(ExpressionError::new(format!(
                            "unterminated string {} (missing closing {quote_char})",
                            cut(&self.text[start..])
                        )));
                    }
                    Some('n') => value.push('\n'),
                    Some('t') => value.push('\t'),
                    Some('r') => value.push('\r'),
                    Some('b') => value.push('\u{8}'),
                    Some('f') => value.push('\u{c}'),
                    Some('u') => value.push(self.unicode_escape()?),
                    Some(c) => value.push(c),
                },
                Some(c) if c == quote_char => return Ok(value),
                Some(c) => value.push(c),
            }
        }
    }

    /// After `\\u`: four hex digits, or a surrogate pair written as two escapes (JSON's way).
    fn unicode_escape(&mut self) -> Result<char, ExpressionError> {
        let first = self.hex4()?;
        let code = if (0xD800..0xDC00).contains(&first) {
            let low = if self.rest().starts_with("\\u") {
                self.position += 2;
                self.hex4()?
            } else {
                0
            };
            if !(0xDC00..0xE000).contains(&low) {
                return Err(ExpressionError::new(format!(
                    "\\u{first:04x} starts a surrogate pair that does not end"
                )));
            }
            0x10000 + ((first - 0xD800) << 10) + (low - 0xDC00)
        } else {
            first
        };
        char::from_u32(code)
            .ok_or_else(|| ExpressionError::new(format!("\\u{code:04x} is not a character")))
    }

    fn hex4(&mut self) -> Result<u32, ExpressionError> {
        let digits: String = self.rest().chars().take(4).collect();
        if digits.len() != 4 || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(ExpressionError::new(format!(
                "\\u must be followed by four hex digits, found {digits:?}"
            )));
        }
        self.position += 4;
        u32::from_str_radix(&digits, 16)
            .map_err(|_| ExpressionError::new(format!("{digits:?} is not hexadecimal")))
    }

    /// The value after an operator.
    fn literal(&mut self, operator: Operator, in_filter: bool) -> Result<Literal, ExpressionError> {
        match self.peek() {
            None => Err(ExpressionError::new(format!(
                "missing value after {}",
                operator.symbol()
            ))),
            Some(')') if in_filter => Err(ExpressionError::new(format!(
                "missing value after {}",
                operator.symbol()
            ))),
            Some('"' | '\'') => Ok(Literal::String(self.quoted()?)),
            Some(_) => {
                let word = self
                    .take_while(|c| !c.is_whitespace() && !(in_filter && (c == ')' || c == ']')));
                if word.contains(['"', '\'']) {
                    return Err(ExpressionError::new(format!(
                        "stray quote in the value {} (quote the whole value)",
                        cut(word)
                    )));
                }
                Ok(classify(word))
            }
        }
    }
}

fn wildcard() -> ExpressionError {
    ExpressionError::new(
        "wildcards (*) are not supported; select one element with an index such as [0] or a \
         filter such as [?(@.type==\"Ready\")]",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn holds(expression: &str, object: &Value) -> bool {
        Expression::parse(expression)
            .unwrap_or_else(|e| panic!("{expression}: {e}"))
            .evaluate(object)
            .holds
    }

    #[test]
    fn paths_display_in_jsonpath_form() {
        for (text, display) in [
            ("a", ".a"),
            (".a.b", ".a.b"),
            ("{.a[0].b}", ".a[0].b"),
            ("{ .a['x.y'] }", ".a[\"x.y\"]"),
            ("a[-1]", ".a[-1]"),
            (
                "{.conditions[?(@.type==\"Ready\")].status}",
                ".conditions[?(@.type==\"Ready\")].status",
            ),
            ("{.c[?(@.n >= 2)]}", ".c[?(@.n>=2)]"),
        ] {
            assert_eq!(Path::parse(text).unwrap().to_string(), display, "{text}");
        }
    }

    #[test]
    fn indexes_count_from_either_end() {
        let object = json!({"status": {"a": [1, 2, 3]}});
        assert!(holds("a[0] == 1", &object));
        assert!(holds("a[-1] == 3", &object));
        assert!(!holds("a[3] == 1", &object));
        assert!(!holds("a[-4] == 1", &object));
        assert!(!holds("a[-9223372036854775808] == 1", &object));
    }

    #[test]
    fn filters_pick_the_first_matching_element() {
        let object = json!({"status": {"conditions": [
            {"type": "Progressing", "status": "True"},
            {"type": "Ready", "status": "False", "observedGeneration": 2},
            {"type": "Ready", "status": "True"},
        ]}});
        assert!(holds(
            "{.conditions[?(@.type==\"Ready\")].status} == \"False\"",
            &object
        ));
        assert!(holds(
            "{.conditions[?(@.type == 'Ready')].status} == false",
            &object
        ));
        assert!(holds("conditions[?(@.type==Ready)].status==False", &object));
        assert!(holds(
            "conditions[?(@.observedGeneration>1)].type==Ready",
            &object
        ));
        assert!(!holds(
            "conditions[?(@.type==Missing)].status==False",
            &object
        ));
    }

    #[test]
    fn filters_may_nest_but_not_without_bound() {
        let object = json!({"status": {"a": [{"b": [{"c": 1}]}]}});
        assert!(holds("a[?(@.b[?(@.c==1)].c == 1)].b[0].c == 1", &object));
        let deep = format!(
            "a{} == 1",
            "[?(@".repeat(MAX_FILTER_DEPTH + 1) + &"==1)]".repeat(MAX_FILTER_DEPTH + 1)
        );
        let error = Expression::parse(&deep).unwrap_err();
        assert!(error.message.contains("nested more than"), "{error}");
    }

    #[test]
    fn quoted_strings_take_json_escapes_so_printed_paths_parse_back() {
        let path = Path::parse(r#"{['a\u0000b\n\ud83d\ude00\/']}"#).unwrap();
        assert_eq!(path.segments, vec![Segment::Field("a\0b\n😀/".to_string())]);
        assert_eq!(Path::parse(&path.to_string()).unwrap(), path);
        // Found by the fuzz target: a name with NUL characters printed as \u0000.
        let path = Path::parse("[\"{.s\u{0}\u{0} =de}de= :\"]").unwrap();
        assert_eq!(Path::parse(&path.to_string()).unwrap(), path);
        for (text, message) in [
            (r"['\u12']", "four hex digits"),
            (r"['\ud83d']", "surrogate pair that does not end"),
            (r"['\ude00']", "is not a character"),
        ] {
            let error = Path::parse(text).unwrap_err();
            assert!(error.message.contains(message), "{text}: {error}");
        }
    }

    #[test]
    fn errors_quote_long_text_cut_short() {
        let long = format!("a {}", "x".repeat(10_000));
        let error = Expression::parse(&long).unwrap_err();
        assert!(error.message.len() < 400, "{}", error.message);
        assert!(
            error
                .message
                .starts_with(&format!("\"a {}\"...: ", "x".repeat(118)))
        );
    }

    #[test]
    fn split_keeps_commas_inside_quotes_and_brackets() {
        assert_eq!(
            split_top_level(r#"a=="x,y",b[?(@.c==",")]==1,'d,'"#),
            vec![r#"a=="x,y""#, r#"b[?(@.c==",")]==1"#, "'d,'"]
        );
        assert_eq!(split_top_level(r#""\",""#), vec![r#""\",""#]);
    }
}
