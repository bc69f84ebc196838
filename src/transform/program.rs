//! A jq program as jaq compiles and runs it: the code the worker process runs for each event,
//! and the compile-only check of [`super::Transform::parse`].

use jaq_core::load::{Arena, File, Loader};
use jaq_core::{Compiler, Ctx, Vars, data};
use jaq_json::{Num, Val};

use super::template::Template;

/// What one run of a program made of one body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ran {
    /// Exactly one output: its JSON text, compact.
    One(Vec<u8>),
    /// No output: the event is left out (outcome `filtered`).
    Nothing,
    /// An error, several outputs, an output over the budget, a body that is not JSON: the
    /// attempt fails permanently with this message.
    Failed(String),
}

type Data = data::JustLut<Val>;
type Filter = jaq_core::compile::Filter<jaq_core::Native<Data>>;

/// A compiled program, and its template where it only builds JSON out of the body's fields.
pub struct Compiled {
    filter: Filter,
    template: Option<Template>,
}

#[cfg(test)]
impl Compiled {
    /// The program as jaq runs it, its template left out.
    pub fn jaq_only(self) -> Compiled {
        Compiled {
            template: None,
            ..self
        }
    }

    pub fn has_template(&self) -> bool {
        self.template.is_some()
    }

    /// The first output on `body` as jaq's `Display` prints it.
    pub fn displayed(&self, body: &[u8]) -> String {
        let input = jaq_json::read::parse_single(body).unwrap();
        let ctx = Ctx::<Data>::new(&self.filter.lut, Vars::new([]));
        let mut outputs = self.filter.id.run((ctx, input)).map(jaq_core::unwrap_valr);
        outputs.next().unwrap().unwrap().to_string()
    }
}

/// Compile `code`, or say what is wrong and where (`line:column`, from 1).
pub fn compile(code: &str) -> Result<Compiled, String> {
    let defs = jaq_core::defs()
        .chain(jaq_std::defs())
        .chain(jaq_json::defs());
    let funs = jaq_core::funs()
        .chain(jaq_std::funs())
        .chain(jaq_json::funs());
    let arena = Arena::default();
    let program = File { code, path: () };
    let modules = Loader::new(defs)
        .load(&arena, program)
        .map_err(|errors| load_errors(code, errors))?;
    let filter = Compiler::default()
        .with_funs(funs)
        .compile(modules)
        .map_err(|errors| {
            let (what, at) = errors
                .into_iter()
                .flat_map(|(_, list)| list)
                .map(|(name, undefined)| {
                    (format!("undefined {} `{name}`", undefined.as_str()), name)
                })
                .next()
                .unwrap_or_else(|| ("does not compile".into(), code));
            format!("{what} at {}", position(code, at))
        })?;
    Ok(Compiled {
        filter,
        template: Template::of(code),
    })
}

fn load_errors(code: &str, errors: jaq_core::load::Errors<&str, ()>) -> String {
    use jaq_core::load::Error;
    let Some((_, first)) = errors.into_iter().next() else {
        return "does not parse".into();
    };
    match first {
        Error::Io(list) => list
            .into_iter()
            .next()
            .map(|(path, why)| format!("cannot import `{path}`: {why}"))
            .unwrap_or_else(|| "cannot import".into()),
        Error::Lex(list) => match list.first() {
            Some((expected, found)) => format!(
                "expected {} at {}",
                expected.as_str(),
                position(code, found)
            ),
            None => "does not parse".into(),
        },
        Error::Parse(list) => match list.first() {
            Some((expected, found)) => {
                let got = if found.is_empty() {
                    "the end".to_string()
                } else {
                    format!("`{}`", found.chars().take(20).collect::<String>())
                };
                format!(
                    "expected {}, found {got} at {}",
                    expected.as_str(),
                    position(code, found)
                )
            }
            None => "does not parse".into(),
        },
    }
}

/// `line:column` (from 1, columns in characters) of `part`, a slice of `code`.
fn position(code: &str, part: &str) -> String {
    let start = jaq_core::load::span(code, part).start.min(code.len());
    let before = &code[..code.floor_char_boundary(start)];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    format!("{line}:{column}")
}

