//! The config's `[[subscriptions]]` tables through the subscriptions' one check: each mistake
//! named by its key, the defaults of `[consumers]` and `[downstream]` filled in.

use super::*;
use crate::config::Settings;
use crate::domain::DeliveryMode;

fn refused(text: &str) -> String {
    Settings::from_toml(text, "t", Vec::new())
        .unwrap_err()
        .to_string()
}

/// Every mistake of SPEC section 13 is refused at start, naming the key.
#[test]
fn bad_subscriptions_are_refused_naming_the_key() {
    let sub = |body: &str| format!("[[subscriptions]]\n{body}\n");
    for (text, key, words) in [
        (
            sub("name = \"a\"\nkind = \"audit\"") + &sub("name = \"a\"\nkind = \"audit\""),
            "subscriptions[1].name",
            "twice",
        ),
        (
            sub("name = \"a\"\nkind = \"mail\""),
            "kind",
            "unknown variant",
        ),
        (
            sub("name = \"Bad_Name\"\nkind = \"audit\""),
            "subscriptions[0].name",
            "lowercase",
        ),
        (
            sub("name = \"a\"\nkind = \"audit\"\ntypes = [\"\"]"),
            "subscriptions[0].types",
            "cannot match",
        ),
        (
            sub("name = \"a\"\nkind = \"audit\"\ntypes = [\"[ab]\"]"),
            "subscriptions[0].types",
            "cannot match",
        ),
        (
            sub("name = \"a\"\nkind = \"audit\"\ntypes = []"),
            "subscriptions[0].types",
            "empty",
        ),
        (
            sub("name = \"a\"\nkind = \"audit\"\nsources = []"),
            "subscriptions[0].sources",
            "empty",
        ),
        (
            sub("name = \"a\"\nkind = \"audit\"\nsources = [\"requests\"]"),
            "subscriptions[0].sources",
            "downstream",
        ),
        (
            sub("name = \"a\"\nkind = \"audit\"\nurl = \"http://x\""),
            "subscriptions[0].url",
            "http",
        ),
        (
            sub("name = \"a\"\nkind = \"audit\"\ntoken = \"t\""),
            "subscriptions[0].token",
            "pull",
        ),
        (
            sub("name = \"a\"\nkind = \"loyalty-credit\"\nmode = \"at-most-once\""),
            "subscriptions[0].mode",
            "at-least-once",
        ),
        (
            sub("name = \"a\"\nkind = \"audit\"\nmax_attempts = 0"),
            "subscriptions[0].max_attempts",
            "at least 1",
        ),
        (
            sub("name = \"a\"\nkind = \"audit\"\nbackoff_base_ms = 9\nbackoff_max_ms = 1"),
            "subscriptions[0].backoff_base_ms",
            "exceed",
        ),
        (
            sub("name = \"a\"\nkind = \"audit\"\nordered_by = \"data.id\""),
            "subscriptions[0].ordered_by",
            "JSON pointer",
        ),
        (
            sub("name = \"a\"\nkind = \"audit\"\nordered_by = \"/items/0\""),
            "subscriptions[0].ordered_by",
            "array position",
        ),
        (
            sub("name = \"a\"\nkind = \"audit\"\nordered_by = \"/a//b\""),
            "subscriptions[0].ordered_by",
            "empty segment",
        ),
        (
            sub("name = \"a\"\nkind = \"audit\"\non_failure = \"skip\""),
            "subscriptions[0].on_failure",
            "ordered",
        ),
        (
            sub("name = \"a\"\nkind = \"downstream\"\nordered_by = \"/id\""),
            "subscriptions[0].ordered_by",
            "not ordered",
        ),
        (
            sub("name = \"a\"\nkind = \"audit\"\nordered_by = \"/d\"\non_failure = \"later\""),
            "subscriptions[0].on_failure",
            "unknown variant",
        ),
        (
            sub("name = \"a\"\nkind = \"pull\"\ntoken = \"short\""),
            "subscriptions[0].token",
            "at least 16",
        ),
        (
            sub("name = \"a\"\nkind = \"pull\"\nconcurrency = 2"),
            "subscriptions[0].concurrency",
            "http",
        ),
        (
            sub("name = \"a\"\nkind = \"http\""),
            "subscriptions[0].url",
            "needs the URL",
        ),
        (
            sub("name = \"a\"\nkind = \"nats\"\nsubject = \"a\""),
            "subscriptions[0].url",
            "broker's URL",
        ),
        (
            sub("name = \"a\"\nkind = \"nats\"\nurl = \"https://x\"\nsubject = \"a\""),
            "subscriptions[0].url",
            "nats://",
        ),
        (
            sub("name = \"a\"\nkind = \"nats\"\nurl = \"nats://x\""),
            "subscriptions[0].subject",
            "needs the subject",
        ),
        (
            sub("name = \"a\"\nkind = \"nats\"\nurl = \"nats://x\"\nsubject = \"a.>\""),
            "subscriptions[0].subject",
            "wildcards",
        ),
        (
            sub(
                "name = \"a\"\nkind = \"nats\"\nurl = \"nats://x\"\nsubject = \"a\"\nstream = \"a.b\"",
            ),
            "subscriptions[0].stream",
            "stream name",
        ),
        (
            sub(
                "name = \"a\"\nkind = \"nats\"\nurl = \"nats://x\"\nsubject = \"a\"\nsigning_secret = \"whsec_x\"",
            ),
            "subscriptions[0].signing_secret",
            "http",
        ),
        (
            sub("name = \"a\"\nkind = \"http\"\nurl = \"http://x\"\nsubject = \"a\""),
            "subscriptions[0].subject",
            "nats",
        ),
        (
            sub("name = \"a\"\nkind = \"http\"\nurl = \"ftp://h/x\""),
            "subscriptions[0].url",
            "http:// or https://",
        ),
        (
            sub("name = \"a\"\nkind = \"http\"\nurl = \"billing/hooks\""),
            "subscriptions[0].url",
            "absolute",
        ),
        (
            sub("name = \"a\"\nkind = \"http\"\nurl = \"http://h\"\nsigning_secret = \"whsec_!!\""),
            "subscriptions[0].signing_secret",
            "base64",
        ),
        (
            sub("name = \"a\"\nkind = \"amqp\"\nexchange = \"\"\nrouting_key = \"q\""),
            "subscriptions[0].url",
            "a `amqp` subscription needs the broker's URL",
        ),
        (
            sub("name = \"a\"\nkind = \"amqp\"\nurl = \"amqp://h\"\nrouting_key = \"q\""),
            "subscriptions[0].exchange",
            "needs the exchange",
        ),
        (
            sub(
                "name = \"a\"\nkind = \"amqp\"\nurl = \"amqp://h\"\nexchange = \"x y\"\nrouting_key = \"q\"",
            ),
            "subscriptions[0].exchange",
            "an exchange name",
        ),
        (
            sub(
                "name = \"a\"\nkind = \"amqp\"\nurl = \"amqp://h\"\nexchange = \"x\"\nrouting_key = \"{id}\"",
            ),
            "subscriptions[0].routing_key",
            "only placeholders",
        ),
        (
            sub(
                "name = \"a\"\nkind = \"amqp\"\nurl = \"http://h\"\nexchange = \"x\"\nrouting_key = \"q\"",
            ),
            "subscriptions[0].url",
            "amqp://",
        ),
        (
            sub(
                "name = \"a\"\nkind = \"nats\"\nurl = \"nats://h\"\nsubject = \"a\"\nrouting_key = \"q\"",
            ),
            "subscriptions[0].routing_key",
            "amqp",
        ),
        (
            sub("name = \"a\"\nkind = \"http\"\nurl = \"http://h\"\nsigning_secret = []"),
            "subscriptions[0].signing_secret",
            "empty",
        ),
        (
            sub("name = \"a\"\nkind = \"http\"\nurl = \"http://h\"\ntimeout_ms = 0"),
            "subscriptions[0].timeout_ms",
            "half of consumers.lease_seconds",
        ),
        (
            sub("name = \"a\"\nkind = \"http\"\nurl = \"http://h\"\ntimeout_ms = 15000"),
            "subscriptions[0].timeout_ms",
            "half of consumers.lease_seconds",
        ),
        (
            sub("name = \"a\"\nkind = \"http\"\nurl = \"http://h\"\nconcurrency = 0"),
            "subscriptions[0].concurrency",
            "between 1 and 1024",
        ),
        (
            sub("name = \"a\"\nkind = \"http\"\nurl = \"http://h\"\nca_file = \"/no/such.pem\""),
            "subscriptions[0].ca_file",
            "cannot read",
        ),
        (
            sub("name = \"a\"\nkind = \"http\"\nurl = \"http://h\"\nca_file = \"/etc/hostname\""),
            "subscriptions[0].ca_file",
            "no PEM certificate",
        ),
        (
            sub(
                "name = \"a\"\nkind = \"nats\"\nurl = \"nats://h\"\nsubject = \"s\"\n\
                 creds_file = \"/no/such.creds\"",
            ),
            "subscriptions[0].creds_file",
            "cannot read",
        ),
        (
            sub(
                "name = \"a\"\nkind = \"nats\"\nurl = \"nats://h\"\nsubject = \"s\"\n\
                 creds_file = \"/etc/hostname\"",
            ),
            "subscriptions[0].creds_file",
            "cannot parse user JWT",
        ),
        (
            sub(
                "name = \"a\"\nkind = \"http\"\nurl = \"http://h\"\ncreds_file = \"/etc/hostname\"",
            ),
            "subscriptions[0].creds_file",
            "for kind `nats` only",
        ),
        (
            sub("name = \"a\"\nkind = \"audit\"\ntransform = \".id\""),
            "subscriptions[0].transform",
            "kind `audit` delivers nothing to reshape",
        ),
        (
            sub("name = \"a\"\nkind = \"pull\"\ntransform = \"{id: .id\""),
            "subscriptions[0].transform",
            "expected closing brace at 1:9",
        ),
        (
            sub(&format!(
                "name = \"a\"\nkind = \"http\"\nurl = \"http://h\"\ntransform = \"{}\"",
                ".".repeat(20_000)
            )),
            "subscriptions[0].transform",
            "over the limit of 16384",
        ),
        (
            sub("name = \"a\"\nkind = \"audit\"\nfilter = 1"),
            "subscriptions[0].filter",
            "a filter is an object",
        ),
        (
            sub("name = \"a\"\nkind = \"audit\"\nfilter = { path = \"/amount\", gte = { a = 1 } }"),
            "subscriptions[0].filter",
            "`/amount` `gte`: takes a number or a string, not an object",
        ),
    ] {
        let err = refused(&text);
        assert!(err.contains(key) && err.contains(words), "{text}: {err}");
    }
}

