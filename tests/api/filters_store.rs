//! Filters compiled into the fan-out (issue 61), on both stores: for a corpus of filters ×
//! bodies, the states the store's fan-out gives are exactly the ones the filter's Rust
//! evaluator (`Filter::matches`, the preview's) says, including bodies that are not JSON,
//! missing fields, `1000` against `1000.0` against `"1000"`, and hostile keys and values that
//! would break a statement built by pasting them in.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use webhook_inbox::domain::time::now_ms;
use webhook_inbox::store::{EventFilter, Lane, NewDelivery, Page, Status};
use webhook_inbox::subscriptions::filter::Filter;
use webhook_inbox::subscriptions::{Kind, Route, Subscription};

use crate::helpers::*;

crate::stores::store_tests!(
    the_fan_out_takes_what_the_evaluator_says,
    a_backfill_takes_what_the_filter_takes
);

/// Filters over the fields of [`bodies`]; each becomes a subscription `f{i}`.
fn filters() -> Vec<Value> {
    let hostile = "x'); DROP TABLE event_log; --";
    vec![
        json!({"path": "/amount", "eq": 1000}),
        json!({"path": "/amount", "eq": 1000.0}),
        json!({"path": "/amount", "eq": "1000"}),
        json!({"path": "/amount", "ne": 1000}),
        json!({"path": "/amount", "gte": 1000}),
        json!({"path": "/amount", "gt": 999.5, "lt": 5000}),
        json!({"path": "/amount", "lte": -1}),
        json!({"path": "/amount", "in": [1, "1000", 2.5]}),
        json!({"path": "/amount", "nin": [1000, 7]}),
        json!({"path": "/amount", "exists": true}),
        json!({"path": "/amount", "exists": false}),
        json!({"not": {"path": "/amount", "eq": 1000}}),
        json!({"path": "/currency", "eq": "usd"}),
        json!({"path": "/currency", "gt": "eur"}),
        json!({"path": "/currency", "lt": "é"}),
        json!({"path": "/currency", "prefix": "us"}),
        json!({"path": "/currency", "in": ["usd", "eur"]}),
        json!({"path": "/live", "eq": true}),
        json!({"path": "/live", "ne": false}),
        json!({"path": "/data/object/currency", "eq": "usd"}),
        json!({"all": [{"path": "/data/object/currency", "eq": "usd"},
                       {"path": "/data/object/amount", "gte": 1000}]}),
        json!({"any": [{"path": "/currency", "eq": "usd"}, {"not": {"path": "/live", "exists": true}}]}),
        json!({"path": "/data/object", "exists": true}),
        json!({"path": "/data/object", "eq": "{\"amount\":1}"}),
        json!({"path": "/it's", "eq": hostile}),
        json!({"path": "/back\\slash", "eq": "a\\b"}),
        json!({"path": "/dots.and[brackets]$", "eq": 1}),
        json!({"path": "/a~1b/c~0d", "eq": "slash"}),
        json!({"path": "/note", "eq": "a'b\"c\\d\ne"}),
        json!({"path": "/note", "prefix": "ü"}),
        json!({"not": {"any": [{"path": "/amount", "gte": 1000}, {"path": "/currency", "exists": true}]}}),
    ]
}

/// Bodies as stored.
fn bodies() -> Vec<String> {
    let hostile = "x'); DROP TABLE event_log; --";
    let mut out: Vec<String> = [
        json!({"amount": 1000, "currency": "usd", "live": true}),
        json!({"amount": 1000.0, "currency": "eur", "live": false}),
        json!({"amount": "1000", "currency": "USD"}),
        json!({"amount": 2500.75, "currency": "us"}),
        json!({"amount": -3, "currency": "é"}),
        json!({"amount": null, "live": "true"}),
        json!({"amount": [1000], "currency": ["usd"]}),
        json!({"amount": {"v": 1000}, "currency": {"usd": 1}}),
        json!({"amount": 1, "currency": "ü", "note": "üx"}),
        json!({"amount": 7}),
        json!({"data": {"object": {"currency": "usd", "amount": 1000}}}),
        json!({"data": {"object": {"currency": "usd", "amount": 999}}}),
        json!({"data": {"object": {"amount": 1}}}),
        json!({"data": {"object": "flat"}}),
        json!({"data": [{"object": {"currency": "usd"}}]}),
        json!({"it's": hostile, "back\\slash": "a\\b"}),
        json!({"dots.and[brackets]$": 1, "a/b": {"c~d": "slash"}}),
        json!({"note": "a'b\"c\\d\ne"}),
        json!([{"amount": 1000}]),
        json!("usd"),
        json!(1000),
        json!({}),
    ]
    .iter()
    .map(Value::to_string)
    .collect();
    out.extend(
        [
            "amount=1000&currency=usd",
            "{\"amount\": 1000,",
            "",
            "{\"amount\": 1e3, \"currency\": \"\\u0075sd\"}",
            "  {\"amount\" : 1000 }  ",
        ]
        .map(String::from),
    );
    out
}

