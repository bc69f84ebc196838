//! The fields of an `order.completed` event the loyalty credit needs.

use serde_json::Value;
use serde_json::value::RawValue;

/// A payload the loyalty handler cannot use; permanent: retrying will not add the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OrderError {
    #[error("payload is not a JSON object")]
    NotAnObject,
    #[error("missing {0}")]
    Missing(&'static str),
    #[error("{0} must be {1}")]
    Invalid(&'static str, &'static str),
}

/// The most points one order may credit. A balance is a 64-bit integer (about 9.2 × 10^18):
/// with each credit at most 10^9, a customer would need over 9 × 10^9 credited orders to
/// overflow it, and no loyalty programme credits a billion points for one order. An event
/// over the bound fails alone (a permanent error naming the bound) instead of making the
/// balance unreadable; the database's CHECK on balances is the backstop.
pub const MAX_POINTS: i64 = 1_000_000_000;

/// A validated credit: `points` between 1 and [`MAX_POINTS`], ids non-empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderCredit {
    order_id: String,
    customer_id: String,
    points: i64,
}

/// A string or an integer, compared as a string (`42` and `"42"` are the same order).
fn id_field(value: Option<&Value>, name: &'static str) -> Result<String, OrderError> {
    match value {
        None | Some(Value::Null) => Err(OrderError::Missing(name)),
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.trim().to_string()),
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
        Some(_) => Err(OrderError::Invalid(
            name,
            "a non-empty string or an integer",
        )),
    }
}

/// The three fields as found in one object (the body, or its `data`), every other key
/// skipped without being built; `data` is kept as raw text.
#[derive(serde::Deserialize)]
struct Fields<'a> {
    #[serde(default)]
    order_id: Option<Value>,
    #[serde(default)]
    customer_id: Option<Value>,
    #[serde(default)]
    points: Option<Value>,
    #[serde(default, borrow)]
    data: Option<&'a RawValue>,
}

