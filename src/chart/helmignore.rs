//! `.helmignore`, with Helm's own rules (which are not gitignore's).
//!
//! Each line is a Go `filepath.Match` pattern. A pattern with a `/` matches the whole path
//! relative to the chart; one without matches the base name; a trailing `/` matches only
//! directories; a leading `/` anchors at the chart root. A `!` pattern ignores everything it does
//! NOT match, which is how Helm evaluates negation. `**` is refused, as in Helm.

/// The parsed rules of a `.helmignore` file.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    patterns: Vec<Pattern>,
}

#[derive(Debug, Clone)]
struct Pattern {
    glob: String,
    negate: bool,
    must_be_dir: bool,
    whole_path: bool,
}

impl Rules {
    /// Parses the text of a `.helmignore` file. The error names the offending line.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut patterns = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let rule = line.trim();
            if rule.is_empty() || rule.starts_with('#') {
                continue;
            }
            if rule.contains("**") {
                return Err(format!(
                    "line {}: double-star (**) syntax is not supported",
                    number + 1
                ));
            }
            if glob_match(rule, "abc").is_err() {
                return Err(format!(
                    "line {}: syntax error in pattern {rule:?}",
                    number + 1
                ));
            }
            let (negate, rule) = match rule.strip_prefix('!') {
                Some(rest) => (true, rest),
                None => (false, rule),
            };
            let (must_be_dir, rule) = match rule.strip_suffix('/') {
                Some(rest) => (true, rest),
                None => (false, rule),
            };
            let (whole_path, glob) = match rule.strip_prefix('/') {
                Some(rest) => (true, rest),
                None => (rule.contains('/'), rule),
            };
            patterns.push(Pattern {
                glob: glob.to_string(),
                negate,
                must_be_dir,
                whole_path,
            });
        }
        Ok(Rules { patterns })
    }

    /// Whether Helm skips `path` (relative to the chart root, `/`-separated).
    pub fn ignores(&self, path: &str, is_dir: bool) -> bool {
        if path.is_empty() || path == "." || path == "./" {
            return false;
        }
        for pattern in &self.patterns {
            let subject = if pattern.whole_path {
                path
            } else {
                path.rsplit('/').next().unwrap_or(path)
            };
            let matched = glob_match(&pattern.glob, subject).unwrap_or(false);
            if pattern.negate {
                if (pattern.must_be_dir && !is_dir) || !matched {
                    return true;
                }
                continue;
            }
            if pattern.must_be_dir && !is_dir {
                continue;
            }
            if matched {
                return true;
            }
        }
        false
    }
}

/// A glob pattern that Go's `filepath.Match` rejects (`[` without `]`, a trailing `\`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("syntax error in pattern")]
pub struct BadPattern;

/// Go's `filepath.Match` on `/`-separated paths: `*` and `?` never match `/`, `[...]` classes
/// with `^` negation and ranges, `\` escapes. A malformed pattern is an error.
pub fn glob_match(pattern: &str, name: &str) -> Result<bool, BadPattern> {
    let pattern: Vec<char> = pattern.chars().collect();
    let name: Vec<char> = name.chars().collect();
    let result = match_from(&pattern, &name)?;
    // Go reports a malformed pattern even when the name already failed to match.
    validate_pattern(&pattern)?;
    Ok(result)
}

fn validate_pattern(pattern: &[char]) -> Result<(), BadPattern> {
    let mut i = 0;
    while i < pattern.len() {
        match pattern[i] {
            '\\' => {
                if i + 1 >= pattern.len() {
                    return Err(BadPattern);
                }
                i += 2;
            }
            '[' => {
                let (_, next) = class_matches(pattern, i, 'a')?;
                i = next;
            }
            _ => i += 1,
        }
    }
    Ok(())
}

