//! The destination template of a broker kind (a `nats` subject, an `amqp` routing key): text
//! with `{source}` and `{type}`, filled per event.

/// The placeholders a template may hold.
pub const PLACEHOLDERS: [&str; 2] = ["{source}", "{type}"];

/// The destination of one event: each placeholder becomes exactly one token, its value with
/// every character but ASCII letters, digits, `-` and `_` made `_` (a type's `.` would
/// otherwise add tokens to a subject or a topic's routing key, and a `*`, `>` or `#` would be
/// a wildcard to the broker).
pub fn fill(template: &str, source: &str, event_type: &str) -> String {
    let token = |value: &str| -> String {
        if value.is_empty() {
            return "_".into();
        }
        value
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    template
        .replace("{source}", &token(source))
        .replace("{type}", &token(event_type))
}

/// The template with each placeholder replaced by `x`: what is left to check as the broker's
/// own syntax (a `{` or `}` left over is a placeholder that does not exist).
pub fn skeleton(template: &str) -> String {
    PLACEHOLDERS
        .iter()
        .fold(template.to_string(), |t, p| t.replace(p, "x"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_is_filled_with_one_token_per_placeholder() {
        let t = "webhooks.{source}.{type}";
        assert_eq!(
            fill(t, "stripe", "order.completed"),
            "webhooks.stripe.order_completed"
        );
        assert_eq!(fill(t, "a b", "*>#"), "webhooks.a_b.___");
        assert_eq!(fill(t, "s", ""), "webhooks.s._");
        assert_eq!(fill("fixed", "s", "t"), "fixed");
        assert_eq!(skeleton("a.{source}.{type}.{id}"), "a.x.x.{id}");
    }
}
