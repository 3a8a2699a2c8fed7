//! Helm's version constraints.
//!
//! Helm does not use Cargo's requirement syntax: it delegates to the Go
//! library `github.com/Masterminds/semver/v3`, and this module reproduces that
//! library's behaviour on top of [`semver::Version`]. Helm relies on it to
//!
//! * match a subchart found in `charts/` to a `dependencies[]` entry of
//!   `Chart.yaml` ([`is_compatible_range`]),
//! * pick a chart version from a repository index ([`best_match`]),
//! * validate chart versions, which may be written loosely ([`parse_version`]).
//!
//! # Syntax
//!
//! A constraint is a list of alternatives separated by `||`; an alternative is
//! a list of comparisons separated by whitespace or by a single comma, all of
//! which must hold. A comparison is an optional operator followed by a
//! version, optionally with whitespace between the two:
//!
//! | operator  | meaning                                                           |
//! |-----------|-------------------------------------------------------------------|
//! | none, `=` | equal; with a wildcard or a missing part it behaves like `~`      |
//! | `!=`      | not equal                                                         |
//! | `>` `<`   | greater, less                                                     |
//! | `>=` `=>` | greater or equal                                                  |
//! | `<=` `=<` | less or equal                                                     |
//! | `~` `~>`  | at least the version, same major and minor (`~1`: same major)     |
//! | `^`       | at least the version, same major (`^0.2`, `^0.0`: same minor; `^0.0.3`: equal) |
//!
//! The version of a comparison may start with `v` and may leave out the minor
//! and patch numbers or write them as a wildcard, `x`, `X` or `*` (`1`, `1.x`,
//! `1.2.*`); a wildcard in the major position makes the whole version a
//! wildcard. Such a version stands for a range, not for its `.0` version:
//! `<= 2.0` accepts `2.0.9` and `> 1.2` rejects `1.2.5`; only `<` and `>=`
//! compare against the version padded with zeros (`< 1.x` is `< 1.0.0`).
//! `A - B` (with whitespace on both sides of the hyphen) means `>= A, <= B`;
//! without the whitespace, `1.2-3` is the version `1.2.0-3`.
//!
//! # Pre-releases
//!
//! A pre-release version such as `1.3.0-beta.1` satisfies an alternative only
//! if one of that alternative's comparisons itself names a pre-release: `>=1.2`
//! does not accept `1.3.0-beta.1` but `>=1.2.0-0` does. There is no way to ask
//! for pre-releases otherwise, which is also how Helm behaves (its `--devel`
//! flag is implemented as the constraint `>0.0.0-0`).
//!
//! # Faithfulness
//!
//! The Go library is driven by regular expressions and some of its answers are
//! surprising; they are reproduced rather than corrected, because the point of
//! this module is to agree with Helm. Among them: an empty constraint is an
//! error (and so never matches); `<=*` accepts only `0.0.x`; `^*` accepts only
//! `0.0.0`; a `|` inside a version is taken as part of a number, so `1||2 - 3`
//! reads as `>= 1 || 2, <= 3`; build metadata never takes part in comparisons.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use semver::{BuildMetadata, Prerelease, Version};

/// Why a constraint or a version could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// One `||`-separated alternative of a constraint (quoted, after hyphen
    /// ranges were rewritten) is not a list of comparisons.
    #[error("improper constraint: {0:?}")]
    ImproperConstraint(String),
    /// A comparison of a constraint is well formed, but its version is not a
    /// version: a number mixing digits and wildcards, a number too large, or a
    /// numeric pre-release identifier with a leading zero.
    #[error("improper constraint: {comparison:?}: {source}")]
    InvalidComparison {
        /// The comparison, operator included.
        comparison: String,
        /// Why its version, with wildcards replaced by zeros, did not parse.
        source: Box<Error>,
    },
    /// The text does not have the shape of a version.
    #[error("invalid semantic version: {0:?}")]
    InvalidVersion(String),
    /// A major, minor or patch number does not fit in 64 bits.
    #[error("invalid semantic version: {input:?}: number {number:?} is out of range")]
    NumberOutOfRange {
        /// The version.
        input: String,
        /// The offending number.
        number: String,
    },
    /// A numeric pre-release identifier has a leading zero.
    #[error(
        "invalid semantic version: {input:?}: pre-release identifier {identifier:?} starts with 0"
    )]
    LeadingZero {
        /// The version.
        input: String,
        /// The offending identifier.
        identifier: String,
    },
}

/// A parsed version constraint such as `^1.2`, `>= 1.0, < 2.0` or `1.x || 3.x`.
///
/// Parsing and matching follow `github.com/Masterminds/semver/v3`, the library
/// Helm uses; see the [module documentation](self).
#[derive(Debug, Clone)]
pub struct Constraint {
    text: String,
    alternatives: Vec<Alternative>,
}

/// Comparisons that must all hold.
#[derive(Debug, Clone)]
struct Alternative {
    comparisons: Vec<Comparison>,
    /// Whether pre-release versions are considered at all: true when one of
    /// the comparisons names a pre-release.
    includes_prerelease: bool,
}

#[derive(Debug, Clone)]
struct Comparison {
    op: Op,
    /// The version compared against, wildcards replaced by zeros.
    version: Version,
    wildcard: Wildcard,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// No operator or `=`.
    Equal,
    NotEqual,
    Greater,
    Less,
    GreaterOrEqual,
    LessOrEqual,
    Tilde,
    Caret,
}

/// Which part of a comparison's version was left out or written as a wildcard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wildcard {
    /// `1.2.3`
    None,
    /// `*`, `x.y.z`: everything.
    Major,
    /// `1`, `1.x`
    Minor,
    /// `1.2`, `1.2.x`
    Patch,
}

impl Constraint {
    /// Parses a constraint the way Masterminds' `NewConstraint` does.
    ///
    /// An empty or blank constraint is an error, as it is in Go; Helm itself
    /// substitutes `*` when a chart is requested without a version (see
    /// [`Constraint::any`]).
    pub fn parse(text: &str) -> Result<Self, Error> {
        let rewritten = rewrite_hyphen_ranges(text);
        let alternatives = rewritten
            .split("||")
            .map(parse_alternative)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            text: text.to_owned(),
            alternatives,
        })
    }

    /// The constraint `*`: any version that is not a pre-release.
    ///
    /// This is what Helm looks up when no version is requested, so that the
    /// latest stable version wins.
    pub fn any() -> Self {
        Self {
            text: "*".to_owned(),
            alternatives: vec![Alternative {
                comparisons: vec![Comparison {
                    op: Op::Equal,
                    version: Version::new(0, 0, 0),
                    wildcard: Wildcard::Major,
                }],
                includes_prerelease: false,
            }],
        }
    }

    /// The text the constraint was parsed from.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `version` satisfies the constraint (Masterminds' `Check`).
    ///
    /// Build metadata is ignored. A pre-release version only satisfies an
    /// alternative that itself names a pre-release.
    pub fn matches(&self, version: &Version) -> bool {
        self.alternatives.iter().any(|alternative| {
            alternative
                .comparisons
                .iter()
                .all(|comparison| comparison.accepts(version, alternative.includes_prerelease))
        })
    }
}

impl fmt::Display for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for Constraint {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        Self::parse(text)
    }
}

