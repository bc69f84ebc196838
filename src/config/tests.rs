use super::*;

fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
    vars.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const SOURCE: &str = r#"
[[sources]]
name = "shop"
scheme = "standard-webhooks"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
"#;

#[test]
fn an_empty_file_gives_the_spec_defaults() {
    let s = Settings::from_toml("", "t", env(&[])).unwrap();
    assert_eq!(s.listen, "127.0.0.1:8080");
    assert_eq!(s.database_url, "sqlite://data/webhook-inbox.db");
    assert_eq!(s.body_limit_bytes, 1_048_576);
    assert_eq!(s.consumers.workers, 4);
    assert_eq!(s.consumers.batch_size, 256);
    assert_eq!(s.consumers.lease_seconds, 30);
    assert_eq!(s.consumers.max_attempts, 15);
    assert_eq!(s.consumers.backoff_base_ms, 1000);
    assert_eq!(s.consumers.backoff_max_ms, 3_600_000);
    assert_eq!(s.downstream.timeout_ms, 10_000);
    assert_eq!(s.downstream.mode, DeliveryMode::AtMostOnce);
    let s = Settings::from_toml(SOURCE, "t", env(&[])).unwrap();
    assert_eq!(s.sources[0].tolerance_seconds, 300);
    assert_eq!(s.sources[0].on_payload_mismatch, MismatchPolicy::Duplicate);
}

#[test]
fn a_bad_environment_value_names_its_variable_in_plain_words() {
    let err = Settings::from_toml(
        "[consumers]\nworkers = 2",
        "webhook-inbox.toml",
        env(&[("WEBHOOK_INBOX_CONSUMERS__WORKERS", "abc")]),
    )
    .unwrap_err();
    assert!(
        matches!(&err, ConfigError::Env { var, .. } if var == "WEBHOOK_INBOX_CONSUMERS__WORKERS"),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("a non-negative integer") && !text.contains("usize"),
        "{text}"
    );
    assert!(!text.contains("webhook-inbox.toml"), "{text}");
    // The same value in the file is the file's fault, in the same words.
    let err = Settings::from_toml("[consumers]\nworkers = -1", "f.toml", env(&[])).unwrap_err();
    assert!(
        err.to_string().contains("f.toml") && err.to_string().contains("non-negative integer"),
        "{err}"
    );
}

