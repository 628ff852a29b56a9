//! The unit a per-address cap counts: an IPv4 address, or the /64 prefix of an IPv6 address
//! (one host usually owns a whole /64, so counting single IPv6 addresses would give it billions
//! of caps). Shared by the HTTP front's handshake slots and the router's per-address budgets.
//!
//! A plain value: it must never hold a table or a lock.

use std::net::IpAddr;

/// The unit a cap applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddressKey {
    /// An IPv4 address (an IPv4-mapped IPv6 address counts as its IPv4 address).
    V4([u8; 4]),
    /// The first 64 bits of an IPv6 address.
    V6Prefix([u8; 8]),
}

impl AddressKey {
    /// The key of `ip`.
    pub fn of(ip: IpAddr) -> AddressKey {
        match ip {
            IpAddr::V4(v4) => AddressKey::V4(v4.octets()),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => AddressKey::V4(v4.octets()),
                None => {
                    let mut prefix = [0u8; 8];
                    prefix.copy_from_slice(&v6.octets()[..8]);
                    AddressKey::V6Prefix(prefix)
                }
            },
        }
    }
}
