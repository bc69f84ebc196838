//! A subscription's `filter` (SPEC section 13, issue 61): declarative conditions on JSON
//! pointers into the body, combined with `all`, `any` and `not`. Parsed and checked here once
//! (the config's tables and the API's bodies alike); the stores compile it into their fan-out
//! statement (`store::filters`), and [`Filter::matches`] is the same decision in Rust, for the
//! preview and the event's view. The two must agree: a corpus test runs both on each store.
//!
//! The rules both sides follow:
//! - a body that is not JSON matches no filter (not even a `not`);
//! - a condition on a field the body lacks is false (`exists = false` aside), so `ne` and
//!   `nin` need the field, and `not` of a condition on a missing field is true;
//! - numbers compare as numbers (`1000` equals `1000.0`), strings as strings (by code point),
//!   and never with each other (a string `"1000"` is not a number); `gt`, `gte`, `lt`, `lte`
//!   take a number or a string and are false for a field of another type;
//! - `eq`, `ne`, `in`, `nin` take strings, numbers and booleans.

use std::cmp::Ordering as Order;

use serde_json::{Map, Number, Value};

/// How deep `all`/`any`/`not` may nest, and how many conditions and listed values one filter
/// may hold: each becomes SQL in every fan-out statement.
const MAX_DEPTH: usize = 8;
const MAX_TERMS: usize = 256;
/// A value's length in bytes.
const MAX_VALUE_BYTES: usize = 1024;

/// A filter, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filter {
    All(Vec<Filter>),
    Any(Vec<Filter>),
    Not(Box<Filter>),
    /// Every test holds for the value at one pointer.
    Field(Condition),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// As written, e.g. `/data/object/amount`.
    pub pointer: String,
    /// Its object keys, unescaped.
    pub path: Vec<String>,
    pub tests: Vec<Test>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Test {
    Eq(Scalar),
    Ne(Scalar),
    In(Vec<Scalar>),
    Nin(Vec<Scalar>),
    Cmp(Cmp, Bound),
    Exists(bool),
    Prefix(String),
}

/// A value `eq`, `ne`, `in` and `nin` compare with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scalar {
    Str(String),
    Num(Number),
    Bool(bool),
}

/// A value `gt`, `gte`, `lt` and `lte` compare with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bound {
    Str(String),
    Num(Number),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    Gt,
    Gte,
    Lt,
    Lte,
}

impl Cmp {
    pub fn as_str(self) -> &'static str {
        match self {
            Cmp::Gt => "gt",
            Cmp::Gte => "gte",
            Cmp::Lt => "lt",
            Cmp::Lte => "lte",
        }
    }

    /// The SQL operator.
    pub fn sql(self) -> &'static str {
        match self {
            Cmp::Gt => ">",
            Cmp::Gte => ">=",
            Cmp::Lt => "<",
            Cmp::Lte => "<=",
        }
    }

    fn holds(self, o: Order) -> bool {
        match self {
            Cmp::Gt => o == Order::Greater,
            Cmp::Gte => o != Order::Less,
            Cmp::Lt => o == Order::Less,
            Cmp::Lte => o != Order::Greater,
        }
    }
}

/// The operators of a condition, in the order a filter is shown.
pub const OPERATORS: [&str; 10] = [
    "eq", "ne", "in", "nin", "gt", "gte", "lt", "lte", "exists", "prefix",
];

/// Why a filter does not compile: where (`all[1]`, empty at the top) and what, naming the
/// pointer and the operator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", if at.is_empty() { String::new() } else { format!("{at}: ") })]
pub struct FilterError {
    pub at: String,
    pub message: String,
}

struct Parser {
    terms: usize,
}

impl Filter {
    /// A filter from its JSON (or TOML) form; the error names where, the pointer and the
    /// operator.
    pub fn parse(value: &Value) -> Result<Filter, FilterError> {
        Parser { terms: 0 }.node(value, "", 0)
    }

    /// The filter as it is kept and shown: the form [`Filter::parse`] reads.
    pub fn to_json(&self) -> Value {
        match self {
            Filter::All(list) => {
                serde_json::json!({"all": list.iter().map(Filter::to_json).collect::<Vec<_>>()})
            }
            Filter::Any(list) => {
                serde_json::json!({"any": list.iter().map(Filter::to_json).collect::<Vec<_>>()})
            }
            Filter::Not(inner) => serde_json::json!({"not": inner.to_json()}),
            Filter::Field(c) => {
                let mut object = Map::new();
                object.insert("path".into(), Value::String(c.pointer.clone()));
                for test in &c.tests {
                    let (name, value) = match test {
                        Test::Eq(s) => ("eq", s.to_json()),
                        Test::Ne(s) => ("ne", s.to_json()),
                        Test::In(list) => ("in", list.iter().map(Scalar::to_json).collect()),
                        Test::Nin(list) => ("nin", list.iter().map(Scalar::to_json).collect()),
                        Test::Cmp(op, b) => (op.as_str(), b.to_json()),
                        Test::Exists(e) => ("exists", Value::Bool(*e)),
                        Test::Prefix(p) => ("prefix", Value::String(p.clone())),
                    };
                    object.insert(name.into(), value);
                }
                Value::Object(object)
            }
        }
    }

