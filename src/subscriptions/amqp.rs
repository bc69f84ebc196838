//! An `amqp` subscription's settings (SPEC section 13): the broker's URL, the exchange and the
//! routing key template, checked the same way at start and in the API (the routing key of an
//! event is [`super::template::fill`]'s, as a `nats` subject is).

use super::settings::{FieldError, invalid};

/// An AMQP short string (an exchange name, a routing key) is at most 255 bytes.
pub const MAX_SHORT_STRING: usize = 255;

/// An `amqp` subscription's `url`, `exchange` and `routing_key`, checked: its exchange and
/// routing key.
pub fn destination(
    url: &str,
    exchange: Option<&str>,
    routing_key: Option<&str>,
) -> Result<(Option<String>, Option<String>), FieldError> {
    check_url(url)?;
    let exchange = exchange.ok_or_else(|| {
        invalid(
            "exchange",
            "an `amqp` subscription needs the exchange (\"\" for the default exchange)",
        )
    })?;
    check_exchange(exchange)?;
    let routing_key = routing_key.ok_or_else(|| {
        invalid(
            "routing_key",
            "an `amqp` subscription needs the routing key",
        )
    })?;
    check_routing_key(routing_key)?;
    Ok((Some(exchange.to_string()), Some(routing_key.to_string())))
}

/// `amqp://` or `amqps://` with a host, as the client reads it (credentials as
/// `user:password@`, the vhost as the path, `%2f` for `/`). Never echoed: it may hold them.
pub fn check_url(url: &str) -> Result<(), FieldError> {
    let host = reqwest::Url::parse(url)
        .ok()
        .filter(|u| matches!(u.scheme(), "amqp" | "amqps"))
        .and_then(|u| u.host_str().map(str::to_string))
        .is_some_and(|h| !h.is_empty());
    if !host || url.parse::<lapin::uri::AMQPUri>().is_err() {
        return Err(invalid(
            "url",
            "must be an amqp:// or amqps:// URL with a host (credentials as user:password@, \
             the vhost as the path: %2f for `/`)",
        ));
    }
    Ok(())
}

/// An exchange name as AMQP 0-9-1 writes it: letters, digits, `-`, `_`, `.`, `:`, at most 255
/// bytes; empty for the default exchange (which routes to the queue the key names).
pub fn check_exchange(exchange: &str) -> Result<(), FieldError> {
    if exchange.len() > MAX_SHORT_STRING
        || !exchange
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
    {
        return Err(invalid(
            "exchange",
            "an exchange name: letters, digits, `-`, `_`, `.` and `:`, at most 255 bytes (\"\" \
             for the default exchange)",
        ));
    }
    Ok(())
}

/// A routing key template: at most 255 bytes, no control character, and no `{…}` but
/// `{source}` and `{type}`. Empty is allowed: a fanout or headers exchange ignores the key.
pub fn check_routing_key(template: &str) -> Result<(), FieldError> {
    let filled = super::template::skeleton(template);
    if filled.len() > MAX_SHORT_STRING
        || filled
            .chars()
            .any(|c| c.is_control() || matches!(c, '{' | '}'))
    {
        return Err(invalid(
            "routing_key",
            format!(
                "`{}` is not a routing key: at most 255 bytes, without control characters; \
                 `{{source}}` and `{{type}}` are the only placeholders",
                template.escape_debug()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_exchanges_and_routing_keys_are_checked() {
        for good in [
            "amqp://127.0.0.1:5672",
            "amqps://user:pw@rabbit.internal/%2f",
            "amqp://u:p@h/vhost?heartbeat=10",
        ] {
            assert!(check_url(good).is_ok(), "{good}");
        }
        for bad in ["http://x", "amqp://", "127.0.0.1:5672", "nats://h"] {
            assert_eq!(check_url(bad).unwrap_err().field, "url", "{bad}");
        }
        for good in ["", "webhooks", "amq.topic", "a-b_c:d"] {
            assert!(check_exchange(good).is_ok(), "{good}");
        }
        for bad in ["a b", "x/y", &"e".repeat(256)] {
            assert_eq!(check_exchange(bad).unwrap_err().field, "exchange");
        }
        for good in ["", "orders", "webhooks.{source}.{type}", "q-{type}"] {
            assert!(check_routing_key(good).is_ok(), "{good}");
        }
        for bad in ["a\nb", "{id}", "a.{source", &"k".repeat(256)] {
            assert_eq!(check_routing_key(bad).unwrap_err().field, "routing_key");
        }
        let missing = destination("amqp://h", None, Some("k")).unwrap_err();
        assert_eq!(missing.field, "exchange");
        let missing = destination("amqp://h", Some(""), None).unwrap_err();
        assert_eq!(missing.field, "routing_key");
    }
}