/// Parses a version leniently, like Masterminds' `NewVersion` (which Helm
/// uses for chart versions).
///
/// A leading `v` is accepted and dropped, a missing minor or patch number is
/// zero (`1.2` is `1.2.0`, `v1` is `1.0.0`), and leading zeros in the three
/// numbers are accepted (`01.02.03` is `1.2.3`). Nothing else is forgiven:
/// no surrounding whitespace, no fourth number, and pre-release and build
/// identifiers must follow SemVer (`[0-9A-Za-z-]`, non-empty, no leading zero
/// in a numeric pre-release identifier).
pub fn parse_version(text: &str) -> Result<Version, Error> {
    let bytes = text.as_bytes();
    let runs = Runs::new(bytes, is_digit);
    let shape = runs
        .shape(0)
        .filter(|shape| shape.end == bytes.len())
        .ok_or_else(|| Error::InvalidVersion(text.to_owned()))?;

    let number = |range: Option<Range<usize>>| -> Result<u64, Error> {
        let Some(range) = range else { return Ok(0) };
        let digits = slice(text, range);
        digits.parse().map_err(|_| Error::NumberOutOfRange {
            input: text.to_owned(),
            number: digits.to_owned(),
        })
    };
    let major = number(Some(shape.major))?;
    let minor = number(shape.minor)?;
    let patch = number(shape.patch)?;

    let pre = match shape.pre {
        None => Prerelease::EMPTY,
        Some(range) => {
            let pre = slice(text, range);
            if let Some(identifier) = pre
                .split('.')
                .find(|id| id.len() > 1 && id.starts_with('0') && id.bytes().all(is_digit))
            {
                return Err(Error::LeadingZero {
                    input: text.to_owned(),
                    identifier: identifier.to_owned(),
                });
            }
            Prerelease::new(pre).map_err(|_| Error::InvalidVersion(text.to_owned()))?
        }
    };
    let build = match shape.build {
        None => BuildMetadata::EMPTY,
        Some(range) => BuildMetadata::new(slice(text, range))
            .map_err(|_| Error::InvalidVersion(text.to_owned()))?,
    };
    Ok(Version {
        major,
        minor,
        patch,
        pre,
        build,
    })
}

/// Whether `version` satisfies `constraint`, like Helm's `IsCompatibleRange`:
/// false when either does not parse (so an empty constraint never matches).
pub fn is_compatible_range(constraint: &str, version: &str) -> bool {
    let Ok(version) = parse_version(version) else {
        return false;
    };
    Constraint::parse(constraint).is_ok_and(|constraint| constraint.matches(&version))
}

/// The highest version in `candidates` that satisfies `constraint`, ignoring
/// candidates that do not parse, as Helm picks from a repository index.
///
/// Like Helm's index lookup, a candidate spelled exactly like the constraint
/// text wins outright, before any range matching (so `1.2.3` picks `1.2.3`
/// over `v1.2.3` and `1.2.3+build`, which are equal to it). Among matching
/// candidates of equal precedence (differing only in build metadata or a `v`
/// prefix) the first one in `candidates` wins, which is what Helm does when
/// the candidates are given in the order of the index file.
///
/// Helm looks up `*` ([`Constraint::any`]) when no version is given: the
/// latest version that is not a pre-release. Its `--devel` flag turns that
/// into `>0.0.0-0`, which accepts pre-releases too.
pub fn best_match<'a>(
    constraint: &Constraint,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let candidates: Vec<&'a str> = candidates.into_iter().collect();
    if let Some(exact) = candidates
        .iter()
        .copied()
        .find(|candidate| *candidate == constraint.text)
    {
        return Some(exact);
    }
    let mut best: Option<(&'a str, Version)> = None;
    for candidate in candidates {
        let Ok(version) = parse_version(candidate) else {
            continue;
        };
        if !constraint.matches(&version) {
            continue;
        }
        let better = best
            .as_ref()
            .is_none_or(|(_, current)| precedence(&version, current) == Ordering::Greater);
        if better {
            best = Some((candidate, version));
        }
    }
    best.map(|(candidate, _)| candidate)
}

impl Comparison {
    fn accepts(&self, version: &Version, includes_prerelease: bool) -> bool {
        if !version.pre.is_empty() && !includes_prerelease {
            return false;
        }
        let wanted = &self.version;
        let order = precedence(version, wanted);
        match self.op {
            Op::Equal if self.wildcard != Wildcard::None => self.tilde(version, order),
            Op::Equal => order == Ordering::Equal,
            Op::NotEqual => self.not_equal(version, order),
            Op::Greater => self.greater(version, order),
            Op::Less => order == Ordering::Less,
            Op::GreaterOrEqual => order != Ordering::Less,
            Op::LessOrEqual => self.less_or_equal(version, order),
            Op::Tilde => self.tilde(version, order),
            Op::Caret => self.caret(version, order),
        }
    }

    fn not_equal(&self, version: &Version, order: Ordering) -> bool {
        let wanted = &self.version;
        match self.wildcard {
            Wildcard::None => {}
            _ if version.major != wanted.major => return true,
            Wildcard::Minor => return false,
            _ if version.minor != wanted.minor => return true,
            Wildcard::Patch => {
                return (!version.pre.is_empty() || !wanted.pre.is_empty())
                    && compare_prerelease(version.pre.as_str(), wanted.pre.as_str())
                        != Ordering::Equal;
            }
            Wildcard::Major => {}
        }
        order != Ordering::Equal
    }

    fn greater(&self, version: &Version, order: Ordering) -> bool {
        let wanted = &self.version;
        if self.wildcard == Wildcard::None {
            return order == Ordering::Greater;
        }
        match version.major.cmp(&wanted.major) {
            Ordering::Greater => true,
            Ordering::Less => false,
            Ordering::Equal => match self.wildcard {
                // `>1` wants 2 or more.
                Wildcard::Minor => false,
                // `>1.2` wants 1.3 or more.
                Wildcard::Patch => version.minor > wanted.minor,
                Wildcard::Major | Wildcard::None => order == Ordering::Greater,
            },
        }
    }

    fn less_or_equal(&self, version: &Version, order: Ordering) -> bool {
        let wanted = &self.version;
        if self.wildcard == Wildcard::None {
            return order != Ordering::Greater;
        }
        if version.major > wanted.major {
            return false;
        }
        !(version.major == wanted.major
            && version.minor > wanted.minor
            && self.wildcard != Wildcard::Minor)
    }

    fn tilde(&self, version: &Version, order: Ordering) -> bool {
        let wanted = &self.version;
        if order == Ordering::Less {
            return false;
        }
        // `~*` and `~0.0.0` accept everything from 0.0.0 on.
        if wanted.major == 0
            && wanted.minor == 0
            && wanted.patch == 0
            && matches!(self.wildcard, Wildcard::None | Wildcard::Major)
        {
            return true;
        }
        version.major == wanted.major
            && (version.minor == wanted.minor || self.wildcard == Wildcard::Minor)
    }

    fn caret(&self, version: &Version, order: Ordering) -> bool {
        let wanted = &self.version;
        if order == Ordering::Less {
            return false;
        }
        if wanted.major > 0 || self.wildcard == Wildcard::Minor {
            return version.major == wanted.major;
        }
        if version.major > 0 {
            return false;
        }
        if wanted.minor > 0 || self.wildcard == Wildcard::Patch {
            return version.minor == wanted.minor;
        }
        if version.minor > 0 {
            return false;
        }
        version.patch == wanted.patch
    }
}

/// SemVer precedence as Masterminds computes it: build metadata is ignored,
/// and a pre-release sorts before its release.
fn precedence(a: &Version, b: &Version) -> Ordering {
    a.major
        .cmp(&b.major)
        .then(a.minor.cmp(&b.minor))
        .then(a.patch.cmp(&b.patch))
        .then_with(|| match (a.pre.is_empty(), b.pre.is_empty()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            (false, false) => compare_prerelease(a.pre.as_str(), b.pre.as_str()),
        })
}

/// Compares two pre-release strings identifier by identifier; a missing
/// identifier sorts first, numbers sort before words and compare as numbers,
/// words compare as ASCII.
fn compare_prerelease(a: &str, b: &str) -> Ordering {
    let mut left = a.split('.');
    let mut right = b.split('.');
    loop {
        let (x, y) = match (left.next(), right.next()) {
            (None, None) => return Ordering::Equal,
            (x, y) => (x.unwrap_or(""), y.unwrap_or("")),
        };
        let order = compare_identifier(x, y);
        if order != Ordering::Equal {
            return order;
        }
    }
}

