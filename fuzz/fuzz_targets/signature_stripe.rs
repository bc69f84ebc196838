//! The stripe signature header parser (see signature.rs for the input and the properties).
#![no_main]

#[path = "signature.rs"]
mod signature;

use libfuzzer_sys::fuzz_target;
use webhook_inbox::signature::Scheme;

fuzz_target!(|data: &[u8]| {
    signature::check(Scheme::Stripe, &["whsec_5f0d2c7e9a1b4c3d8e6f0a1b2c3d4e5f", "stripe-endpoint-secret-2"], data);
});
