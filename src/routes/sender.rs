//! Who sent a request: the peer, or, when the peer is a trusted proxy, the nearest address in
//! the forwarding chain that is not a trusted proxy. The chain is read from the one header the
//! proxies set (`forwarded_header`: `X-Forwarded-For`, or RFC 7239 `Forwarded`), never from the
//! other, which a proxy passes through as the client wrote it. Each proxy appends the address
//! it received from, so the chain is read from the right; what a client wrote at the left can
//! be anything, and a header from an untrusted peer is never read.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use actix_web::HttpRequest;
use actix_web::http::header::{FORWARDED, HeaderMap, HeaderName};

use crate::config::{ForwardedHeader, Settings, any_contains};

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The sender's address; `None` when a trusted proxy forwarded for a hop it could not name
/// (`for=unknown`, an obfuscated identifier, a malformed header): then nobody can say.
pub fn address(req: &HttpRequest, settings: &Settings) -> Option<IpAddr> {
    let trusted = &settings.trusted_proxies;
    let peer = req.peer_addr()?.ip().to_canonical();
    if !any_contains(trusted, peer) {
        return Some(peer);
    }
    let mut sender = peer;
    for hop in chain(req.headers(), settings.forwarded_header)
        .into_iter()
        .rev()
    {
        let ip = hop?;
        if !any_contains(trusted, ip) {
            return Some(ip);
        }
        // A trusted proxy forwarded for another trusted proxy: read on.
        sender = ip;
    }
    Some(sender)
}

/// The forwarded-for chain of `header`, client first; several header lines are one list in
/// their order.
fn chain(headers: &HeaderMap, header: ForwardedHeader) -> Vec<Option<IpAddr>> {
    let (name, read): (&HeaderName, fn(&str) -> Option<IpAddr>) = match header {
        ForwardedHeader::Forwarded => (&FORWARDED, forwarded_for),
        ForwardedHeader::XForwardedFor => (&X_FORWARDED_FOR, |hop| node(hop.trim())),
    };
    headers
        .get_all(name)
        .flat_map(|value| match value.to_str() {
            Ok(text) => text.split(',').map(read).collect(),
            Err(_) => vec![None],
        })
        .collect()
}

/// The `for=` of one `Forwarded` element (`for=192.0.2.60;proto=http;by=203.0.113.43`).
fn forwarded_for(element: &str) -> Option<IpAddr> {
    element
        .split(';')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| key.trim().eq_ignore_ascii_case("for"))
        .and_then(|(_, value)| node(value.trim().trim_matches('"')))
}

/// An address as proxies write it: `192.0.2.1`, `192.0.2.1:4711`, `2001:db8::1`,
/// `[2001:db8::1]` or `[2001:db8::1]:4711`.
fn node(text: &str) -> Option<IpAddr> {
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    if let Some(rest) = text.strip_prefix('[') {
        let (ip, _) = rest.split_once(']')?;
        return ip
            .parse::<Ipv6Addr>()
            .ok()
            .map(|ip| IpAddr::V6(ip).to_canonical());
    }
    text.parse::<SocketAddr>()
        .ok()
        .map(|s| s.ip().to_canonical())
}

#[cfg(test)]
mod tests {
    use actix_web::test::TestRequest;

    use super::*;

    fn sender(peer: &str, headers: &[(&str, &str)], trusted: &[&str]) -> Option<String> {
        sender_reading(ForwardedHeader::XForwardedFor, peer, headers, trusted)
    }

    fn sender_reading(
        header: ForwardedHeader,
        peer: &str,
        headers: &[(&str, &str)],
        trusted: &[&str],
    ) -> Option<String> {
        let mut req = TestRequest::default().peer_addr(peer.parse().unwrap());
        for (name, value) in headers {
            req = req.append_header((*name, *value));
        }
        let settings = Settings {
            trusted_proxies: trusted.iter().map(|t| t.parse().unwrap()).collect(),
            forwarded_header: header,
            ..Settings::default()
        };
        address(&req.to_http_request(), &settings).map(|ip| ip.to_string())
    }

