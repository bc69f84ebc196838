//! Balances stay 64-bit integers: points per order are bounded, and the database refuses any
//! balance that is not an integer, so `GET /loyalty/{customer}` can always answer.

use webhook_inbox::domain::time::now_ms;
use webhook_inbox::store::Status;

use crate::harness::{Harness, results};
use crate::helpers::*;
use crate::stores::{StoreKind, store_tests};

const ORDER: &str = "order.completed";

/// An order of i64::MAX points used to be credited; the next order of the same customer then
/// overflowed the balance into a REAL and every read of it failed with a 500.
#[tokio::test]
async fn an_order_beyond_the_points_bound_fails_alone_and_the_balance_stays_readable() {
    let app = spawn_app().await;
    let huge = format!(
        r#"{{"type":"order.completed","data":{{"order_id":"o-huge","customer_id":"c-1","points":{}}}}}"#,
        i64::MAX
    );
    assert_eq!(app.deliver("shop", "evt-huge", &huge).await.status, 200);
    let body = order_body("o-2", "c-1", 5);
    assert_eq!(app.deliver("shop", "evt-2", &body).await.status, 200);
    app.drain().await;

    let event = app.event("shop", "evt-huge").await;
    assert_eq!(event["status"], "failed", "{event}");
    assert_eq!(event["history"][0]["result"], "permanent_error");
    let error = event["last_error"].as_str().unwrap();
    assert!(error.contains("from 1 to 1000000000"), "{error}");
    assert_eq!(app.event("shop", "evt-2").await["outcome"], "credited");

    let account = app.get("/loyalty/c-1").await;
    assert_eq!(account.status, 200, "{}", account.body);
    assert_eq!(account.body["balance"], 5);
}

/// The CHECK is the backstop for any path that would still overflow: the credit that would
/// push a balance past i64::MAX is refused by the database, its event fails alone with the
/// reason, and the balance is untouched and readable.
fn a_credit_that_would_overflow_a_balance_is_refused_by_the_database(kind: StoreKind) {
    let h = Harness::on(kind, 5, 30);
    h.insert(&[("shop", "evt-1", ORDER, order_body("o-1", "c-1", 10))]);
    assert_eq!(h.drain(), 1);
    let near_max = i64::MAX - 5;
    h.db.execute(&format!(
        "UPDATE loyalty_balances SET balance = {near_max} WHERE customer_id = 'c-1'"
    ));
    h.insert(&[
        ("shop", "evt-2", ORDER, order_body("o-2", "c-1", 10)),
        ("shop", "evt-3", ORDER, order_body("o-3", "c-2", 7)),
    ]);
    assert_eq!(h.drain(), 2);
    let d = h.detail("shop", "evt-2");
    assert_eq!(d.event.status, Status::Failed);
    assert_eq!(results(&d), ["permanent_error"]);
    // SQLite's CHECK refuses it; PostgreSQL's bigint arithmetic already does.
    let error = d.event.last_error.clone().unwrap().to_lowercase();
    assert!(
        error.contains("check constraint") || error.contains("out of range"),
        "{error}"
    );
    if kind == StoreKind::Postgres {
        // The server's code goes with its message, never a bare "db error".
        assert!(error.contains("(sqlstate 22003)"), "{error}");
    }
    assert_eq!(h.balance("c-1"), near_max, "untouched and still an integer");
    assert_eq!(h.balance("c-2"), 7, "the rest of the batch is credited");
    assert_eq!(
        h.count("SELECT count(*) FROM loyalty_credits WHERE order_id = 'o-2'"),
        0
    );
}