fn match_from(pattern: &[char], name: &[char]) -> Result<bool, BadPattern> {
    let Some((&first, rest)) = pattern.split_first() else {
        return Ok(name.is_empty());
    };
    match first {
        '*' => {
            // Try every split that does not cross a separator.
            let mut consumed = 0;
            loop {
                if match_from(rest, &name[consumed..])? {
                    return Ok(true);
                }
                if consumed >= name.len() || name[consumed] == '/' {
                    return Ok(false);
                }
                consumed += 1;
            }
        }
        '?' => match name.split_first() {
            Some((&c, tail)) if c != '/' => match_from(rest, tail),
            _ => Ok(false),
        },
        '[' => {
            let Some((&c, tail)) = name.split_first() else {
                class_matches(pattern, 0, 'a')?;
                return Ok(false);
            };
            let (matched, next) = class_matches(pattern, 0, c)?;
            if matched && c != '/' {
                match_from(&pattern[next..], tail)
            } else {
                Ok(false)
            }
        }
        '\\' => {
            let Some(&literal) = rest.first() else {
                return Err(BadPattern);
            };
            match name.split_first() {
                Some((&c, tail)) if c == literal => match_from(&rest[1..], tail),
                _ => Ok(false),
            }
        }
        literal => match name.split_first() {
            Some((&c, tail)) if c == literal => match_from(rest, tail),
            _ => Ok(false),
        },
    }
}

/// Evaluates the class starting at `pattern[start] == '['` against `c`; returns whether it
/// matched and the index after the closing `]`.
fn class_matches(pattern: &[char], start: usize, c: char) -> Result<(bool, usize), BadPattern> {
    let mut i = start + 1;
    let negated = pattern.get(i) == Some(&'^');
    if negated {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    loop {
        let Some(&ch) = pattern.get(i) else {
            return Err(BadPattern);
        };
        if ch == ']' && !first {
            i += 1;
            break;
        }
        first = false;
        let (low, after_low) = class_char(pattern, i)?;
        i = after_low;
        let mut high = low;
        if pattern.get(i) == Some(&'-') && pattern.get(i + 1).is_some_and(|&n| n != ']') {
            let (h, after_high) = class_char(pattern, i + 1)?;
            high = h;
            i = after_high;
        }
        if low <= c && c <= high {
            matched = true;
        }
    }
    Ok((matched != negated, i))
}

fn class_char(pattern: &[char], i: usize) -> Result<(char, usize), BadPattern> {
    match pattern.get(i) {
        Some('\\') => pattern.get(i + 1).map(|&c| (c, i + 2)).ok_or(BadPattern),
        Some('-') | Some(']') | None => Err(BadPattern),
        Some(&c) => Ok((c, i + 1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_filepath_match_semantics() {
        let cases = [
            ("abc", "abc", true),
            ("*", "abc", true),
            ("*c", "abc", true),
            ("a*", "a", true),
            ("a*/b", "abc/b", true),
            ("a*/b", "a/c/b", false),
            ("a*b*c*d*e*/f", "axbxcxdxe/f", true),
            ("ab[c]", "abc", true),
            ("ab[b-d]", "abc", true),
            ("ab[e-g]", "abc", false),
            ("ab[^c]", "abc", false),
            ("ab[^e-g]", "abc", true),
            ("a\\*b", "a*b", true),
            ("a\\*b", "ab", false),
            ("a?b", "a☺b", true),
            ("a?b", "a/b", false),
            ("*.tgz", "bar-1.0.0.tgz", true),
            ("*", "a/b", false),
        ];
        for (pattern, name, want) in cases {
            assert_eq!(glob_match(pattern, name), Ok(want), "{pattern} vs {name}");
        }
        assert_eq!(glob_match("[", "a"), Err(BadPattern));
        assert_eq!(glob_match("a[", "x"), Err(BadPattern));
        assert_eq!(glob_match("[a-", "a"), Err(BadPattern));
        assert_eq!(glob_match("\\", "a"), Err(BadPattern));
    }

    #[test]
    fn rules_follow_helm() {
        let rules = Rules::parse("# comment\n\n*.md\ncharts/skipped/\n/top.txt\n").unwrap();
        assert!(rules.ignores("charts/README.md", false));
        assert!(rules.ignores("charts/skipped", true));
        assert!(!rules.ignores("charts/skipped", false));
        assert!(rules.ignores("top.txt", false));
        assert!(!rules.ignores("charts/top.txt", false));
        assert!(!rules.ignores("charts/bar", true));
        // Helm's negation: everything that does not match is ignored.
        let negated = Rules::parse("!charts\n").unwrap();
        assert!(negated.ignores("values.yaml", false));
        assert!(!negated.ignores("charts", true));
        assert!(
            Rules::parse("a/**/b\n")
                .unwrap_err()
                .contains("double-star")
        );
        assert!(Rules::parse("[\n").unwrap_err().contains("line 1"));
    }
}
