//! Finding the client's address behind trusted reverse proxies.
//!
//! Each proxy appends the address it received the request from. Reading the list from the right
//! and skipping our own proxies gives the first address we did not put there ourselves; anything
//! further left was written by the client and cannot be trusted.

use std::net::IpAddr;
use std::str::FromStr;

use http::HeaderMap;
use ipnet::IpNet;

use crate::ConfigError;

#[derive(Debug, Default)]
pub(crate) struct TrustedProxies {
    nets: Vec<IpNet>,
}

impl TrustedProxies {
    pub(crate) fn parse<I, S>(networks: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nets = networks
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                let s = s.as_ref().trim();
                IpNet::from_str(s)
                    .or_else(|_| IpAddr::from_str(s).map(IpNet::from))
                    .map_err(|_| ConfigError::BadProxyNetwork { entry: s.to_owned(), number: i + 1 })
            })
            .collect::<Result<_, _>>()?;
        Ok(TrustedProxies { nets })
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.nets.iter().any(|n| n.contains(&ip))
    }

    #[inline]
    pub(crate) fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        // No proxies configured (the default): the peer is the client, nothing to look at.
        if self.nets.is_empty() || !self.trusts(peer) {
            return peer;
        }
        // `Forwarded` is the standard; fall back to `X-Forwarded-For` when it is absent.
        let hops = forwarded_for(headers);
        let hops = if hops.is_empty() { x_forwarded_for(headers) } else { hops };
        let mut client = peer;
        for hop in hops.into_iter().rev() {
            match hop {
                Some(ip) if self.trusts(ip) => client = ip,
                Some(ip) => return ip,
                // An unknown or obfuscated hop: stop at the last address we could trust.
                None => return client,
            }
        }
        client
    }
}

fn x_forwarded_for(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| parse_node(s.trim()))
        .collect()
}

fn forwarded_for(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    headers
        .get_all(http::header::FORWARDED)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|element| {
            element.split(';').find_map(|pair| {
                let (k, v) = pair.trim().split_once('=')?;
                k.eq_ignore_ascii_case("for").then(|| parse_node(v.trim().trim_matches('"')))
            })
        })
        .collect()
}

/// An address as proxies write it: `1.2.3.4`, `1.2.3.4:80`, `[2001:db8::1]:80` or `2001:db8::1`.
fn parse_node(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse() {
        return Some(ip);
    }
    if let Some(rest) = s.strip_prefix('[') {
        return rest.split(']').next()?.parse().ok();
    }
    s.rsplit_once(':').and_then(|(host, _port)| host.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    #[test]
    fn untrusted_peer_headers_are_ignored() {
        let t = TrustedProxies::parse(["10.0.0.0/8"]).unwrap();
        let h = headers(&[("x-forwarded-for", "1.1.1.1")]);
        assert_eq!(t.client_ip("203.0.113.9".parse().unwrap(), &h), "203.0.113.9".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn right_most_untrusted_hop_wins_over_spoofed_left_entries() {
        let t = TrustedProxies::parse(["10.0.0.0/8"]).unwrap();
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 198.51.100.7, 10.0.0.2")]);
        assert_eq!(t.client_ip("10.0.0.1".parse().unwrap(), &h), "198.51.100.7".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn forwarded_header_with_ports_and_ipv6() {
        let t = TrustedProxies::parse(["::1"]).unwrap();
        let h = headers(&[("forwarded", r#"for="[2001:db8::7]:4711";proto=https, for=192.0.2.60:8080"#)]);
        assert_eq!(t.client_ip("::1".parse().unwrap(), &h), "192.0.2.60".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn obfuscated_hop_stops_at_the_last_trusted_address() {
        let t = TrustedProxies::parse(["10.0.0.0/8"]).unwrap();
        let h = headers(&[("forwarded", "for=unknown, for=10.0.0.3")]);
        assert_eq!(t.client_ip("10.0.0.1".parse().unwrap(), &h), "10.0.0.3".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn bad_network_is_an_error_naming_it() {
        let err = TrustedProxies::parse(["10.0.0.0/8", "ten.0.0.0"]).unwrap_err();
        assert!(err.to_string().contains("ten.0.0.0"), "{err}");
    }
}
