//! The github signature header parser (see signature.rs for the input and the properties).
#![no_main]

#[path = "signature.rs"]
mod signature;

use libfuzzer_sys::fuzz_target;
use webhook_inbox::signature::Scheme;

fuzz_target!(|data: &[u8]| {
    signature::check(Scheme::Github, &["It's a Secret to Everybody", "gh-hook-secret-8c1f"], data);
});
