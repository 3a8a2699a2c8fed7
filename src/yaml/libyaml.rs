//! libyaml's event parser (the `unsafe-libyaml` translation of libyaml 0.2.5), behind a safe,
//! owning interface: the only place of [`crate::yaml`] that calls into it.
//!
//! The parser reads a borrowed string and hands out owned events; libyaml's own event and parser
//! structures are freed as soon as they are read (events) or when the [`Parser`] is dropped,
//! whatever happened in between.

use std::ffi::CStr;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use unsafe_libyaml::{
    YAML_ALIAS_EVENT, YAML_DOCUMENT_END_EVENT, YAML_DOCUMENT_START_EVENT,
    YAML_DOUBLE_QUOTED_SCALAR_STYLE, YAML_FLOW_MAPPING_STYLE, YAML_FLOW_SEQUENCE_STYLE,
    YAML_FOLDED_SCALAR_STYLE, YAML_LITERAL_SCALAR_STYLE, YAML_MAPPING_END_EVENT,
    YAML_MAPPING_START_EVENT, YAML_READER_ERROR, YAML_SCALAR_EVENT, YAML_SCANNER_ERROR,
    YAML_SEQUENCE_END_EVENT, YAML_SEQUENCE_START_EVENT, YAML_SINGLE_QUOTED_SCALAR_STYLE,
    YAML_STREAM_START_EVENT, yaml_event_delete, yaml_event_t, yaml_mark_t, yaml_parser_delete,
    yaml_parser_initialize, yaml_parser_parse, yaml_parser_set_input_string, yaml_parser_t,
};

/// A position in the parsed text, 0-based as libyaml counts: `index` in bytes, `line` in line
/// breaks (`\n`, `\r`, `\r\n`, U+0085, U+2028, U+2029) and `column` in characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Mark {
    pub index: usize,
    pub line: usize,
    pub column: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ScalarStyle {
    Plain,
    SingleQuoted,
    DoubleQuoted,
    Literal,
    Folded,
}

/// A parsing event. Anchors are names without `&`; tags are resolved (`tag:yaml.org,2002:str`
/// for `!!str`, `!` for the non-specific tag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Event {
    StreamStart,
    /// Also what the parser gives after the end of the stream, or after an error.
    StreamEnd,
    /// `version` is the `%YAML` directive's (major, minor), if there is one.
    DocumentStart {
        version: Option<(i32, i32)>,
    },
    DocumentEnd,
    Alias {
        anchor: String,
    },
    Scalar {
        value: String,
        anchor: Option<String>,
        tag: Option<String>,
        style: ScalarStyle,
    },
    SequenceStart {
        anchor: Option<String>,
        tag: Option<String>,
        flow: bool,
    },
    SequenceEnd,
    MappingStart {
        anchor: Option<String>,
        tag: Option<String>,
        flow: bool,
    },
    MappingEnd,
}

/// An event and the span of text it comes from. For a node, `start` is where its first property
/// (anchor or tag) starts, or the node itself if it has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Located {
    pub event: Event,
    pub start: Mark,
    pub end: Mark,
}

/// Which part of libyaml found an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// Reading characters (a character YAML does not allow): only `index` of the mark is known.
    Reader,
    /// Splitting the text into tokens.
    Scanner,
    /// Putting tokens together into nodes.
    Parser,
}

/// Why libyaml stopped, in its own words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SyntaxError {
    pub stage: Stage,
    /// What is wrong (`did not find expected key`).
    pub problem: String,
    pub problem_mark: Mark,
    /// What libyaml was reading (`while parsing a block mapping`) and where that started.
    pub context: Option<(String, Mark)>,
}

/// libyaml's event parser over a string.
pub(super) struct Parser<'input> {
    /// A parser that `yaml_parser_initialize` set up, in a heap allocation of its own: libyaml
    /// keeps its address as the data of the string reader, so it must not move.
    raw: NonNull<yaml_parser_t>,
    input: PhantomData<&'input [u8]>,
}

