//! The config loader and its environment overrides (config::Settings::from_toml).
//!
//! An input is a TOML document, then a NUL byte, then override lines `KEY=VALUE`, each read as
//! the variable `WEBHOOK_INBOX_KEY` (nested keys with `__`).
//!
//! Property: no panic on any input: a document and overrides are settings or a ConfigError.
#![no_main]

use libfuzzer_sys::fuzz_target;
use webhook_inbox::config::Settings;

fuzz_target!(|data: &[u8]| {
    let (toml, env) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &data[data.len()..]),
    };
    let toml = String::from_utf8_lossy(toml);
    let env: Vec<(String, String)> = String::from_utf8_lossy(env)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (format!("WEBHOOK_INBOX_{k}"), v.to_string()))
        .collect();
    if let Ok(settings) = Settings::from_toml(&toml, "fuzz.toml", env) {
        let _ = settings.database();
        let _ = settings.consumers.lease_ms();
        for source in &settings.sources {
            assert!(settings.source(&source.name).is_some());
        }
    }
});
