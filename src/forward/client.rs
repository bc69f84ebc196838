//! The HTTP client of an `http` subscription: HTTP/1.1 over its own kept-alive connections,
//! one per call in flight, on the forwarder's thread.
//!
//! Why not reqwest for every call: each of its requests clones the client's header map and
//! connector, parses the URL back and forth for its redirect policy, and matches the proxy
//! rules (docs/performance.md, "Delivery out of the node"); on a forwarder that is most of
//! the node's own work per event. Here the fixed parts (the address, the TLS settings, the
//! request's target, `Host`, `Accept`, the URL's credentials) are made once per subscription.
//! When the environment names a proxy for the URL (`HTTPS_PROXY` and the like, as reqwest reads
//! them), the calls go through reqwest as before, so that its proxy support stays whole.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Body as _;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{ACCEPT, AUTHORIZATION, HOST, HeaderMap, HeaderValue};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use rustls::pki_types::ServerName;
use tokio::time::Instant;

use crate::domain::error_chain;
use crate::subscriptions::HttpTarget;

/// How much of an answer's body is read: enough for the history's 200 characters in any
/// encoding. The rest is never read: an endpoint's endless or multi-megabyte error page costs
/// neither memory nor the call's remaining time (its connection is closed instead).
pub(super) const ANSWER_READ_BYTES: usize = 4 * 1024;

/// An idle connection unused this long is closed (reqwest's default).
const IDLE_FOR: Duration = Duration::from_secs(90);

/// What the endpoint answered.
pub struct Reply {
    pub status: u16,
    pub retry_after: Option<HeaderValue>,
    /// The start of the body of an answer that is neither a 2xx nor a 410, for the history.
    pub text: String,
}

/// Why there is no answer.
pub enum Failure {
    /// Nothing was sent (the connection, or its TLS handshake, failed).
    Connect(String),
    /// No answer within the timeout (in ms), after the request may have been sent.
    Timeout(u128),
    /// The call failed after the request may have been sent.
    AfterSent(String),
}

/// Where an `http` subscription's calls go. Errors never name the URL, which may hold
/// credentials.
pub struct Endpoint {
    via: Via,
    timeout: Duration,
}

enum Via {
    Direct(Box<Direct>),
    /// A proxy applies: reqwest, with the URL parsed once.
    Proxied(reqwest::Client, reqwest::Url),
}

struct Direct {
    host: String,
    port: u16,
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    /// The request's target in origin form (path and query).
    target: hyper::Uri,
    fixed: HeaderMap,
    /// Kept-alive connections not in use, the last used at the end.
    idle: Mutex<Vec<(SendRequest<Full<Bytes>>, Instant)>>,
    max_idle: usize,
}

impl Endpoint {
    /// The endpoint of `target`: its timeout (connecting included), its CA beside the system's
    /// roots, no redirects, and up to `concurrency` connections kept alive.
    pub fn new(target: &HttpTarget) -> anyhow::Result<Endpoint> {
        let url = reqwest::Url::parse(&target.url)
            .map_err(|e| anyhow::anyhow!("the subscription's url does not parse: {e}"))?;
        let timeout = Duration::from_millis(target.timeout_ms);
        let uri: hyper::Uri = url
            .as_str()
            .parse()
            .map_err(|_| anyhow::anyhow!("the subscription's url is not a valid request target"))?;
        let proxied = hyper_util::client::proxy::matcher::Matcher::from_system()
            .intercept(&uri)
            .is_some();
        let via = if proxied {
            Via::Proxied(super::proxied::client(target)?, url)
        } else {
            Via::Direct(Box::new(Direct::new(target, &url)?))
        };
        Ok(Endpoint { via, timeout })
    }

    /// POST `body` with `headers` (the fixed ones are added), within the timeout.
    pub async fn post(&self, headers: HeaderMap, body: Bytes) -> Result<Reply, Failure> {
        match &self.via {
            Via::Direct(direct) => direct.post(headers, body, self.timeout).await,
            Via::Proxied(client, url) => {
                let sent = client.post(url.clone()).headers(headers).body(body).send();
                super::proxied::reply(sent.await, self.timeout).await
            }
        }
    }
}

