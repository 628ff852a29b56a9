//! Handshake slots per peer address: how many connections one address may have open before
//! their upgrade (or reply), so that one address trickling request heads cannot take every
//! slot of a listener.
//!
//! An address is an IPv4 address, or the /64 prefix of an IPv6 address: one host usually owns
//! a whole /64, so counting single IPv6 addresses would give it billions of caps. The table
//! holds one entry per address with a connection in its handshake, so it is bounded by the
//! listener's handshake slots. It must never be consulted after the upgrade: established
//! connections are capped elsewhere (`max_connections`, `max_links`).

use execrelay_protocol::address::AddressKey;
use execrelay_protocol::sync::lock;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// The per-address counts of one listener.
#[derive(Debug)]
pub struct AddressSlots {
    per_address: usize,
    held: Mutex<HashMap<AddressKey, usize>>,
}

/// One connection's slot; given back on drop.
#[derive(Debug)]
pub struct AddressSlot {
    slots: Arc<AddressSlots>,
    key: AddressKey,
}

impl AddressSlots {
    /// At most `per_address` slots per address.
    pub fn new(per_address: usize) -> Arc<AddressSlots> {
        Arc::new(AddressSlots {
            per_address,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// A slot for a connection from `ip`, or `None` when its address holds them all.
    pub fn try_take(self: &Arc<Self>, ip: IpAddr) -> Option<AddressSlot> {
        let key = AddressKey::of(ip);
        let mut held = lock(&self.held);
        let count = held.entry(key).or_insert(0);
        if *count >= self.per_address {
            return None;
        }
        *count += 1;
        Some(AddressSlot {
            slots: Arc::clone(self),
            key,
        })
    }

    /// Slots `ip`'s address holds now.
    pub fn held_by(&self, ip: IpAddr) -> usize {
        let held = lock(&self.held);
        held.get(&AddressKey::of(ip)).copied().unwrap_or(0)
    }

    /// Addresses holding a slot now (bounded by the listener's handshake slots).
    pub fn addresses(&self) -> usize {
        lock(&self.held).len()
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut held = lock(&self.slots.held);
        if let Some(count) = held.get_mut(&self.key) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_is_capped_others_are_not() {
        let slots = AddressSlots::new(2);
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.1".parse().unwrap();
        let first = slots.try_take(a).expect("first");
        let second = slots.try_take(a).expect("second, at the cap");
        assert!(slots.try_take(a).is_none(), "one over the cap");
        let other = slots.try_take(b).expect("another address is not affected");
        assert_eq!(slots.held_by(a), 2);
        drop(first);
        let again = slots.try_take(a).expect("a freed slot lets the next in");
        drop((second, again, other));
        assert_eq!(slots.addresses(), 0, "empty entries are removed");
    }

    #[test]
    fn ipv6_counts_by_64_prefix_and_mapped_ipv4_as_ipv4() {
        let slots = AddressSlots::new(1);
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let same_prefix: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let other_prefix: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        let _held = slots.try_take(a).expect("first");
        assert!(slots.try_take(same_prefix).is_none());
        assert!(slots.try_take(other_prefix).is_some());
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        let _v4 = slots.try_take(v4).expect("v4");
        assert!(slots.try_take(mapped).is_none());
    }
}
