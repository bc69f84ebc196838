//! Changes of one subscription through the API, at the store (both stores, a real SQLite file
//! or a PostgreSQL database, two stores opened on it as two nodes): two `PATCH`es released at
//! once leave the subscription as one of them after the other, never a mix and never one of
//! them lost; and a config that names an api-made subscription leaves it as the API wrote it.

use std::sync::{Arc, Barrier};

use serde_json::{Map, Value, json};
use webhook_inbox::config::ConsumerSettings;
use webhook_inbox::domain::DeliveryMode;
use webhook_inbox::domain::time::now_ms;
use webhook_inbox::store::Store;
use webhook_inbox::store::registry::{Created, Updated};
use webhook_inbox::subscriptions::{HttpSettings, SubscriptionSettings, patched, validate};

use crate::stores::{StoreKind, TestDb};

crate::stores::store_tests!(
    concurrent_patches_of_one_subscription_apply_one_after_the_other,
    a_config_naming_an_api_made_subscription_leaves_it_as_the_api_wrote_it,
);

fn object(value: Value) -> Map<String, Value> {
    value.as_object().unwrap().clone()
}

fn create(store: &Arc<dyn Store>, body: Value) {
    let fields: SubscriptionSettings = serde_json::from_value(body).unwrap();
    let mut sub = validate(
        &fields,
        &ConsumerSettings::default(),
        DeliveryMode::AtMostOnce,
    )
    .unwrap();
    if let Some(target) = sub.http.as_mut() {
        target
            .signing_secrets
            .push(webhook_inbox::signature::Secret::new(
                crate::helpers::SW_SECRET,
            ));
    }
    assert!(matches!(
        store
            .create_subscription(&sub, &[], "api", now_ms())
            .unwrap(),
        Created::Created(_)
    ));
}

/// Lay `patch` over `hooks` as `PATCH` does, `slow` ms into it (a check that takes a while: a
/// CA file read, a busy machine), so that the other change has time to run meanwhile.
fn patch(store: &Arc<dyn Store>, patch: Map<String, Value>, slow: u64) {
    let change = |current: &webhook_inbox::subscriptions::Subscription| {
        std::thread::sleep(std::time::Duration::from_millis(slow));
        patched(
            current,
            &patch,
            &ConsumerSettings::default(),
            DeliveryMode::AtMostOnce,
        )
    };
    let updated = store.update_subscription("hooks", &change).unwrap();
    assert!(matches!(updated, Updated::Updated(_)), "{updated:?}");
}

fn settings_of(store: &Arc<dyn Store>) -> HttpSettings {
    let live = store.registry().unwrap();
    let hooks = live.iter().find(|l| l.name == "hooks").unwrap();
    hooks.settings.clone().unwrap()
}

/// Seen failing with the read of the subscription moved out of the writing transaction (on
/// SQLite, `registry::update` reading through `self.routes()` before `registry_write`): one of
/// the two changes was lost in most rounds (`concurrency` back to 1, or `rate_per_second` to 0).
fn concurrent_patches_of_one_subscription_apply_one_after_the_other(kind: StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::create(kind, dir.path());
    let (a, b) = (db.open_store(), db.open_store());
    create(
        &a,
        json!({"name": "hooks", "kind": "http", "url": "http://127.0.0.1:9/in"}),
    );
    for round in 0..8 {
        patch(
            &a,
            object(json!({"timeout_ms": 1000, "concurrency": 1, "rate_per_second": 0})),
            0,
        );
        let barrier = Arc::new(Barrier::new(2));
        let changes = [
            (
                Arc::clone(&a),
                json!({"timeout_ms": 2000, "concurrency": 2}),
            ),
            (
                Arc::clone(&b),
                json!({"timeout_ms": 3000, "rate_per_second": 3}),
            ),
        ];
        let threads: Vec<_> = changes
            .into_iter()
            .map(|(store, body)| {
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    barrier.wait();
                    patch(&store, object(body), 30);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let now = settings_of(&b);
        // In either order both changes are whole: each one's own field kept, the shared one
        // from whichever came second.
        assert_eq!(
            (now.concurrency, now.rate_per_second),
            (2, 3),
            "round {round}: a change was lost: {now:?}"
        );
        assert!(
            [2000, 3000].contains(&now.timeout_ms),
            "round {round}: {now:?}"
        );
        assert_eq!(now.url, "http://127.0.0.1:9/in");
    }
}

fn a_config_naming_an_api_made_subscription_leaves_it_as_the_api_wrote_it(kind: StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::create(kind, dir.path());
    let store = db.open_store();
    create(
        &store,
        json!({"name": "hooks", "kind": "http", "url": "http://127.0.0.1:9/api",
               "max_attempts": 9}),
    );
    let fields: SubscriptionSettings = serde_json::from_value(json!({
        "name": "hooks", "kind": "http", "url": "http://127.0.0.1:9/config",
        "max_attempts": 2, "signing_secret": crate::helpers::SW_SECRET
    }))
    .unwrap();
    let from_config = validate(
        &fields,
        &ConsumerSettings::default(),
        DeliveryMode::AtMostOnce,
    )
    .unwrap();
    store
        .node_seen("n", &["hooks".to_string()], now_ms())
        .unwrap();
    store.sync_subscriptions(&[from_config], now_ms()).unwrap();
    assert_eq!(settings_of(&store).url, "http://127.0.0.1:9/api");
    let info = store.subscriptions(false).unwrap();
    let hooks = info.iter().find(|s| s.name == "hooks").unwrap();
    assert_eq!(hooks.origin, "api");
    assert_eq!(hooks.max_attempts, 9);
    assert_eq!(hooks.declared_by, vec!["n".to_string()]);
    // Once the API removes it, the config's declaration applies at the next sync.
    assert_eq!(
        store.remove_subscription("hooks", false, now_ms()).unwrap(),
        Some(0)
    );
    store
        .sync_subscriptions(
            &[validate(
                &fields,
                &ConsumerSettings::default(),
                DeliveryMode::AtMostOnce,
            )
            .unwrap()],
            now_ms(),
        )
        .unwrap();
    assert_eq!(settings_of(&store).url, "http://127.0.0.1:9/config");
    let info = store.subscriptions(false).unwrap();
    assert_eq!(
        info.iter().find(|s| s.name == "hooks").unwrap().origin,
        "config"
    );
}