impl<'input> Parser<'input> {
    pub fn new(input: &'input str) -> Parser<'input> {
        let raw = NonNull::from(Box::leak(Box::new(MaybeUninit::<yaml_parser_t>::uninit())))
            .cast::<yaml_parser_t>();
        // SAFETY: `raw` points to memory the size and alignment of a parser, which
        // yaml_parser_initialize zeroes and fills in. The translation reports allocation failure
        // by aborting, so initialisation cannot fail and its result carries no information.
        let _ = unsafe { yaml_parser_initialize(raw.as_ptr()) };
        // SAFETY: the parser is initialised and has no input yet. The input outlives the parser
        // (the parser borrows it for 'input), and the parser stays where it is until `drop`.
        unsafe {
            yaml_parser_set_input_string(raw.as_ptr(), input.as_ptr(), input.len() as u64);
        }
        Parser {
            raw,
            input: PhantomData,
        }
    }

    /// The next event, or libyaml's error (once: after it, the parser gives `StreamEnd`).
    pub fn next_event(&mut self) -> Result<Located, SyntaxError> {
        let mut event = MaybeUninit::<yaml_event_t>::uninit();
        // SAFETY: the parser is initialised and its input alive (see `new`), and `event` is
        // writable memory for an event.
        let parsed = unsafe { yaml_parser_parse(self.raw.as_ptr(), event.as_mut_ptr()) };
        // SAFETY: yaml_parser_parse zeroes the event before anything else, so it is initialised
        // (as an empty event if parsing failed); `OwnedEvent` frees what it holds when dropped.
        let event = OwnedEvent(unsafe { event.assume_init() });
        if parsed.fail {
            return Err(self.error());
        }
        Ok(event.read())
    }

    fn error(&self) -> SyntaxError {
        // SAFETY: the parser is initialised and not being mutated; after a failed
        // yaml_parser_parse its error fields are set, and `problem` and `context` are null or
        // static NUL-terminated strings.
        let (stage, problem, problem_mark, context) = unsafe {
            let parser = self.raw.as_ref();
            let stage = match parser.error {
                YAML_READER_ERROR => Stage::Reader,
                YAML_SCANNER_ERROR => Stage::Scanner,
                _ => Stage::Parser,
            };
            let problem_mark = match stage {
                Stage::Reader => Mark {
                    index: size(parser.problem_offset),
                    line: 0,
                    column: 0,
                },
                _ => mark(parser.problem_mark),
            };
            let context =
                c_string(parser.context.cast()).map(|text| (text, mark(parser.context_mark)));
            (
                stage,
                c_string(parser.problem.cast()),
                problem_mark,
                context,
            )
        };
        SyntaxError {
            stage,
            problem: problem.unwrap_or_else(|| "unknown problem parsing YAML content".to_owned()),
            problem_mark,
            context,
        }
    }
}

impl Drop for Parser<'_> {
    fn drop(&mut self) {
        // SAFETY: the parser was initialised in `new` and is deleted only here, after which the
        // allocation `new` made for it is freed (as the `MaybeUninit` it was allocated as).
        unsafe {
            yaml_parser_delete(self.raw.as_ptr());
            drop(Box::from_raw(
                self.raw.cast::<MaybeUninit<yaml_parser_t>>().as_ptr(),
            ));
        }
    }
}

/// An event filled in by yaml_parser_parse, freed with yaml_event_delete when dropped.
struct OwnedEvent(yaml_event_t);

impl OwnedEvent {
    /// Copies the event out of libyaml's memory.
    fn read(&self) -> Located {
        let raw = &self.0;
        // SAFETY: each arm reads the union field that belongs to the event's type. Its pointers
        // are null or point to memory the event owns until it is deleted (when `self` drops):
        // anchors and tags are NUL-terminated, a scalar's value is `length` bytes, the version
        // directive is a single struct.
        let event = unsafe {
            let data = &raw.data;
            match raw.type_ {
                YAML_STREAM_START_EVENT => Event::StreamStart,
                YAML_DOCUMENT_START_EVENT => {
                    let version = data.document_start.version_directive;
                    Event::DocumentStart {
                        version: (!version.is_null()).then(|| ((*version).major, (*version).minor)),
                    }
                }
                YAML_DOCUMENT_END_EVENT => Event::DocumentEnd,
                YAML_ALIAS_EVENT => Event::Alias {
                    anchor: c_string(data.alias.anchor).unwrap_or_default(),
                },
                YAML_SCALAR_EVENT => {
                    let scalar = &data.scalar;
                    let value = if scalar.value.is_null() {
                        String::new()
                    } else {
                        let bytes = std::slice::from_raw_parts(scalar.value, size(scalar.length));
                        String::from_utf8_lossy(bytes).into_owned()
                    };
                    Event::Scalar {
                        value,
                        anchor: c_string(scalar.anchor),
                        tag: c_string(scalar.tag),
                        style: match scalar.style {
                            YAML_SINGLE_QUOTED_SCALAR_STYLE => ScalarStyle::SingleQuoted,
                            YAML_DOUBLE_QUOTED_SCALAR_STYLE => ScalarStyle::DoubleQuoted,
                            YAML_LITERAL_SCALAR_STYLE => ScalarStyle::Literal,
                            YAML_FOLDED_SCALAR_STYLE => ScalarStyle::Folded,
                            _ => ScalarStyle::Plain,
                        },
                    }
                }
                YAML_SEQUENCE_START_EVENT => Event::SequenceStart {
                    anchor: c_string(data.sequence_start.anchor),
                    tag: c_string(data.sequence_start.tag),
                    flow: data.sequence_start.style == YAML_FLOW_SEQUENCE_STYLE,
                },
                YAML_SEQUENCE_END_EVENT => Event::SequenceEnd,
                YAML_MAPPING_START_EVENT => Event::MappingStart {
                    anchor: c_string(data.mapping_start.anchor),
                    tag: c_string(data.mapping_start.tag),
                    flow: data.mapping_start.style == YAML_FLOW_MAPPING_STYLE,
                },
                YAML_MAPPING_END_EVENT => Event::MappingEnd,
                // The empty event yaml_parser_parse gives after the end of the stream.
                _ => Event::StreamEnd,
            }
        };
        Located {
            event,
            start: mark(raw.start_mark),
            end: mark(raw.end_mark),
        }
    }
}

