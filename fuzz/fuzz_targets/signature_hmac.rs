//! The hmac signature header parser (see signature.rs for the input and the properties).
#![no_main]

#[path = "signature.rs"]
mod signature;

use libfuzzer_sys::fuzz_target;
use webhook_inbox::signature::Scheme;

fuzz_target!(|data: &[u8]| {
    signature::check(Scheme::HmacSha256, &["generic-shared-secret-7e2a", "whsec_c2VjcmV0LWtleS1mb3ItdGVzdHM="], data);
});
