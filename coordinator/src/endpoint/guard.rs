//! Where an endpoint may point: `https` only, never a loopback, private,
//! link-local or unspecified address, unless its host is listed in
//! `RUNLEASE_ENDPOINT_ALLOW_HOSTS` (which also allows plain `http`). The
//! URL is checked when it is set; the address is checked again on every
//! connection ([`GuardedResolver`] and [`AllowList::check_literal`]), so a
//! name that resolves somewhere else later cannot move an endpoint inside.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use url::{Host, Url};

/// The longest endpoint URL.
pub use runlease_protocol::limits::MAX_ENDPOINT_URL_LEN as MAX_URL_LEN;

/// The hosts an endpoint may reach although their addresses are internal.
#[derive(Debug, Clone, Default)]
pub struct AllowList {
    hosts: HashSet<String>,
}

/// Why an address is refused, if it is: the kind of address.
pub fn internal_kind(ip: IpAddr) -> Option<&'static str> {
    // An IPv4 address written as IPv6 (::ffff:a.b.c.d) is judged as IPv4.
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) => v4_kind(v4),
        IpAddr::V6(v6) => v6_kind(v6),
    }
}

fn v4_kind(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_unspecified() || a == 0 {
        Some("unspecified")
    } else if ip.is_link_local() {
        Some("link-local")
    } else if ip.is_private() || (a == 100 && (64..128).contains(&b)) {
        // 100.64.0.0/10: carrier-grade NAT, private in practice.
        Some("private")
    } else if ip.is_broadcast() || ip.is_multicast() {
        Some("broadcast or multicast")
    } else {
        None
    }
}

fn v6_kind(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_unspecified() {
        Some("unspecified")
    } else if first & 0xffc0 == 0xfe80 {
        Some("link-local")
    } else if first & 0xfe00 == 0xfc00 {
        Some("private")
    } else if ip.is_multicast() {
        Some("broadcast or multicast")
    } else {
        None
    }
}

/// A URL's host as it is written and compared (addresses without brackets).
fn host_text(url: &Url) -> Option<String> {
    match url.host()? {
        Host::Domain(d) => Some(d.trim_end_matches('.').to_ascii_lowercase()),
        Host::Ipv4(ip) => Some(ip.to_string()),
        Host::Ipv6(ip) => Some(ip.to_string()),
    }
}

impl AllowList {
    /// The list `RUNLEASE_ENDPOINT_ALLOW_HOSTS` gives: comma-separated host
    /// names or addresses (IPv6 with or without brackets).
    pub fn parse(raw: &str) -> Self {
        let hosts = raw
            .split(',')
            .map(|h| h.trim().trim_start_matches('[').trim_end_matches(']'))
            .filter(|h| !h.is_empty())
            .map(|h| match h.parse::<IpAddr>() {
                Ok(ip) => ip.to_string(),
                Err(_) => h.trim_end_matches('.').to_ascii_lowercase(),
            })
            .collect();
        Self { hosts }
    }

    /// Whether `host` (as [`host_text`] writes it) is listed.
    pub fn allows(&self, host: &str) -> bool {
        self.hosts.contains(host)
    }

