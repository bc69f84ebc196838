//! The dashboard and the API reference against hostile input and careless keys, in a real
//! browser: a token typed and submitted with Enter never lands in a URL, and markup an outsider
//! put into an id, a type, a body, a header or an endpoint's answer never runs.

use std::time::Duration;

use fantoccini::{Client, Locator, key::Key};

use crate::browser::{Driver, js, type_into, wait_until};
use crate::dashboard::{browser_found, sign_in};
use crate::helpers::ADMIN_TOKEN;
use crate::process::{ServerProcess, free_port, write_config};

/// The binary with no consumers running and nothing delivered yet.
fn start() -> (
    ServerProcess,
    webhook_inbox::config::Settings,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (config, settings) = write_config(dir.path(), port, "", "workers = 0\nmax_attempts = 3");
    let server = ServerProcess::start(dir.path(), &config, port, "server.log");
    (server, settings, dir)
}

/// Type `token` into `css` and press Enter, as a person signing in does; then give a
/// navigation, if the form starts one, the time to happen, and answer where the tab is.
async fn enter_token(c: &Client, css: &str, token: &str) -> String {
    type_into(c, css, token).await;
    let input = c.find(Locator::Css(css)).await.unwrap();
    input.send_keys(&Key::Enter.to_string()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    c.current_url().await.unwrap().to_string()
}

/// SPEC section 10: tokens never in URLs. Enter in the API reference's token field, and in the
/// dashboard's sign-in form whether or not its script has taken the form over yet (a form
/// with its listeners stripped stands for the moment before `main.js` runs), keeps the token
/// out of the address bar and out of any request line.
#[test]
fn a_token_submitted_with_enter_never_lands_in_a_url() {
    if !browser_found() {
        return;
    }
    let (server, _settings, _dir) = start();
    let base = server.base.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let driver = Driver::start().await;
        driver
            .run("token-not-in-url", 1280, |c| async move {
                c.goto(&format!("{base}/docs/")).await.unwrap();
                wait_until(&c, "return document.querySelectorAll('#operations .op').length > 10;", "the operations").await;
                let url = enter_token(&c, "#token", ADMIN_TOKEN).await;
                assert!(!url.contains(ADMIN_TOKEN) && !url.contains('?'), "the reference put the token in {url}");
                // Still the reference, with the token kept for "Try it".
                assert_eq!(js(&c, "return document.querySelectorAll('#operations .op').length > 10 && sessionStorage.length;").await, 1);

                // The dashboard with its script running: signed in, the URL clean. (It shares
                // the reference's sessionStorage key: forget the token first.)
                js(&c, "sessionStorage.clear();").await;
                c.goto(&format!("{base}/ui/")).await.unwrap();
                wait_until(&c, "return !document.querySelector('#login-form button[type=submit]').disabled;", "the sign-in form ready").await;
                let url = enter_token(&c, "#token", ADMIN_TOKEN).await;
                assert!(!url.contains(ADMIN_TOKEN), "the dashboard put the token in {url}");
                wait_until(&c, "return !document.getElementById('view-overview').hidden;", "the overview after Enter").await;

                // The form as the HTML alone makes it (no listener): Enter must not make a GET
                // with the token in its query either.
                js(&c, "sessionStorage.clear();").await;
                c.goto(&format!("{base}/ui/")).await.unwrap();
                wait_until(&c, "return !document.getElementById('view-login').hidden && !document.querySelector('#login-form button[type=submit]').disabled;", "the sign-in form again").await;
                js(&c, "const f = document.getElementById('login-form'); f.replaceWith(f.cloneNode(true));").await;
                let url = enter_token(&c, "#token", ADMIN_TOKEN).await;
                assert!(!url.contains(ADMIN_TOKEN) && !url.contains('?'), "the bare form put the token in {url}");
            })
            .await;
    });
}

/// Markup that would run if any view built HTML from text: as an attribute, and breaking out of
/// one.
const IMG: &str = r#"<img src=x onerror="window.__pwned=1">"#;
const BREAKOUT: &str = r#""><script>window.__pwned=1</script>"#;

