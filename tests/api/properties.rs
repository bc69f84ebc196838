//! Property tests of the parsers that read untrusted input (issue 14): no panic on any input; a
//! body signed by our own signer always verifies and one flipped byte never does; the body peek
//! agrees with serde_json on what both accept. The cargo-fuzz targets (fuzz/) push the same
//! parsers further; these run in the ordinary suite, bounded by proptest's case count.

use proptest::prelude::*;
use webhook_inbox::config::Settings;
use webhook_inbox::domain::payload::peek;
use webhook_inbox::domain::replay::ReplayLine;
use webhook_inbox::signature::Scheme;
use webhook_inbox::signature::Secret;

const SCHEMES: [Scheme; 5] = [
    Scheme::StandardWebhooks,
    Scheme::Stripe,
    Scheme::Github,
    Scheme::Shopify,
    Scheme::HmacSha256,
];

const NOW: i64 = 1_700_000_000;

fn secret(scheme: Scheme) -> Secret {
    match scheme {
        Scheme::StandardWebhooks => Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
        _ => Secret::new("It's a Secret to Everybody"),
    }
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_body_we_signed_verifies_and_one_flipped_byte_does_not(
        scheme in prop::sample::select(SCHEMES.to_vec()),
        body in prop::collection::vec(any::<u8>(), 1..512),
        id in "[A-Za-z0-9_]{1,40}",
        flip_at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let key = secret(scheme);
        let headers = scheme.sign(&key, &id, "order.completed", &body, NOW).unwrap();
        let verified = scheme.verify(&headers, &body, std::slice::from_ref(&key), NOW, 300);
        prop_assert!(verified.is_ok(), "{scheme:?}: {verified:?}");
        let mut tampered = body.clone();
        tampered[flip_at.index(body.len())] ^= flip;
        let result = scheme.verify(&headers, &tampered, &[key], NOW, 300);
        prop_assert!(result.is_err(), "{scheme:?}: a flipped byte verified");
    }

    /// Any event id and type: our signer refuses what cannot travel in a header, and whatever
    /// it signs verifies, with the id it was given (fuzz/found/signature_standard-*).
    #[test]
    fn any_id_is_refused_by_the_signer_or_verifies(
        scheme in prop::sample::select(SCHEMES.to_vec()),
        id in prop_oneof![any::<String>(), "[ -~]{0,12}", "[\\x00-\\xff]{1,12}"],
        event_type in prop_oneof![Just("order.completed".to_string()), any::<String>()],
    ) {
        let key = secret(scheme);
        let Ok(headers) = scheme.sign(&key, &id, &event_type, b"{}", NOW) else {
            let travels = |v: &str| {
                v.trim() == v && v.bytes().all(|b| (b' '..=b'~').contains(&b))
            };
            let signed_id_empty = scheme == Scheme::StandardWebhooks && id.is_empty();
            prop_assert!(
                signed_id_empty || !travels(&id) || !travels(&event_type),
                "refused {id:?} {event_type:?}"
            );
            return Ok(());
        };
        let verified = scheme.verify(&headers, b"{}", std::slice::from_ref(&key), NOW, 300);
        prop_assert!(verified.is_ok(), "{scheme:?} signed {id:?} and then refused it: {verified:?}");
        if scheme != Scheme::Stripe && !id.is_empty() {
            prop_assert_eq!(verified.unwrap().event_id, Some(id));
        }
    }

    /// Peek and serde_json agree on raw bytes too, invalid UTF-8 included
    /// (fuzz/found/peek-invalid-utf8-in-string).
    #[test]
    fn peek_agrees_with_serde_json_on_any_bytes(
        raw in json_ish(),
        at in any::<prop::sample::Index>(),
        byte in 0x80u8..=0xff,
    ) {
        // Right after a quote, so that half the time the byte lands inside a string, where
        // serde_json only checks UTF-8 in the strings it reads, not those it skips.
        let mut bytes = raw.into_bytes();
        let quotes: Vec<usize> = (0..bytes.len()).filter(|&i| bytes[i] == b'"').collect();
        let place = if quotes.is_empty() { 0 } else { quotes[at.index(quotes.len())] + 1 };
        bytes.insert(place, byte);
        let parsed = serde_json::from_slice::<serde_json::Value>(&bytes);
        let peeked = peek(&bytes, Some("application/json"));
        prop_assert_eq!(parsed.is_ok() && parsed.unwrap().is_object(), peeked.is_ok(), "{:?}", bytes);
    }

    /// Any header values, ASCII or not, for every header any scheme reads.
    #[test]
    fn signature_parsers_never_panic(
        scheme in prop::sample::select(SCHEMES.to_vec()),
        values in prop::collection::vec(any::<String>(), 15),
        ascii in prop::collection::vec("[ -~]{0,120}", 15),
        use_ascii in any::<bool>(),
        body in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        const NAMES: [&str; 15] = [
            "webhook-id", "webhook-timestamp", "webhook-signature", "svix-id", "svix-timestamp",
            "svix-signature", "Stripe-Signature", "X-Hub-Signature-256", "X-GitHub-Delivery",
            "X-GitHub-Event", "X-Shopify-Hmac-Sha256", "X-Shopify-Webhook-Id", "X-Shopify-Topic",
            "X-Signature", "X-Event-Id",
        ];
        let chosen = if use_ascii { ascii } else { values };
        let headers: Vec<(String, String)> = NAMES
            .iter()
            .zip(chosen)
            .map(|(n, v)| (n.to_string(), v))
            .collect();
        let _ = scheme.verify(&headers, &body, &[secret(scheme)], NOW, 300);
    }

    #[test]
    fn peek_never_panics(raw in prop::collection::vec(any::<u8>(), 0..256), form in any::<bool>()) {
        let content_type = form.then_some("application/x-www-form-urlencoded");
        let _ = peek(&raw, content_type);
    }

    /// Where serde_json reads an object, peek reads the same id, event id and type; where
    /// serde_json refuses, so does peek.
    #[test]
    fn peek_agrees_with_serde_json(raw in json_ish()) {
        let parsed = serde_json::from_slice::<serde_json::Value>(raw.as_bytes());
        let peeked = peek(raw.as_bytes(), Some("application/json"));
        match parsed {
            Err(_) => prop_assert!(peeked.is_err(), "peek accepted what serde_json refused: {raw}"),
            Ok(value) => {
                let p = peeked.expect("peek refused what serde_json read");
                let field = |name: &str| match value.get(name) {
                    Some(serde_json::Value::String(s)) => Some(s.clone()),
                    Some(serde_json::Value::Number(n)) => Some(n.to_string()),
                    _ => None,
                };
                prop_assert_eq!(p.id(), field("id"));
                prop_assert_eq!(p.event_id(), field("event_id"));
                let t = field("type").filter(|t| t.parse::<f64>().is_err());
                prop_assert_eq!(p.into_event_type(), t);
            }
        }
    }

    #[test]
    fn replay_lines_never_panic(line in replay_ish()) {
        if let Ok(parsed) = serde_json::from_str::<ReplayLine>(&line) {
            let _ = parsed.body_bytes();
        }
    }

    /// The config loader, with environment overrides, refuses bad input with an error.
    #[test]
    fn config_loader_never_panics(
        text in config_ish(),
        env in prop::collection::vec(("WEBHOOK_INBOX_[A-Z_]{1,30}", "[ -~]{0,20}"), 0..4),
    ) {
        let _ = Settings::from_toml(&text, "prop", env);
    }
}

