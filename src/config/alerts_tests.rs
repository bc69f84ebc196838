//! `[[alerts]]`'s settings: read, defaulted and refused.

use super::super::Settings;
use super::*;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const REJECTED: &str =
    "[[alerts.conditions]]\nkind = \"source_rejected\"\nthreshold = 5\nduration_seconds = 60\n";

fn parse(text: &str) -> Result<Settings, ConfigError> {
    Settings::from_toml(text, "t", Vec::new())
}

/// The error's key and message, for a config that must be refused.
fn refused(text: &str) -> (String, String) {
    match parse(text) {
        Err(ConfigError::Invalid { key, message }) => (key, message),
        other => panic!("expected an invalid key, got {other:?}"),
    }
}

#[test]
fn a_channel_alone_gets_the_default_conditions_and_its_kind_as_name() {
    let s = parse("[[alerts]]\nkind = \"slack\"\nurl = \"https://hooks.example.com/x\"\n").unwrap();
    assert_eq!(s.alerts[0].channel(), "slack");
    let kinds: Vec<&str> = s.alerts[0]
        .conditions()
        .iter()
        .map(|c| c.kind.name())
        .collect();
    assert_eq!(
        kinds,
        [
            "subscription_failed",
            "breaker_open",
            "subscription_lag",
            "source_rejected",
            "store_unavailable"
        ]
    );
    assert_eq!(s.alert_every_ms, 15_000);
    assert_eq!(s.alerts[0].timeout_ms, 5_000);
}

#[test]
fn conditions_are_read_with_their_threshold_duration_and_subject() {
    let s = parse(&format!(
        "alert_every_ms = 2000\n[[alerts]]\nname = \"ops\"\nkind = \"webhook\"\n\
         url = \"http://127.0.0.1:9/\"\nsecret = \"{SECRET}\"\n\
         [[alerts.conditions]]\nkind = \"source_rejected\"\nthreshold = 5\n\
         duration_seconds = 60\nonly = \"shop\"\n\
         [[sources]]\nname = \"shop\"\nscheme = \"standard-webhooks\"\nsecrets = [\"{SECRET}\"]\n"
    ))
    .unwrap();
    assert_eq!(
        s.alerts[0].conditions(),
        [ConditionSettings {
            kind: ConditionKind::SourceRejected,
            threshold: 5,
            duration_seconds: 60,
            only: Some("shop".into()),
        }]
    );
}

#[test]
fn bad_alert_settings_are_refused_naming_the_key() {
    let slack = "[[alerts]]\nkind = \"slack\"\nurl = \"https://hooks.example.com/x\"\n";
    for (text, key, words) in [
        (
            "[[alerts]]\nkind = \"webhook\"\nurl = \"https://x.example.com/\"\n".to_string(),
            "alerts[0].secret",
            "signs",
        ),
        (
            "[[alerts]]\nkind = \"webhook\"\nurl = \"https://x.example.com/\"\nsecret = \"plain\"\n"
                .to_string(),
            "alerts[0].secret",
            "whsec_",
        ),
        (
            "[[alerts]]\nkind = \"slack\"\nurl = \"not a url\"\n".to_string(),
            "alerts[0].url",
            "not a URL",
        ),
        (format!("{slack}{slack}"), "alerts[1].name", "twice"),
        (
            format!("{slack}[[alerts.conditions]]\nkind = \"source_rejected\"\nduration_seconds = 60\n"),
            "alerts[0].conditions[0].threshold",
            "at least 1",
        ),
        (
            format!("{slack}[[alerts.conditions]]\nkind = \"breaker_open\"\nthreshold = 3\nduration_seconds = 60\n"),
            "alerts[0].conditions[0].threshold",
            "no threshold",
        ),
        (
            format!("{slack}[[alerts.conditions]]\nkind = \"breaker_open\"\nduration_seconds = 9999999\n"),
            "alerts[0].conditions[0].duration_seconds",
            "a week",
        ),
        (format!("alert_every_ms = 1\n{slack}"), "alert_every_ms", "between"),
        (
            format!("{slack}[[alerts.conditions]]\nkind = \"subscription_lag\"\nduration_seconds = 0\n"),
            "alerts[0].conditions[0].threshold",
            "at least 1",
        ),
        (
            format!("{slack}[[alerts.conditions]]\nkind = \"subscription_failed\"\nthreshold = 99999999999999999\nduration_seconds = 60\n"),
            "alerts[0].conditions[0].threshold",
            "at most",
        ),
        (
            format!("[rejections]\nkeep_count = 0\n{slack}{REJECTED}"),
            "alerts[0].conditions[0].kind",
            "keeps none",
        ),
        (
            format!("[rejections]\nkeep_days = 1\n{slack}{REJECTED}").replace("= 60", "= 90000"),
            "alerts[0].conditions[0].kind",
            "keep_days",
        ),
        (
            format!("{slack}{REJECTED}only = \"nowhere\"\n"),
            "alerts[0].conditions[0].only",
            "nowhere",
        ),
        (format!("public_url = \"ftp://x\"\n{slack}"), "public_url", "http"),
    ] {
        let (got, message) = refused(&text);
        assert_eq!(got, key, "{text}");
        assert!(message.contains(words), "{key}: {message}");
    }
}

#[test]
fn an_unknown_condition_or_key_is_refused_by_name() {
    let err = parse(
        "[[alerts]]\nkind = \"slack\"\nurl = \"https://h.example.com/\"\n\
         [[alerts.conditions]]\nkind = \"disk_full\"\nduration_seconds = 1\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("alerts[0].conditions[0].kind"), "{err}");
    let err = parse("[[alerts]]\nkind = \"slack\"\nurl = \"https://h.example.com/\"\nchanel = 1\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("chanel"), "{err}");
}
