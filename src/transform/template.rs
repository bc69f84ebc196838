//! The commonest transform, run without jaq's interpreter: a program that only builds JSON out
//! of the body's fields (`{order: .data.order_id, type, label: "order \(.data.order_id)"}`:
//! field picks, renames, nesting, string interpolation) is written straight from the parsed
//! body. jaq builds such an object as a sum of one-key objects, each field through boxed path
//! iterators, which was about two thirds of a worker's run (docs/performance.md).
//!
//! The same bytes as jaq or nothing: a program is a template only when every part of it has
//! exactly one output whatever the body, and a run gives up (`false`: jaq runs the program, and
//! says what it says) wherever jaq could fail or print a form of its own: a field of something
//! that is neither an object nor null, an interpolated value that is not a string, what
//! `write_plain` does not write. Anything else in a program (a number, a call, `?`, a variable,
//! a computed key, a key twice) leaves it to jaq.

use jaq_core::load::lex::StrPart;
use jaq_core::load::parse::Term;
use jaq_core::path::{Opt, Part};
use jaq_json::Val;

use super::program::{write_plain, write_str};

/// A program that only builds JSON out of the body's fields.
#[derive(Debug)]
pub enum Template {
    /// `.`, `.a.b`, `."a b"`: the keys followed from the body (none: the body).
    Field(Vec<Val>),
    /// `"order \(.id)"`: a string, its interpolations string fields of the body.
    Text(Vec<Piece>),
    /// `{a: ..., b}`: its keys as written, once each.
    Object(Vec<(Vec<u8>, Template)>),
    /// `[..., ...]`
    Array(Vec<Template>),
}

#[derive(Debug)]
pub enum Piece {
    Literal(Vec<u8>),
    Field(Vec<Val>),
}

impl Template {
    /// The template of `code`, when it is one; it compiled already (jaq's parser reads it).
    pub fn of(code: &str) -> Option<Template> {
        let term = jaq_core::load::parse(code, |p| p.term())?;
        Template::from_term(&term)
    }

    fn from_term(term: &Term<&str>) -> Option<Template> {
        match term {
            Term::Id => Some(Template::Field(Vec::new())),
            Term::Path(base, path) if matches!(**base, Term::Id) => {
                let keys = path.0.iter().map(|(part, opt)| match (part, opt) {
                    (Part::Index(key), Opt::Essential) => literal(key).map(Val::utf8_str),
                    _ => None,
                });
                keys.collect::<Option<_>>().map(Template::Field)
            }
            Term::Str(None, parts) => {
                let pieces = parts.iter().map(|part| match part {
                    StrPart::Str(s) => Some(Piece::Literal(s.as_bytes().to_vec())),
                    StrPart::Char(c) => Some(Piece::Literal(c.to_string().into_bytes())),
                    StrPart::Term(t) => match Template::from_term(t)? {
                        Template::Field(keys) => Some(Piece::Field(keys)),
                        _ => None,
                    },
                });
                pieces.collect::<Option<_>>().map(Template::Text)
            }
            Term::Obj(entries) => {
                let mut fields: Vec<(Vec<u8>, Template)> = Vec::with_capacity(entries.len());
                for (key, value) in entries {
                    let key = literal(key)?;
                    if fields.iter().any(|(k, _)| *k == key) {
                        return None;
                    }
                    // `{type}` is `{type: .type}`.
                    let value = match value {
                        Some(value) => Template::from_term(value)?,
                        None => Template::Field(vec![Val::utf8_str(key.clone())]),
                    };
                    fields.push((key, value));
                }
                Some(Template::Object(fields))
            }
            Term::Arr(None) => Some(Template::Array(Vec::new())),
            Term::Arr(Some(items)) => {
                let mut out = Vec::new();
                commas(items, &mut out)?;
                Some(Template::Array(out))
            }
            _ => None,
        }
    }

    /// Write what the program makes of `input` into `out` (compact JSON, the bytes jaq's
    /// `Display` gives it); `false` (and `out` half written) where jaq must run it.
    pub fn write(&self, input: &Val, out: &mut Vec<u8>) -> bool {
        match self {
            Template::Field(keys) => match field(input, keys) {
                Some(Some(v)) => write_plain(out, v),
                Some(None) => {
                    out.extend_from_slice(b"null");
                    true
                }
                None => false,
            },
            Template::Text(pieces) => {
                let mut text = Vec::new();
                for piece in pieces {
                    match piece {
                        Piece::Literal(s) => text.extend_from_slice(s),
                        Piece::Field(keys) => match field(input, keys) {
                            Some(Some(Val::TStr(s))) => text.extend_from_slice(s),
                            _ => return false,
                        },
                    }
                }
                write_str(out, &text)
            }
            Template::Object(fields) => {
                out.push(b'{');
                for (i, (key, value)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    if !write_str(out, key) {
                        return false;
                    }
                    out.push(b':');
                    if !value.write(input, out) {
                        return false;
                    }
                }
                out.push(b'}');
                true
            }
            Template::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    if !item.write(input, out) {
                        return false;
                    }
                }
                out.push(b']');
                true
            }
        }
    }
}

/// `a, b, c` in an array's brackets, each a template.
fn commas(term: &Term<&str>, out: &mut Vec<Template>) -> Option<()> {
    use jaq_core::load::parse::BinaryOp;
    match term {
        Term::BinOp(left, BinaryOp::Comma, right) => {
            commas(left, out)?;
            commas(right, out)
        }
        item => {
            out.push(Template::from_term(item)?);
            Some(())
        }
    }
}

/// A string as the program writes it, without interpolation or format (a key).
fn literal(term: &Term<&str>) -> Option<Vec<u8>> {
    let Term::Str(None, parts) = term else {
        return None;
    };
    let mut key = String::new();
    for part in parts {
        match part {
            StrPart::Str(s) => key.push_str(s),
            StrPart::Char(c) => key.push(*c),
            StrPart::Term(_) => return None,
        }
    }
    Some(key.into_bytes())
}

/// The field `keys` of `input`, `Some(None)` for null (jq's `null.a` is `null`, as is a missing
/// key's); `None` where jaq fails (indexing what is neither an object nor null).
fn field<'v>(input: &'v Val, keys: &[Val]) -> Option<Option<&'v Val>> {
    keys.iter().try_fold(Some(input), |v, key| match v {
        Some(Val::Obj(o)) => Some(o.get(key)),
        Some(Val::Null) | None => Some(None),
        Some(_) => None,
    })
}