/// Only an object has fields (a derived struct would also read an array positionally).
fn is_object(json: &[u8]) -> bool {
    json.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

impl OrderCredit {
    /// Fields come from the body's `data` object (Standard Webhooks convention), else the top
    /// level.
    pub fn parse(payload: &Value) -> Result<OrderCredit, OrderError> {
        let top = payload.as_object().ok_or(OrderError::NotAnObject)?;
        let obj = match top.get("data") {
            Some(Value::Object(data)) => data,
            _ => top,
        };
        Self::from_fields(
            obj.get("order_id"),
            obj.get("customer_id"),
            obj.get("points"),
        )
    }

    /// [`OrderCredit::parse`] straight from JSON text, reading only the three fields (the
    /// consumer's hot path: building the whole document cost about 7,000 instructions per
    /// credit). `None` when the text needs the general path: not an object, or JSON the typed
    /// read refuses though it is valid (a repeated key, where the last value wins), or not JSON
    /// at all, whose error the general path words.
    ///
    /// Fields it does not read are only skipped, so it takes a few bodies the general read
    /// refuses for what sits in such a field: a lone surrogate escape, a number beyond `f64`,
    /// nesting deeper than 128. Ingest refuses those now (`payload::peek` checks every
    /// field), but earlier versions stored them, and their order fields are good, so they are
    /// credited.
    pub fn from_json(json: &[u8]) -> Option<Result<OrderCredit, OrderError>> {
        if !is_object(json) {
            return None;
        }
        let top: Fields<'_> = serde_json::from_slice(json).ok()?;
        let fields = match top.data {
            Some(data) if is_object(data.get().as_bytes()) => {
                serde_json::from_str(data.get()).ok()?
            }
            _ => top,
        };
        Some(Self::from_fields(
            fields.order_id.as_ref(),
            fields.customer_id.as_ref(),
            fields.points.as_ref(),
        ))
    }

    fn from_fields(
        order_id: Option<&Value>,
        customer_id: Option<&Value>,
        points: Option<&Value>,
    ) -> Result<OrderCredit, OrderError> {
        let order_id = id_field(order_id, "order_id")?;
        let customer_id = id_field(customer_id, "customer_id")?;
        let points =
            match points {
                None | Some(Value::Null) => return Err(OrderError::Missing("points")),
                Some(v) => v.as_i64().filter(|p| (1..=MAX_POINTS).contains(p)).ok_or(
                    OrderError::Invalid("points", "an integer from 1 to 1000000000"),
                )?,
            };
        Ok(OrderCredit {
            order_id,
            customer_id,
            points,
        })
    }

    pub fn order_id(&self) -> &str {
        &self.order_id
    }

    pub fn customer_id(&self) -> &str {
        &self.customer_id
    }

    pub fn points(&self) -> i64 {
        self.points
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn general(json: &str) -> Option<Result<OrderCredit, OrderError>> {
        let value: Value = serde_json::from_str(json).ok()?;
        Some(OrderCredit::parse(&value))
    }

    /// The fast read gives what the general one gives, and takes the common shapes itself.
    #[test]
    fn the_typed_read_agrees_with_the_general_one() {
        let taken = [
            r#"{"type": "order.completed", "data": {"order_id": "o-1", "customer_id": "c", "points": 5}}"#,
            r#"{"order_id": 42, "customer_id": " c ", "points": 1, "extra": [1, {"a": null}]}"#,
            r#"  {"data": "not an object", "order_id": "o", "customer_id": "c", "points": 2}"#,
            r#"{"data": [1, 2, 3], "order_id": "o", "customer_id": "c", "points": 2}"#,
            r#"{"data": null, "order_id": "o", "customer_id": "c", "points": 2}"#,
            r#"{"data": {"data": {"order_id": "x"}, "order_id": "o", "customer_id": "c", "points": 3}}"#,
            r#"{"data": {"customer_id": "c", "points": 1}}"#,
            r#"{"order_id": null, "customer_id": "c", "points": 1}"#,
            r#"{"order_id": "  ", "customer_id": "c", "points": 1}"#,
            r#"{"order_id": 1.5, "customer_id": "c", "points": 1}"#,
            r#"{"order_id": "o", "customer_id": "c", "points": -3}"#,
            r#"{"order_id": "o", "customer_id": "c", "points": "3"}"#,
            r#"{"order_id": "o", "customer_id": "c", "points": 2.0}"#,
            r#"{"order_id": "o", "customer_id": "c"}"#,
            r#"{"order\u005fid": "o", "customer_id": "c", "points": 4}"#,
            r#"{"order_id": 18446744073709551615, "customer_id": "c", "points": 4}"#,
        ];
        for json in taken {
            let fast = OrderCredit::from_json(json.as_bytes());
            assert!(fast.is_some(), "{json}: the typed read takes it");
            assert_eq!(fast, general(json), "{json}");
        }
        // Taken here though the general read refuses them: what it refuses sits in a field
        // neither reads. Ingest refuses them now (its peek checks every field, as the fuzzers
        // asked), so only bodies stored by earlier versions reach this.
        for json in [
            r#"{"note": "\ud800", "order_id": "o", "customer_id": "c", "points": 1}"#,
            r#"{"data": {"big": 1e400, "order_id": "o", "customer_id": "c", "points": 1}}"#,
        ] {
            assert!(general(json).is_none(), "{json}");
            assert!(
                matches!(OrderCredit::from_json(json.as_bytes()), Some(Ok(_))),
                "{json}"
            );
            assert!(
                crate::domain::payload::peek(json.as_bytes(), None).is_err(),
                "{json}"
            );
        }
        // Left to the general read: not an object, a repeated key (the last one wins there),
        // not JSON.
        let left = [
            r#"[{"order_id": "o", "customer_id": "c", "points": 1}]"#,
            r#""text""#,
            r#"{"order_id": "a", "order_id": "b", "customer_id": "c", "points": 1}"#,
            r#"{"data": {"points": 1, "points": 2, "order_id": "o", "customer_id": "c"}}"#,
            r#"{"order_id": "o", "#,
        ];
        for json in left {
            assert_eq!(OrderCredit::from_json(json.as_bytes()), None, "{json}");
        }
        assert_eq!(
            general(left[2]).unwrap().map(|c| c.order_id().to_string()),
            Ok("b".to_string())
        );
    }
}