/// JSON objects with the fields peek reads, sometimes broken.
fn json_ish() -> impl Strategy<Value = String> {
    let scalar = prop_oneof![
        "\"[a-z0-9._\\\\\"]{0,8}\"",
        "-?[0-9]{1,20}(\\.[0-9]{1,3})?(e[0-9])?",
        Just("null".to_string()),
        Just("true".to_string()),
        Just("[1,{}]".to_string()),
        Just("{\"a\":1}".to_string()),
        // What serde_json refuses inside a string or a number, even in a field peek skips.
        Just("\"\\ud83d\"".to_string()),
        Just("\"\\ud83d\\ude00\"".to_string()),
        Just("1e400".to_string()),
    ];
    let key = prop_oneof![
        Just("id"),
        Just("event_id"),
        Just("type"),
        Just("data"),
        Just("x")
    ];
    (
        prop::collection::vec((key, scalar), 0..5),
        prop::option::of(0usize..40),
    )
        .prop_map(|(fields, cut)| {
            let body = fields
                .iter()
                .map(|(k, v)| format!("\"{k}\": {v}"))
                .collect::<Vec<_>>()
                .join(",");
            let text = format!(" {{{body}}} ");
            match cut {
                Some(at) if at < text.len() && text.is_char_boundary(at) => text[..at].to_string(),
                _ => text,
            }
        })
}

fn replay_ish() -> impl Strategy<Value = String> {
    let value = prop_oneof![
        "\"[ -~]{0,12}\"",
        Just("null".to_string()),
        Just("7".to_string()),
        Just("\"%%%\"".to_string()),
    ];
    let key = prop_oneof![
        Just("source"),
        Just("event_id"),
        Just("type"),
        Just("body"),
        Just("body_base64"),
        Just("content_type"),
    ];
    prop_oneof![
        prop::collection::vec((key, value), 0..7).prop_map(|f| {
            let body = f
                .iter()
                .map(|(k, v)| format!("\"{k}\":{v}"))
                .collect::<Vec<_>>()
                .join(",");
            format!("{{{body}}}")
        }),
        any::<String>(),
    ]
}

fn config_ish() -> impl Strategy<Value = String> {
    let line = prop_oneof![
        Just("listen = \"127.0.0.1:0\"".to_string()),
        Just("database_url = \"sqlite://x.db\"".to_string()),
        Just("admin_token = \"t\"".to_string()),
        Just("admin_token = \"a-long-enough-token\"".to_string()),
        Just("[consumers]".to_string()),
        Just("workers = 99999999999999999999".to_string()),
        Just("lease_seconds = -1".to_string()),
        Just("[[sources]]".to_string()),
        Just("name = \"shop\"".to_string()),
        Just("scheme = \"standard-webhooks\"".to_string()),
        Just("secrets = [\"whsec_%%%\"]".to_string()),
        Just("tolerance_seconds = 18446744073709551615".to_string()),
        "[a-z_]{1,12} = [0-9]{1,25}",
        "[ -~]{0,30}",
    ];
    prop::collection::vec(line, 0..12).prop_map(|l| l.join("\n"))
}