    /// Whether an event's body passes: the decision the stores' fan-out makes in SQL.
    pub fn matches(&self, body: &[u8]) -> bool {
        match serde_json::from_slice::<Value>(body) {
            Ok(json) => self.holds(&json),
            Err(_) => false,
        }
    }

    /// [`Filter::matches`] on a body already read as JSON.
    pub fn holds(&self, body: &Value) -> bool {
        match self {
            Filter::All(list) => list.iter().all(|f| f.holds(body)),
            Filter::Any(list) => list.iter().any(|f| f.holds(body)),
            Filter::Not(inner) => !inner.holds(body),
            Filter::Field(c) => {
                let found = c
                    .path
                    .iter()
                    .try_fold(body, |at, key| at.as_object()?.get(key));
                c.tests.iter().all(|t| t.holds(found))
            }
        }
    }
}

impl Test {
    fn holds(&self, found: Option<&Value>) -> bool {
        match (self, found) {
            (Test::Exists(e), found) => found.is_some() == *e,
            (_, None) => false,
            (Test::Eq(s), Some(v)) => s.equals(v),
            (Test::Ne(s), Some(v)) => !s.equals(v),
            (Test::In(list), Some(v)) => list.iter().any(|s| s.equals(v)),
            (Test::Nin(list), Some(v)) => !list.iter().any(|s| s.equals(v)),
            (Test::Cmp(op, bound), Some(v)) => {
                let order = match (bound, v) {
                    (Bound::Num(b), Value::Number(n)) => compare_numbers(n, b),
                    (Bound::Str(b), Value::String(s)) => Some(s.as_str().cmp(b.as_str())),
                    _ => None,
                };
                order.is_some_and(|o| op.holds(o))
            }
            (Test::Prefix(p), Some(v)) => v.as_str().is_some_and(|s| s.starts_with(p.as_str())),
        }
    }
}

impl Scalar {
    fn equals(&self, v: &Value) -> bool {
        match (self, v) {
            (Scalar::Str(a), Value::String(b)) => a == b,
            (Scalar::Num(a), Value::Number(b)) => compare_numbers(b, a) == Some(Order::Equal),
            (Scalar::Bool(a), Value::Bool(b)) => a == b,
            _ => false,
        }
    }

    pub fn to_json(&self) -> Value {
        match self {
            Scalar::Str(s) => Value::String(s.clone()),
            Scalar::Num(n) => Value::Number(n.clone()),
            Scalar::Bool(b) => Value::Bool(*b),
        }
    }
}

impl Bound {
    pub fn to_json(&self) -> Value {
        match self {
            Bound::Str(s) => Value::String(s.clone()),
            Bound::Num(n) => Value::Number(n.clone()),
        }
    }
}

/// Numbers by value, exactly as SQLite compares an integer with a real (and PostgreSQL its
/// numerics, within 64-bit integers and doubles): `1000` equals `1000.0`.
fn compare_numbers(a: &Number, b: &Number) -> Option<Order> {
    let int = |n: &Number| {
        n.as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from))
    };
    match (int(a), int(b)) {
        (Some(x), Some(y)) => Some(x.cmp(&y)),
        (Some(x), None) => int_with_float(x, b.as_f64()?),
        (None, Some(y)) => int_with_float(y, a.as_f64()?).map(Order::reverse),
        (None, None) => a.as_f64()?.partial_cmp(&b.as_f64()?),
    }
}

fn int_with_float(i: i128, f: f64) -> Option<Order> {
    if f.is_nan() {
        return None;
    }
    // Beyond every 64-bit integer: no rounding of `i` can change the answer.
    if f >= 1.8e19 {
        return Some(Order::Less);
    }
    if f <= -9.3e18 {
        return Some(Order::Greater);
    }
    let whole = f.trunc();
    Some(match i.cmp(&(whole as i128)) {
        Order::Equal => 0.0f64.partial_cmp(&(f - whole))?,
        other => other,
    })
}

impl Parser {
    fn node(&mut self, value: &Value, at: &str, depth: usize) -> Result<Filter, FilterError> {
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
        let path =
            super::Ordering::parse_pointer(pointer).map_err(|m| fail(format!("`path` {m}")))?;
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

#[cfg(test)]
#[path = "filter_tests.rs"]
mod tests;