    /// Checks an endpoint URL as it is set; the error says what is wrong.
    pub fn check_url(&self, raw: &str) -> Result<Url, String> {
        if raw.len() > MAX_URL_LEN {
            return Err(format!("endpoint.url is longer than {MAX_URL_LEN} bytes"));
        }
        let url = Url::parse(raw).map_err(|e| format!("endpoint.url is not a URL: {e}"))?;
        let host = host_text(&url).ok_or("endpoint.url has no host")?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err("endpoint.url must not carry a user name or password".into());
        }
        if url.fragment().is_some() {
            return Err("endpoint.url must not carry a #fragment".into());
        }
        let listed = self.allows(&host);
        match url.scheme() {
            "https" => {}
            "http" if listed => {}
            "http" => {
                return Err(format!(
                    "endpoint.url must use https (plain http only for a host in RUNLEASE_ENDPOINT_ALLOW_HOSTS; {host} is not)"
                ));
            }
            other => return Err(format!("endpoint.url must use https, not {other}")),
        }
        self.check_literal(&url)?;
        Ok(url)
    }

    /// Refuses a URL whose host is an internal address written out (a
    /// connection to it needs no name lookup, so [`GuardedResolver`] never
    /// sees it), unless it is listed.
    pub fn check_literal(&self, url: &Url) -> Result<(), String> {
        let ip = match url.host() {
            Some(Host::Ipv4(ip)) => IpAddr::V4(ip),
            Some(Host::Ipv6(ip)) => IpAddr::V6(ip),
            _ => return Ok(()),
        };
        match internal_kind(ip) {
            Some(kind) if !self.allows(&ip.to_string()) => Err(format!(
                "endpoint.url points to {ip}, a {kind} address; list it in RUNLEASE_ENDPOINT_ALLOW_HOSTS to allow it"
            )),
            _ => Ok(()),
        }
    }
}

/// The name lookup of the endpoint client: answers only the addresses an
/// endpoint may connect to (every address of a listed host; the public ones
/// of any other), so the check holds for the address each connection uses.
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    /// The hosts allowed to be internal.
    pub allow: Arc<AllowList>,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow = self.allow.clone();
        let host = name.as_str().trim_end_matches('.').to_ascii_lowercase();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if allow.allows(&host) {
                return Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs);
            }
            let (public, refused): (Vec<SocketAddr>, Vec<SocketAddr>) =
                addrs.into_iter().partition(|a| internal_kind(a.ip()).is_none());
            if public.is_empty() {
                let what = refused.first().map_or_else(
                    || "no address".to_owned(),
                    |a| {
                        format!(
                            "{}, a {} address",
                            a.ip(),
                            internal_kind(a.ip()).unwrap_or("refused")
                        )
                    },
                );
                let message = format!(
                    "{host} resolves to {what}; list it in RUNLEASE_ENDPOINT_ALLOW_HOSTS to allow it"
                );
                return Err(message.into());
            }
            Ok(Box::new(public.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_named() {
        for (ip, kind) in [
            ("127.0.0.1", "loopback"),
            ("::1", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("192.168.1.1", "private"),
            ("100.64.0.1", "private"),
            ("169.254.169.254", "link-local"),
            ("fe80::1", "link-local"),
            ("fd00::1", "private"),
            ("0.0.0.0", "unspecified"),
            ("::", "unspecified"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:169.254.169.254", "link-local"),
        ] {
            assert_eq!(internal_kind(ip.parse().unwrap()), Some(kind), "{ip}");
        }
        for ip in ["1.1.1.1", "93.184.216.34", "2606:4700::1111"] {
            assert_eq!(internal_kind(ip.parse().unwrap()), None, "{ip}");
        }
    }

    #[test]
    fn urls_are_https_and_public_unless_listed() {
        let none = AllowList::default();
        assert!(none.check_url("https://example.com/hook").is_ok());
        for bad in [
            "http://example.com/",
            "ftp://example.com/",
            "https://127.0.0.1/",
            "https://[::1]:8443/",
            "https://10.0.0.5/",
            "https://169.254.169.254/latest",
            "https://user:pw@example.com/",
            "not a url",
            "https://",
        ] {
            assert!(none.check_url(bad).is_err(), "{bad}");
        }
        let local = AllowList::parse(" 127.0.0.1 , Localhost., [::1]");
        assert!(local.check_url("http://127.0.0.1:8080/").is_ok());
        assert!(local.check_url("http://localhost:8080/").is_ok());
        assert!(local.check_url("https://[::1]:8443/").is_ok());
        assert!(local.check_url("http://example.com/").is_err());
        assert!(local.check_url("https://10.0.0.5/").is_err());
    }
}