fn compare_identifier(a: &str, b: &str) -> Ordering {
    if a == b {
        return Ordering::Equal;
    }
    if a.is_empty() {
        return Ordering::Less;
    }
    if b.is_empty() {
        return Ordering::Greater;
    }
    // Go parses identifiers as uint64; one too large to parse is a word.
    let number = |s: &str| {
        s.bytes()
            .all(is_digit)
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    match (number(a), number(b)) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

/// Rewrites each hyphen range `A - B` into `>= A, <= B `, searching and
/// replacing exactly as the Go library does (including its treatment of `|`
/// as part of a version number, before the text is split on `||`).
fn rewrite_hyphen_ranges(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    let runs = Runs::new(bytes, is_constraint_digit);
    let mut found = Vec::new();
    let mut start = 0;
    while start < bytes.len() {
        match runs.hyphen_range(start) {
            Some(range) => {
                start = range.whole.end;
                found.push(range);
            }
            None => start += 1,
        }
    }
    if found.is_empty() {
        return Cow::Borrowed(text);
    }
    let mut rewritten = text.to_owned();
    for range in found {
        let replacement = format!(
            ">= {}, <= {} ",
            slice(text, range.low),
            slice(text, range.high)
        );
        // Go replaces the first occurrence of the matched text, which is not
        // necessarily where it was found.
        rewritten = rewritten.replacen(slice(text, range.whole), &replacement, 1);
    }
    Cow::Owned(rewritten)
}

/// Parses one `||`-separated alternative: comparisons separated by
/// whitespace or by one comma (with optional whitespace around it).
fn parse_alternative(text: &str) -> Result<Alternative, Error> {
    let improper = || Error::ImproperConstraint(text.to_owned());
    let bytes = text.as_bytes();
    let runs = Runs::new(bytes, is_constraint_digit);
    let mut comparisons = Vec::new();
    let mut at = runs.skip_space(0);
    loop {
        let op_end = at
            + bytes.get(at..).map_or(0, |rest| {
                rest.iter().take_while(|&&b| is_operator_char(b)).count()
            });
        let op = Op::from_symbol(slice(text, at..op_end)).ok_or_else(improper)?;
        let shape = runs.shape(runs.skip_space(op_end)).ok_or_else(improper)?;
        comparisons.push(Comparison::new(text, op, at, &shape)?);

        let after = runs.skip_space(shape.end);
        if after == bytes.len() {
            break;
        }
        at = if bytes.get(after) == Some(&b',') {
            runs.skip_space(after + 1)
        } else if after > shape.end {
            after
        } else {
            return Err(improper());
        };
    }
    let includes_prerelease = comparisons.iter().any(|c| !c.version.pre.is_empty());
    Ok(Alternative {
        comparisons,
        includes_prerelease,
    })
}

impl Op {
    fn from_symbol(symbol: &str) -> Option<Self> {
        Some(match symbol {
            "" | "=" => Self::Equal,
            "!=" => Self::NotEqual,
            ">" => Self::Greater,
            "<" => Self::Less,
            ">=" | "=>" => Self::GreaterOrEqual,
            "<=" | "=<" => Self::LessOrEqual,
            "~" | "~>" => Self::Tilde,
            "^" => Self::Caret,
            _ => return None,
        })
    }
}

impl Comparison {
    /// Builds a comparison from the operator starting at `op_start` and the
    /// version `shape` of `text`.
    fn new(text: &str, op: Op, op_start: usize, shape: &Shape) -> Result<Self, Error> {
        let is_wild = |part: &str| matches!(part, "x" | "X" | "*");
        let major = slice(text, shape.major.clone());
        let minor = shape.minor.clone().map(|range| slice(text, range));
        let patch = shape.patch.clone().map(|range| slice(text, range));
        let pre = shape
            .pre
            .clone()
            .map(|range| format!("-{}", slice(text, range)))
            .unwrap_or_default();
        // Missing and wildcard parts become zeros; the rest of the version
        // after a wildcard, and build metadata, are dropped unread.
        let (wildcard, version) = if is_wild(major) {
            (Wildcard::Major, Cow::Owned(format!("0.0.0{pre}")))
        } else if minor.is_none_or(is_wild) {
            (Wildcard::Minor, Cow::Owned(format!("{major}.0.0{pre}")))
        } else if patch.is_none_or(is_wild) {
            let minor = minor.unwrap_or_default();
            (
                Wildcard::Patch,
                Cow::Owned(format!("{major}.{minor}.0{pre}")),
            )
        } else {
            (
                Wildcard::None,
                Cow::Borrowed(slice(text, shape.start..shape.end)),
            )
        };
        let version = parse_version(&version).map_err(|source| Error::InvalidComparison {
            comparison: slice(text, op_start..shape.end).to_owned(),
            source: Box::new(source),
        })?;
        Ok(Self {
            op,
            version,
            wildcard,
        })
    }
}

/// Where the parts of a version-like token lie in the text.
#[derive(Debug, Clone)]
struct Shape {
    start: usize,
    end: usize,
    major: Range<usize>,
    minor: Option<Range<usize>>,
    patch: Option<Range<usize>>,
    pre: Option<Range<usize>>,
    build: Option<Range<usize>>,
}

struct HyphenRange {
    whole: Range<usize>,
    low: Range<usize>,
    high: Range<usize>,
}

/// Precomputed run lengths over a text, so that recognising a version at any
/// position takes constant time and scanning a whole text stays linear.
struct Runs<'a> {
    bytes: &'a [u8],
    /// End of the run of number characters starting at each position.
    number_end: Vec<usize>,
    /// End of the dot-separated identifiers starting at each position.
    identifiers_end: Vec<usize>,
    /// End of the whitespace starting at each position.
    space_end: Vec<usize>,
}

impl<'a> Runs<'a> {
    fn new(bytes: &'a [u8], is_number: fn(u8) -> bool) -> Self {
        let len = bytes.len();
        let mut number_end = vec![len; len + 1];
        let mut identifier_end = vec![len; len + 1];
        let mut identifiers_end = vec![len; len + 1];
        let mut space_end = vec![len; len + 1];
        for (i, &b) in bytes.iter().enumerate().rev() {
            let next = |table: &[usize]| table.get(i + 1).copied().unwrap_or(len);
            number_end[i] = if is_number(b) { next(&number_end) } else { i };
            space_end[i] = if is_space(b) { next(&space_end) } else { i };
            identifier_end[i] = if is_identifier(b) {
                next(&identifier_end)
            } else {
                i
            };
            let end = identifier_end[i];
            identifiers_end[i] = if end == i {
                i
            } else if bytes.get(end) == Some(&b'.')
                && bytes.get(end + 1).copied().is_some_and(is_identifier)
            {
                identifiers_end.get(end + 1).copied().unwrap_or(len)
            } else {
                end
            };
        }
        Self {
            bytes,
            number_end,
            identifiers_end,
            space_end,
        }
    }

    fn skip_space(&self, at: usize) -> usize {
        self.space_end.get(at).copied().unwrap_or(at)
    }

    /// The non-empty run of number characters at `at`.
    fn number(&self, at: usize) -> Option<Range<usize>> {
        let end = self.number_end.get(at).copied().unwrap_or(at);
        (end > at).then_some(at..end)
    }

    /// The non-empty dot-separated identifiers at `at`.
    fn identifiers(&self, at: usize) -> Option<Range<usize>> {
        let end = self.identifiers_end.get(at).copied().unwrap_or(at);
        (end > at).then_some(at..end)
    }

    /// What follows `lead` at `at`, if `lead` is there.
    fn after(
        &self,
        at: usize,
        lead: u8,
        part: impl Fn(usize) -> Option<Range<usize>>,
    ) -> Option<Range<usize>> {
        (self.bytes.get(at) == Some(&lead))
            .then(|| part(at + 1))
            .flatten()
    }

    /// The longest version-like token at `at`: `v?N(.N)?(.N)?(-P)?(+B)?`.
    fn shape(&self, start: usize) -> Option<Shape> {
        let mut at = start;
        if self.bytes.get(at) == Some(&b'v') && self.number(at + 1).is_some() {
            at += 1;
        }
        let major = self.number(at)?;
        let mut end = major.end;
        let mut part = |lead: u8, parse: &dyn Fn(usize) -> Option<Range<usize>>| {
            let found = self.after(end, lead, parse);
            if let Some(range) = &found {
                end = range.end;
            }
            found
        };
        let minor = part(b'.', &|at| self.number(at));
        let patch = part(b'.', &|at| self.number(at));
        let pre = part(b'-', &|at| self.identifiers(at));
        let build = part(b'+', &|at| self.identifiers(at));
        Some(Shape {
            start,
            end,
            major,
            minor,
            patch,
            pre,
            build,
        })
    }

    /// A hyphen range `\s*LOW\s+-\s+HIGH\s*` starting exactly at `start`.
    fn hyphen_range(&self, start: usize) -> Option<HyphenRange> {
        let low = self.shape(self.skip_space(start))?;
        let hyphen = self.skip_space(low.end);
        if hyphen == low.end || self.bytes.get(hyphen) != Some(&b'-') {
            return None;
        }
        let high_start = self.skip_space(hyphen + 1);
        if high_start == hyphen + 1 {
            return None;
        }
        let high = self.shape(high_start)?;
        Some(HyphenRange {
            whole: start..self.skip_space(high.end),
            low: low.start..low.end,
            high: high.start..high.end,
        })
    }
}

/// Go's `\s`: ASCII whitespace without the vertical tab.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\x0c' | b'\r')
}

