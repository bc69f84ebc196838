//! The shopify signature header parser (see signature.rs for the input and the properties).
#![no_main]

#[path = "signature.rs"]
mod signature;

use libfuzzer_sys::fuzz_target;
use webhook_inbox::signature::Scheme;

fuzz_target!(|data: &[u8]| {
    signature::check(Scheme::Shopify, &["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", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"], data);
});
