//! Subscriptions' secrets in the stores and at rest (SPEC section 13): the store's rotation
//! on both stores, PostgreSQL's migration of plain tokens, and secrets sealed under the nodes'
//! key.

use std::path::Path;

use webhook_inbox::domain::time::now_ms;
use webhook_inbox::startup::BuildOptions;
use webhook_inbox::store::secrets::{Purpose, Rotation};

use crate::helpers::*;
use crate::secrets::{database_bytes, holds, signing_secrets};
use crate::stores::{StoreKind, TestDb};

crate::stores::store_tests!(
    a_rotation_keeps_the_old_secret_for_its_grace_only,
    rotations_at_once_leave_one_current_secret
);

/// The store's rotation, on both stores: the new secret is current, the old one is listed
/// until its grace ends and is dropped by the heartbeat after; a config's secret is not
/// rotated; the registry's version moves, so that every node reads the secrets again.
fn a_rotation_keeps_the_old_secret_for_its_grace_only(kind: StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::create(kind, dir.path());
    let (a, b) = (db.open_store(), db.open_store());
    let t0 = now_ms();
    let kept = a
        .keep_secret("billing", Purpose::Signing, "whsec_old", t0)
        .unwrap();
    assert_eq!(kept.value, "whsec_old");
    let again = b
        .keep_secret("billing", Purpose::Signing, "whsec_other", t0)
        .unwrap();
    assert_eq!(again.value, "whsec_old", "the first kept is everyone's");
    let version = |s: &std::sync::Arc<dyn webhook_inbox::store::Store>| {
        s.registry().unwrap();
        s.registry_version_seen().unwrap()
    };
    let before = version(&b);
    let rotated = a
        .rotate_secret("billing", Purpose::Signing, "whsec_new", 10_000, t0)
        .unwrap();
    assert_eq!(
        rotated,
        Rotation::Rotated {
            previous_until: t0 + 10_000
        }
    );
    assert!(
        version(&b) > before,
        "the rotation moved the registry's version"
    );
    let values = |at: i64| -> Vec<String> {
        b.subscription_secrets("billing", at)
            .unwrap()
            .into_iter()
            .map(|s| s.value)
            .collect()
    };
    assert_eq!(values(t0 + 9_999), ["whsec_new", "whsec_old"]);
    assert_eq!(values(t0 + 10_000), ["whsec_new"]);
    assert_eq!(db.count("SELECT count(*) FROM subscription_secrets"), 2);
    b.prune_subscriptions(t0 + 10_000, 0).unwrap();
    assert_eq!(
        db.count("SELECT count(*) FROM subscription_secrets"),
        1,
        "the heartbeat dropped the expired one"
    );
    a.put_config_secrets("ledger", Purpose::Signing, &["whsec_cfg".into()], t0)
        .unwrap();
    assert_eq!(
        a.rotate_secret("ledger", Purpose::Signing, "whsec_x", 0, t0)
            .unwrap(),
        Rotation::HeldByConfig
    );
    assert_eq!(
        a.rotate_secret("nothing", Purpose::Token, "sha256:00", 0, t0)
            .unwrap(),
        Rotation::NoSecret
    );
}

/// Nodes rotating one secret at once, released together: each rotation ends one current
/// secret's life and adds the next, so one secret is current after them all and none fails
/// (PostgreSQL locks the current row, `Dialect::lock`; a rotation that waited on it finds it
/// no longer current and answers `NoSecret`). Seen failing on PostgreSQL with the lock left
/// out: two rotations read one current row, and the second new one broke the unique key.
fn rotations_at_once_leave_one_current_secret(kind: StoreKind) {
    const NODES: usize = 6;
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::create(kind, dir.path());
    let stores: Vec<_> = (0..NODES).map(|_| db.open_store()).collect();
    let t0 = now_ms();
    stores[0]
        .keep_secret("billing", Purpose::Signing, "whsec_0", t0)
        .unwrap();
    let barrier = std::sync::Barrier::new(NODES);
    let rotated = std::thread::scope(|s| {
        let runs: Vec<_> = stores
            .iter()
            .enumerate()
            .map(|(i, store)| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let value = format!("whsec_{}", i + 1);
                    store.rotate_secret("billing", Purpose::Signing, &value, 60_000, t0)
                })
            })
            .collect();
        runs.into_iter()
            .map(|r| r.join().unwrap().expect("a rotation fails nothing"))
            .filter(|r| matches!(r, Rotation::Rotated { .. }))
            .count()
    });
    assert!(rotated >= 1);
    let current = "SELECT count(*) FROM subscription_secrets WHERE expires_at IS NULL";
    assert_eq!(db.count(current), 1);
    assert_eq!(
        db.count("SELECT count(*) FROM subscription_secrets"),
        1 + rotated as i64,
        "each rotation added one secret"
    );
}

