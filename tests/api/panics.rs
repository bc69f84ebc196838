//! A handler that panics fails that event with the panic's message, and the worker pool keeps
//! running: the next event is processed as usual (issue 14).

use std::sync::Arc;
use std::time::{Duration, Instant};

use webhook_inbox::domain::DeliveryMode;
use webhook_inbox::handlers::{Handled, Handler, Registry};
use webhook_inbox::startup::BuildOptions;
use webhook_inbox::store::Claimed;

use crate::helpers::{TestApp, spawn_app_with};

/// The real audit handler, except that a body containing `boom` panics.
struct Panicky(Arc<dyn Handler>);

impl Handler for Panicky {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn mode(&self) -> DeliveryMode {
        self.0.mode()
    }
    fn handle(&self, event: &Claimed) -> Handled {
        if String::from_utf8_lossy(&event.payload).contains("boom") {
            panic!("boom in {}", event.claim.event_id);
        }
        self.0.handle(event)
    }
}

async fn wait_terminal(app: &TestApp, id: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let event = app.event("shop", id).await;
        if event["status"] == "completed" || event["status"] == "failed" {
            return event;
        }
        assert!(Instant::now() < deadline, "{id} never finished: {event}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_panicking_handler_fails_its_event_with_the_message_and_the_pool_keeps_running() {
    let options = BuildOptions {
        registry: Some(Box::new(|real: Registry| {
            let audit: Arc<dyn Handler> = Arc::new(Panicky(real.audit().clone()));
            Registry::from_parts(real.loyalty().clone(), audit, real.downstream().clone())
        })),
        ..BuildOptions::default()
    };
    let app = spawn_app_with(|c| *c = c.replace("workers = 0", "workers = 1"), options).await;
    assert_eq!(
        app.deliver("shop", "bad_1", r#"{"type":"note","x":"boom"}"#)
            .await
            .status,
        200
    );
    let failed = wait_terminal(&app, "bad_1").await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(
        failed["attempts"], 1,
        "failed at once, not retried: {failed}"
    );
    let error = failed["last_error"].as_str().unwrap();
    assert!(error.contains("panicked: boom in bad_1"), "{error}");
    // The same worker pool goes on with the next event.
    assert_eq!(
        app.deliver("shop", "good_1", r#"{"type":"note"}"#)
            .await
            .status,
        200
    );
    let done = wait_terminal(&app, "good_1").await;
    assert_eq!(done["status"], "completed", "{done}");
}
