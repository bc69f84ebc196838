//! Settings of the edge: which addresses may send to a source (`allow_from`), whose
//! forwarding header to believe (`trusted_proxies`, `forwarded_header`), and the connections'
//! limits.

use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use serde::Deserialize;

/// An address range, `203.0.113.0/24` or `2001:db8::/32`, or one address (`192.0.2.7`, read
/// as `/32` or `/128`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr(IpNet);

impl Cidr {
    /// Whether `ip` is in the range; an IPv4 address written as IPv6 (`::ffff:192.0.2.7`, as a
    /// dual-stack listener reports it) counts as the IPv4 address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.contains(&ip.to_canonical())
    }
}

/// Whether any of `ranges` holds `ip`.
pub fn any_contains(ranges: &[Cidr], ip: IpAddr) -> bool {
    ranges.iter().any(|r| r.contains(ip))
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Cidr, String> {
        let text = text.trim();
        if let Ok(net) = text.parse::<IpNet>() {
            return Ok(Cidr(net.trunc()));
        }
        text.parse::<IpAddr>()
            .map(|ip| Cidr(IpNet::from(ip.to_canonical())))
            .map_err(|_| {
                format!(
                    "`{text}` is not an address or a CIDR range (such as 192.0.2.0/24 or \
                     2001:db8::/32)"
                )
            })
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Cidr, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The one forwarding header the trusted proxies set, and so the only one read from them. A
/// proxy appends to the header it sets and passes any other through as the client wrote it
/// (nginx's `$proxy_add_x_forwarded_for` leaves a client's `Forwarded` alone), so reading the
/// other one would let a client name itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1` (nginx, HAProxy, most load balancers).
    #[default]
    #[serde(rename = "x-forwarded-for")]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client;proto=https` (Envoy, Caddy or Traefik when configured to).
    #[serde(rename = "forwarded")]
    Forwarded,
}

/// How many refused deliveries are kept for ops (`GET /rejections`): the newest `keep_count`,
/// none older than `keep_days`. A flood cannot grow the table past that, and what the writer
/// cannot keep up with is counted and dropped, never queued without bound.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RejectionSettings {
    /// 0: keep none (nothing is recorded).
    pub keep_count: u64,
    pub keep_days: u32,
}

impl Default for RejectionSettings {
    fn default() -> Self {
        RejectionSettings {
            keep_count: 10_000,
            keep_days: 7,
        }
    }
}

/// Limits on the connections the HTTP server keeps (SPEC section 14), so that idle or slow
/// clients cannot hold what providers need: a connection's request head must arrive within
/// `header_timeout_ms` (a slowloris sender, or a connection that never sends, is answered 408
/// and closed), a body within `body_timeout_ms` (408 `request_timeout`, nothing stored), an
/// idle keep-alive connection is closed after `keep_alive_seconds`, and at most `max`
/// connections are open at once (further ones wait in the listen backlog).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConnectionSettings {
    pub max: usize,
    pub header_timeout_ms: u64,
    pub body_timeout_ms: u64,
    pub keep_alive_seconds: u64,
}

impl Default for ConnectionSettings {
    fn default() -> Self {
        ConnectionSettings {
            max: 10_000,
            header_timeout_ms: 5_000,
            body_timeout_ms: 30_000,
            keep_alive_seconds: 5,
        }
    }
}

impl ConnectionSettings {
    /// What is wrong with the limits, as (key, reason).
    pub fn problem(&self) -> Option<(&'static str, &'static str)> {
        const HOUR_MS: u64 = 3_600_000;
        if !(1..=1_000_000).contains(&self.max) {
            return Some(("connections.max", "must be between 1 and 1000000"));
        }
        if !(1..=HOUR_MS).contains(&self.header_timeout_ms) {
            return Some((
                "connections.header_timeout_ms",
                "must be between 1 and 3600000",
            ));
        }
        if !(1..=HOUR_MS).contains(&self.body_timeout_ms) {
            return Some((
                "connections.body_timeout_ms",
                "must be between 1 and 3600000",
            ));
        }
        if self.keep_alive_seconds > 3_600 {
            return Some((
                "connections.keep_alive_seconds",
                "must be at most 3600 (0 closes a connection after each request)",
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::Cidr;

    #[test]
    fn ranges_and_single_addresses_parse_and_match() {
        let net: Cidr = "192.0.2.0/24".parse().unwrap();
        assert!(net.contains("192.0.2.200".parse().unwrap()));
        assert!(net.contains("::ffff:192.0.2.1".parse().unwrap()));
        assert!(!net.contains("192.0.3.1".parse().unwrap()));
        assert!(!net.contains("2001:db8::1".parse().unwrap()));
        let one: Cidr = "127.0.0.2".parse().unwrap();
        assert!(one.contains("127.0.0.2".parse().unwrap()));
        assert!(!one.contains("127.0.0.3".parse().unwrap()));
        let v6: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains("2001:db8:1::9".parse().unwrap()));
        // Host bits are dropped: 10.1.2.3/8 is 10.0.0.0/8.
        let loose: Cidr = "10.1.2.3/8".parse().unwrap();
        assert!(loose.contains("10.200.0.1".parse().unwrap()));
        for bad in ["", "10.0.0.0/33", "example.com", "10.0.0.0/8/8", "1.2.3"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }
}