/// With `secrets_key`, the signing secret is sealed in the database (the file read directly
/// holds no trace of it) and shown whole to an admin. A node started on that database with
/// another key, or none, refuses to start and says why; it never makes a new secret in its
/// place (the same one is shown once the right key is back). Seen failing with the sealer
/// left out of the kept form (no sealed value in the table).
#[tokio::test]
async fn a_sealed_secret_needs_the_nodes_key() {
    use base64::Engine as _;
    let b64 = |byte: u8| base64::engine::general_purpose::STANDARD.encode([byte; 32]);
    let with_key = |key: Option<String>| {
        move |c: &mut String| {
            if let Some(key) = key {
                *c = format!("secrets_key = \"{key}\"\n{c}");
            }
            c.push_str(
                "\n[[subscriptions]]\nname = \"billing\"\nkind = \"http\"\n\
                 url = \"http://127.0.0.1:9/hooks\"\n",
            );
        }
    };
    let app = spawn_app_with(with_key(Some(b64(1))), BuildOptions::default()).await;
    let shown = signing_secrets(&app, "billing").await;
    assert_eq!(shown.len(), 1);
    assert_eq!(
        app.count("SELECT count(*) FROM subscription_secrets WHERE value LIKE 'sealed1:%'"),
        1
    );
    let bare = shown[0].trim_start_matches("whsec_").to_string();
    assert!(!holds(&database_bytes(app.dir.path(), "inbox.db"), &bare));
    let dir = app.stop().await;
    for (key, says) in [(Some(b64(2)), "not the key"), (None, "no secrets key")] {
        let mut config = test_config(&dir);
        with_key(key)(&mut config);
        let settings =
            webhook_inbox::config::Settings::from_toml(&config, "test", Vec::new()).unwrap();
        let refused = webhook_inbox::startup::Application::build(settings, BuildOptions::default());
        let error = format!(
            "{:#}",
            refused.err().expect("a node without the key starts")
        );
        assert!(error.contains(says), "{error}");
        assert!(
            !error.contains(&bare),
            "the error shows the secret: {error}"
        );
    }
    let mut config = test_config(&dir);
    with_key(Some(b64(1)))(&mut config);
    let again = spawn_in(dir, &config, BuildOptions::default()).await;
    assert_eq!(
        signing_secrets(&again, "billing").await,
        shown,
        "no new secret was made"
    );
    again.stop().await;
}

/// PostgreSQL's migration 0009 on a database whose pull token was kept plain (0007): the token
/// becomes its digest, with the claims key earlier versions derived from it (computed in SQL
/// there: checked against the Rust definitions).
#[test]
fn postgres_a_plain_token_becomes_its_digest() {
    use webhook_inbox::store::secrets::{claims_key_of, token_digest};
    if !crate::pgdb::available() {
        return;
    }
    let db = crate::pgdb::PgDatabase::create();
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/postgres");
    let mut files: Vec<String> = std::fs::read_dir(&folder)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    let mut sql = String::from(
        "CREATE TABLE schema_migrations (version integer NOT NULL PRIMARY KEY, \
         name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());",
    );
    for file in files.iter().filter(|f| f.as_str() < "0009") {
        let version: i32 = file[..4].parse().unwrap();
        let name = file[5..].trim_end_matches(".sql");
        sql.push_str(&std::fs::read_to_string(folder.join(file)).unwrap());
        sql.push_str(&format!(
            ";\nINSERT INTO schema_migrations (version, name) VALUES ({version}, '{name}');\n"
        ));
    }
    db.execute(&sql);
    db.execute(
        "INSERT INTO subscription_secrets (name, purpose, value, created_at)
         VALUES ('worker', 'token', 'plain-token-0123456789', 5)",
    );
    let store =
        webhook_inbox::store::open(&webhook_inbox::config::Database::Postgres(db.url.clone()))
            .unwrap();
    assert!(store.migrate().unwrap().contains(&9));
    let count = |purpose: &str, value: &str| {
        db.count(&format!(
            "SELECT count(*) FROM subscription_secrets
              WHERE name = 'worker' AND purpose = '{purpose}' AND value = '{value}'
                AND expires_at IS NULL"
        ))
    };
    assert_eq!(count("token", &token_digest("plain-token-0123456789")), 1);
    assert_eq!(
        count(
            "claims",
            &hex::encode(claims_key_of("plain-token-0123456789"))
        ),
        1
    );
    assert_eq!(
        db.count("SELECT count(*) FROM subscription_secrets WHERE value LIKE '%plain-token%'"),
        0
    );
}
