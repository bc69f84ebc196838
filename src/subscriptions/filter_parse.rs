//! Reading a filter from its JSON (or TOML) form, checked: every refusal names where, the
//! pointer and the operator.

use serde_json::{Map, Value};

use super::{Bound, Cmp, Condition, Filter, FilterError, OPERATORS, Scalar, Test};

/// How deep `all`/`any`/`not` may nest, and how many conditions and listed values one filter
/// may hold: each becomes SQL in every fan-out statement.
const MAX_DEPTH: usize = 8;
const MAX_TERMS: usize = 256;
/// A value's length in bytes.
const MAX_VALUE_BYTES: usize = 1024;

#[derive(Default)]
pub(super) struct Parser {
    terms: usize,
}

impl Parser {
    pub(super) fn node(
        &mut self,
        value: &Value,
        at: &str,
        depth: usize,
    ) -> Result<Filter, FilterError> {
        let fail = |message: String| FilterError {
            at: at.to_string(),
            message,
        };
        if depth > MAX_DEPTH {
            return Err(fail(format!(
                "nested deeper than {MAX_DEPTH} levels of `all`, `any` and `not`"
            )));
        }
        let Value::Object(object) = value else {
            return Err(fail(
                "a filter is an object: `{ path = \"/a/b\", eq = \"x\" }`, or `all`, `any` \
                 or `not` of filters"
                    .into(),
            ));
        };
        let joined = |key: &str| {
            if at.is_empty() {
                key.to_string()
            } else {
                format!("{at}.{key}")
            }
        };
        for key in ["all", "any", "not"] {
            let Some(inner) = object.get(key) else {
                continue;
            };
            if object.len() > 1 {
                return Err(fail(format!(
                    "`{key}` stands alone in its object (put `path` conditions inside it)"
                )));
            }
            if key == "not" {
                return Ok(Filter::Not(Box::new(self.node(
                    inner,
                    &joined("not"),
                    depth + 1,
                )?)));
            }
            let list = match inner {
                Value::Array(list) if !list.is_empty() => list,
                _ => return Err(fail(format!("`{key}` takes a non-empty list of filters"))),
            };
            let parsed = list
                .iter()
                .enumerate()
                .map(|(i, f)| self.node(f, &format!("{}[{i}]", joined(key)), depth + 1))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(if key == "all" {
                Filter::All(parsed)
            } else {
                Filter::Any(parsed)
            });
        }
        let Some(pointer) = object.get("path") else {
            return Err(fail(format!(
                "a condition needs `path` (a JSON pointer into the body); or use `all`, `any`, \
                 `not`; found {}",
                keys(object)
            )));
        };
        let Some(pointer) = pointer.as_str() else {
            return Err(fail("`path` is a JSON pointer, as a string".into()));
        };
        let path = crate::subscriptions::Ordering::parse_pointer(pointer)
            .map_err(|m| fail(format!("`path` {m}")))?;
        let mut tests = Vec::new();
        for (op, v) in object.iter().filter(|(k, _)| *k != "path") {
            let wrong = |what: &str| {
                fail(format!(
                    "`{pointer}` `{op}`: takes {what}, not {}",
                    kind_of(v)
                ))
            };
            let test = match op.as_str() {
                "eq" | "ne" => {
                    let s = self
                        .scalar(v)
                        .ok_or_else(|| wrong("a string, a number or a boolean"))?;
                    if op == "eq" { Test::Eq(s) } else { Test::Ne(s) }
                }
                "in" | "nin" => {
                    let items = v
                        .as_array()
                        .filter(|l| !l.is_empty())
                        .ok_or_else(|| wrong("a non-empty list of strings, numbers or booleans"))?;
                    let list = items
                        .iter()
                        .map(|item| self.scalar(item))
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(|| wrong("a list of strings, numbers or booleans only"))?;
                    if op == "in" {
                        Test::In(list)
                    } else {
                        Test::Nin(list)
                    }
                }
                "gt" | "gte" | "lt" | "lte" => {
                    let cmp = match op.as_str() {
                        "gt" => Cmp::Gt,
                        "gte" => Cmp::Gte,
                        "lt" => Cmp::Lt,
                        _ => Cmp::Lte,
                    };
                    let bound = match self.scalar(v) {
                        Some(Scalar::Str(s)) => Bound::Str(s),
                        Some(Scalar::Num(n)) => Bound::Num(n),
                        _ => return Err(wrong("a number or a string")),
                    };
                    Test::Cmp(cmp, bound)
                }
                "exists" => Test::Exists(v.as_bool().ok_or_else(|| wrong("true or false"))?),
                "prefix" => match self.scalar(v) {
                    Some(Scalar::Str(s)) if !s.is_empty() => Test::Prefix(s),
                    _ => return Err(wrong("a non-empty string")),
                },
                _ => {
                    return Err(fail(format!(
                        "`{pointer}`: unknown operator `{op}` (one of {})",
                        OPERATORS.join(", ")
                    )));
                }
            };
            tests.push(test);
        }
        if tests.is_empty() {
            return Err(fail(format!(
                "`{pointer}`: a condition needs an operator ({})",
                OPERATORS.join(", ")
            )));
        }
        if self.terms > MAX_TERMS {
            return Err(fail(format!(
                "a filter holds at most {MAX_TERMS} conditions and listed values"
            )));
        }
        Ok(Filter::Field(Condition {
            pointer: pointer.to_string(),
            path,
            tests,
        }))
    }

    /// A string (of at most [`MAX_VALUE_BYTES`], without U+0000, which PostgreSQL's text
    /// cannot hold), a number or a boolean; each counts towards [`MAX_TERMS`].
    fn scalar(&mut self, v: &Value) -> Option<Scalar> {
        self.terms += 1;
        match v {
            Value::String(s) if s.len() <= MAX_VALUE_BYTES && !s.contains('\0') => {
                Some(Scalar::Str(s.clone()))
            }
            Value::Number(n) if n.as_f64().is_some_and(f64::is_finite) => {
                Some(Scalar::Num(n.clone()))
            }
            Value::Bool(b) => Some(Scalar::Bool(*b)),
            _ => None,
        }
    }
}

fn kind_of(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(_) => "a boolean".into(),
        Value::Number(_) => "a number".into(),
        Value::String(s) if s.contains('\0') => "a string with U+0000".into(),
        Value::String(s) if s.len() > MAX_VALUE_BYTES => {
            format!("a string of more than {MAX_VALUE_BYTES} bytes")
        }
        Value::String(_) => "a string".into(),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "an object".into(),
    }
}

fn keys(object: &Map<String, Value>) -> String {
    if object.is_empty() {
        return "an empty object".into();
    }
    let names: Vec<String> = object.keys().map(|k| format!("`{k}`")).collect();
    names.join(", ")
}
