//! The fields of an `order.completed` event the loyalty credit needs.

use serde_json::Value;

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

/// A validated credit: `points` positive, ids non-empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderCredit {
    order_id: String,
    customer_id: String,
    points: i64,
}

/// A string or an integer, compared as a string (`42` and `"42"` are the same order).
fn id_field(
    obj: &serde_json::Map<String, Value>,
    name: &'static str,
) -> Result<String, OrderError> {
    match obj.get(name) {
        None | Some(Value::Null) => Err(OrderError::Missing(name)),
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.trim().to_string()),
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
        Some(_) => Err(OrderError::Invalid(
            name,
            "a non-empty string or an integer",
        )),
    }
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
        let order_id = id_field(obj, "order_id")?;
        let customer_id = id_field(obj, "customer_id")?;
        let points = match obj.get("points") {
            None | Some(Value::Null) => return Err(OrderError::Missing("points")),
            Some(v) => v
                .as_i64()
                .filter(|p| *p > 0)
                .ok_or(OrderError::Invalid("points", "a positive integer"))?,
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
