//! The replay file reader: JSON lines, each a `ReplayLine` whose body is decoded and re-signed
//! (what `webhook-inbox replay` does with each line before sending it).
//!
//! Properties: no panic on any file; every body survives `ReplayLine::new` (what `events
//! export` writes), one line of JSON, and back, byte for byte.
#![no_main]

use libfuzzer_sys::fuzz_target;
use webhook_inbox::domain::replay::ReplayLine;
use webhook_inbox::signature::{Scheme, Secret};

const SCHEMES: [Scheme; 5] = [
    Scheme::StandardWebhooks,
    Scheme::Stripe,
    Scheme::Github,
    Scheme::Shopify,
    Scheme::HmacSha256,
];

fuzz_target!(|data: &[u8]| {
    let secret = Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    // As the reader: a file that is not UTF-8 is an error before any line is read.
    if let Ok(text) = std::str::from_utf8(data) {
        for raw in text.lines().filter(|l| !l.trim().is_empty()) {
            let Ok(line) = serde_json::from_str::<ReplayLine>(raw) else {
                continue;
            };
            let Ok(body) = line.body_bytes() else {
                continue;
            };
            for scheme in SCHEMES {
                let _ = scheme.sign(&secret, &line.event_id, &line.event_type, &body, 1_700_000_000);
            }
        }
    }
    // The writer's side: any body, as a line, and back.
    let content_type = data.first().map(|b| b % 2 == 0).map(|form| {
        if form { "application/x-www-form-urlencoded" } else { "application/json" }
    });
    let line = ReplayLine::new("shop", "evt_1", "order.completed", data, content_type);
    let text = serde_json::to_string(&line).expect("a line serialises");
    assert!(!text.contains('\n'), "a replay line spans lines: {text}");
    let back: ReplayLine = serde_json::from_str(&text).expect("a written line reads back");
    assert_eq!(back, line);
    assert_eq!(back.body_bytes().as_deref(), Ok(data));
});