#[test]
fn listen_takes_a_host_name_and_refuses_what_is_not_host_port() {
    let s = Settings::from_toml("listen = \"localhost:28100\"", "t", env(&[])).unwrap();
    assert_eq!(s.listen, "localhost:28100");
    for bad in ["localhost", "127.0.0.1:http", "127.0.0.1:99999"] {
        let err = Settings::from_toml(&format!("listen = \"{bad}\""), "t", env(&[])).unwrap_err();
        assert!(
            err.to_string().contains("e.g. 127.0.0.1:8080"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn unknown_keys_are_refused_by_name() {
    for (text, key) in [
        ("max_atempts = 3", "max_atempts"),
        ("[consumers]\nworkerz = 3", "workerz"),
        (
            "[[sources]]\nname = \"a\"\nscheme = \"github\"\nsecrets = [\"x\"]\nsecret = \"y\"",
            "secret",
        ),
    ] {
        let err = Settings::from_toml(text, "t", env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{err}");
    }
    let err = Settings::from_toml("", "t", env(&[("WEBHOOK_INBOX_CONSUMERS__WORKERZ", "1")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("workerz"), "{err}");
}

#[test]
fn bad_values_name_their_key() {
    for (text, key) in [
        ("listen = \"nowhere\"", "listen"),
        ("database_url = \"mysql://x\"", "database_url"),
        ("database_url = \"postgres://\"", "database_url"),
        ("[consumers]\nbatch_size = 0", "consumers.batch_size"),
        (
            "[consumers]\nlease_seconds = 10\n[downstream]\ntimeout_ms = 5000",
            "downstream.timeout_ms",
        ),
        ("[downstream]\nmode = \"sometimes\"", "mode"),
        ("log_format = \"xml\"", "log_format"),
        (
            "[[sources]]\nname = \"requests\"\nscheme = \"github\"\nsecrets = [\"x\"]",
            "sources[0].name",
        ),
        (
            "[[sources]]\nname = \"a\"\nscheme = \"github\"\nsecrets = []",
            "sources[0].secrets",
        ),
        (
            "[[sources]]\nname = \"a\"\nscheme = \"standard-webhooks\"\nsecrets = [\"whsec_***\"]",
            "sources[0].secrets",
        ),
        (
            "[[sources]]\nname = \"a\"\nscheme = \"gitlab\"\nsecrets = [\"x\"]",
            "gitlab",
        ),
    ] {
        let err = Settings::from_toml(text, "t", env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{text}: {err}");
    }
    let twice = format!("{SOURCE}{SOURCE}");
    let err = Settings::from_toml(&twice, "t", env(&[]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("sources[1].name"), "{err}");
}

#[test]
fn environment_overrides_the_file() {
    let s = Settings::from_toml(
        "[consumers]\nworkers = 2",
        "t",
        env(&[
            ("WEBHOOK_INBOX_CONSUMERS__WORKERS", "7"),
            ("WEBHOOK_INBOX_DATABASE_URL", "sqlite:///tmp/x.db"),
            ("WEBHOOK_INBOX_ADMIN_TOKEN", "1234567890123456"),
            ("WEBHOOK_INBOX_URL", "http://cli-only"),
            ("OTHER", "ignored"),
        ]),
    )
    .unwrap();
    assert_eq!(s.consumers.workers, 7);
    assert_eq!(
        s.database().unwrap(),
        super::Database::Sqlite(std::path::PathBuf::from("/tmp/x.db"))
    );
    assert_eq!(s.admin_token.expose(), "1234567890123456");
    let err = Settings::from_toml("", "t", env(&[("WEBHOOK_INBOX_SOURCES", "[]")])).unwrap_err();
    assert!(err.to_string().contains("config file"), "{err}");
}

#[test]
fn secrets_never_show_in_debug_output() {
    let s = Settings::from_toml(
        &format!("admin_token = \"tok-123-long-enough\"\n{SOURCE}"),
        "t",
        env(&[]),
    )
    .unwrap();
    let debug = format!("{s:?}");
    assert!(!debug.contains("tok-123"));
    assert!(!debug.contains("MfKQ9r8G"));
    assert!(debug.contains("[redacted]"));
}

/// A guessable token is refused at start with its key named; an empty admin token is still
/// the way to have one generated.
#[test]
fn short_admin_and_submission_tokens_are_refused() {
    for (toml, key) in [
        ("admin_token = \"change-me\"", "admin_token"),
        ("admin_token = \"123456789012345\"", "admin_token"),
        (
            "submission_tokens = [\"a-long-enough-submit-token\", \"short\"]",
            "submission_tokens[1]",
        ),
        ("listen_tokens = [\"too-short\"]", "listen_tokens[0]"),
    ] {
        let err = Settings::from_toml(&format!("{toml}\n{SOURCE}"), "t", env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains(key) && err.contains("16"), "{toml}: {err}");
    }
    let err = Settings::from_toml(SOURCE, "t", env(&[("WEBHOOK_INBOX_ADMIN_TOKEN", "weak")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("admin_token"), "{err}");
    for toml in [
        "admin_token = \"\"",
        "admin_token = \"0123456789abcdef\"\nsubmission_tokens = [\"0123456789abcdef\"]",
    ] {
        Settings::from_toml(&format!("{toml}\n{SOURCE}"), "t", env(&[])).unwrap();
    }
}

#[test]
fn the_test_switch_with_the_prefix_is_not_a_setting() {
    let vars = env(&[("WEBHOOK_INBOX_UNSAFE_SKIP_WAL_FSYNC", "1")]);
    Settings::from_toml("", "t", vars).unwrap();
    let err = Settings::from_toml("", "t", env(&[("WEBHOOK_INBOX_TEST_OTHER", "1")])).unwrap_err();
    assert!(err.to_string().contains("test_other"), "{err}");
}

/// Values near the top of their type are refused by name instead of overflowing the
/// arithmetic that compares them (`timeout_ms * 2`, `lease_seconds * 1000` used to).
#[test]
fn huge_durations_are_refused_without_overflow() {
    for (text, key) in [
        (
            "[consumers]\nlease_seconds = 18446744073709551615",
            "lease_seconds",
        ),
        (
            "[downstream]\ntimeout_ms = 18446744073709551615",
            "timeout_ms",
        ),
        (
            "[consumers]\nbackoff_max_ms = 18446744073709551615",
            "backoff_max_ms",
        ),
        ("[downstream]\nconcurrency = 0", "concurrency"),
    ] {
        let err = Settings::from_toml(text, "t", env(&[])).unwrap_err();
        assert!(err.to_string().contains(key), "{text}: {err}");
    }
}

/// The refusal of a URL this build cannot use names the URL, never its password; a
/// PostgreSQL URL's `Debug` (settings may be logged) hides it too.
#[test]
fn a_database_url_is_never_shown_with_its_credentials() {
    let url = "postgres://app:s3cret-pw@db.internal:5432/inbox";
    let debug = format!("{:?}", super::Database::parse(url).unwrap());
    assert!(
        !debug.contains("s3cret-pw") && debug.contains("db.internal"),
        "{debug}"
    );
    let text = r#"database_url = "mysql://app:s3cret-pw@db.internal:5432/inbox""#;
    let err = Settings::from_toml(text, "t", env(&[]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("database_url"), "{err}");
    assert!(!err.contains("s3cret-pw") && !err.contains("app:"), "{err}");
    assert!(err.contains("db.internal:5432/inbox"), "{err}");
}

#[test]
fn session_idle_seconds_defaults_to_ten_minutes_and_must_be_positive() {
    let s = Settings::from_toml("", "t", env(&[])).unwrap();
    assert_eq!(s.session_idle_seconds, 600);
    let s = Settings::from_toml("session_idle_seconds = 1", "t", env(&[])).unwrap();
    assert_eq!(s.session_idle_seconds, 1);
    let err = Settings::from_toml("session_idle_seconds = 0", "t", env(&[])).unwrap_err();
    assert!(err.to_string().contains("session_idle_seconds"), "{err}");
}

#[test]
fn telemetry_is_off_by_default_and_its_keys_are_checked() {
    let s = Settings::from_toml("", "t", env(&[])).unwrap();
    assert!(s.telemetry.otlp_endpoint.is_empty());
    assert_eq!(s.telemetry.sample_ratio, 1.0);
    let s = Settings::from_toml(
        "",
        "t",
        env(&[
            (
                "WEBHOOK_INBOX_TELEMETRY__OTLP_ENDPOINT",
                "http://127.0.0.1:4318/v1/traces",
            ),
            ("WEBHOOK_INBOX_TELEMETRY__SAMPLE_RATIO", "0.01"),
        ]),
    )
    .unwrap();
    assert_eq!(s.telemetry.otlp_endpoint, "http://127.0.0.1:4318/v1/traces");
    assert_eq!(s.telemetry.sample_ratio, 0.01);
    for (text, key) in [
        ("[telemetry]\nsample_ratio = 1.5", "telemetry.sample_ratio"),
        ("[telemetry]\nsample_ratio = -0.1", "telemetry.sample_ratio"),
        (
            "[telemetry]\notlp_endpoint = \"collector:4318\"",
            "telemetry.otlp_endpoint",
        ),
        ("[telemetry]\nendpoint = \"http://x\"", "endpoint"),
    ] {
        let err = Settings::from_toml(text, "t", env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{text}: {err}");
    }
}
