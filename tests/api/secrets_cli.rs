//! `webhook-inbox subscriptions secret|rotate-secret` against a running node.

use webhook_inbox::startup::BuildOptions;

use crate::helpers::*;
use crate::secrets::signing_secrets;

/// The CLI: `subscriptions secret NAME` prints the signing secrets, current first;
/// `subscriptions rotate-secret NAME --grace-seconds N` prints the new one (the grace's end on
/// standard error), and a bad grace is refused naming the field.
#[tokio::test]
async fn the_cli_shows_and_rotates_a_secret() {
    use crate::cli::{cli, stderr, stdout};
    let app = spawn_app_with(
        |c| {
            c.push_str(
                "\n[[subscriptions]]\nname = \"billing\"\nkind = \"http\"\n\
                 url = \"http://127.0.0.1:9/hooks\"\n",
            )
        },
        BuildOptions::default(),
    )
    .await;
    let old = signing_secrets(&app, "billing").await.remove(0);
    let shown = cli(&app, &["subscriptions", "secret", "billing"]).await;
    assert!(shown.status.success(), "{}", stderr(&shown));
    assert_eq!(stdout(&shown).trim(), old);
    let rotated = cli(
        &app,
        &[
            "subscriptions",
            "rotate-secret",
            "billing",
            "--grace-seconds",
            "60",
        ],
    )
    .await;
    assert!(rotated.status.success(), "{}", stderr(&rotated));
    let new = stdout(&rotated).trim().to_string();
    assert!(new.starts_with("whsec_") && new != old);
    assert!(stderr(&rotated).contains("keeps working until"));
    let shown = cli(&app, &["subscriptions", "secret", "billing"]).await;
    assert_eq!(
        stdout(&shown).lines().collect::<Vec<_>>(),
        [new.as_str(), old.as_str()]
    );
    let refused = cli(
        &app,
        &[
            "subscriptions",
            "rotate-secret",
            "billing",
            "--grace-seconds=-5",
        ],
    )
    .await;
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("grace_seconds"),
        "{}",
        stderr(&refused)
    );
    app.stop().await;
}