fn is_digit(b: u8) -> bool {
    b.is_ascii_digit()
}

/// A character of a number in a constraint: the Go library's character class
/// `[0-9|x|X|\*]`, which includes `|` by accident.
fn is_constraint_digit(b: u8) -> bool {
    matches!(b, b'0'..=b'9' | b'x' | b'X' | b'*' | b'|')
}

fn is_identifier(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-'
}

fn is_operator_char(b: u8) -> bool {
    matches!(b, b'=' | b'!' | b'<' | b'>' | b'~' | b'^')
}

/// `text[range]`; the ranges used here always fall on ASCII characters.
fn slice(text: &str, range: Range<usize>) -> &str {
    text.get(range).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn version(text: &str) -> Version {
        match parse_version(text) {
            Ok(version) => version,
            Err(error) => panic!("{text:?} should parse: {error}"),
        }
    }

    fn constraint(text: &str) -> Constraint {
        match Constraint::parse(text) {
            Ok(constraint) => constraint,
            Err(error) => panic!("{text:?} should parse: {error}"),
        }
    }

    /// (constraint, version, matches), from the tables of Masterminds'
    /// `constraints_test.go` (`TestConstraintCheck`, `TestConstraintsCheck`,
    /// `TestConstraintsValidate`; duplicates removed, and without the rows for
    /// an empty constraint, which only its internal parser accepts).
    const MASTERMINDS_CHECKS: &[(&str, &str, bool)] = &[
        ("=2.0.0", "1.2.3", false),
        ("=2.0.0", "2.0.0", true),
        ("=2.0", "1.2.3", false),
        ("=2.0", "2.0.0", true),
        ("=2.0", "2.0.1", true),
        ("4.1", "4.1.0", true),
        ("!=4.1.0", "4.1.0", false),
        ("!=4.1.0", "4.1.1", true),
        ("!=4.1", "4.1.0", false),
        ("!=4.1", "4.1.1", false),
        ("!=4.1", "5.1.0-alpha.1", false),
        ("!=4.1.0", "5.1.0-alpha.1", false),
        ("!=4.1-alpha", "4.1.0", true),
        ("!=4.1", "5.1.0", true),
        ("<11", "0.1.0", true),
        ("<11", "11.1.0", false),
        ("<1.1", "0.1.0", true),
        ("<1.1", "1.1.0", false),
        ("<1.1", "1.1.1", false),
        ("<=11", "1.2.3", true),
        ("<=11", "12.2.3", false),
        ("<=11", "11.2.3", true),
        ("<=1.1", "1.2.3", false),
        ("<=1.1", "0.1.0", true),
        ("<=1.1", "1.1.0", true),
        ("<=1.1", "1.1.1", true),
        (">1.1", "4.1.0", true),
        (">1.1", "1.1.0", false),
        (">0", "0", false),
        (">0", "1", true),
        (">0", "0.0.1-alpha", false),
        (">0.0", "0.0.1-alpha", false),
        (">0-0", "0.0.1-alpha", false),
        (">0.0-0", "0.0.1-alpha", false),
        (">0", "0.0.0-alpha", false),
        (">0-0", "0.0.0-alpha", false),
        (">0.0.0-0", "0.0.0-alpha", true),
        (">1.2.3-alpha.1", "1.2.3-alpha.2", true),
        (">1.2.3-alpha.1", "1.3.3-alpha.2", true),
        (">11", "11.1.0", false),
        (">11.1", "11.1.0", false),
        (">11.1", "11.1.1", false),
        (">11.1", "11.2.1", true),
        (">=11", "11.1.2", true),
        (">=11.1", "11.1.2", true),
        (">=11.1", "11.0.2", false),
        (">=1.1", "4.1.0", true),
        (">=1.1", "1.1.0", true),
        (">=1.1", "0.0.9", false),
        (">=0", "0.0.1-alpha", false),
        (">=0.0", "0.0.1-alpha", false),
        (">=0-0", "0.0.1-alpha", true),
        (">=0.0-0", "0.0.1-alpha", true),
        (">=0", "0.0.0-alpha", false),
        (">=0-0", "0.0.0-alpha", true),
        (">=0.0.0-0", "0.0.0-alpha", true),
        (">=0.0.0-0", "1.2.3", true),
        (">=0.0.0-0", "3.4.5-beta.1", true),
        ("<0", "0.0.0-alpha", false),
        ("<0-z", "0.0.0-alpha", true),
        (">=0", "0", true),
        ("=0", "1", false),
        ("*", "1", true),
        ("*", "4.5.6", true),
        ("*", "1.2.3-alpha.1", false),
        ("*-0", "1.2.3-alpha.1", true),
        ("2.*", "1", false),
        ("2.*", "3.4.5", false),
        ("2.*", "2.1.1", true),
        ("2.1.*", "2.1.1", true),
        ("2.1.*", "2.2.1", false),
        ("2", "1", false),
        ("2", "3.4.5", false),
        ("2", "2.1.1", true),
        ("2.1", "2.1.1", true),
        ("2.1", "2.2.1", false),
        ("~1.2.3", "1.2.4", true),
        ("~1.2.3", "1.3.4", false),
        ("~1.2", "1.2.4", true),
        ("~1.2", "1.3.4", false),
        ("~1", "1.2.4", true),
        ("~1", "2.3.4", false),
        ("~0.2.3", "0.2.5", true),
        ("~0.2.3", "0.3.5", false),
        ("~1.2.3-beta.2", "1.2.3-beta.4", true),
        ("~1.2.3-beta.2", "1.2.4-beta.2", true),
        ("~1.2.3-beta.2", "1.3.4-beta.2", false),
        ("^1.2.3", "1.8.9", true),
        ("^1.2.3", "2.8.9", false),
        ("^1.2.3", "1.2.1", false),
        ("^1.1.0", "2.1.0", false),
        ("^1.2.0", "2.2.1", false),
        ("^1.2.0", "1.2.1-alpha.1", false),
        ("^1.2.0-alpha.0", "1.2.1-alpha.1", true),
        ("^1.2.0-alpha.0", "1.2.1-alpha.0", true),
        ("^1.2.0-alpha.2", "1.2.0-alpha.1", false),
        ("^1.2", "1.8.9", true),
        ("^1.2", "2.8.9", false),
        ("^1", "1.8.9", true),
        ("^1", "2.8.9", false),
        ("^0.2.3", "0.2.5", true),
        ("^0.2.3", "0.5.6", false),
        ("^0.2", "0.2.5", true),
        ("^0.2", "0.5.6", false),
        ("^0.0.3", "0.0.3", true),
        ("^0.0.3", "0.0.4", false),
        ("^0.0", "0.0.3", true),
        ("^0.0", "0.1.4", false),
        ("^0.0", "1.0.4", false),
        ("^0", "0.2.3", true),
        ("^0", "1.1.4", false),
        ("^0.2.3-beta.2", "0.2.3-beta.4", true),
        ("^0.2.3-beta.2", "0.2.4-beta.2", true),
        ("^0.2.3-beta.2", "0.3.4-beta.2", false),
        ("^0.2.3-beta.2", "0.2.3-beta.2", true),
        ("*", "1.2.3", true),
        ("~0.0.0", "1.2.3", true),
        ("0.x.x", "1.2.3", false),
        ("0.0.x", "1.2.3", false),
        ("0.0.0", "1.2.3", false),
        ("^0.0.0", "1.2.3", false),
        ("= 2.0", "1.2.3", false),
        ("= 2.0", "2.0.0", true),
        ("4.1.x", "4.1.3", true),
        ("1.x", "1.4", true),
        ("!=4.1-alpha", "4.1.0-alpha", false),
        ("!=4.1-alpha", "4.1.1-alpha", false),
        ("!=4.x", "5.1.0", true),
        ("!=4.x", "4.1.0", false),
        ("!=4.1.x", "4.2.0", true),
        ("!=4.2.x", "4.2.3", false),
        ("<1.x", "1.1.1", false),
        ("<1.x", "0.1.1", true),
        ("<1.x", "2.0.0", false),
        ("<1.1.x", "1.2.1", false),
        ("<1.1.x", "1.1.500", false),
        ("<1.1.x", "1.0.500", true),
        ("<1.2.x", "1.1.1", true),
        (">=1.1", "4.1.0-beta", false),
        ("<=1.1", "0.1.0-alpha", false),
        ("<=1.1-a", "0.1.0-alpha", true),
        ("<=1.x", "1.1.0", true),
        ("<=2.x", "3.0.0", false),
        ("<=1.1.x", "1.2.500", false),
        ("<=4.5", "3.4.0", true),
        ("<=4.5", "3.7.0", true),
        ("<=4.5", "4.6.3", false),
        (">1.1, <2", "1.1.1", false),
        (">1.1, <2", "1.2.1", true),
        (">1.1, <3", "4.3.2", false),
        (">=1.1, <2, !=1.2.3", "1.2.3", false),
        (">1.1 <2", "1.1.1", false),
        (">1.1 <2", "1.2.1", true),
        (">1.1    <3", "4.3.2", false),
        (">=1.1    <2    !=1.2.3", "1.2.3", false),
        (">=1.1, <2, !=1.2.3 || > 3", "4.1.2", true),
        (">=1.1, <2, !=1.2.3 || > 3", "3.1.2", false),
        (">=1.1, <2, !=1.2.3 || >= 3", "3.0.0", true),
        (">=1.1, <2, !=1.2.3 || > 3", "3.0.0", false),
        (">=1.1, <2, !=1.2.3 || > 3", "1.2.3", false),
        (">=1.1 <2 !=1.2.3", "1.2.3", false),
        (">=1.1 <2 !=1.2.3 || > 3", "4.1.2", true),
        (">=1.1 <2 !=1.2.3 || > 3", "3.1.2", false),
        (">=1.1 <2 !=1.2.3 || >= 3", "3.0.0", true),
        (">=1.1 <2 !=1.2.3 || > 3", "3.0.0", false),
        (">=1.1 <2 !=1.2.3 || > 3", "1.2.3", false),
        ("> 1.1, <     2", "1.1.1", false),
        (">   1.1, <2", "1.2.1", true),
        (">1.1, <  3", "4.3.2", false),
        (">= 1.1, <     2, !=1.2.3", "1.2.3", false),
        ("> 1.1 < 2", "1.1.1", false),
        (">1.1 < 2", "1.2.1", true),
        ("> 1.1    <3", "4.3.2", false),
        (">=1.1    < 2    != 1.2.3", "1.2.3", false),
        (">= 1.1, <2, !=1.2.3 || > 3", "4.1.2", true),
        (">= 1.1, <2, != 1.2.3 || > 3", "3.1.2", false),
        (">= 1.1, <2, != 1.2.3 || >= 3", "3.0.0", true),
        (">= 1.1, <2, !=1.2.3 || > 3", "3.0.0", false),
        (">= 1.1, <2, !=1.2.3 || > 3", "1.2.3", false),
        (">= 1.1 <2 != 1.2.3", "1.2.3", false),
        (">= 1.1 <2 != 1.2.3 || > 3", "4.1.2", true),
        (">= 1.1 <2 != 1.2.3 || > 3", "3.1.2", false),
        (">= 1.1 <2 != 1.2.3 || >= 3", "3.0.0", true),
        (">= 1.1 < 2 !=1.2.3 || > 3", "3.0.0", false),
        (">=1.1 < 2 !=1.2.3 || > 3", "1.2.3", false),
        (">= 1.0.0  <= 2.0.0-beta", "1.0.1-beta", true),
        (">= 1.0.0  <= 2.0.0-beta", "1.0.1", true),
        (">= 1.0.0  <= 2.0.0-beta", "3.0.0", false),
        (">= 1.0.0  <= 2.0.0-beta || > 3", "1.0.1-beta", true),
        (">= 1.0.0  <= 2.0.0-beta || > 3", "3.0.1-beta", false),
        (
            ">= 1.0.0  <= 2.0.0-beta != 1.0.1 || > 3",
            "1.0.1-beta",
            true,
        ),
        (
            ">= 1.0.0  <= 2.0.0-beta != 1.0.1-beta || > 3",
            "1.0.1-beta",
            false,
        ),
        (">= 1.0.0-0  <= 2.0.0", "1.0.1-beta", true),
        ("1.1 - 2", "1.1.1", true),
        ("1.5.0 - 4.5", "3.7.0", true),
        ("1.1-3", "4.3.2", false),
        ("^1.1", "1.1.1", true),
        ("^1.1", "4.3.2", false),
        ("^1.x", "1.1.1", true),
        ("^2.x", "1.1.1", false),
        ("^1.x", "2.1.1", false),
        ("^1.x", "1.1.1-beta1", false),
        ("^1.1.2-alpha", "1.2.1-beta1", true),
        ("^1.2.x-alpha", "1.1.1-beta1", false),
        ("^0.0.1", "0.0.1", true),
        ("^0.0.1", "0.3.1", false),
        ("~*", "2.1.1", true),
        ("~1", "2.1.1", false),
        ("~1", "1.3.5", true),
        ("~1", "1.4", true),
        ("~1.x", "2.1.1", false),
        ("~1.x", "1.3.5", true),
        ("~1.x", "1.4", true),
        ("~1.1", "1.1.1", true),
        ("~1.1", "1.1.1-alpha", false),
        ("~1.1-alpha", "1.1.1-beta", true),
        ("~1.1.1-beta", "1.1.1-alpha", false),
        ("~1.1.1-beta", "1.1.1", true),
        ("~1.2.3", "1.2.5", true),
        ("~1.2.3", "1.2.2", false),
        ("~1.2.3", "1.3.2", false),
        ("~1.1", "1.2.3", false),
        ("~1.3", "2.4.5", false),
        ("1.0.0 - 2.0.0 <=2.0.0", "1.5.0", true),
        ("1.0.0 - 2.0.0, <=2.0.0", "1.5.0", true),
        ("<2.x", "1.1.1", true),
        ("<1.x", "2.1.1", false),
        ("<=2.x", "3.1.0", false),
        ("^1.1", "1.1.1-alpha", false),
        ("^1.1.1-alpha", "1.1.1-beta", true),
        ("^1.1.1-beta", "1.1.1-alpha", false),
        ("^0.0.1", "0.1.3", false),
        ("~1", "1.3.5-beta", false),
        ("~1.x", "1.3.5-beta", false),
        ("~1.3.6-alpha", "1.3.5-beta", false),
        ("~1.3.5-alpha", "1.3.5-beta", true),
        ("~1.3.5-beta", "1.3.5-alpha", false),
    ];

    /// Further cases for the ranges Helm charts use, and the odd corners of the
    /// grammar, checked against the Go library's rules.
    const MORE_CHECKS: &[(&str, &str, bool)] = &[
        ("^1.2", "1.2.0", true),
        ("^1.2", "1.99.0", true),
        ("^1.2", "1.1.9", false),
        ("^1.2", "2.0.0", false),
        ("^1.2", "1.5.0-rc.1", false),
        ("~1.2.3", "1.2.3", true),
        ("~1.2.3", "1.2.99", true),
        ("~> 1.2.3", "1.3.0", false),
        ("~>1.2", "1.2.7", true),
        (">=1.0 <2.0", "1.9.9", true),
        (">=1.0 <2.0", "2.0.0", false),
        (">=1.0 <2.0", "2.0.0-alpha", false),
        (">= 1.2, < 3", "2.9.9", true),
        (">= 1.2, < 3", "3.0.0", false),
        (">= 1.2 , < 3", "1.2.0", true),
        ("1.2.x", "1.2.9", true),
        ("1.2.x", "1.3.0", false),
        ("1.2.X", "1.2.9", true),
        ("1.2.*", "1.2.9", true),
        ("1.x.x", "1.9.9", true),
        ("1.x.5", "1.9.0", true),
        ("x.2.3", "7.0.0", true),
        ("*", "0.0.0", true),
        ("*", "99.0.0+build", true),
        ("X", "1.0.0", true),
        ("1.0 - 2.0", "2.0.0", true),
        // `<= 2.0` accepts every 2.0.x.
        ("1.0 - 2.0", "2.0.1", true),
        ("1.0 - 2.0", "2.1.0", false),
        ("1.0 - 2.0", "0.9.9", false),
        ("1.0 -  2.0", "1.5.0", true),
        ("1.0\t-\t2.0", "1.5.0", true),
        ("1.0 - 2", "2.5.0", true),
        ("1.0 - 2.0 || 4.x", "4.2.0", true),
        ("^1 || ^2", "2.3.0", true),
        ("^1 || ^2", "3.0.0", false),
        ("^1||^2", "1.0.0", true),
        ("1.2.3", "1.2.3", true),
        ("1.2.3", "1.2.4", false),
        ("1.2.3", "1.2.3+build.7", true),
        ("1.2.3+build", "1.2.3", true),
        ("v1.2.3", "1.2.3", true),
        ("=v1.2.3", "1.2.3", true),
        ("=1.2.3", "1.2.3-rc.1", false),
        ("1.2.3-rc.1", "1.2.3-rc.1", true),
        ("1.2.3-rc.1", "1.2.3", false),
        ("=< 1.2.3", "1.2.3", true),
        ("=> 1.2.3", "1.2.3", true),
        (">=01.02.03", "1.2.3", true),
        (">=1.2.3-0", "1.2.3-alpha", true),
        (">=1.2.3-0", "1.3.0-alpha", true),
        (">0.0.0-0", "0.0.1-rc.1", true),
        (">0.0.0-0", "5.0.0", true),
        ("1.2-3", "1.2.0-3", true),
        ("1.2-3", "1.2.1", true),
        ("1.2-3", "1.3.0", false),
        ("^0.0", "0.0.9", true),
        ("^0.0", "0.1.0", false),
        ("^0", "0.9.0", true),
        ("^0", "1.0.0", false),
        ("^0.1.2", "0.1.9", true),
        ("^0.1.2", "0.2.0", false),
        ("^0.0.0", "0.0.0", true),
        ("^0.0.0", "0.0.1", false),
        ("^*", "0.0.0", true),
        ("^*", "0.0.1", false),
        ("^*", "1.0.0", false),
        ("~0", "0.5.0", true),
        ("~0", "1.0.0", false),
        ("~0.0", "0.0.5", true),
        ("~0.0", "0.1.0", false),
        ("<=*", "0.0.7", true),
        ("<=*", "0.1.0", false),
        (">*", "0.0.1", true),
        ("<*", "0.0.0", false),
        ("!=*", "0.0.0", false),
        ("!=*", "0.0.1", true),
        ("!=1.2.x", "1.2.5", false),
        ("!=1.2.x-beta", "1.2.0-beta", false),
        ("!=1.2.x-beta", "1.2.0-rc", true),
        ("1||2 - 3", "1.5.0", true),
        ("1||2 - 3", "3.0.0", true),
        ("1||2 - 3", "2.5.0", true),
        ("1||2 - 3", "5.0.0", true),
        ("1 - 2||3", "3.5.0", true),
        ("1 - 2||3", "2.5.0", true),
        (">= 1.0.0, <= 2.0.0 || >= 3.0.0-0", "3.0.0-alpha", true),
        (">= 1.0.0, <= 2.0.0 || >= 3.0.0-0", "1.5.0-alpha", false),
        ("<2-0", "1.9.9-rc", true),
        ("<2", "1.9.9-rc", false),
    ];

    #[test]
    fn masterminds_check_table() {
        assert!(MASTERMINDS_CHECKS.len() >= 200);
        let mut failures = Vec::new();
        for &(text, candidate, expected) in MASTERMINDS_CHECKS.iter().chain(MORE_CHECKS) {
            let actual = constraint(text).matches(&version(candidate));
            if actual != expected || is_compatible_range(text, candidate) != expected {
                failures.push(format!("{text:?} vs {candidate:?}: expected {expected}"));
            }
        }
        assert!(failures.is_empty(), "{failures:#?}");
    }

    #[test]
    fn versions_from_the_semver_crate_match_too() {
        let c = constraint("^1.2");
        assert!(c.matches(&Version::new(1, 4, 0)));
        assert!(!c.matches(&Version::new(2, 0, 0)));
        let pre = Version::parse("1.4.0-rc.1").map_err(|e| e.to_string());
        assert_eq!(pre.map(|v| c.matches(&v)), Ok(false));
    }

    #[test]
    fn improper_constraints() {
        for text in [
            "",
            " ",
            "foo",
            ">= bar",
            "BAR >= 1.2.3",
            "12.3.4.1234",
            "12.23.4.1234",
            "12.3.34.1234",
            "12.3.34~ 1.2.3",
            "1 ||",
            "|| 1",
            "1 || || 2",
            ">=1,,<2",
            ",1",
            "1,",
            ">1<2",
            "> = 1",
            "==1",
            ">>1",
            "=>=1",
            "~=1",
            "1.2 -3",
            "1.2- 3",
            "1 - ",
            "v",
            "vv1",
            "V1.2.3",
            "1.2.3-",
            "1.2.3+",
            "1.2.3-beta..1",
            "1.2.3_1",
            "latest",
            "1.2.3\u{a0}",
            "\u{b}1.2.3",
        ] {
            match Constraint::parse(text) {
                Err(Error::ImproperConstraint(_)) => {}
                other => panic!("{text:?}: expected an improper constraint, got {other:?}"),
            }
            assert!(!is_compatible_range(text, "1.2.3"), "{text:?}");
        }
    }

    #[test]
    fn comparisons_whose_version_does_not_parse() {
        for text in [
            "v1.2.3-beta.01",
            "1x",
            "x1",
            "xx",
            "**",
            "1.2x",
            "1.2.3x",
            "1|2",
            "1.|",
            "1 | 2",
            ">=1.2.3-01",
            "1.x-01",
            "99999999999999999999",
            "^1.99999999999999999999",
        ] {
            match Constraint::parse(text) {
                Err(Error::InvalidComparison { .. }) => {}
                other => panic!("{text:?}: expected an invalid comparison, got {other:?}"),
            }
        }
        // Whatever follows a wildcard is never read.
        for text in ["x.|", "1.x.|", "1.x.999999999999999999999", "*.**"] {
            assert!(Constraint::parse(text).is_ok(), "{text:?}");
        }
    }

    #[test]
    fn alternatives_and_comparisons_are_counted_like_masterminds() {
        for (text, alternatives, first) in [
            (">= 1.1", 1, 1),
            (">40.50.60, < 50.70", 1, 2),
            ("2.0", 1, 1),
            ("v2.3.5-20161202202307-sha.e8fc5e5", 1, 1),
            ("v1.2.3-0abc", 1, 1),
            (">= 1.2.3 < 2.0", 1, 2),
            (">= 1.2.3 < 2.0 || => 3.0 < 4", 2, 2),
            (">= 1.2.3, < 2.0", 1, 2),
            (">= 1.2.3, < 2.0 || => 3.0, < 4", 2, 2),
            ("3 - 4 || => 3.0, < 4", 2, 2),
            ("12.3.34 ~1.2.3", 1, 2),
            ("1.0.0 - 2.0.0, <=2.0.0", 1, 3),
        ] {
            let c = constraint(text);
            assert_eq!(c.alternatives.len(), alternatives, "{text:?}");
            assert_eq!(c.alternatives[0].comparisons.len(), first, "{text:?}");
        }
    }

    #[test]
    fn hyphen_ranges_are_rewritten_like_masterminds() {
        for (text, rewritten) in [
            ("2 - 3", ">= 2, <= 3 "),
            ("2 - 3, 2 - 3", ">= 2, <= 3 ,>= 2, <= 3 "),
            ("2 - 3, 4.0.0 - 5.1", ">= 2, <= 3 ,>= 4.0.0, <= 5.1 "),
            ("2 - 3 4.0.0 - 5.1", ">= 2, <= 3 >= 4.0.0, <= 5.1 "),
            ("1.0.0 - 2.0.0 <=2.0.0", ">= 1.0.0, <= 2.0.0 <=2.0.0"),
            ("1.1-3", "1.1-3"),
            ("1||2 - 3", ">= 1||2, <= 3 "),
            ("  v1 -\t2.x+b  ", ">= v1, <= 2.x+b "),
        ] {
            assert_eq!(rewrite_hyphen_ranges(text), rewritten, "{text:?}");
        }
    }

    #[test]
    fn display_is_the_original_text() {
        for text in [
            "*",
            ">= 1.2.3",
            "2.x,   >=1.2.3 || >4.5.6, < 5.7",
            "1.0 - 2.0",
            " ^1 ",
        ] {
            assert_eq!(constraint(text).to_string(), text);
            assert_eq!(constraint(text).as_str(), text);
        }
        assert_eq!(Constraint::any().to_string(), "*");
        assert_eq!(
            "~1.2".parse::<Constraint>().map(|c| c.to_string()),
            Ok("~1.2".to_owned())
        );
    }

    #[test]
    fn any_is_the_star_constraint() {
        let any = Constraint::any();
        for candidate in ["0.0.0", "1.2.3", "v9", "1.0.0+b", "1.0.0-rc.1", "0.0.0-0"] {
            let v = version(candidate);
            assert_eq!(
                any.matches(&v),
                constraint("*").matches(&v),
                "{candidate:?}"
            );
        }
    }

    #[test]
    fn error_messages_quote_the_input() {
        let message = |text: &str| {
            Constraint::parse(text)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert_eq!(
            message("foo"),
            Err(r#"improper constraint: "foo""#.to_owned())
        );
        assert_eq!(message(""), Err(r#"improper constraint: """#.to_owned()));
        assert_eq!(
            message("^1 || bar "),
            Err(r#"improper constraint: " bar ""#.to_owned())
        );
        assert_eq!(
            message(">= 1x"),
            Err(r#"improper constraint: ">= 1x": invalid semantic version: "1x.0.0""#.to_owned())
        );
        let version_message =
            |text: &str| parse_version(text).map(|_| ()).map_err(|e| e.to_string());
        assert_eq!(
            version_message("foo"),
            Err(r#"invalid semantic version: "foo""#.to_owned())
        );
        assert_eq!(
            version_message("1.2.3-beta.01"),
            Err(r#"invalid semantic version: "1.2.3-beta.01": pre-release identifier "01" starts with 0"#.to_owned())
        );
        assert_eq!(
            parse_version("18446744073709551616"),
            Err(Error::NumberOutOfRange {
                input: "18446744073709551616".to_owned(),
                number: "18446744073709551616".to_owned(),
            })
        );
    }

    /// (version, fails), from Masterminds' `TestNewVersion` (loose mode).
    const MASTERMINDS_VERSIONS: &[(&str, bool)] = &[
        ("1.2.3", false),
        ("1.2.3-alpha.01", true),
        ("1.2.3+test.01", false),
        ("1.2.3-alpha.-1", false),
        ("v1.2.3", false),
        ("1.0", false),
        ("v1.0", false),
        ("1", false),
        ("v1", false),
        ("1.2.beta", true),
        ("v1.2.beta", true),
        ("foo", true),
        ("1.2-5", false),
        ("v1.2-5", false),
        ("1.2-beta.5", false),
        ("v1.2-beta.5", false),
        ("\n1.2", true),
        ("\nv1.2", true),
        ("1.2.0-x.Y.0+metadata", false),
        ("v1.2.0-x.Y.0+metadata", false),
        ("1.2.0-x.Y.0+metadata-width-hypen", false),
        ("v1.2.0-x.Y.0+metadata-width-hypen", false),
        ("1.2.3-rc1-with-hypen", false),
        ("v1.2.3-rc1-with-hypen", false),
        ("1.2.3-0abc123", false),
        ("1.2.3-beta.01", true),
        ("1.2.3.4", true),
        ("v1.2.3.4", true),
        ("1.2.2147483648", false),
        ("1.2147483648.3", false),
        ("2147483648.3.0", false),
        ("12.3.4.1234", true),
        ("12.23.4.1234", true),
        ("12.3.34.1234", true),
        ("20221209-update-renovatejson-v4", false),
        ("1.1.2+.123", true),
        ("1.0.0-alpha_beta", true),
        ("1.0.0-alpha..", true),
        ("1.0.0-alpha..1", true),
        ("9.8.7+meta+meta", true),
        ("1.2.31----RC-SNAPSHOT.12.09.1--.12+788", true),
        ("01.1.1", false),
        ("1.01.1", false),
        ("1.1.01", false),
    ];

    #[test]
    fn lenient_versions() {
        for &(text, fails) in MASTERMINDS_VERSIONS {
            assert_eq!(parse_version(text).is_err(), fails, "{text:?}");
        }
        for (text, expected) in [
            ("1", "1.0.0"),
            ("v1", "1.0.0"),
            ("1.2", "1.2.0"),
            ("v1.2", "1.2.0"),
            ("01.02.03", "1.2.3"),
            ("1.2-beta.5", "1.2.0-beta.5"),
            ("1.2.3+build.01", "1.2.3+build.01"),
            (
                "20221209-update-renovatejson-v4",
                "20221209.0.0-update-renovatejson-v4",
            ),
            ("18446744073709551615.0.0", "18446744073709551615.0.0"),
        ] {
            assert_eq!(version(text).to_string(), expected, "{text:?}");
        }
        for text in [
            "", " 1.2.3", "1.2.3 ", "1.2.3\n", "V1.2.3", "1.2.3.4", "1..2", "+1.2.3", "1.2.+3",
        ] {
            assert!(parse_version(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn precedence_like_masterminds() {
        // From Masterminds' `TestCompare`.
        for (a, b, expected) in [
            ("1.2.3", "1.5.1", Ordering::Less),
            ("2.2.3", "1.5.1", Ordering::Greater),
            ("2.2.3", "2.2.2", Ordering::Greater),
            ("3.2-beta", "3.2-beta", Ordering::Equal),
            ("1.3", "1.1.4", Ordering::Greater),
            ("4.2", "4.2-beta", Ordering::Greater),
            ("4.2-beta", "4.2", Ordering::Less),
            ("4.2-alpha", "4.2-beta", Ordering::Less),
            ("4.2-alpha", "4.2-alpha", Ordering::Equal),
            ("4.2-beta.2", "4.2-beta.1", Ordering::Greater),
            ("4.2-beta2", "4.2-beta1", Ordering::Greater),
            ("4.2-beta", "4.2-beta.2", Ordering::Less),
            ("4.2-beta", "4.2-beta.foo", Ordering::Less),
            ("4.2-beta.2", "4.2-beta", Ordering::Greater),
            ("4.2-beta.foo", "4.2-beta", Ordering::Greater),
            ("1.2+bar", "1.2+baz", Ordering::Equal),
            ("1.0.0-beta.4", "1.0.0-beta.-2", Ordering::Less),
            ("1.0.0-beta.-2", "1.0.0-beta.-3", Ordering::Less),
            ("1.0.0-beta.-3", "1.0.0-beta.5", Ordering::Greater),
            ("1.0.0-10", "1.0.0-9", Ordering::Greater),
            ("1.0.0-BETA", "1.0.0-alpha", Ordering::Less),
            // Too large for Go's uint64: compared as a word, after numbers.
            ("1.0.0-99999999999999999999", "1.0.0-5", Ordering::Greater),
            ("1.0.0-99999999999999999999", "1.0.0-a", Ordering::Less),
        ] {
            assert_eq!(precedence(&version(a), &version(b)), expected, "{a} vs {b}");
        }
    }

    #[test]
    fn best_match_picks_the_highest_match() {
        let index = [
            "2.1.0-rc.1",
            "2.0.0",
            "1.10.0",
            "1.9.3",
            "v1.9.2",
            "1.2.0",
            "not-a-version",
            "1.2.0-alpha",
            "0.3.1",
            "0.3.0",
        ];
        let pick = |text: &str| best_match(&constraint(text), index);
        assert_eq!(pick("^1.2"), Some("1.10.0"));
        assert_eq!(pick("~1.9.0"), Some("1.9.3"));
        assert_eq!(pick("1.9.x"), Some("1.9.3"));
        assert_eq!(pick(">=1.0 <2.0"), Some("1.10.0"));
        assert_eq!(pick(">= 1.2, < 3"), Some("2.0.0"));
        assert_eq!(pick("*"), Some("2.0.0"));
        assert_eq!(pick(">0.0.0-0"), Some("2.1.0-rc.1"));
        assert_eq!(pick("^2.1.0-0"), Some("2.1.0-rc.1"));
        assert_eq!(pick("1.0 - 1.9.2"), Some("v1.9.2"));
        assert_eq!(pick("^0.3"), Some("0.3.1"));
        assert_eq!(pick("^0.3 || ^1"), Some("1.10.0"));
        assert_eq!(pick("0.3.0"), Some("0.3.0"));
        assert_eq!(pick("1.9.2"), Some("v1.9.2"));
        assert_eq!(pick("<1.2.0"), Some("0.3.1"));
        assert_eq!(pick("^3"), None);
        assert_eq!(pick("1.2.0-beta"), None);
        assert_eq!(best_match(&Constraint::any(), index), Some("2.0.0"));
        assert_eq!(best_match(&Constraint::any(), ["1.0.0-rc.1"]), None);
        assert_eq!(best_match(&Constraint::any(), []), None);
    }

    /// Recorded from `helm show chart sub --repo ... --version <constraint>`
    /// (helm v4.1.4) against a repository index holding these versions, in
    /// the order `helm repo index` wrote them.
    #[test]
    fn best_match_agrees_with_helm_repository_lookups() {
        let index = [
            "2.1.0-rc.1",
            "2.0.0",
            "1.10.0",
            "1.9.3",
            "1.9.2+b",
            "v1.9.2",
            "1.2.0",
            "1.2.0-alpha",
            "0.3.1",
            "0.3.0",
        ];
        for (text, expected) in [
            ("^1.2", Some("1.10.0")),
            ("~1.9.0", Some("1.9.3")),
            ("1.9.x", Some("1.9.3")),
            (">=1.0 <2.0", Some("1.10.0")),
            (">= 1.2, < 3", Some("2.0.0")),
            ("*", Some("2.0.0")),
            (">0.0.0-0", Some("2.1.0-rc.1")),
            ("1.0 - 1.9.2", Some("1.9.2+b")),
            ("^0.3 || ^1", Some("1.10.0")),
            ("1.9.2", Some("1.9.2+b")),
            ("v1.9.2", Some("v1.9.2")),
            ("1.9.2+b", Some("1.9.2+b")),
            ("=1.9.2", Some("1.9.2+b")),
            ("<1.2.0", Some("0.3.1")),
            ("^3", None),
            ("1.2.0-beta", None),
        ] {
            assert_eq!(best_match(&constraint(text), index), expected, "{text:?}");
        }
        // No version requested.
        assert_eq!(best_match(&Constraint::any(), index), Some("2.0.0"));
    }

    #[test]
    fn best_match_prefers_the_exact_spelling() {
        let index = ["1.2.3+b", "v1.2.3", "1.2.3", "1.x"];
        assert_eq!(best_match(&constraint("1.2.3"), index), Some("1.2.3"));
        assert_eq!(best_match(&constraint("v1.2.3"), index), Some("v1.2.3"));
        assert_eq!(best_match(&constraint("=1.2.3"), index), Some("1.2.3+b"));
        // Helm returns an exact spelling even when it is not a version.
        assert_eq!(best_match(&constraint("1.x"), index), Some("1.x"));
        assert_eq!(
            best_match(&constraint("1.x"), ["1.2.3", "1.4.0"]),
            Some("1.4.0")
        );
    }

    #[test]
    fn long_inputs_stay_fast() {
        let digits = "1".repeat(200_000);
        assert!(Constraint::parse(&digits).is_err());
        let spaced = "1 ".repeat(100_000);
        assert!(Constraint::parse(&spaced).is_ok());
        let dotted = format!("1.0.0-{}", "a.".repeat(100_000));
        assert!(Constraint::parse(&dotted).is_err());
        let hyphens = "1 - 2 ".repeat(2_000);
        assert!(Constraint::parse(&hyphens).is_ok());
    }

    fn version_text() -> impl Strategy<Value = String> {
        "v?[0-9]{1,3}(\\.[0-9]{1,3}){0,2}(-[0-9A-Za-z-]{1,4}(\\.[0-9A-Za-z-]{1,4}){0,2})?(\\+[0-9A-Za-z-]{1,4})?"
    }

    proptest! {
        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,40}", candidate in "\\PC{0,20}") {
            let parsed = Constraint::parse(&text);
            let _ = parse_version(&text);
            let _ = is_compatible_range(&text, &candidate);
            if let Ok(c) = parsed {
                prop_assert_eq!(c.to_string(), text.clone());
                let _ = best_match(&c, [candidate.as_str(), text.as_str()]);
            }
        }

        #[test]
        fn constraint_alphabet_never_panics(
            text in "[0-9xX*|.,<>=!~^ v\\-+a\t]{0,40}",
            candidate in version_text(),
        ) {
            if let Ok(c) = Constraint::parse(&text)
                && let Ok(v) = parse_version(&candidate)
            {
                let _ = c.matches(&v);
            }
        }

        #[test]
        fn equality_constraint_matches_its_version(text in version_text()) {
            if let Ok(v) = parse_version(&text) {
                let exact = format!("={v}");
                prop_assert!(constraint(&exact).matches(&v), "{} vs {}", exact, v);
                let at_least = format!(">= {text}");
                let not_equal = format!("!={text}");
                prop_assert!(is_compatible_range(&at_least, &text));
                prop_assert!(!is_compatible_range(&not_equal, &text));
            }
        }

        #[test]
        fn strict_versions_parse_like_the_semver_crate(text in version_text()) {
            if let Ok(strict) = Version::parse(&text) {
                prop_assert_eq!(parse_version(&text), Ok(strict));
            }
        }
    }
}