/// Two loyalty subscriptions take the same events, and their handlers share one dedup
/// consumer: finished in one batch, each event is credited by the first of its claims and
/// found already processed by the second, whose row keeps the first's outcome. Seen failing on
/// SQLite with a batch's dedup rows written in one statement that took an event's two rows
/// together: both claims counted as first, the second refused by the order's key and its row
/// rewritten `duplicate_order` (docs/performance.md, "The drain's writer (issue 60, eighth
/// look)").
fn one_event_finished_twice_in_a_batch_by_one_consumer_is_credited_by_the_first(kind: StoreKind) {
    use webhook_inbox::store::{AttemptResult, Effect, Finish, Finished, Lane, Next, Outcome};
    use webhook_inbox::subscriptions::Kind;
    let h = Harness::on(kind, 5, 30);
    let subs = [
        test_subscription("points", Kind::LoyaltyCredit),
        test_subscription("points-too", Kind::LoyaltyCredit),
    ];
    h.store.sync_subscriptions(&subs, now_ms()).unwrap();
    h.insert(&[
        ("shop", "evt-1", ORDER, order_body("o-1", "c-1", 10)),
        ("shop", "evt-2", ORDER, order_body("o-2", "c-1", 5)),
    ]);
    let now = now_ms();
    let mut claimed = h
        .store
        .claim("w", Lane::InProcess, 32, 30_000, now)
        .unwrap();
    assert_eq!(claimed.len(), 4, "{claimed:?}");
    claimed.sort_by_key(|c| (c.claim.seq, c.claim.subscription));
    let items: Vec<Finish> = claimed
        .iter()
        .map(|c| Finish {
            claim: c.claim.clone(),
            next: Next::Complete {
                effect: Some(Effect::LoyaltyCredit {
                    consumer: "loyalty_credit",
                    order_id: format!("o-{}", &c.claim.event_id[4..]),
                    customer_id: "c-1".into(),
                    points: if c.claim.event_id == "evt-1" { 10 } else { 5 },
                }),
                outcome: Outcome::Credited,
            },
        })
        .collect();
    let (first, again) = (
        Finished::Completed {
            outcome: Outcome::Credited,
            result: AttemptResult::Ok,
        },
        Finished::Completed {
            outcome: Outcome::Credited,
            result: AttemptResult::AlreadyProcessed,
        },
    );
    assert_eq!(
        h.store.finish(&items, now).unwrap(),
        [first, again, first, again]
    );
    assert_eq!(h.balance("c-1"), 15);
    assert_eq!(
        h.count("SELECT count(*) FROM processed_events WHERE outcome = 'credited'"),
        2
    );
}

store_tests!(
    a_credit_that_would_overflow_a_balance_is_refused_by_the_database,
    one_event_finished_twice_in_a_batch_by_one_consumer_is_credited_by_the_first,
);

/// On SQLite a customer's credits are listed from a log and an index that the consumers fill
/// from the log once it holds 8,192 credits (migration 0008): after a drain past that, through
/// the real finishing path, the log was moved and every customer's listing still holds each of
/// its credits once, newest first, page after page.
#[test]
fn listings_hold_every_credit_once_after_the_consumers_move_the_log() {
    const EVENTS: usize = 8_600;
    let h = Harness::new(5, 30);
    let ids: Vec<String> = (0..EVENTS).map(|i| format!("evt-{i}")).collect();
    for start in (0..EVENTS).step_by(500) {
        let batch: Vec<(&str, &str, &str, String)> = (start..(start + 500).min(EVENTS))
            .map(|i| {
                let body = order_body(&format!("o-{i}"), &format!("c-{}", i % 5), 1);
                ("shop", ids[i].as_str(), ORDER, body)
            })
            .collect();
        h.insert(&batch);
    }
    assert_eq!(h.drain(), EVENTS);
    let logged = h.count("SELECT count(*) FROM loyalty_unlisted_credits");
    assert!(
        logged < EVENTS as i64 - 8_192,
        "{logged} credits still in the log: the consumers never moved it"
    );
    assert!(h.count("SELECT count(*) FROM loyalty_customer_credits") >= 8_192);
    for customer in 0..5 {
        let customer = format!("c-{customer}");
        let mut seqs = Vec::new();
        let mut before_seq = None;
        loop {
            let page = h
                .store
                .loyalty(
                    &customer,
                    webhook_inbox::store::Page {
                        limit: 400,
                        before_seq,
                    },
                )
                .unwrap();
            let Some(last) = page.credits.last() else {
                break;
            };
            before_seq = Some(last.seq);
            seqs.extend(page.credits.iter().map(|c| c.seq));
        }
        assert_eq!(seqs.len(), EVENTS / 5, "{customer}");
        assert!(
            seqs.windows(2).all(|w| w[0] > w[1]),
            "{customer}: newest first, once each"
        );
        assert_eq!(h.balance(&customer), (EVENTS / 5) as i64);
    }
}