    #[test]
    fn an_untrusted_peer_is_the_sender_whatever_its_headers_say() {
        let spoofed = [
            ("x-forwarded-for", "192.0.2.1"),
            ("forwarded", "for=192.0.2.1"),
        ];
        assert_eq!(
            sender("198.51.100.7:5000", &spoofed, &[]).unwrap(),
            "198.51.100.7"
        );
        let other_proxy = ["10.0.0.0/8"];
        assert_eq!(
            sender("198.51.100.7:5000", &spoofed, &other_proxy).unwrap(),
            "198.51.100.7"
        );
    }

    #[test]
    fn behind_trusted_proxies_the_nearest_untrusted_hop_is_the_sender() {
        let proxies = ["10.0.0.0/8"];
        let xff = |v| [("x-forwarded-for", v)];
        assert_eq!(
            sender("10.0.0.1:1", &xff("192.0.2.9"), &proxies).unwrap(),
            "192.0.2.9"
        );
        // The client wrote 192.0.2.1 itself; the proxy appended what it saw.
        assert_eq!(
            sender("10.0.0.1:1", &xff("192.0.2.1, 198.51.100.7"), &proxies).unwrap(),
            "198.51.100.7"
        );
        // Two proxies in a row.
        assert_eq!(
            sender("10.0.0.1:1", &xff("198.51.100.7, 10.9.9.9"), &proxies).unwrap(),
            "198.51.100.7"
        );
        // Every hop trusted: the farthest one.
        assert_eq!(
            sender("10.0.0.1:1", &xff("10.2.2.2"), &proxies).unwrap(),
            "10.2.2.2"
        );
        // No header: the proxy itself.
        assert_eq!(sender("10.0.0.1:1", &[], &proxies).unwrap(), "10.0.0.1");
        // An unreadable hop before any untrusted one: nobody can say.
        assert_eq!(
            sender("10.0.0.1:1", &xff("192.0.2.1, garbage"), &proxies),
            None
        );
        // Ports, brackets and mapped addresses.
        assert_eq!(
            sender("10.0.0.1:1", &xff("192.0.2.9:443"), &proxies).unwrap(),
            "192.0.2.9"
        );
        assert_eq!(
            sender("[::ffff:10.0.0.1]:1", &xff("[2001:db8::7]:80"), &proxies).unwrap(),
            "2001:db8::7"
        );
    }

    /// nginx's `$proxy_add_x_forwarded_for` appends to X-Forwarded-For and passes a client's
    /// own `Forwarded` through: with the default, that `Forwarded` is never read.
    #[test]
    fn only_the_configured_header_is_read() {
        let proxies = ["10.0.0.0/8"];
        let spoofed = [
            ("forwarded", "for=192.0.2.1"),
            ("x-forwarded-for", "198.51.100.7"),
        ];
        assert_eq!(
            sender("10.0.0.1:1", &spoofed, &proxies).unwrap(),
            "198.51.100.7"
        );
        assert_eq!(
            sender("10.0.0.1:1", &[("forwarded", "for=192.0.2.1")], &proxies).unwrap(),
            "10.0.0.1"
        );
        let fwd = |headers: &[(&str, &str)]| {
            sender_reading(ForwardedHeader::Forwarded, "10.0.0.1:1", headers, &proxies)
        };
        let spoofed = [
            ("x-forwarded-for", "192.0.2.1"),
            ("forwarded", "for=198.51.100.7"),
        ];
        assert_eq!(fwd(&spoofed).unwrap(), "198.51.100.7");
        assert_eq!(
            fwd(&[("x-forwarded-for", "192.0.2.1")]).unwrap(),
            "10.0.0.1"
        );
    }

    #[test]
    fn forwarded_elements_name_the_sender_when_configured() {
        let proxies = ["10.0.0.0/8"];
        let fwd = |headers: &[(&str, &str)]| {
            sender_reading(ForwardedHeader::Forwarded, "10.0.0.1:1", headers, &proxies)
        };
        let headers = [(
            "forwarded",
            r#"for=192.0.2.60;proto=https, For="[2001:db8:cafe::17]:4711""#,
        )];
        assert_eq!(fwd(&headers).unwrap(), "2001:db8:cafe::17");
        let lines = [
            ("forwarded", "for=192.0.2.60"),
            ("forwarded", "for=10.3.3.3;by=10.0.0.1"),
        ];
        assert_eq!(fwd(&lines).unwrap(), "192.0.2.60");
        assert_eq!(fwd(&[("forwarded", "for=unknown")]), None);
        assert_eq!(fwd(&[("forwarded", "proto=https")]), None);
    }
}