impl Direct {
    fn new(target: &HttpTarget, url: &reqwest::Url) -> anyhow::Result<Direct> {
        let host = url
            .host_str()
            .ok_or_else(|| anyhow::anyhow!("the subscription's url has no host"))?;
        // An IPv6 address is written in brackets in a URL and a `Host`, bare for a socket.
        let bare = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = url
            .port_or_known_default()
            .ok_or_else(|| anyhow::anyhow!("the subscription's url has no port"))?;
        let tls = match url.scheme() {
            "http" => None,
            "https" => Some((connector(target.ca_file.as_deref())?, server_name(&bare)?)),
            other => anyhow::bail!("the subscription's url has scheme `{other}`"),
        };
        let mut fixed = HeaderMap::with_capacity(3);
        let authority = match url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_string(),
        };
        fixed.insert(HOST, HeaderValue::from_str(&authority)?);
        fixed.insert(ACCEPT, HeaderValue::from_static("*/*"));
        if let Some(value) = basic_auth(url) {
            fixed.insert(AUTHORIZATION, value);
        }
        let target_uri = match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_string(),
        };
        Ok(Direct {
            host: bare,
            port,
            tls,
            target: target_uri.parse().context("the url's path")?,
            fixed,
            idle: Mutex::new(Vec::with_capacity(target.concurrency)),
            max_idle: target.concurrency,
        })
    }

    async fn post(
        &self,
        mut headers: HeaderMap,
        body: Bytes,
        timeout: Duration,
    ) -> Result<Reply, Failure> {
        let deadline = Instant::now() + timeout;
        for (name, value) in &self.fixed {
            headers.insert(name, value.clone());
        }
        let mut request = hyper::Request::post(self.target.clone())
            .body(Full::new(body))
            .map_err(|e| Failure::Connect(e.to_string()))?;
        *request.headers_mut() = headers;
        let mut sent = false;
        let exchange = async {
            // A kept-alive connection the endpoint closed meanwhile gives the request back
            // unsent: the next one (at last a new one) takes it.
            loop {
                let (mut sender, kept) = match self.take() {
                    Some(sender) => (sender, true),
                    // Boxed: a TLS handshake's future is large, and rare.
                    None => (
                        Box::pin(self.connect()).await.map_err(Failure::Connect)?,
                        false,
                    ),
                };
                if kept && sender.ready().await.is_err() {
                    continue;
                }
                sent = true;
                match sender.try_send_request(request).await {
                    Ok(response) => return Ok((sender, response)),
                    Err(mut e) => match e.take_message() {
                        Some(unsent) if kept => {
                            sent = false;
                            request = unsent;
                        }
                        _ => return Err(Failure::AfterSent(error_chain(&e.into_error()))),
                    },
                }
            }
        };
        let (sender, response) = match tokio::time::timeout_at(deadline, exchange).await {
            Ok(exchanged) => exchanged?,
            Err(_) if sent => return Err(Failure::Timeout(timeout.as_millis())),
            Err(_) => {
                let ms = timeout.as_millis();
                return Err(Failure::Connect(format!("not connected within {ms} ms")));
            }
        };
        let (parts, mut body) = response.into_parts();
        let status = parts.status.as_u16();
        let mut reply = Reply {
            status,
            retry_after: None,
            text: String::new(),
        };
        if parts.status.is_success() || status == 410 {
            // Whatever already arrived is read, so that a short body keeps the connection; a
            // 2xx never waits for more.
            let mut read = 0;
            while !body.is_end_stream() && read < ANSWER_READ_BYTES {
                use futures_util::FutureExt;
                match body.frame().now_or_never() {
                    Some(Some(Ok(frame))) => read += frame.data_ref().map_or(0, Bytes::len),
                    _ => break,
                }
            }
        } else {
            reply.retry_after = parts.headers.get(hyper::header::RETRY_AFTER).cloned();
            let mut kept = Vec::new();
            let reading = async {
                while kept.len() < ANSWER_READ_BYTES {
                    match body.frame().await {
                        Some(Ok(frame)) => {
                            if let Some(chunk) = frame.data_ref() {
                                let room = ANSWER_READ_BYTES - kept.len();
                                kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
                            }
                        }
                        None | Some(Err(_)) => break,
                    }
                }
            };
            let _ = tokio::time::timeout_at(deadline, reading).await;
            reply.text = String::from_utf8_lossy(&kept).chars().take(200).collect();
        }
        if body.is_end_stream() {
            self.put(sender);
        }
        Ok(reply)
    }

    fn take(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.idle.lock();
        while let Some((sender, _)) = idle.pop() {
            if !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    fn put(&self, sender: SendRequest<Full<Bytes>>) {
        let now = Instant::now();
        let mut idle = self.idle.lock();
        let stale = idle
            .iter()
            .take_while(|(_, since)| now - *since > IDLE_FOR)
            .count();
        idle.drain(..stale);
        if idle.len() < self.max_idle {
            idle.push((sender, now));
        }
    }

    /// A new connection (TCP, then TLS for `https`), its task on the forwarder's runtime.
    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| e.to_string())?;
        // Small requests and answers: Nagle's wait for an ACK would add 40 ms to each.
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        match &self.tls {
            None => handshake(tcp).await,
            Some((connector, name)) => {
                let tls = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|e| error_chain(&e))?;
                handshake(tls).await
            }
        }
    }
}