#[test]
fn a_config_names_its_subscriptions_with_their_defaults() {
    let text = "[consumers]\nmax_attempts = 4\n[downstream]\nmode = \"at-least-once\"\n\
                [[subscriptions]]\nname = \"pay\"\nkind = \"downstream\"\n\
                [[subscriptions]]\nname = \"inv\"\nkind = \"audit\"\n\
                sources = [\"stripe\"]\ntypes = [\"invoice.*\"]\nmax_attempts = 9\n";
    let settings = Settings::from_toml(text, "t", Vec::new()).unwrap();
    let subs = subscriptions_of(&settings).unwrap();
    assert_eq!(subs.len(), 2);
    assert_eq!(subs[0].route.sources, Some(vec!["requests".to_string()]));
    assert_eq!(subs[0].mode, DeliveryMode::AtLeastOnce);
    assert_eq!(subs[0].max_attempts, 4);
    assert_eq!(subs[1].max_attempts, 9);
    assert!(subs[1].route.matches("stripe", "invoice.paid"));
    assert!(!subs[1].route.matches("shop", "invoice.paid"));
    assert!(!subs[1].route.matches("stripe", "charge.paid"));
    // None named: the implicit three.
    let implicit = subscriptions_of(&Settings::default()).unwrap();
    let names: Vec<_> = implicit.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["loyalty", "downstream", "audit"]);
}

