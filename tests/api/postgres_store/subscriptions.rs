//! A subscription dropped from the config while another node, still on the old config, fans
//! events out to it or backfills it. `sync` deletes a subscription that has no state rows; a
//! writer giving it its first rows at that moment must either be seen by the delete (which
//! then only marks it removed) or see it (and write nothing). The foreign key that made the
//! loser fail is gone (migration 0006), so the locks are what hold it; the assertion is that
//! no state row is left without its subscription.

use std::sync::Barrier;

use webhook_inbox::domain::time::now_ms;
use webhook_inbox::store::{Lane, NewDelivery, Store};
use webhook_inbox::subscriptions::{Kind, Route, Subscription};

use super::fresh::FreshDb;
use crate::helpers::{new_delivery, test_subscription as subscription};

#[derive(Clone, Copy, Debug)]
enum Writer {
    /// A claim whose fan-out gives the new subscription its first rows.
    FanOut,
    /// A backfill of the events stored before it was added.
    Backfill,
    /// Submitted requests, whose state rows are written with them (a `downstream`
    /// subscription takes them).
    Submission,
}

/// Per round: node A syncs a config that adds `late-N`, then node A's writer and node B's
/// sync of a config without `late-N` are released together. Seen failing (rows without their
/// subscription within the first rounds) with the sync's locks removed (both writers), with
/// the backfill's lock removed, and with the backfill's check that the subscription is still
/// there removed; with submissions, with the sync's ingest lock removed.
fn race(writer: Writer) {
    let Some(db) = FreshDb::create() else { return };
    let (a, b) = (db.migrated(), db.node());
    const EVENTS: usize = 150;
    const ROUNDS: usize = 40;
    let base = subscription("base", Kind::Audit);
    a.sync_subscriptions(std::slice::from_ref(&base), now_ms())
        .unwrap();
    let mut stored = 0;
    let mut store_events = |n: usize, lane: Lane| {
        let source = if lane == Lane::CallOut {
            "requests"
        } else {
            "shop"
        };
        let batch: Vec<_> = (stored..stored + n)
            .map(|i| NewDelivery {
                lane,
                ..new_delivery(source, &format!("e-{i}"), "audit.thing", "{}")
            })
            .collect();
        stored += n;
        a.insert_deliveries(&batch).unwrap();
    };
    if let Writer::Backfill = writer {
        // Behind the cursor before any `late-N` is added: what a backfill hands out.
        store_events(EVENTS, Lane::InProcess);
        let fanned = a
            .claim("w", Lane::InProcess, EVENTS, 600_000, now_ms())
            .unwrap();
        assert_eq!(fanned.len(), EVENTS);
    }
    let (mut deleted, mut kept) = (0, 0);
    for round in 0..ROUNDS {
        let late = match writer {
            Writer::Submission => Subscription {
                // As the config gives a `downstream` without `sources`.
                route: Route {
                    sources: Some(vec!["requests".into()]),
                    ..Route::default()
                },
                ..subscription(&format!("late-{round}"), Kind::Downstream)
            },
            _ => subscription(&format!("late-{round}"), Kind::Audit),
        };
        a.sync_subscriptions(&[base.clone(), late.clone()], now_ms())
            .unwrap();
        // Node A reads the new config's subscriptions now, as a serving node has before it
        // claims or backfills (else a sync that won the race would leave it nothing to write).
        let live = a.subscription_ids().unwrap();
        assert!(live.iter().any(|(_, name)| *name == late.name));
        if let Writer::FanOut = writer {
            store_events(EVENTS, Lane::InProcess);
        }
        let barrier = Barrier::new(2);
        std::thread::scope(|s| {
            let writing = s.spawn(|| {
                barrier.wait();
                match writer {
                    Writer::FanOut => {
                        a.claim("w", Lane::InProcess, 2 * EVENTS, 600_000, now_ms())
                            .unwrap();
                    }
                    Writer::Backfill => {
                        a.backfill(&late.name, 0, now_ms()).unwrap().unwrap();
                    }
                    Writer::Submission => store_events(EVENTS, Lane::CallOut),
                }
            });
            let syncing = s.spawn(|| {
                barrier.wait();
                b.sync_subscriptions(std::slice::from_ref(&base), now_ms())
                    .unwrap();
            });
            writing.join().unwrap();
            syncing.join().unwrap();
        });
        let url = db.url.clone();
        let orphans = std::thread::spawn(move || crate::pgdb::orphans(&url).unwrap())
            .join()
            .unwrap();
        assert_eq!(
            orphans, 0,
            "{writer:?}, round {round}: state rows left without their subscription"
        );
        let rows = db.scalar(&format!(
            "SELECT count(*) FROM event_state s JOIN subscriptions u ON u.id = s.sub
              WHERE u.name = '{}'",
            late.name
        ));
        match db.scalar(&format!(
            "SELECT count(*) FROM subscriptions WHERE name = '{}'",
            late.name
        )) {
            // Deleted before the writer read the subscriptions: it wrote nothing.
            0 => deleted += 1,
            // The writer first: every row it wrote is there, under a removed subscription.
            _ => {
                assert_eq!(rows as usize, EVENTS, "{writer:?}, round {round}");
                kept += 1;
            }
        }
    }
    eprintln!("{writer:?}: {deleted} rounds the sync deleted first, {kept} the writer wrote first");
}

#[test]
fn postgres_a_subscription_dropped_while_another_node_fans_out_to_it_leaves_no_rows_behind() {
    race(Writer::FanOut);
}

#[test]
fn postgres_a_subscription_dropped_while_another_node_backfills_it_leaves_no_rows_behind() {
    race(Writer::Backfill);
}

#[test]
fn postgres_a_subscription_dropped_while_another_node_stores_requests_for_it_leaves_no_rows_behind()
{
    race(Writer::Submission);
}
