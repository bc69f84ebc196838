//! HTTPS without a proxy: a CA and server certificates made here (rcgen), clients that verify
//! the chain (reqwest with rustls, and Python's `requests`), a renewal by SIGHUP under load on
//! the real binary, and key files refused at start.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

use crate::helpers::*;
use crate::process::{ServerProcess, free_port, write_config};

/// A certificate authority of the test's own.
pub(crate) struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    pub(crate) fn new() -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "webhook-inbox test CA");
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        Pki {
            ca: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    pub(crate) fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// A server certificate for `localhost` and 127.0.0.1, signed by the CA, with a key of its
    /// own, written as `name.pem` and `name.key` in `dir`; returns the paths and the DER.
    pub(crate) fn issue(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf, Vec<u8>) {
        self.issue_for(dir, name, &["localhost", "127.0.0.1"])
    }

    /// [`Pki::issue`] for these host names (and addresses) only.
    pub(crate) fn issue_for(
        &self,
        dir: &Path,
        name: &str,
        hosts: &[&str],
    ) -> (PathBuf, PathBuf, Vec<u8>) {
        let key = KeyPair::generate().unwrap();
        let hosts = hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>();
        let mut params = CertificateParams::new(hosts).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.signed_by(&key, &self.ca).unwrap();
        let (cert_path, key_path) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path, cert.der().to_vec())
    }
}

pub(crate) fn tls_lines(cert: &Path, key: &Path) -> String {
    format!(
        "tls_cert = \"{}\"\ntls_key = \"{}\"\n",
        cert.display(),
        key.display()
    )
}

fn trusting(pki: &Pki) -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(pki.ca_pem().as_bytes()).unwrap())
        .tls_info(true)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// POST a signed `shop` delivery; returns the status.
fn send(
    client: &reqwest::blocking::Client,
    base: &str,
    settings: &webhook_inbox::config::Settings,
    id: &str,
) -> reqwest::Result<u16> {
    let body = order_body(&format!("o-{id}"), "c-1", 1);
    let mut req = client
        .post(format!("{base}/webhooks/shop"))
        .header("content-type", "application/json")
        .body(body.clone());
    for (k, v) in sign_for(settings, "shop", id, body.as_bytes()) {
        req = req.header(k, v);
    }
    Ok(req.send()?.status().as_u16())
}

/// SIGHUP to the server, then wait (at most 10 s) until its log says `logged`.
fn hang_up(server: &ServerProcess, logged: &str) {
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &server.pid().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !server.logs().contains(logged) {
        assert!(std::time::Instant::now() < deadline, "{}", server.logs());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The DER of the certificate a new connection is served.
fn served_certificate(client: &reqwest::blocking::Client, base: &str) -> Vec<u8> {
    let r = client.get(format!("{base}/healthz")).send().unwrap();
    r.extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|info| info.peer_certificate())
        .expect("a TLS connection")
        .to_vec()
}

#[test]
fn deliveries_over_https_are_verified_by_rust_and_python_clients() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, der) = pki.issue(dir.path(), "server");
    let port = free_port();
    let (config, settings) =
        write_config(dir.path(), port, &tls_lines(&cert, &key), "workers = 0\n");
    let client = trusting(&pki);
    let server = ServerProcess::start_https(dir.path(), &config, port, "server.log", &client);
    assert!(
        server.logs().contains("scheme=\"https\"") || server.logs().contains("scheme=https"),
        "{}",
        server.logs()
    );
    assert_eq!(send(&client, &server.base, &settings, "rust").unwrap(), 200);
    assert_eq!(served_certificate(&client, &server.base), der);

    // A client that does not trust this CA refuses the chain; plain HTTP gets no answer.
    let stranger = reqwest::blocking::Client::builder()
        .tls_built_in_root_certs(false)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    assert!(send(&stranger, &server.base, &settings, "stranger").is_err());
    let plain = reqwest::blocking::Client::new()
        .get(format!("http://127.0.0.1:{port}/healthz"))
        .timeout(Duration::from_secs(5))
        .send();
    assert!(plain.is_err(), "plain HTTP answered: {plain:?}");

    // Python's `requests`, verifying with the CA file.
    if let Some(python) = python_with_requests() {
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, pki.ca_pem()).unwrap();
        let body = order_body("o-python", "c-1", 1);
        let headers: serde_json::Map<String, serde_json::Value> =
            sign_for(&settings, "shop", "python", body.as_bytes())
                .into_iter()
                .map(|(k, v)| (k, v.into()))
                .collect();
        let out = std::process::Command::new(python)
            .args(["-c", PYTHON_POST])
            .arg(format!("{}/webhooks/shop", server.base))
            .arg(&ca)
            .arg(serde_json::Value::Object(headers).to_string())
            .arg(&body)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(text.trim(), "200 queued");
    }
    let stored = |id: &str| {
        client
            .get(format!("{}/events/shop/{id}", server.base))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(stored("rust"), 200);
    assert_eq!(stored("stranger"), 404);
}

