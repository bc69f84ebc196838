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

#[path = "filter_parse.rs"]
mod parse;

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

impl Filter {
    /// A filter from its JSON (or TOML) form; the error names where, the pointer and the
    /// operator.
    pub fn parse(value: &Value) -> Result<Filter, FilterError> {
        parse::Parser::default().node(value, "", 0)
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

#[cfg(test)]
#[path = "filter_tests.rs"]
mod tests;