/// Run `program` on `body` (JSON): its one output, compact, if it is at most `max_output`
/// bytes of JSON. Stops at the second output or the first error.
pub fn run(program: &Compiled, body: &[u8], max_output: usize) -> Ran {
    let input = match jaq_json::read::parse_single(body) {
        Ok(v) => v,
        Err(e) => {
            return Ran::Failed(format!(
                "the body is not JSON ({e}): a transform reads JSON"
            ));
        }
    };
    if let Some(template) = &program.template {
        let mut text = Vec::with_capacity(256);
        if template.write(&input, &mut text) {
            return within(text, max_output);
        }
    }
    let ctx = Ctx::<Data>::new(&program.filter.lut, Vars::new([]));
    let mut outputs = program
        .filter
        .id
        .run((ctx, input))
        .map(jaq_core::unwrap_valr);
    let first = match outputs.next() {
        None => return Ran::Nothing,
        Some(Err(e)) => return Ran::Failed(format!("the program failed: {e}")),
        Some(Ok(v)) => v,
    };
    match outputs.next() {
        None => {}
        Some(Err(e)) => {
            return Ran::Failed(format!("the program failed after its first output: {e}"));
        }
        Some(Ok(_)) => {
            return Ran::Failed(
                "the program gave more than one output: a transform delivers exactly one value \
                 (collect them with `[...]`)"
                    .into(),
            );
        }
    }
    let mut text = Vec::with_capacity(256);
    let plain = write_plain(&mut text, &first);
    if !plain {
        text = first.to_string().into_bytes();
    }
    // jaq prints what JSON cannot hold (NaN, infinities, byte strings) in forms of its own.
    if !plain
        && text.len() <= max_output
        && let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&text)
    {
        return Ran::Failed(format!(
            "the output is not JSON ({e}): NaN, an infinity or bytes"
        ));
    }
    within(text, max_output)
}

/// `text` delivered, if it is within the output budget.
fn within(text: Vec<u8>, max_output: usize) -> Ran {
    if text.len() > max_output {
        return Ran::Failed(format!(
            "the output is {} bytes, over the budget of {max_output}",
            text.len()
        ));
    }
    Ran::One(text)
}

/// Write `v` as JSON, the bytes jaq's `Display` gives it, when it is plainly JSON: `false` (and
/// `out` half written) for what jaq prints in forms of its own (NaN, infinities, byte strings,
/// keys that are not strings, invalid UTF-8, which it replaces), which go the slow way:
/// `Display`, then a parse. `Display` goes through the formatter for every piece, which cost
/// a tenth of a run.
pub(super) fn write_plain(out: &mut Vec<u8>, v: &Val) -> bool {
    use std::io::Write;
    match v {
        Val::Null => out.extend_from_slice(b"null"),
        Val::Bool(true) => out.extend_from_slice(b"true"),
        Val::Bool(false) => out.extend_from_slice(b"false"),
        Val::Num(Num::Float(f)) if !f.is_finite() => return false,
        // As the body spelled it: jaq's reader takes a few forms that JSON does not.
        Val::Num(Num::Dec(n)) if serde_json::from_str::<serde::de::IgnoredAny>(n).is_err() => {
            return false;
        }
        // Writing into a `Vec` cannot fail.
        Val::Num(n) => _ = write!(out, "{n}"),
        Val::TStr(s) => return write_str(out, s),
        Val::BStr(_) => return false,
        Val::Arr(a) => {
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                if !write_plain(out, x) {
                    return false;
                }
            }
            out.push(b']');
        }
        Val::Obj(o) => {
            out.push(b'{');
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                let Val::TStr(k) = k else { return false };
                if !write_str(out, k) {
                    return false;
                }
                out.push(b':');
                if !write_plain(out, x) {
                    return false;
                }
            }
            out.push(b'}');
        }
    }
    true
}

/// A string as jaq's `Display` escapes it (`\b`, `\f`, `\t`, `\n`, `\r`, `\"`, `\\`, other
/// controls and DEL as `\u00xx`); `false` when it is not UTF-8.
pub(super) fn write_str(out: &mut Vec<u8>, s: &[u8]) -> bool {
    if std::str::from_utf8(s).is_err() {
        return false;
    }
    out.push(b'"');
    let mut from = 0;
    for (i, &c) in s.iter().enumerate() {
        let short: &[u8] = match c {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f | 0x7f => b"",
            _ => continue,
        };
        out.extend_from_slice(&s[from..i]);
        from = i + 1;
        if short.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.extend_from_slice(&[HEX[usize::from(c >> 4)], HEX[usize::from(c & 15)]]);
        } else {
            out.extend_from_slice(short);
        }
    }
    out.extend_from_slice(&s[from..]);
    out.push(b'"');
    true
}
