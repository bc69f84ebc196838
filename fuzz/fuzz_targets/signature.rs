//! Shared by the five signature targets. An input reads like an HTTP message, so that the seed
//! corpus holds real deliveries (tests/vectors): header lines `name: value`, a blank line, the
//! body. Any bytes are an input: a line without `: ` is a header with an empty value.
//!
//! Properties: verification never panics; a body signed by our own signer always verifies,
//! and the same body with one byte flipped never does.

use webhook_inbox::signature::{Scheme, Secret, SignatureError};

/// Verification time: inside the tolerance of fresh signatures, far from the vectors' times.
const NOW: i64 = 1_700_000_000;
const TOLERANCE: u64 = 300;

/// Headers and body of an input.
fn split(data: &[u8]) -> (Vec<(String, String)>, &[u8]) {
    let at = data.windows(2).position(|w| w == b"\n\n");
    let (head, body) = match at {
        Some(i) => (&data[..i], &data[i + 2..]),
        None => (data, &data[data.len()..]),
    };
    let headers = String::from_utf8_lossy(head)
        .lines()
        .map(|line| match line.split_once(": ") {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (line.to_string(), String::new()),
        })
        .collect();
    (headers, body)
}

pub fn check(scheme: Scheme, secrets: &[&str], data: &[u8]) {
    let secrets: Vec<Secret> = secrets.iter().map(|s| Secret::new(*s)).collect();
    let (headers, body) = split(data);
    // Any input: an answer, never a panic.
    let _ = scheme.verify(&headers, body, &secrets, NOW, TOLERANCE);

    // Our signer against our verifier, on this input's body, with each secret.
    let event_id = headers
        .first()
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.is_empty())
        .unwrap_or("evt_fuzz");
    for secret in &secrets {
        let Ok(signed) = scheme.sign(secret, event_id, "fuzz.event", body, NOW) else {
            continue;
        };
        let one = std::slice::from_ref(secret);
        if let Err(e) = scheme.verify(&signed, body, one, NOW, TOLERANCE) {
            panic!("{scheme:?}: our own signature does not verify: {e}; headers {signed:?}");
        }
        if body.is_empty() {
            continue;
        }
        let mut flipped = body.to_vec();
        let at = usize::from(body[0]) % flipped.len();
        flipped[at] ^= 1 << (body.len() % 8);
        match scheme.verify(&signed, &flipped, one, NOW, TOLERANCE) {
            Err(SignatureError::NoMatch) => {}
            other => panic!("{scheme:?}: a flipped byte at {at} gave {other:?}"),
        }
    }
}
