//! Environment links upgraded and still silent: no message 1 yet. When every handshake slot
//! (`max_pending_link_handshakes`) is held, one of them gives its slot up to the newcomer.
//!
//! Why: an exec server sends its message 1 as soon as its upgrade is answered, so a link that
//! stays silent is most likely a squatter (no key is needed to upgrade `/v1/env/ID`). Refusing
//! the newcomer let four addresses of a red team, 16 silent links each and renewed as each
//! timed out, keep every environment from reconnecting. Now the newcomer takes the slot of
//! the oldest silent link **of the address that holds the most**: a squatter spread over few
//! addresses loses its own links first, and an honest environment's link is silent for one
//! round trip only.
//!
//! Owns only the table of silent links (bounded by the handshake slots) and their eviction
//! tokens. It must never evict a link that sent its message 1 (it is doing or has done its
//! Diffie-Hellman; the table forgets it then), nor hold its lock across an `.await`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use execrelay_protocol::address::AddressKey;
use execrelay_protocol::sync::lock;
use tokio_util::sync::CancellationToken;

/// The silent links of one relay, oldest first.
#[derive(Debug, Default)]
pub(crate) struct SilentLinks {
    inner: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    next: u64,
    /// By arrival: the address each came from and the token that evicts it.
    waiting: BTreeMap<u64, (AddressKey, CancellationToken)>,
}

/// One silent link's entry: cancelled (`evicted`) when it must give its slot up; leaves the
/// table when dropped (its message 1 arrived, or it ended).
#[derive(Debug)]
pub(crate) struct Silent {
    table: Arc<SilentLinks>,
    id: u64,
    /// Fires when this link is to give its slot up.
    pub evicted: CancellationToken,
}

impl SilentLinks {
    /// Record a link from `ip` that holds a handshake slot and has sent nothing yet.
    pub fn register(self: &Arc<Self>, ip: IpAddr) -> Silent {
        let evicted = CancellationToken::new();
        let mut t = lock(&self.inner);
        let id = t.next;
        t.next += 1;
        t.waiting.insert(id, (AddressKey::of(ip), evicted.clone()));
        Silent {
            table: Arc::clone(self),
            id,
            evicted,
        }
    }

    /// Evict the oldest silent link of the address with the most of them (it leaves the table
    /// at once, its token fired); false when none is silent.
    pub fn evict_one(&self) -> bool {
        let mut t = lock(&self.inner);
        let mut counts: std::collections::HashMap<AddressKey, usize> =
            std::collections::HashMap::new();
        for (addr, _) in t.waiting.values() {
            *counts.entry(*addr).or_insert(0) += 1;
        }
        let Some(most) = counts.values().copied().max() else {
            return false;
        };
        // The oldest of those addresses' links: the map is in arrival order.
        let victim = t
            .waiting
            .iter()
            .find(|(_, (addr, _))| counts.get(addr) == Some(&most))
            .map(|(id, _)| *id);
        match victim.and_then(|id| t.waiting.remove(&id)) {
            Some((_, token)) => {
                token.cancel();
                true
            }
            None => false,
        }
    }

    /// Links silent now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        lock(&self.inner).waiting.len()
    }
}

impl Drop for Silent {
    fn drop(&mut self) {
        lock(&self.table.inner).waiting.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(n: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, n))
    }

    #[test]
    fn the_oldest_link_of_the_address_with_the_most_is_evicted() {
        let table = Arc::new(SilentLinks::default());
        let honest = table.register(ip(1));
        let a1 = table.register(ip(2));
        let b1 = table.register(ip(3));
        let a2 = table.register(ip(2));
        assert!(table.evict_one());
        assert!(
            a1.evicted.is_cancelled(),
            "the oldest of the address holding two"
        );
        assert!(!a2.evicted.is_cancelled() && !b1.evicted.is_cancelled());
        assert!(!honest.evicted.is_cancelled());
        // Now every address holds one: the oldest of all goes.
        assert!(table.evict_one());
        assert!(honest.evicted.is_cancelled());
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn a_link_that_spoke_or_ended_is_never_evicted() {
        let table = Arc::new(SilentLinks::default());
        let spoke = table.register(ip(1));
        drop(spoke);
        assert_eq!(table.len(), 0);
        assert!(!table.evict_one(), "nothing silent: nothing to evict");
        let s = table.register(ip(1));
        assert!(table.evict_one());
        assert!(s.evicted.is_cancelled());
        // Evicted entries leave at once: a second eviction finds nothing.
        assert!(!table.evict_one());
        drop(s);
        assert_eq!(table.len(), 0);
    }

    #[test]
    fn an_ipv6_slash_64_counts_as_one_address() {
        let table = Arc::new(SilentLinks::default());
        let v6 =
            |last: u16| IpAddr::V6(std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, last));
        let other = table.register(ip(9));
        let a = table.register(v6(1));
        let _b = table.register(v6(2));
        assert!(table.evict_one());
        assert!(
            a.evicted.is_cancelled(),
            "two links of one /64 outnumber one"
        );
        assert!(!other.evicted.is_cancelled());
    }
}
