//! `webhook-inbox subscriptions create|update|delete` against a real server: the flags become
//! the body of the registry's runtime routes, a generated token is printed once, a refused
//! field is named on stderr.

use serde_json::{Value, json};

use crate::cli::{cli, stderr, stdout};
use crate::helpers::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_creates_updates_and_deletes_a_subscription() {
    let app = spawn_app().await;
    let made = cli(
        &app,
        &[
            "subscriptions",
            "create",
            "jobs",
            "--kind",
            "pull",
            "--source",
            "shop",
            "--type",
            "order.*",
            "--max-attempts",
            "6",
        ],
    )
    .await;
    assert!(made.status.success(), "{made:?}");
    let out = stdout(&made);
    assert!(out.contains("jobs: created"), "{out}");
    assert!(
        out.contains("token: "),
        "the generated token is shown once: {out}"
    );
    let shown = app.get("/subscriptions/jobs").await;
    assert_eq!(shown.body["route"]["types"], json!(["order.*"]));
    assert_eq!(shown.body["max_attempts"], 6);
    let updated = cli(
        &app,
        &[
            "subscriptions",
            "update",
            "jobs",
            "--max-attempts",
            "2",
            "--json",
        ],
    )
    .await;
    assert!(updated.status.success(), "{updated:?}");
    let answer: Value = serde_json::from_str(&stdout(&updated)).unwrap();
    assert_eq!(answer["max_attempts"], 2);
    assert_eq!(answer["route"]["types"], json!(["order.*"]));
    let refused = cli(
        &app,
        &["subscriptions", "update", "jobs", "--max-attempts", "0"],
    )
    .await;
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("max_attempts"), "{refused:?}");
    let deleted = cli(&app, &["subscriptions", "delete", "jobs"]).await;
    assert!(deleted.status.success(), "{deleted:?}");
    assert!(stdout(&deleted).contains("jobs: removed"), "{deleted:?}");
    app.get("/subscriptions/jobs")
        .await
        .assert_error(404, "not_found");
}