/// An endpoint that answers every call 500 with markup as its body.
fn hostile_endpoint() -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().take(200) {
            let Ok(mut stream) = stream else { continue };
            let mut buf = [0u8; 65536];
            // The calls are small: one read takes the request (enough for the answer).
            let _ = stream.read(&mut buf);
            let body = format!("{IMG}{BREAKOUT}");
            let answer = format!(
                "HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/html\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    url
}

/// Markup in every place an outsider writes (event ids, types, bodies, a refused request's
/// header values, an endpoint's answer) is shown as characters in the events list, the event
/// page and the Rejected view: nothing runs, nothing becomes an element.
#[test]
fn hostile_data_runs_nothing_in_any_view() {
    if !browser_found() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = hostile_endpoint();
    let top = format!(
        "[[subscriptions]]\nname = \"hook\"\nkind = \"http\"\nsources = [\"shop\"]\n\
         url = \"{url}\"\nsigning_secret = \"{}\"\ntimeout_ms = 1500\n",
        crate::helpers::SW_SECRET
    );
    let (config, settings) = write_config(dir.path(), port, &top, "workers = 1\nmax_attempts = 2");
    let server = ServerProcess::start(dir.path(), &config, port, "server.log");
    let base = server.base.clone();
    let client = reqwest::blocking::Client::new();
    let ids = [IMG, BREAKOUT, "../../events/retry"];
    for (i, id) in ids.iter().enumerate() {
        let body = serde_json::json!({
            "type": if i == 0 { BREAKOUT } else { IMG },
            "note": format!("{IMG} {BREAKOUT}"),
        })
        .to_string();
        assert_eq!(
            crate::process::send_signed(&client, &base, &settings, id, &body),
            200,
            "{id}"
        );
    }
    // A refused delivery with markup in its header values.
    let refused = client
        .post(format!("{base}/webhooks/shop"))
        .header("user-agent", IMG)
        .header("x-note", BREAKOUT)
        .header("webhook-id", BREAKOUT)
        .body("{}")
        .send()
        .unwrap();
    assert_eq!(refused.status(), 401);
    // Wait for the endpoint's answer to be in the first event's history.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let encoded = |id: &str| {
        form_urlencoded::byte_serialize(id.as_bytes())
            .collect::<String>()
            .replace('+', "%20")
            .replace('.', "%2E")
    };
    loop {
        let event: serde_json::Value = client
            .get(format!("{base}/events/shop/{}", encoded(IMG)))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .unwrap()
            .json()
            .unwrap();
        if event.to_string().contains("onerror")
            && event["history"].to_string().contains("window.__pwned")
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no endpoint answer kept: {event}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let driver = Driver::start().await;
        driver
            .run("hostile-data", 1280, |c| async move {
                c.goto(&format!("{base}/ui/#events?status=any")).await.unwrap();
                js(&c, "window.__violations = []; document.addEventListener('securitypolicyviolation', e => window.__violations.push(e.violatedDirective));").await;
                sign_in(&c, ADMIN_TOKEN).await;
                wait_until(&c, "return document.querySelectorAll('#events-body tr').length === 3;", "the 3 hostile events").await;
                let clean = "return window.__pwned === undefined && document.querySelectorAll('main img, main script').length === 0;";
                // No API path the dashboard builds lets the browser drop an id: `..` and `.` are
                // refused (as `%2E%2E` would be normalised too), others stay one segment.
                let paths = js(&c, "return import('/ui/js/api.js').then(m => ['..', '.', '...', 'a.b', '../../x'].map(id => { try { return new URL(m.eventPath('shop', id) + '/retry', location.href).pathname; } catch (e) { return e.code; } }));").await;
                assert_eq!(paths, serde_json::json!([
                    "unaddressable",
                    "unaddressable",
                    "unaddressable",
                    "/events/shop/a.b/retry",
                    "/events/shop/..%2F..%2Fx/retry",
                ]));
                assert_eq!(js(&c, clean).await, true, "the events list ran markup");
                let shown = js(&c, "return [...document.querySelectorAll('#events-body a.event-id')].map(a => a.textContent).sort();").await;
                let mut want: Vec<&str> = ids.to_vec();
                want.sort();
                assert_eq!(shown, serde_json::json!(want));

                // Each event's page, opened from its row: the link leads to that event.
                for id in ids {
                    c.goto(&format!("{base}/ui/#events?status=any")).await.unwrap();
                    wait_until(&c, "return document.querySelectorAll('#events-body tr').length === 3;", "the list").await;
                    let open = format!("[...document.querySelectorAll('#events-body a.event-id')].find(a => a.textContent === {}).click(); return true;", serde_json::json!(id));
                    js(&c, &open).await;
                    wait_until(&c, &format!("const b = document.getElementById('event-body'); return !!b && b.textContent.includes('__pwned') && document.getElementById('event-detail').textContent.includes({});", serde_json::json!(id)), "the hostile event's page").await;
                    assert_eq!(js(&c, clean).await, true, "the event page of {id} ran markup");
                }
                // The endpoint's answer is in the first one's history, as text.
                c.goto(&format!("{base}/ui/#events?status=any")).await.unwrap();
                wait_until(&c, "return document.querySelectorAll('#events-body tr').length === 3;", "the list").await;
                js(&c, &format!("[...document.querySelectorAll('#events-body a.event-id')].find(a => a.textContent === {}).click(); return true;", serde_json::json!(IMG))).await;
                wait_until(&c, "const d = document.getElementById('event-detail'); return !!d && d.textContent.includes('500') && d.textContent.includes('<script>window.__pwned=1</script>');", "the endpoint's answer in the history").await;
                assert_eq!(js(&c, clean).await, true, "the endpoint's answer ran");

                // The Rejected view, with the refusal's headers opened.
                c.goto(&format!("{base}/ui/#rejected")).await.unwrap();
                wait_until(&c, "return document.querySelectorAll('#rejected-body tr[data-rejection]').length === 1;", "the refusal").await;
                crate::browser::click(&c, "#rejected-body button.details").await;
                wait_until(&c, "const d = document.querySelector('#rejected-body tr.detail-row:not([hidden])'); return !!d && d.textContent.includes('onerror') && d.textContent.includes('<script>');", "the refused headers").await;
                assert_eq!(js(&c, clean).await, true, "the Rejected view ran markup");
                assert_eq!(js(&c, "return window.__violations;").await, serde_json::json!([]));
            })
            .await;
    });
    drop(server);
}
