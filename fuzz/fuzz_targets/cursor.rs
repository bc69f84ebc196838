//! The paging cursor decoder of `GET /events` and `GET /loyalty/{customer_id}`.
//!
//! Properties: no panic on any text (a cursor or a 422); every cursor the server issues
//! decodes to the sequence it names.
#![no_main]

use libfuzzer_sys::fuzz_target;
use webhook_inbox::routes::paging::{decode_cursor, encode_cursor};

fuzz_target!(|data: &[u8]| {
    let _ = decode_cursor(&String::from_utf8_lossy(data));
    if let Ok(bytes) = <[u8; 8]>::try_from(data.get(..8).unwrap_or_default()) {
        let seq = i64::from_le_bytes(bytes);
        assert_eq!(decode_cursor(&encode_cursor(seq)).ok(), Some(seq));
    }
});
