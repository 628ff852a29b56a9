//! Per-client quotas: how many sessions and processes one Noise client key, and one peer
//! address, may hold at once, below the server-wide `max_sessions`.
//!
//! A session belongs to the client that created it: its static key (Noise) and its peer
//! address (the TCP peer of the `ws://` connection or of the Noise link). A `ws://` client is
//! counted by its address only; a Noise client by its key **and** its link's address, so that
//! neither a key used from many hosts nor many keys from one host can take every slot. A
//! resumed session stays its creator's. Its processes (running, or exited and retained) count
//! against the same owner. stdio has neither: the server-wide limits alone apply.
//!
//! The counts are taken from the sessions themselves when a session or process is admitted
//! (never kept on the side, so they cannot drift from what exists); admissions are serialised
//! so that two at once cannot both pass the last slot. This module holds the rule; it must
//! never decide a JSON-RPC code (that is `connection/error_map.rs`).

/// The unit the per-address quotas count: an IPv4 address, or the /64 prefix of an IPv6
/// address — the HTTP front's own key for its handshake slots, so both count a host alike.
pub use execrelay_io::http::AddressKey;

/// Who owns a session, for the quotas.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owner {
    /// The client's static key (Noise).
    pub key: Option<Vec<u8>>,
    /// The creator's peer address.
    pub address: Option<AddressKey>,
}

/// Which quota a count hit; the name is the limit clients see in `data.limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// `maxSessionsPerKey`, `maxSessionsPerAddress`, `maxProcessesPerKey`,
    /// `maxProcessesPerAddress`.
    pub limit: &'static str,
    /// The quota in force.
    pub value: usize,
}

/// How much of something an owner's key and address hold, and their quotas.
#[derive(Debug, Clone, Copy)]
pub(super) struct Usage {
    pub(super) by_key: usize,
    pub(super) by_address: usize,
}

impl Usage {
    /// The rule: one more is refused when the key or the address already holds its quota
    /// (the key first: it names the client more exactly).
    pub(super) fn admit(
        &self,
        owner: &Owner,
        per_key: Quota,
        per_address: Quota,
    ) -> Result<(), Quota> {
        if owner.key.is_some() && self.by_key >= per_key.value {
            return Err(per_key);
        }
        if owner.address.is_some() && self.by_address >= per_address.value {
            return Err(per_address);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    #[test]
    fn ipv6_counts_by_its_64_prefix_and_mapped_ipv4_as_ipv4() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(AddressKey::of(a), AddressKey::of(b));
        assert_ne!(AddressKey::of(a), AddressKey::of(c));
        let v4: IpAddr = "10.1.2.3".parse().unwrap();
        let mapped: IpAddr = "::ffff:10.1.2.3".parse().unwrap();
        assert_eq!(AddressKey::of(v4), AddressKey::of(mapped));
    }

    #[test]
    fn the_key_is_checked_first_and_absent_parts_are_not_counted() {
        let per_key = Quota {
            limit: "k",
            value: 2,
        };
        let per_address = Quota {
            limit: "a",
            value: 3,
        };
        let both = Owner {
            key: Some(vec![1]),
            address: Some(AddressKey::V4([127, 0, 0, 1])),
        };
        let usage = |k, a| Usage {
            by_key: k,
            by_address: a,
        };
        assert_eq!(usage(1, 2).admit(&both, per_key, per_address), Ok(()));
        assert_eq!(usage(2, 3).admit(&both, per_key, per_address), Err(per_key));
        assert_eq!(
            usage(1, 3).admit(&both, per_key, per_address),
            Err(per_address)
        );
        let address_only = Owner {
            key: None,
            ..both.clone()
        };
        assert_eq!(
            usage(9, 2).admit(&address_only, per_key, per_address),
            Ok(())
        );
        assert_eq!(
            usage(9, 9).admit(&Owner::default(), per_key, per_address),
            Ok(())
        );
    }
}
