//! A `nats` subscription with a `creds_file` (a user JWT and its nkey seed, as `nsc generate
//! creds` writes one) publishing to a broker in operator mode (trusted operator key, a memory
//! resolver holding the account's JWT, JetStream enabled for the account): refused by the
//! broker without it, published with it; a `creds_file` that does not read as one is refused at
//! start and in the API, naming the key.
//!
//! No crate in the tree writes NATS JWTs with JetStream limits (`nats-jwt` has no JetStream
//! field, and `nsc` is not in Debian), so the claims are written here as nats-io/jwt writes
//! them and signed with `nkeys` (the key pairs async-nats itself uses).

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use nkeys::KeyPair;
use serde_json::{Value, json};

use crate::brokers::{NATS, PrivateBroker, send_orders, until_failed_with, until_published};
use crate::helpers::*;
use crate::nats::{app_with_bus, broker, distinct_ids, make_stream, stored, unique};
use crate::registry_routes::{assert_names, create, patch};

/// A NATS JWT (`ed25519-nkey`) of `nats` claims about `subject`, signed by `issuer`.
fn jwt(issuer: &KeyPair, subject: &str, nats: Value) -> String {
    let header = URL_SAFE_NO_PAD.encode(r#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let iat = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = json!({
        "jti": uuid::Uuid::new_v4().simple().to_string().to_uppercase(),
        "iat": iat,
        "iss": issuer.public_key(),
        "name": subject,
        "sub": subject,
        "nats": nats,
    });
    let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signed = format!("{header}.{payload}");
    let signature = issuer.sign(signed.as_bytes()).unwrap();
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature))
}

/// An operator-mode broker's config and a user's creds file, written in `dir`: returns the
/// server options for `scripts/with-nats` and the creds file's path.
fn operator_mode(dir: &Path) -> (String, std::path::PathBuf) {
    let operator = KeyPair::new_operator();
    let account = KeyPair::new_account();
    // JetStream wants the server's own account too.
    let system = KeyPair::new_account();
    let system_jwt = jwt(
        &operator,
        &system.public_key(),
        json!({"type": "account", "version": 2}),
    );
    let user = KeyPair::new_user();
    let account_jwt = jwt(
        &operator,
        &account.public_key(),
        json!({"type": "account", "version": 2, "limits": {
            "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
            "wildcards": true, "conn": -1, "leaf": -1,
            // Limits set: JetStream is enabled for the account.
            "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}}),
    );
    let user_jwt = jwt(
        &account,
        &user.public_key(),
        json!({"type": "user", "version": 2, "subs": -1, "data": -1, "payload": -1}),
    );
    let config = dir.join("operator.conf");
    std::fs::write(
        &config,
        format!(
            "trusted_keys: [\"{}\"]\nsystem_account: {sys}\nresolver: MEMORY\n\
             resolver_preload: {{\n  {sys}: \"{system_jwt}\"\n  {}: \"{account_jwt}\"\n}}\n",
            operator.public_key(),
            account.public_key(),
            sys = system.public_key(),
        ),
    )
    .unwrap();
    let creds = dir.join("user.creds");
    std::fs::write(
        &creds,
        format!(
            "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
             ************************* IMPORTANT *************************\n\
             NKEY Seed printed below can be used to sign and prove identity.\n\n\
             -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
            user.seed().unwrap()
        ),
    )
    .unwrap();
    (format!("-c {}", config.display()), creds)
}

/// A broker in operator mode takes only a user its account signed: the subscription is refused
/// (a failed attempt naming the authorization, nothing published) until it names the creds
/// file, then publishes with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_a_creds_file_signs_in_to_a_broker_in_operator_mode() {
    if broker().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (options, creds) = operator_mode(dir.path());
    let private =
        tokio::task::block_in_place(|| PrivateBroker::start_with(dir.path(), &NATS, &options));
    let refused = async_nats::connect(private.url.as_str()).await;
    assert!(
        refused.is_err(),
        "the broker took a user without credentials"
    );
    let client = async_nats::ConnectOptions::with_credentials_file(&creds)
        .await
        .unwrap()
        .connect(private.url.as_str())
        .await
        .expect("connect with the creds file");
    let js = async_nats::jetstream::new(client);
    let (name, prefix) = (unique("S"), unique("p"));
    make_stream(&js, &name, &prefix).await;

    let app = app_with_bus(&private.url, &prefix, "").await;
    send_orders(&app, "c", 3).await;
    let state = until_failed_with(&app, "c-0", "uthorization").await;
    assert!(
        state["last_error"]
            .as_str()
            .unwrap()
            .contains("could not connect to the broker"),
        "{state}"
    );
    assert_eq!(
        app.get("/subscriptions/bus").await.body["counts"]["completed"],
        0
    );
    assert!(stored(&js, &name).await.is_empty());

    // Once the breaker is open, the change closes it: no wait for the next probe.
    let deadline = Instant::now() + Duration::from_secs(30);
    while app.get("/subscriptions/bus").await.body["state"] != "probing" {
        assert!(Instant::now() < deadline, "the breaker did not open");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let body = json!({ "creds_file": creds.display().to_string() }).to_string();
    let changed = crate::registry_routes::patch(&app, "bus", &body).await;
    assert_eq!(changed.status, 200, "{}", changed.body);
    assert_eq!(changed.body["creds_file"], creds.display().to_string());
    // Less than a lease (30 s): a failing attempt of the old settings still in flight when
    // the PATCH lands cannot open the breaker again, and a probe given back untried is due
    // at once (tests/api/breaker_fence.rs); what is left is a backoff (at most 400 ms).
    until_published(&app, 3, Duration::from_secs(20)).await;
    let messages = stored(&js, &name).await;
    assert_eq!(messages.len(), 3);
    assert_eq!(distinct_ids(&messages).len(), 3);
    app.stop().await;
}

/// A `creds_file` that does not read as one, or on another kind, is refused in the API naming
/// the key, on create and on patch; a good one is shown as its path (no broker needed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_a_bad_creds_file_is_refused_in_the_api_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let (_, creds) = operator_mode(dir.path());
    let not_creds = dir.path().join("operator.conf");
    let creds = creds.display().to_string();
    let app = spawn_app().await;
    let good = json!({"name": "bus", "kind": "nats", "url": "nats://127.0.0.1:4222",
                      "subject": "hooks.{source}", "creds_file": creds});
    for bad in [
        json!("/no/such.creds"),
        json!(dir.path().display().to_string()),
        json!(not_creds.display().to_string()),
        json!(7),
    ] {
        let mut body = good.clone();
        body["creds_file"] = bad;
        assert_names(&create(&app, body).await, "creds_file");
    }
    let on_http = json!({"name": "h", "kind": "http", "url": "http://127.0.0.1:9/in",
                         "creds_file": creds});
    assert_names(&create(&app, on_http).await, "creds_file");
    let made = create(&app, good).await;
    assert_eq!(made.status, 201, "{}", made.body);
    assert_eq!(made.body["creds_file"], creds.as_str());
    let seed = std::fs::read_to_string(&creds).unwrap();
    let seed = seed.lines().find(|l| l.starts_with("SU")).unwrap();
    assert!(!made.body.to_string().contains(seed), "{}", made.body);
    let body = json!({ "creds_file": not_creds.display().to_string() }).to_string();
    assert_names(&patch(&app, "bus", &body).await, "creds_file");
    assert_eq!(
        app.get("/subscriptions/bus").await.body["creds_file"],
        creds.as_str()
    );
    app.stop().await;
}