fn subscription(i: usize, filter: &Value) -> Subscription {
    Subscription {
        route: Route {
            sources: Some(vec!["shop".into()]),
            ..Route::default()
        },
        filter: Some(Filter::parse(filter).expect("a corpus filter compiles")),
        ..test_subscription(&format!("f{i}"), Kind::Pull)
    }
}

/// Fan out everything stored (pull subscriptions' states start pending: nothing is claimed).
fn fan_out_all(h: &Harness) {
    for _ in 0..20 {
        h.store
            .claim("fan", Lane::InProcess, 500, 30_000, now_ms())
            .unwrap();
    }
}

fn taken_by(h: &Harness, id: &str) -> BTreeSet<String> {
    h.detail("shop", id)
        .event
        .subscriptions
        .iter()
        .map(|s| s.name.clone())
        .collect()
}

fn the_fan_out_takes_what_the_evaluator_says(kind: crate::stores::StoreKind) {
    let h = Harness::on(kind, 5, 30);
    let filters = filters();
    let subs: Vec<Subscription> = filters
        .iter()
        .enumerate()
        .map(|(i, f)| subscription(i, f))
        .collect();
    // One subscription without a filter, beside them: it takes every event.
    let mut all = subs.clone();
    all.push(test_subscription("everything", Kind::Pull));
    all[filters.len()].route.sources = Some(vec!["shop".into()]);
    // Two that share a filter of the corpus with `f{TWIN}` (the fan-out tests a filter once per
    // event for all the subscriptions that have it): one with its route, one whose route
    // takes nothing here.
    const TWIN: usize = 20;
    let twin = Subscription {
        name: "twin".into(),
        ..subs[TWIN].clone()
    };
    let mut elsewhere = Subscription {
        name: "twin-elsewhere".into(),
        ..subs[TWIN].clone()
    };
    elsewhere.route.sources = Some(vec!["elsewhere".into()]);
    all.extend([twin, elsewhere]);
    h.store.sync_subscriptions(&all, now_ms()).unwrap();
    // Not here: JSON text with bytes that are not UTF-8 inside a string, which SQLite's
    // `json_valid` takes and PostgreSQL and Rust refuse (docs/guides/subscriptions.md).
    let payloads: Vec<Vec<u8>> = bodies().into_iter().map(String::into_bytes).collect();
    let batch: Vec<NewDelivery> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| NewDelivery {
            payload: p.clone(),
            sha256: {
                use sha2::Digest;
                sha2::Sha256::digest(p).into()
            },
            ..new_delivery("shop", &format!("b{i}"), "thing.done", "")
        })
        .collect();
    h.store.insert_deliveries(&batch).unwrap();
    // Before the fan-out, each subscription's pending list (`GET /events?subscription=f{i}&
    // status=pending`) holds the events its filter will take, and no other. Seen failing (both
    // stores) with the list's filter left out: every event its route takes was listed.
    let mut wrong = Vec::new();
    for (i, sub) in subs.iter().enumerate() {
        let listed: BTreeSet<String> = h
            .store
            .list_events(
                &EventFilter {
                    subscription: Some(sub.name.clone()),
                    status: Some(Status::Pending),
                    ..EventFilter::default()
                },
                Page {
                    limit: 1000,
                    before_seq: None,
                },
            )
            .unwrap()
            .into_iter()
            .map(|e| e.event_id)
            .collect();
        let expected: BTreeSet<String> = payloads
            .iter()
            .enumerate()
            .filter(|(_, p)| sub.filter.as_ref().unwrap().matches(p))
            .map(|(b, _)| format!("b{b}"))
            .collect();
        if listed != expected {
            wrong.push(format!(
                "filter {}: pending lists {listed:?}, Rust takes {expected:?}",
                filters[i]
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    fan_out_all(&h);
    let mut taken = 0;
    let mut left_out = vec![0u64; filters.len()];
    for (b, payload) in payloads.iter().enumerate() {
        let got = taken_by(&h, &format!("b{b}"));
        assert!(
            got.contains("everything"),
            "b{b}: the unfiltered one takes it"
        );
        assert_eq!(
            got.contains("twin"),
            got.contains(&format!("f{TWIN}")),
            "b{b}: a subscription takes what another with its filter and route takes"
        );
        assert!(!got.contains("twin-elsewhere"), "b{b}: its route says no");
        for (i, (f, sub)) in filters.iter().zip(&subs).enumerate() {
            let expected = sub.filter.as_ref().unwrap().matches(payload);
            taken += usize::from(expected);
            left_out[i] += u64::from(!expected);
            if got.contains(&format!("f{i}")) != expected {
                wrong.push(format!(
                    "filter {f} on body {}: the store says {}, Rust {expected}",
                    String::from_utf8_lossy(payload),
                    !expected
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} disagreements:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    // The corpus is not trivially all-or-nothing.
    assert!(
        taken > 60 && taken < filters.len() * payloads.len() / 2,
        "{taken}"
    );
    // Each event left out by a filter has no state row of that subscription, and is counted
    // (`webhook_inbox_filtered_out_total`).
    let rows = h.count("SELECT count(*) FROM event_state");
    let twins = payloads.len() as u64 - left_out[TWIN];
    assert_eq!(rows as usize, taken + payloads.len() + twins as usize);
    let mut expected: Vec<(String, u64)> = left_out
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(i, n)| (format!("f{i}"), *n))
        .chain([("twin".to_string(), left_out[TWIN])])
        .collect();
    expected.sort();
    assert_eq!(h.store.filtered_out(), expected);
}

/// A backfill hands a filtered subscription only the older events its filter takes.
fn a_backfill_takes_what_the_filter_takes(kind: crate::stores::StoreKind) {
    let h = Harness::on(kind, 5, 30);
    let base = Subscription {
        route: Route {
            sources: Some(vec!["shop".into()]),
            ..Route::default()
        },
        ..test_subscription("base", Kind::Pull)
    };
    h.store
        .sync_subscriptions(std::slice::from_ref(&base), now_ms())
        .unwrap();
    let since = now_ms() - 1000;
    let bodies = [
        json!({"data": {"object": {"currency": "usd", "amount": 1000}}}),
        json!({"data": {"object": {"currency": "usd", "amount": 10}}}),
        json!({"data": {"object": {"currency": "eur", "amount": 5000}}}),
    ];
    let deliveries: Vec<(&str, String, &str, String)> = bodies
        .iter()
        .enumerate()
        .map(|(i, b)| ("shop", format!("old-{i}"), "charge.done", b.to_string()))
        .collect();
    let refs: Vec<_> = deliveries
        .iter()
        .map(|(s, id, t, b)| (*s, id.as_str(), *t, b.clone()))
        .collect();
    h.insert(&refs);
    fan_out_all(&h);
    let filter = json!({"all": [{"path": "/data/object/currency", "eq": "usd"},
                                {"path": "/data/object/amount", "gte": 1000}]});
    let late = subscription(0, &filter);
    h.store.sync_subscriptions(&[base, late], now_ms()).unwrap();
    let handed = h.store.backfill("f0", since, now_ms()).unwrap();
    assert_eq!(handed, Some(1));
    assert!(taken_by(&h, "old-0").contains("f0"));
    assert!(!taken_by(&h, "old-1").contains("f0"));
    assert!(!taken_by(&h, "old-2").contains("f0"));
}
