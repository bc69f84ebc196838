//! Secrets shared by real nodes on one PostgreSQL database (SPEC section 13, "One registry").

/// Two nodes with one config, each in its own folder (its own `data/`), on one PostgreSQL
/// database: the signing secret of an `http` subscription that names none and the token of
/// such a `pull` one are made once and shared, so that the user's endpoint verifies either
/// node's calls. Each node keeps the signing secret in its own file too; the token, kept in
/// the database only as a digest, is in the file of the node that made it alone. A rotation
/// through one node is used by the other at once: it shows both signing secrets, and takes the
/// new token and the old. Seen failing before the secrets were kept in the database: each node
/// had its own.
#[test]
fn postgres_two_nodes_with_one_config_share_the_generated_secrets() {
    use crate::process::{ServerProcess, free_port};
    if !crate::pgdb::available() {
        return;
    }
    let db = crate::pgdb::PgDatabase::create();
    let extra = r#"
[[subscriptions]]
name = "billing"
kind = "http"
url = "http://127.0.0.1:9/hooks"

[[subscriptions]]
name = "worker"
kind = "pull"
"#;
    let folders = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut nodes: Vec<ServerProcess> = folders
        .iter()
        .enumerate()
        .map(|(i, dir)| {
            let port = free_port();
            let config =
                crate::nodes::node_config(dir.path(), &format!("n{i}"), port, &db.url, extra);
            ServerProcess::start(dir.path(), &config, port, &format!("n{i}.log"))
        })
        .collect();
    let kept = |file: &str| -> Vec<Option<String>> {
        folders
            .iter()
            .map(|dir| std::fs::read_to_string(dir.path().join("data").join(file)).ok())
            .collect()
    };
    let secrets = kept("subscription-billing-secret");
    assert!(secrets[0].as_ref().is_some_and(|s| !s.trim().is_empty()));
    assert_eq!(secrets[0], secrets[1], "each node made its own");
    let tokens = kept("subscription-worker-token");
    assert!(tokens[0].is_some() && tokens[1].is_none(), "{tokens:?}");
    let old_token = tokens[0].clone().unwrap().trim().to_string();
    assert_eq!(
        db.count("SELECT count(*) FROM subscription_secrets"),
        3,
        "one of each, and the claims key, in the database"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM subscription_secrets WHERE value LIKE 'sha256:%'"),
        1,
        "the token as its digest"
    );
    let client = reqwest::blocking::Client::new();
    let rotated = |node: &ServerProcess, name: &str| -> serde_json::Value {
        let r = client
            .post(format!("{}/subscriptions/{name}/rotate-secret", node.base))
            .bearer_auth(crate::helpers::ADMIN_TOKEN)
            .json(&serde_json::json!({ "grace_seconds": 600 }))
            .send()
            .unwrap();
        assert_eq!(r.status(), 200);
        r.json().unwrap()
    };
    let new_secret = rotated(&nodes[0], "billing")["signing_secret"]
        .as_str()
        .unwrap()
        .to_string();
    let shown: serde_json::Value = client
        .get(format!("{}/subscriptions/billing/secret", nodes[1].base))
        .bearer_auth(crate::helpers::ADMIN_TOKEN)
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(
        shown["signing_secrets"],
        serde_json::json!([new_secret, secrets[0].clone().unwrap().trim()]),
        "the other node signs with both"
    );
    let new_token = rotated(&nodes[0], "worker")["token"]
        .as_str()
        .unwrap()
        .to_string();
    for token in [&new_token, &old_token] {
        let r = client
            .post(format!("{}/subscriptions/worker/claim", nodes[1].base))
            .bearer_auth(token)
            .json(&serde_json::json!({}))
            .send()
            .unwrap();
        assert_eq!(r.status(), 200, "the other node takes both tokens");
    }
    for node in &mut nodes {
        node.terminate(std::time::Duration::from_secs(20));
    }
}
