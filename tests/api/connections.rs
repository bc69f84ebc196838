//! The connections' limits (SPEC section 14, `[connections]`), over real TCP on a random local
//! port: a request head that dawdles or never comes is answered 408 and closed after
//! `header_timeout_ms`; a body that dawdles is refused 408 `request_timeout` after
//! `body_timeout_ms` with nothing stored; past `max` connections a new one waits until a slot
//! frees, and then its delivery is stored.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::*;

async fn limited_app(limits: &str) -> TestApp {
    let limits = format!("\n[connections]\n{limits}\n");
    spawn_app_with(move |config| config.push_str(&limits), Default::default()).await
}

fn addr(app: &TestApp) -> String {
    app.address.trim_start_matches("http://").to_string()
}

/// Read until the server closes the connection (or `within` passes: then `None`).
async fn read_to_close(stream: &mut TcpStream, within: Duration) -> Option<String> {
    let mut out = Vec::new();
    let read = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    read.ok()
        .map(|()| String::from_utf8_lossy(&out).into_owned())
}

#[tokio::test]
async fn a_head_sent_a_byte_at_a_time_or_never_is_cut_off_by_the_header_timeout() {
    let app = limited_app("header_timeout_ms = 600").await;
    // Never sends anything.
    let mut idle = TcpStream::connect(addr(&app)).await.unwrap();
    // Slowloris: a header byte every 100 ms, which would take seconds to finish.
    let mut slow = TcpStream::connect(addr(&app)).await.unwrap();
    let started = Instant::now();
    let head = "POST /webhooks/shop HTTP/1.1\r\nHost: x\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
    let mut cut = false;
    for byte in head.bytes() {
        if slow.write_all(&[byte]).await.is_err() {
            cut = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        if started.elapsed() > Duration::from_secs(5) {
            break;
        }
    }
    let answer = read_to_close(&mut slow, Duration::from_secs(5)).await;
    assert!(
        cut || answer.is_some(),
        "the slow head was not cut off within 5 s"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the slow head held its connection for {:?}",
        started.elapsed()
    );
    if let Some(answer) = answer.filter(|a| !a.is_empty()) {
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    }
    let answer = read_to_close(&mut idle, Duration::from_secs(5))
        .await
        .expect("the idle connection was not closed within 5 s");
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer}"
    );
    // Providers still get in.
    let r = app
        .deliver("shop", "after-slow", &order_body("o-1", "c-1", 1))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
}

#[tokio::test]
async fn a_body_sent_a_byte_at_a_time_is_refused_408_and_stores_nothing() {
    let app = limited_app("body_timeout_ms = 500").await;
    let body = order_body("o-slow", "c-1", 1);
    let head = signed_head(&app, "slow-body", &body);
    let mut stream = TcpStream::connect(addr(&app)).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    for byte in body.bytes().take(20) {
        if stream.write_all(&[byte]).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answer = read_to_close(&mut stream, Duration::from_secs(5))
        .await
        .expect("no answer within 5 s");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains(r#""error":"request_timeout""#), "{answer}");
    assert!(answer.contains("connections.body_timeout_ms"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(app.get("/events/shop/slow-body").await.status, 404);
    // The same delivery sent at once is stored.
    let r = app.deliver("shop", "slow-body", &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["status"], "queued");
}

/// A head whose body never comes: nothing wakes the handler after its first poll (no byte
/// arrives), and the body's timer, armed only once a first read finds the body incomplete,
/// must still refuse it in time.
#[tokio::test]
async fn a_body_that_never_comes_is_refused_408() {
    let app = limited_app("body_timeout_ms = 500").await;
    let body = order_body("o-never", "c-1", 1);
    let head = signed_head(&app, "no-body", &body);
    let mut stream = TcpStream::connect(addr(&app)).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let answer = read_to_close(&mut stream, Duration::from_secs(5))
        .await
        .expect("no answer within 5 s");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains(r#""error":"request_timeout""#), "{answer}");
    assert!(started.elapsed() >= Duration::from_millis(400), "{answer}");
    assert_eq!(app.get("/events/shop/no-body").await.status, 404);
}

#[tokio::test]
async fn past_the_connection_limit_a_provider_waits_for_a_slot_then_gets_in() {
    // Two HTTP workers (the test default) with one connection each.
    let app = limited_app("max = 2\nheader_timeout_ms = 1500").await;
    let mut idle = Vec::new();
    for _ in 0..2 {
        idle.push(TcpStream::connect(addr(&app)).await.unwrap());
    }
    // Let the server take both before the provider comes.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let body = order_body("o-2", "c-1", 1);
    let send = app.deliver("shop", "waited", &body);
    let r = tokio::time::timeout(Duration::from_secs(10), send)
        .await
        .expect("the provider was not served within 10 s");
    assert_eq!(r.status, 200, "{}", r.body);
    // It was served only once the idle connections' header timeout freed their slots.
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "served after {:?}: the limit did not hold",
        started.elapsed()
    );
    for mut stream in idle {
        assert!(
            read_to_close(&mut stream, Duration::from_secs(5))
                .await
                .is_some()
        );
    }
}

#[test]
fn bad_limits_are_refused_at_start_naming_the_key() {
    for (limits, key) in [
        ("max = 0", "connections.max"),
        ("header_timeout_ms = 0", "connections.header_timeout_ms"),
        ("body_timeout_ms = 0", "connections.body_timeout_ms"),
        (
            "keep_alive_seconds = 100000",
            "connections.keep_alive_seconds",
        ),
        ("unknown = 1", "unknown"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let config = format!("{}\n[connections]\n{limits}\n", test_config(&dir));
        let error = webhook_inbox::config::Settings::from_toml(&config, "test", Vec::new())
            .expect_err(limits)
            .to_string();
        assert!(error.contains(key), "{limits}: {error}");
    }
}

/// A signed delivery's request head (its body sent apart, or never).
fn signed_head(app: &TestApp, id: &str, body: &str) -> String {
    let mut head = format!(
        "POST /webhooks/shop HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n",
        body.len()
    );
    for (k, v) in sign_for(&app.settings, "shop", id, body.as_bytes()) {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    head
}