async fn handshake<S>(io: S) -> Result<SendRequest<Full<Bytes>>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| error_chain(&e))?;
    // Ends when the connection closes or its last `SendRequest` is dropped.
    tokio::spawn(connection);
    Ok(sender)
}

/// TLS 1.3 and 1.2 against the system's roots and the `ca_file`'s CAs, HTTP/1.1 by ALPN.
fn connector(ca_file: Option<&str>) -> anyhow::Result<tokio_rustls::TlsConnector> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(file) = ca_file {
        let pem = std::fs::read(file).with_context(|| format!("reading ca_file {file}"))?;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.with_context(|| format!("ca_file {file} is not PEM"))?;
            roots
                .add(cert)
                .with_context(|| format!("a certificate of ca_file {file}"))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .context("TLS protocol versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// The name the certificate must hold: a DNS name or an IP address.
fn server_name(host: &str) -> anyhow::Result<ServerName<'static>> {
    ServerName::try_from(host.to_string())
        .map_err(|_| anyhow::anyhow!("the subscription's host is not a valid TLS name"))
}

/// The URL's `user:password@` as Basic credentials, as reqwest sends them.
fn basic_auth(url: &reqwest::Url) -> Option<HeaderValue> {
    use base64::Engine;
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .ok()
            .map(|s| s.into_owned())
    };
    let user = decode(url.username())?;
    let password = url.password().and_then(decode);
    if user.is_empty() && password.is_none() {
        return None;
    }
    let pair = format!("{user}:{}", password.unwrap_or_default());
    let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
    let mut value = HeaderValue::from_str(&format!("Basic {encoded}")).ok()?;
    value.set_sensitive(true);
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As reqwest sent them: percent-decoded, a missing password empty, nothing without a user.
    #[test]
    fn the_urls_credentials_become_basic_auth() {
        let url = |s: &str| reqwest::Url::parse(s).unwrap();
        let value = basic_auth(&url("https://user:hunter%402@example.com/in")).unwrap();
        // base64("user:hunter@2")
        assert_eq!(value, "Basic dXNlcjpodW50ZXJAMg==");
        assert!(value.is_sensitive());
        let token = basic_auth(&url("http://token@example.com/")).unwrap();
        assert_eq!(token, "Basic dG9rZW46");
        assert_eq!(basic_auth(&url("http://example.com/in")), None);
    }
}
