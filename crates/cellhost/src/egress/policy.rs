//! Which destinations the egress proxy lets a kernel reach: host names on
//! the allow list (`*.` wildcards), resolved by the host, and never an
//! address in loopback, private, link-local, shared, multicast or
//! unspecified ranges unless the operator opted that range in.

use std::net::IpAddr;

/// `[sandbox] network = "allowlist"` settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    /// Host names (`pypi.org`) and wildcards (`*.githubusercontent.com`,
    /// which matches subdomains, not the bare name).
    pub allow_hosts: Vec<String>,
    /// Ranges otherwise refused that the operator allows anyway (tests
    /// host their "allowed" server on loopback: `127.0.0.0/8`).
    pub allow_cidrs: Vec<Cidr>,
    /// Host names never reachable whatever the list says (the daemon's own
    /// and `[[tools]]` endpoints' hosts).
    pub deny_hosts: Vec<String>,
}

/// An address range, `10.0.0.0/8` or `::1/128`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    /// The network address; bits past the prefix are ignored when
    /// matching.
    pub addr: IpAddr,
    /// Prefix length: at most 32 for IPv4, 128 for IPv6 (checked by
    /// `FromStr`; 0 matches every address of the family).
    pub bits: u8,
}

impl std::str::FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Cidr, String> {
        let bad = || format!("{s:?} is not an address range like 127.0.0.0/8");
        let (a, b) = s.split_once('/').ok_or_else(bad)?;
        let addr: IpAddr = a.parse().map_err(|_| bad())?;
        let bits: u8 = b.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if bits > max {
            return Err(bad());
        }
        Ok(Cidr { addr, bits })
    }
}

impl Cidr {
    /// `ip` lies in this range. An IPv4 address is never in an IPv6
    /// range nor the other way round (`::ffff:a.b.c.d` is not matched by
    /// an IPv4 range).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let to_bits = |ip: IpAddr| -> (u128, u8) {
            match ip {
                IpAddr::V4(v) => (u128::from(u32::from(v)) << 96, 32),
                IpAddr::V6(v) => (u128::from(v), 128),
            }
        };
        let ((net, w1), (x, w2)) = (to_bits(self.addr), to_bits(ip));
        if w1 != w2 {
            return false;
        }
        let bits = u32::from(self.bits);
        if bits == 0 {
            return true;
        }
        let mask = u128::MAX << (128 - bits);
        (net & mask) == (x & mask)
    }
}

impl EgressPolicy {
    /// Why `host` may not be asked for at all (before resolving), if so.
    pub(crate) fn refuse_name(&self, host: &str) -> Option<String> {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        if host.parse::<IpAddr>().is_ok() || host.starts_with('[') {
            return Some(format!(
                "{host} is an IP address; the egress allow list admits host names only"
            ));
        }
        if self
            .deny_hosts
            .iter()
            .any(|d| d.eq_ignore_ascii_case(&host))
        {
            return Some(format!(
                "{host} is the daemon's or a [[tools]] endpoint's host; kernels reach tools only \
                 through their `tools` module"
            ));
        }
        let allowed = self.allow_hosts.iter().any(|p| {
            let p = p.to_ascii_lowercase();
            match p.strip_prefix("*.") {
                Some(suffix) => host.ends_with(&format!(".{suffix}")),
                None => p == host,
            }
        });
        if !allowed {
            return Some(format!(
                "{host} is not on the allow list ([sandbox] allow_hosts: {})",
                if self.allow_hosts.is_empty() {
                    "empty".to_owned()
                } else {
                    self.allow_hosts.join(", ")
                }
            ));
        }
        None
    }

    /// Why the resolved address `ip` may not be reached, if so.
    pub(crate) fn refuse_addr(&self, ip: IpAddr) -> Option<String> {
        if self.allow_cidrs.iter().any(|c| c.contains(ip)) {
            return None;
        }
        let what = match ip {
            IpAddr::V4(v) => {
                let o = v.octets();
                if v.is_loopback() {
                    Some("loopback")
                } else if v.is_private() {
                    Some("private")
                } else if v.is_link_local() {
                    Some("link-local")
                } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
                    Some("shared (CGNAT)")
                } else if v.is_unspecified() || v.is_broadcast() || v.is_multicast() || o[0] == 0 {
                    Some("non-routable")
                } else {
                    None
                }
            }
            IpAddr::V6(v) => {
                let seg = v.segments();
                if let Some(v4) = v.to_ipv4_mapped() {
                    return self.refuse_addr(IpAddr::V4(v4));
                }
                if v.is_loopback() {
                    Some("loopback")
                } else if (seg[0] & 0xfe00) == 0xfc00 {
                    Some("private (unique local)")
                } else if (seg[0] & 0xffc0) == 0xfe80 {
                    Some("link-local")
                } else if v.is_unspecified() || v.is_multicast() {
                    Some("non-routable")
                } else {
                    None
                }
            }
        }?;
        Some(format!(
            "it resolves to {ip}, a {what} address; kernels may not reach the host or its networks"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> EgressPolicy {
        EgressPolicy {
            allow_hosts: vec!["pypi.org".into(), "*.githubusercontent.com".into()],
            allow_cidrs: vec![],
            deny_hosts: vec!["tools.internal".into()],
        }
    }

    #[test]
    fn names_on_the_list_pass_and_others_say_why() {
        let p = policy();
        assert_eq!(p.refuse_name("pypi.org"), None);
        assert_eq!(p.refuse_name("PyPI.org."), None);
        assert_eq!(p.refuse_name("raw.githubusercontent.com"), None);
        assert!(p
            .refuse_name("githubusercontent.com")
            .unwrap()
            .contains("not on the allow list"));
        assert!(p.refuse_name("evilpypi.org").is_some());
        assert!(p.refuse_name("1.2.3.4").unwrap().contains("IP address"));
        assert!(p.refuse_name("[::1]").unwrap().contains("IP address"));
        assert!(p.refuse_name("tools.internal").unwrap().contains("tools"));
    }

    #[test]
    fn host_ranges_are_refused_unless_opted_in() {
        let mut p = policy();
        for (ip, what) in [
            ("127.0.0.1", "loopback"),
            ("10.77.0.2", "private"),
            ("192.168.1.1", "private"),
            ("169.254.169.254", "link-local"),
            ("100.64.0.1", "CGNAT"),
            ("0.0.0.0", "non-routable"),
            ("::1", "loopback"),
            ("fd00::1", "unique local"),
            ("::ffff:127.0.0.1", "loopback"),
        ] {
            let why = p.refuse_addr(ip.parse().unwrap()).unwrap_or_default();
            assert!(why.contains(what), "{ip}: {why}");
        }
        assert_eq!(p.refuse_addr("151.101.0.223".parse().unwrap()), None);
        p.allow_cidrs.push("127.0.0.0/8".parse().unwrap());
        assert_eq!(p.refuse_addr("127.0.0.1".parse().unwrap()), None);
        assert!(p.refuse_addr("10.0.0.1".parse().unwrap()).is_some());
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
    }
}
