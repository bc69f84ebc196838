//! The standard signature header parser (see signature.rs for the input and the properties).
#![no_main]

#[path = "signature.rs"]
mod signature;

use libfuzzer_sys::fuzz_target;
use webhook_inbox::signature::Scheme;

fuzz_target!(|data: &[u8]| {
    signature::check(Scheme::StandardWebhooks, &["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_rs3uroCO1uPjq6Wgbw4k0HKSHJpNO9wcN//Tp5E6eq4="], data);
});