impl Drop for OwnedEvent {
    fn drop(&mut self) {
        // SAFETY: the event was initialised by yaml_parser_parse (possibly as an empty event) and
        // is deleted only here.
        unsafe { yaml_event_delete(&mut self.0) };
    }
}

fn size(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

fn mark(raw: yaml_mark_t) -> Mark {
    Mark {
        index: size(raw.index),
        line: size(raw.line),
        column: size(raw.column),
    }
}

/// A copy of a NUL-terminated string libyaml made or holds, or `None` for a null pointer.
///
/// # Safety
///
/// `text` must be null or point to a NUL-terminated string.
unsafe fn c_string(text: *const u8) -> Option<String> {
    // SAFETY: guaranteed by the caller.
    (!text.is_null()).then(|| {
        unsafe { CStr::from_ptr(text.cast()) }
            .to_string_lossy()
            .into_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(text: &str) -> Result<Vec<Event>, SyntaxError> {
        let mut parser = Parser::new(text);
        let mut events = Vec::new();
        loop {
            let located = parser.next_event()?;
            let end = located.event == Event::StreamEnd;
            events.push(located.event);
            if end {
                return Ok(events);
            }
        }
    }

    #[test]
    fn events_carry_anchors_tags_and_styles() {
        let got = events("%YAML 1.1\n--- &m\nk: !!str 'v'\ns: [*m, |\n  x\n ]\n").unwrap_err();
        // A block scalar cannot sit in a flow sequence.
        assert_eq!(got.stage, Stage::Scanner);
        let got = events("%YAML 1.1\n--- &m\nk: !!str 'v'\ns: [*m]\n").unwrap();
        let scalar = |value: &str, style| Event::Scalar {
            value: value.to_owned(),
            anchor: None,
            tag: None,
            style,
        };
        assert_eq!(
            got,
            vec![
                Event::StreamStart,
                Event::DocumentStart {
                    version: Some((1, 1))
                },
                Event::MappingStart {
                    anchor: Some("m".to_owned()),
                    tag: None,
                    flow: false
                },
                scalar("k", ScalarStyle::Plain),
                Event::Scalar {
                    value: "v".to_owned(),
                    anchor: None,
                    tag: Some("tag:yaml.org,2002:str".to_owned()),
                    style: ScalarStyle::SingleQuoted
                },
                scalar("s", ScalarStyle::Plain),
                Event::SequenceStart {
                    anchor: None,
                    tag: None,
                    flow: true
                },
                Event::Alias {
                    anchor: "m".to_owned()
                },
                Event::SequenceEnd,
                Event::MappingEnd,
                Event::DocumentEnd,
                Event::StreamEnd,
            ]
        );
    }

    #[test]
    fn values_may_hold_nul_and_marks_count_bytes_and_characters() {
        let mut parser = Parser::new("é: \"a\\0b\"\n");
        let mut scalars = Vec::new();
        while let Ok(located) = parser.next_event() {
            match located.event {
                Event::Scalar { value, .. } => scalars.push((value, located.start, located.end)),
                Event::StreamEnd => break,
                _ => {}
            }
        }
        let mark = |index, column| Mark {
            index,
            line: 0,
            column,
        };
        assert_eq!(
            scalars,
            vec![
                ("é".to_owned(), mark(0, 0), mark(2, 1)),
                ("a\0b".to_owned(), mark(4, 3), mark(10, 9)),
            ]
        );
    }

    #[test]
    fn errors_have_libyaml_problems_and_marks() {
        let error = events("a: b: c\n").unwrap_err();
        assert_eq!(error.stage, Stage::Scanner);
        assert_eq!(
            error.problem,
            "mapping values are not allowed in this context"
        );
        assert_eq!((error.problem_mark.line, error.problem_mark.column), (0, 4));
        let error = events("a:\n  b: 1\n c: 2\n").unwrap_err();
        assert_eq!(error.stage, Stage::Parser);
        assert_eq!(error.problem, "did not find expected key");
        let (context, context_mark) = error.context.unwrap();
        assert_eq!(context, "while parsing a block mapping");
        assert_eq!((context_mark.line, context_mark.column), (0, 0));
        let error = events("a: x\u{1}\n").unwrap_err();
        assert_eq!(error.stage, Stage::Reader);
        assert_eq!(error.problem, "control characters are not allowed");
        assert_eq!(error.problem_mark.index, 4);
    }

    #[test]
    fn the_end_repeats() {
        let mut parser = Parser::new("a");
        let mut last = None;
        for _ in 0..8 {
            last = Some(parser.next_event().unwrap().event);
        }
        assert_eq!(last, Some(Event::StreamEnd));
        let mut parser = Parser::new("[");
        while parser.next_event().is_ok() {}
        assert_eq!(parser.next_event().unwrap().event, Event::StreamEnd);
    }
}
