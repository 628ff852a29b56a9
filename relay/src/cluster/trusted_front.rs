//! Which peers may say they are the cluster's front (`trusted_front`): the addresses of the
//! load balancer (HAProxy) whose `X-Execrelay-Front` header a relay honours. Sans-IO: a parsed
//! list of IP addresses and CIDR blocks, and a membership test on a peer's address.
//!
//! # What this module owns
//!
//! The syntax of the setting (`ADDR[,ADDR…]`, each an IP address or a CIDR block, at most
//! [`MAX_TRUSTED_FRONTS`]), its errors, and the match of a TCP peer address against it
//! (IPv4-mapped IPv6 peers match their IPv4 entries).
//!
//! # What it must never do
//!
//! Trust anything by default: an empty list (the default) trusts no peer, so the header is
//! ignored from everyone until an operator names the front. It never looks at a header
//! itself, nor at anything a peer says about its address (`X-Forwarded-For` and the like):
//! only the TCP peer address the relay accepted.

use std::net::IpAddr;

/// The most entries `trusted_front` holds: a front is one or a few load balancers (an HA
/// pair, a subnet of them); a longer list is a configuration mistake, and every client link
/// that carries the header is checked against the whole list.
pub const MAX_TRUSTED_FRONTS: usize = 64;

/// One entry: an address block (`10.0.0.0/8`; a bare address is its own block, `/32` or
/// `/128`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Block {
    addr: IpAddr,
    prefix: u8,
}

impl Block {
    fn contains(&self, peer: IpAddr) -> bool {
        match (self.addr, peer) {
            (IpAddr::V4(net), IpAddr::V4(p)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(p) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(p)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(p) & mask
            }
            _ => false,
        }
    }

    fn parse(word: &str) -> Result<Block, String> {
        let bad = || {
            format!(
                "{word:?} is not an IP address or a CIDR block (e.g. 127.0.0.1, 10.0.0.0/24, fd00::/8)"
            )
        };
        let (addr, prefix) = match word.split_once('/') {
            None => {
                let addr: IpAddr = word.parse().map_err(|_| bad())?;
                let max = if addr.is_ipv4() { 32 } else { 128 };
                (addr, max)
            }
            Some((a, p)) => {
                let addr: IpAddr = a.parse().map_err(|_| bad())?;
                let max = if addr.is_ipv4() { 32 } else { 128 };
                // Digits only: `+8` or ` 8` would parse as a number but is not CIDR.
                if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                let prefix: u8 = p.parse().map_err(|_| bad())?;
                if prefix > max {
                    return Err(format!(
                        "{word:?}: a prefix length of {prefix} is longer than the address ({max} bits)"
                    ));
                }
                (addr, prefix)
            }
        };
        let block = Block { addr, prefix };
        // A block with host bits set is most likely a typo for another block: say which.
        let network = block.network();
        if network != addr {
            return Err(format!(
                "{word:?} has host bits set: did you mean {network}/{prefix}?"
            ));
        }
        Ok(block)
    }

    /// The block's first address.
    fn network(&self) -> IpAddr {
        match self.addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V4((u32::from(a) & mask).into())
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V6((u128::from(a) & mask).into())
            }
        }
    }
}

impl std::fmt::Display for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let full = if self.addr.is_ipv4() { 32 } else { 128 };
        if self.prefix == full {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.prefix)
        }
    }
}

/// The peers whose `X-Execrelay-Front` header a relay honours (`--trusted-front`,
/// `trusted_front`): IP addresses and CIDR blocks, at most [`MAX_TRUSTED_FRONTS`]. Empty by
/// default: no peer is trusted. Written as a comma list (`127.0.0.1,10.1.0.0/24`); `none`
/// (or nothing) is the empty list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedFronts {
    blocks: Vec<Block>,
}

impl TrustedFronts {
    /// No peer trusted (the default).
    pub fn none() -> TrustedFronts {
        TrustedFronts::default()
    }

    /// Whether no peer is trusted.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// How many entries the list holds.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether a connection from `peer` (its TCP peer address) is the front's. An
    /// IPv4-mapped IPv6 peer (`::ffff:10.0.0.5`, as a dual-stack listener sees IPv4 clients)
    /// is matched as its IPv4 address.
    pub fn contains(&self, peer: IpAddr) -> bool {
        let peer = peer.to_canonical();
        self.blocks.iter().any(|b| b.contains(peer))
    }

    fn from_words<'a>(words: impl Iterator<Item = &'a str>) -> Result<TrustedFronts, String> {
        let mut blocks = Vec::new();
        for word in words.map(str::trim).filter(|w| !w.is_empty()) {
            if blocks.len() == MAX_TRUSTED_FRONTS {
                return Err(format!(
                    "more than {MAX_TRUSTED_FRONTS} entries: list the front's addresses, or cover them with CIDR blocks"
                ));
            }
            let block = Block::parse(word)?;
            if !blocks.contains(&block) {
                blocks.push(block);
            }
        }
        Ok(TrustedFronts { blocks })
    }
}

