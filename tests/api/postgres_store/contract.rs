//! The ops side of the PostgreSQL store, one pass over each method the consumers do not use:
//! lists and cursors, counts, export, retries, the purge and its tombstones, requests.

use webhook_inbox::domain::time::now_ms;
use webhook_inbox::store::{
    AddDocument, EventFilter, Finished, InsertOutcome, Lane, NewDocument, Next, Outcome, Page,
    PurgeCutoffs, RetryOutcome, Status, Store, SubmitOutcome,
};

use super::fresh::FreshDb;
use super::{ORDER, finish};
use crate::helpers::new_delivery;

#[test]
fn postgres_ops_reads_retries_purge_and_requests_follow_the_store_contract() {
    let Some(db) = FreshDb::create() else { return };
    let store = db.migrated();
    let batch: Vec<_> = (0..5)
        .map(|i| new_delivery("shop", &format!("e-{i}"), ORDER, "{\"x\":1}"))
        .collect();
    store.insert_deliveries(&batch).unwrap();
    // Pages walk newest first without repeats.
    let first = store
        .list_events(
            &EventFilter::default(),
            Page {
                limit: 3,
                before_seq: None,
            },
        )
        .unwrap();
    let rest = store
        .list_events(
            &EventFilter::default(),
            Page {
                limit: 3,
                before_seq: Some(first[2].seq),
            },
        )
        .unwrap();
    let ids: Vec<_> = first
        .iter()
        .chain(&rest)
        .map(|e| e.event_id.clone())
        .collect();
    assert_eq!(ids, ["e-4", "e-3", "e-2", "e-1", "e-0"]);
    let exported = store
        .export_events(
            &EventFilter::default(),
            Page {
                limit: 10,
                before_seq: None,
            },
        )
        .unwrap();
    assert_eq!(exported[0].payload, b"{\"x\":1}");
    let counts = store.status_counts().unwrap();
    assert_eq!((counts.pending, counts.completed), (5, 0));
    assert!(counts.oldest_due_at.is_some());
    let minutes = store.received_per_minute(now_ms() - 3_600_000).unwrap();
    assert_eq!(minutes.iter().map(|m| m.1).sum::<i64>(), 5);
    // Fail one, complete the others.
    let claimed = store
        .claim("w", Lane::InProcess, 5, 60_000, now_ms())
        .unwrap();
    for c in &claimed {
        let next = if c.claim.event_id == "e-0" {
            Next::Fail {
                error: "bad".into(),
                result: webhook_inbox::store::AttemptResult::PermanentError,
                abandoned: false,
            }
        } else {
            Next::Complete {
                effect: None,
                outcome: Outcome::Logged,
            }
        };
        assert_ne!(finish(store.as_ref(), c, next), Finished::LeaseLost);
    }
    let failed = EventFilter {
        status: Some(Status::Failed),
        ..Default::default()
    };
    assert_eq!(
        store
            .list_events(
                &failed,
                Page {
                    limit: 10,
                    before_seq: None
                }
            )
            .unwrap()
            .len(),
        1
    );
    assert!(matches!(
        store.retry("shop", "e-1", None, false, now_ms()).unwrap(),
        RetryOutcome::NeedsForce(_)
    ));
    assert!(matches!(
        store.retry("shop", "nope", None, false, now_ms()).unwrap(),
        RetryOutcome::NotFound
    ));
    assert_eq!(
        store
            .retry_failed(&EventFilter::default(), now_ms())
            .unwrap(),
        1
    );
    assert!(matches!(
        store.retry("shop", "e-0", None, false, now_ms()).unwrap(),
        RetryOutcome::Unchanged(_)
    ));
    match store.retry("shop", "e-1", None, true, now_ms()).unwrap() {
        RetryOutcome::Retried(e) => assert_eq!(e.status, Status::Pending),
        other => panic!("{other:?}"),
    }
    // Purge the completed ones: tombstones keep the dedup and answer with their fields.
    let cutoffs = PurgeCutoffs {
        completed_before: Some(now_ms() + 60_000),
        failed_before: None,
    };
    let batch_one = store.purge_batch(&cutoffs, 0, 100, now_ms()).unwrap();
    assert_eq!(
        batch_one.purged, 3,
        "e-2, e-3, e-4 (e-0 and e-1 are pending again)"
    );
    let tomb = store.event("shop", "e-2").unwrap().unwrap();
    assert!(tomb.event.purged_at.is_some() && tomb.payload.is_empty() && tomb.history.is_empty());
    assert_eq!(tomb.payload_sha256.len(), 32);
    assert!(matches!(
        store.retry("shop", "e-2", None, true, now_ms()).unwrap(),
        RetryOutcome::Purged(_)
    ));
    assert_eq!(
        store.insert_deliveries(&batch[2..3]).unwrap(),
        [InsertOutcome::Duplicate]
    );
    let lifecycle = store.lifecycle_counts().unwrap();
    assert_eq!(lifecycle.tombstones, 3);
    assert!(lifecycle.database_bytes > 0);
    // Requests: draft, a document, submit once, then no more documents.
    let now = now_ms();
    store.create_request("req-1", now).unwrap();
    let doc = NewDocument {
        id: "d-1".into(),
        name: "a.txt".into(),
        content_type: "text/plain".into(),
        content: b"hello".to_vec(),
    };
    match store.add_document("req-1", &doc, now).unwrap() {
        AddDocument::Added(r) => assert_eq!(r.documents[0].size, 5),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        store.submit_request("req-1", now).unwrap(),
        SubmitOutcome::Queued
    );
    assert_eq!(
        store.submit_request("req-1", now).unwrap(),
        SubmitOutcome::Duplicate
    );
    assert_eq!(
        store.submit_request("nope", now).unwrap(),
        SubmitOutcome::NotFound
    );
    let second = NewDocument {
        id: "d-2".into(),
        ..doc
    };
    assert!(matches!(
        store.add_document("req-1", &second, now).unwrap(),
        AddDocument::Submitted
    ));
    assert!(matches!(
        store.add_document("nope", &second, now).unwrap(),
        AddDocument::NotFound
    ));
    let request = store.request("req-1").unwrap().unwrap();
    assert_eq!(request.event.unwrap().status, Status::Pending);
    assert_eq!(
        store.request_documents("req-1").unwrap()[0].content,
        b"hello"
    );
    let call_out = store
        .claim("c", Lane::CallOut, 1, 60_000, now_ms())
        .unwrap();
    assert_eq!(call_out[0].claim.event_id, "req-1");
    assert_eq!(
        store
            .release(&[call_out[0].claim.clone()], now_ms())
            .unwrap(),
        1
    );
}
