//! The calls of an `http` subscription whose URL a proxy of the environment applies to
//! (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`, minus `NO_PROXY`): through reqwest, whose proxy
//! support stays whole, with the answers read as [`super::client`] reads its own.

use std::time::Duration;

use anyhow::Context;

use super::client::{ANSWER_READ_BYTES, Failure, Reply};
use crate::domain::error_chain;
use crate::subscriptions::HttpTarget;

/// The proxied client: its timeout, its CA, no redirects, the system's roots, and up to
/// `concurrency` connections kept alive.
pub(super) fn client(target: &HttpTarget) -> anyhow::Result<reqwest::Client> {
    let timeout = Duration::from_millis(target.timeout_ms);
    let mut builder = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(target.concurrency)
        .tls_built_in_webpki_certs(false)
        .tls_built_in_native_certs(true);
    if let Some(file) = &target.ca_file {
        let pem = std::fs::read(file).with_context(|| format!("reading ca_file {file}"))?;
        for cert in reqwest::Certificate::from_pem_bundle(&pem)
            .with_context(|| format!("ca_file {file} is not PEM"))?
        {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder.build().context("building the HTTP client")
}

pub(super) async fn reply(
    sent: reqwest::Result<reqwest::Response>,
    timeout: Duration,
) -> Result<Reply, Failure> {
    let mut response = match sent {
        Ok(r) => r,
        Err(e) => {
            let e = e.without_url();
            return Err(if e.is_connect() {
                Failure::Connect(error_chain(&e))
            } else if e.is_timeout() {
                Failure::Timeout(timeout.as_millis())
            } else {
                Failure::AfterSent(error_chain(&e))
            });
        }
    };
    let status = response.status();
    let mut reply = Reply {
        status: status.as_u16(),
        retry_after: response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .cloned(),
        text: String::new(),
    };
    if status.is_success() || status.as_u16() == 410 {
        return Ok(reply);
    }
    let mut kept = Vec::new();
    while kept.len() < ANSWER_READ_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = ANSWER_READ_BYTES - kept.len();
                kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    reply.text = String::from_utf8_lossy(&kept).chars().take(200).collect();
    Ok(reply)
}