impl std::fmt::Display for TrustedFronts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.blocks.is_empty() {
            return f.write_str("none");
        }
        for (i, b) in self.blocks.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{b}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for TrustedFronts {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().eq_ignore_ascii_case("none") {
            return Ok(TrustedFronts::none());
        }
        TrustedFronts::from_words(s.split(','))
    }
}

impl<'de> serde::Deserialize<'de> for TrustedFronts {
    /// A comma list in one string (as the flag), or an array of strings.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Given {
            One(String),
            Many(Vec<String>),
        }
        let named =
            |e: String| serde::de::Error::custom(format!("trusted_front (--trusted-front): {e}"));
        match Given::deserialize(d).map_err(|_: D::Error| {
            named(
                "expected a string (\"127.0.0.1,10.0.0.0/24\") or an array of strings ([\"127.0.0.1\"])".into(),
            )
        })? {
            Given::One(s) => s.parse().map_err(named),
            Given::Many(words) => {
                TrustedFronts::from_words(words.iter().map(String::as_str)).map_err(named)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_and_blocks_match_their_peers_only() {
        let t: TrustedFronts = "127.0.0.1, 10.1.0.0/24,fd00::/8".parse().unwrap();
        assert_eq!(t.len(), 3);
        for yes in [
            "127.0.0.1",
            "10.1.0.0",
            "10.1.0.255",
            "fd12::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(t.contains(ip(yes)), "{yes}");
        }
        for no in [
            "127.0.0.2",
            "10.1.1.0",
            "10.0.255.255",
            "fe80::1",
            "::1",
            "::ffff:10.2.0.1",
        ] {
            assert!(!t.contains(ip(no)), "{no}");
        }
        assert_eq!(t.to_string(), "127.0.0.1,10.1.0.0/24,fd00::/8");
        let all: TrustedFronts = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("203.0.113.9")));
        assert!(
            !all.contains(ip("2001:db8::1")),
            "an IPv4 block never matches IPv6"
        );
    }

    #[test]
    fn the_default_and_none_trust_no_one() {
        for t in [
            TrustedFronts::default(),
            "none".parse().unwrap(),
            "".parse().unwrap(),
        ] {
            assert!(t.is_empty());
            assert!(!t.contains(ip("127.0.0.1")));
            assert_eq!(t.to_string(), "none");
        }
    }

    #[test]
    fn bad_entries_are_named() {
        for (bad, says) in [
            ("localhost", "not an IP address or a CIDR block"),
            ("10.0.0.0/33", "longer than the address (32 bits)"),
            ("::/129", "longer than the address (128 bits)"),
            ("10.0.0.1/8", "did you mean 10.0.0.0/8?"),
            ("10.0.0.0/", "not an IP address"),
            ("10.0.0.0/+8", "not an IP address"),
            ("127.0.0.1:80", "not an IP address"),
        ] {
            let err = bad.parse::<TrustedFronts>().unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn the_list_is_capped() {
        let at = (0..MAX_TRUSTED_FRONTS)
            .map(|i| format!("10.0.{}.{}", i / 256, i % 256))
            .collect::<Vec<_>>();
        let t: TrustedFronts = at.join(",").parse().unwrap();
        assert_eq!(t.len(), MAX_TRUSTED_FRONTS);
        let over = format!("{},10.9.9.9", at.join(","));
        let err = over.parse::<TrustedFronts>().unwrap_err();
        assert!(
            err.contains(&format!("more than {MAX_TRUSTED_FRONTS}")),
            "{err}"
        );
    }

    #[test]
    fn toml_takes_a_string_or_an_array_and_names_the_key() {
        #[derive(serde::Deserialize)]
        struct S {
            trusted_front: TrustedFronts,
        }
        let s: S = toml::from_str("trusted_front = \"127.0.0.1,10.0.0.0/8\"").unwrap();
        assert_eq!(s.trusted_front.len(), 2);
        let s: S = toml::from_str("trusted_front = [\"127.0.0.1\", \"::1\"]").unwrap();
        assert!(s.trusted_front.contains(ip("::1")));
        for bad in [
            "trusted_front = \"10.0.0.300\"",
            "trusted_front = [\"nope\"]",
            "trusted_front = 7",
        ] {
            let err = toml::from_str::<S>(bad).err().unwrap().to_string();
            assert!(
                err.contains("trusted_front (--trusted-front)"),
                "{bad}: {err}"
            );
        }
    }
}