/// An `http` subscription with its defaults; a secret list (a rotation) keeps every secret.
#[test]
fn an_http_subscription_takes_its_defaults_and_every_secret() {
    let text = "[consumers]\nlease_seconds = 60\n\
                [[subscriptions]]\nname = \"billing\"\nkind = \"http\"\n\
                url = \"https://user:pw@billing.internal/hooks\"\n\
                [[subscriptions]]\nname = \"ledger\"\nkind = \"http\"\n\
                url = \"http://127.0.0.1:9/x\"\nmode = \"at-most-once\"\n\
                signing_secret = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\", \"whsec_c2VjcmV0\"]\n\
                timeout_ms = 29999\nconcurrency = 64\nrate_per_second = 100\n";
    let settings = Settings::from_toml(text, "t", Vec::new()).unwrap();
    let subs = subscriptions_of(&settings).unwrap();
    let billing = subs[0].http.as_ref().unwrap();
    assert_eq!(billing.url, "https://user:pw@billing.internal/hooks");
    assert!(
        billing.signing_secrets.is_empty(),
        "filled from data/ at start"
    );
    assert_eq!((billing.timeout_ms, billing.concurrency), (10_000, 8));
    assert_eq!(billing.rate_per_second, 0);
    assert_eq!(subs[0].mode, DeliveryMode::AtLeastOnce);
    assert_eq!(subs[0].kind.lane(), 1);
    let ledger = subs[1].http.as_ref().unwrap();
    assert_eq!(ledger.signing_secrets.len(), 2);
    assert_eq!((ledger.timeout_ms, ledger.concurrency), (29_999, 64));
    assert_eq!(ledger.rate_per_second, 100);
    assert_eq!(subs[1].mode, DeliveryMode::AtMostOnce);
    // The URL may hold credentials: a refused config never echoes it.
    let bad = "[[subscriptions]]\nname = \"b\"\nkind = \"http\"\nurl = \"ftp://u:hunter2@h/\"\n";
    assert!(!refused(bad).contains("hunter2"));
}
