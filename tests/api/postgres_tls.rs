//! PostgreSQL over TLS (SPEC section 14): a throwaway cluster of this test's own that takes
//! TCP connections over TLS only, with a certificate for `localhost` made here by a CA of the
//! test's, and every `sslmode` against it: what connects, and what is refused with an error
//! naming the cause.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use webhook_inbox::config::Database;

use crate::https::Pki;

/// Open a store on `url` and migrate: `Ok` when it connected, else the error's text.
fn connect(url: &str) -> Result<(), String> {
    let store = webhook_inbox::store::open(&Database::Postgres(url.to_string()))
        .map_err(|e| format!("{e:#}"))?;
    store.migrate().map(|_| ()).map_err(|e| format!("{e:#}"))
}

#[test]
fn every_sslmode_against_a_server_that_requires_tls() {
    // The cluster comes from the same script as the other PostgreSQL tests'.
    if !crate::pgdb::available() {
        return;
    }
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = pki.issue_for(dir.path(), "postgres", &["localhost"]);
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, pki.ca_pem()).unwrap();
    let other_ca = dir.path().join("other-ca.pem");
    std::fs::write(&other_ca, Pki::new().ca_pem()).unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/with-postgres");
    let mut cluster = Command::new(script)
        .args([
            "sh",
            "-c",
            "echo \"URL=$TEST_POSTGRES_URL\"; cat >/dev/null",
        ])
        .env("WITH_POSTGRES_TLS_CERT", &cert)
        .env("WITH_POSTGRES_TLS_KEY", &key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("scripts/with-postgres");
    let url = BufReader::new(cluster.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("URL=").map(str::to_string))
        .expect("the TLS cluster did not start");
    // postgres://user:password@127.0.0.1:PORT/db
    let by_name = url.replace("@127.0.0.1:", "@localhost:");
    let with = |base: &str, query: &str| format!("{base}?{query}");
    let ca_q = format!("sslrootcert={}", ca.display());
    let other_q = format!("sslrootcert={}", other_ca.display());
    let results = [
        ("require", connect(&with(&url, "sslmode=require"))),
        ("prefer", connect(&with(&url, "sslmode=prefer"))),
        ("no sslmode (prefer)", connect(&url)),
        (
            "verify-full, the right CA and host",
            connect(&with(&by_name, &format!("sslmode=verify-full&{ca_q}"))),
        ),
        (
            "verify-ca, the right CA, another name",
            connect(&with(&url, &format!("sslmode=verify-ca&{ca_q}"))),
        ),
    ];
    for (what, result) in &results {
        assert!(result.is_ok(), "{what}: {result:?}");
    }
    let refused = [
        (
            "verify-full, a wrong CA",
            connect(&with(&by_name, &format!("sslmode=verify-full&{other_q}"))),
            // Another CA of the same name: its signature does not check (else UnknownIssuer).
            "invalid peer certificate",
        ),
        (
            "verify-full, a wrong host name",
            connect(&with(&url, &format!("sslmode=verify-full&{ca_q}"))),
            "certificate not valid for name",
        ),
        (
            "require with sslrootcert checks the CA (libpq)",
            connect(&with(&by_name, &format!("sslmode=require&{other_q}"))),
            "invalid peer certificate",
        ),
        (
            "disable, against a server that requires TLS",
            connect(&with(&url, "sslmode=disable")),
            "no encryption",
        ),
        (
            "an sslrootcert that does not exist",
            connect(&with(&url, "sslmode=verify-ca&sslrootcert=/no/such/ca.pem")),
            "/no/such/ca.pem",
        ),
        (
            "an sslmode libpq does not have",
            connect(&with(&url, "sslmode=always")),
            "sslmode `always`",
        ),
    ];
    for (what, result, cause) in &refused {
        let error = result.as_ref().expect_err(what);
        assert!(
            error.contains(cause),
            "{what}: the error names no cause: {error}"
        );
        let password = url.split(':').nth(2).unwrap().split('@').next().unwrap();
        assert!(
            !error.contains(password),
            "{what}: the password leaked: {error}"
        );
    }
    drop(cluster.stdin.take());
    let _ = cluster.wait();
}