const PYTHON_POST: &str = r#"
import json, sys
import requests
url, ca, headers, body = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
headers["content-type"] = "application/json"
r = requests.post(url, data=body.encode(), headers=headers, verify=ca, timeout=10)
print(r.status_code, r.json()["status"])
"#;

/// The virtual environment of scripts/test-deps has `requests`.
fn python_with_requests() -> Option<PathBuf> {
    let python = PathBuf::from("/opt/webhook-inbox/apitools/bin/python3");
    let found = std::process::Command::new(&python)
        .args(["-c", "import requests"])
        .output()
        .map_err(|e| e.to_string())
        .and_then(|o| {
            o.status
                .success()
                .then_some(())
                .ok_or_else(|| "`requests` is not installed (scripts/test-deps installs it)".into())
        });
    crate::requires::available("Python's requests", found).then_some(python)
}

/// A renewed certificate installed by SIGHUP while deliveries arrive: connections open before
/// go on, new ones get the new certificate, every acknowledged delivery is stored, and none
/// fails.
#[test]
fn a_certificate_renewed_by_sighup_under_load_loses_nothing() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, old_der) = pki.issue(dir.path(), "server");
    let port = free_port();
    let (config, settings) =
        write_config(dir.path(), port, &tls_lines(&cert, &key), "workers = 1\n");
    let client = trusting(&pki);
    let server = ServerProcess::start_https(dir.path(), &config, port, "server.log", &client);
    let base = server.base.clone();

    let stop = Arc::new(AtomicBool::new(false));
    let senders: Vec<_> = (0..4)
        .map(|t| {
            let (client, base, settings, stop) =
                (client.clone(), base.clone(), settings.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                for i in 0..2_000 {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let id = format!("t{t}-{i}");
                    let status = send(&client, &base, &settings, &id)
                        .unwrap_or_else(|e| panic!("{id}: {e}"));
                    assert_eq!(status, 200, "{id}");
                    acked.push(id);
                }
                acked
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // Renew: new files written in place (as certbot or a secret mount does), then SIGHUP.
    let renewed = dir.path().join("renewed");
    std::fs::create_dir(&renewed).unwrap();
    let (new_cert, new_key, new_der) = pki.issue(&renewed, "server");
    std::fs::copy(&new_cert, &cert).unwrap();
    std::fs::copy(&new_key, &key).unwrap();
    hang_up(&server, "TLS certificate reloaded");
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let acked: Vec<String> = senders
        .into_iter()
        .flat_map(|s| s.join().unwrap())
        .collect();
    assert!(acked.len() > 40, "{} deliveries", acked.len());

    // A new connection is served the renewed certificate.
    let fresh = trusting(&pki);
    assert_ne!(old_der, new_der);
    assert_eq!(served_certificate(&fresh, &base), new_der);
    for id in &acked {
        let status = fresh
            .get(format!("{base}/events/shop/{id}"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .unwrap()
            .status();
        assert_eq!(status.as_u16(), 200, "{id} was acknowledged and is missing");
    }

    // A renewal that does not load keeps the certificate in use.
    std::fs::write(&key, "not a key").unwrap();
    hang_up(&server, "did not reload");
    assert_eq!(served_certificate(&trusting(&pki), &base), new_der);
    assert_eq!(send(&fresh, &base, &settings, "after").unwrap(), 200);
}

/// Files that cannot serve are refused at start, naming the key.
#[test]
fn bad_certificate_files_are_refused_at_start_naming_the_key() {
    use webhook_inbox::startup::{Application, BuildOptions};
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = pki.issue(dir.path(), "server");
    let (_, other_key, _) = pki.issue(dir.path(), "other");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "hello").unwrap();
    let cases = [
        (
            cert.clone(),
            other_key,
            "tls_key",
            "is not the key of the certificate",
        ),
        (cert.clone(), garbage.clone(), "tls_key", "garbage.pem"),
        (garbage, key.clone(), "tls_cert", "holds no PEM certificate"),
        (
            dir.path().join("missing.pem"),
            key,
            "tls_cert",
            "missing.pem",
        ),
    ];
    for (cert, key, setting, words) in cases {
        let config = format!("{}{}", tls_lines(&cert, &key), test_config(&dir));
        let settings = webhook_inbox::config::Settings::from_toml(&config, "t", vec![]).unwrap();
        let err = Application::build(settings, BuildOptions::default())
            .err()
            .map(|e| format!("{e:#}"))
            .expect("refused");
        assert!(err.contains(setting) && err.contains(words), "{err}");
    }
    let only_cert = format!("tls_cert = \"{}\"\n{}", cert.display(), test_config(&dir));
    let err = webhook_inbox::config::Settings::from_toml(&only_cert, "t", vec![])
        .unwrap_err()
        .to_string();
    assert!(err.contains("tls_key"), "{err}");
}
