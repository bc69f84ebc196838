use super::*;

#[test]
fn globs_match_as_written() {
    for (glob, text, expected) in [
        ("invoice.*", "invoice.paid", true),
        ("invoice.*", "invoice.", true),
        ("invoice.*", "invoices.paid", false),
        ("*", "", true),
        ("a?c", "abc", true),
        ("a?c", "ac", false),
        ("*.paid", "invoice.paid", true),
        ("*.paid", "invoice.paid.x", false),
        ("a*b*c", "aXbYbZc", true),
        ("a*b*c", "aXbYbZ", false),
        ("charge.refunded", "charge.refunded", true),
        ("charge.refunded", "charge.refundedX", false),
    ] {
        assert_eq!(glob_matches(glob, text), expected, "{glob} on {text}");
    }
}

#[test]
fn the_implicit_three_partition_every_event() {
    let subs = implicit_with(&ConsumerSettings::default(), DeliveryMode::AtMostOnce);
    for (source, event_type, expected) in [
        ("shop", "order.completed", "loyalty"),
        ("shop", "order.created", "audit"),
        ("requests", "request.submitted", "downstream"),
    ] {
        let matched: Vec<_> = subs
            .iter()
            .filter(|s| s.route.matches(source, event_type))
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(matched, [expected], "{source}/{event_type}");
    }
}

#[test]
fn names_follow_the_pattern() {
    for good in ["a", "billing", "b-2", "0x", &"a".repeat(63)] {
        assert!(valid_name(good), "{good}");
    }
    for bad in ["", "-a", "A", "a_b", "a.b", &"a".repeat(64), "a b"] {
        assert!(!valid_name(bad), "{bad}");
    }
}

/// A pointer's segments are unescaped as RFC 6901 says.
#[test]
fn ordered_by_reads_a_json_pointer() {
    let path = super::Ordering::parse_pointer("/data/a~1b/c~0d").unwrap();
    assert_eq!(path, ["data", "a/b", "c~d"]);
    assert!(super::Ordering::parse_pointer("/x~2").is_err());
}
