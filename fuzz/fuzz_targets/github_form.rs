//! GitHub's form-encoded deliveries (`application/x-www-form-urlencoded`, the JSON in the
//! `payload` field): domain::payload::{peek, payload_json} on form bodies.
//!
//! Properties: no panic on any form body; a form body reads as its `payload` field would read
//! as a JSON body (same acceptance, same id and type); the input itself, sent as the `payload`
//! of a form, peeks as it does sent as JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;
use webhook_inbox::domain::payload::{payload_json, peek};

const FORM: Option<&str> = Some("application/x-www-form-urlencoded");
const JSON: Option<&str> = Some("application/json");

fn same(form: &[u8], json: &[u8]) {
    let (a, b) = (peek(form, FORM), peek(json, JSON));
    match (&a, &b) {
        (Ok(a), Ok(b)) => {
            assert_eq!(
                (a.id(), a.event_id(), a.event_type()),
                (b.id(), b.event_id(), b.event_type())
            );
        }
        (Err(_), Err(_)) => {}
        _ => panic!("form {a:?} but JSON {b:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let _ = payload_json(data, FORM);
    let payload = form_urlencoded::parse(data)
        .find(|(k, _)| k == "payload")
        .map(|(_, v)| v.into_owned());
    match payload {
        Some(json) => same(data, json.as_bytes()),
        None => assert!(peek(data, FORM).is_err(), "a form without payload"),
    }
    let text = String::from_utf8_lossy(data);
    let form = form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", &text)
        .finish();
    same(form.as_bytes(), text.as_bytes());
});
