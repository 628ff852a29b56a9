//! Byte budgets: how many bytes a connection, a link or the whole server may hold of what its
//! peers sent, and the [`Charge`] that holds them.
//!
//! A [`ByteBudget`] is a limit and a running total, optionally under a parent: a connection's
//! budget sits under the server's, so a charge on the connection counts on the server too,
//! and is refused when either is full. A charge is taken before the memory it pays for is
//! held (or grown) and given back when the [`Charge`] is dropped, so the total can never
//! drift from what is actually held: nothing has to remember to release it.
//!
//! Charging never waits: a charge that does not fit is refused with [`OverBudget`], naming
//! the limit that was full, and the caller refuses what it was about to hold (a request gets
//! `-32004`, a Noise stream is reset). Lock-free: one atomic per level.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A charge that did not fit: which limit was full (declared with the record layer, which
/// reports it for a message over its budget).
pub use execrelay_protocol::noise::budget::OverBudget;

#[derive(Debug)]
struct Level {
    name: &'static str,
    limit: usize,
    used: AtomicUsize,
    parent: Option<Arc<Level>>,
}

impl Level {
    /// Add `bytes` here if it fits under the limit (or unconditionally with `force`).
    fn add(&self, bytes: usize, force: bool) -> bool {
        if force {
            self.used.fetch_add(bytes, Ordering::Relaxed);
            return true;
        }
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.limit)
            })
            .is_ok()
    }

    fn sub(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Charge `bytes` on this level and every ancestor, or on none of them.
    fn charge_chain(self: &Arc<Self>, bytes: usize, force: bool) -> Result<(), OverBudget> {
        let mut level = Some(self);
        while let Some(l) = level {
            if !l.add(bytes, force) {
                // Give back what the levels below took.
                let mut undo = Some(self);
                while let Some(u) = undo {
                    if Arc::ptr_eq(u, l) {
                        break;
                    }
                    u.sub(bytes);
                    undo = u.parent.as_ref();
                }
                return Err(OverBudget {
                    limit: l.name,
                    max: l.limit,
                });
            }
            level = l.parent.as_ref();
        }
        Ok(())
    }

    fn release_chain(&self, bytes: usize) {
        self.sub(bytes);
        let mut level = self.parent.as_ref();
        while let Some(l) = level {
            l.sub(bytes);
            level = l.parent.as_ref();
        }
    }
}

/// A limit in bytes, shared by everything that charges it (clones share the total).
#[derive(Debug, Clone)]
pub struct ByteBudget {
    level: Arc<Level>,
}

impl ByteBudget {
    /// A budget of `limit` bytes named `name` (the name a refusal reports).
    pub fn new(name: &'static str, limit: usize) -> ByteBudget {
        ByteBudget {
            level: Arc::new(Level {
                name,
                limit,
                used: AtomicUsize::new(0),
                parent: None,
            }),
        }
    }

    /// A budget that never refuses (a client's opener, tests).
    pub fn unlimited() -> ByteBudget {
        ByteBudget::new("unlimited", usize::MAX)
    }

    /// A budget of `limit` bytes under this one: its charges count here too, and are refused
    /// when either is full.
    pub fn child(&self, name: &'static str, limit: usize) -> ByteBudget {
        ByteBudget {
            level: Arc::new(Level {
                name,
                limit,
                used: AtomicUsize::new(0),
                parent: Some(self.level.clone()),
            }),
        }
    }

    /// Hold `bytes` against this budget and its ancestors, or refuse, naming the first full
    /// one (this budget first, then up).
    pub fn try_charge(&self, bytes: usize) -> Result<Charge, OverBudget> {
        self.level.charge_chain(bytes, false)?;
        Ok(Charge {
            level: Some(self.level.clone()),
            bytes,
        })
    }

    /// Hold `bytes` even past the limits: for the few small things that must never be
    /// refused (each caller bounds what it forces). It still counts, so later charges see it.
    pub fn force_charge(&self, bytes: usize) -> Charge {
        // Forced charges cannot fail.
        let _ = self.level.charge_chain(bytes, true);
        Charge {
            level: Some(self.level.clone()),
            bytes,
        }
    }

    /// Bytes held against this budget now (its children's charges included).
    pub fn used(&self) -> usize {
        self.level.used.load(Ordering::Relaxed)
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.level.limit
    }

    /// The name refusals report.
    pub fn name(&self) -> &'static str {
        self.level.name
    }
}

/// Bytes held against a [`ByteBudget`] (and its ancestors); given back on drop.
#[derive(Debug, Default)]
pub struct Charge {
    level: Option<Arc<Level>>,
    bytes: usize,
}

impl Charge {
    /// A charge of nothing, against nothing.
    pub fn none() -> Charge {
        Charge::default()
    }

    /// The bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Hold `more` bytes on the same budget, or refuse (and keep what is held).
    pub fn try_grow(&mut self, more: usize) -> Result<(), OverBudget> {
        if let Some(level) = &self.level {
            level.charge_chain(more, false)?;
        }
        self.bytes += more;
        Ok(())
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if let Some(level) = &self.level {
            level.release_chain(self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_charge_fits_to_the_byte_and_is_given_back_on_drop() {
        let b = ByteBudget::new("b", 100);
        let c = b.try_charge(100).unwrap();
        assert_eq!(b.used(), 100);
        assert_eq!(
            b.try_charge(1).unwrap_err(),
            OverBudget {
                limit: "b",
                max: 100
            }
        );
        drop(c);
        assert_eq!(b.used(), 0);
        assert!(b.try_charge(100).is_ok());
    }

    #[test]
    fn a_child_charges_its_parent_and_names_the_full_level() {
        let server = ByteBudget::new("server", 150);
        let a = server.child("conn", 100);
        let b = server.child("conn", 100);
        let ca = a.try_charge(100).unwrap();
        assert_eq!(
            a.try_charge(1).unwrap_err().limit,
            "conn",
            "the child is full"
        );
        assert_eq!(server.used(), 100);
        // The other child has room of its own but the parent has only 50 left.
        let e = b.try_charge(51).unwrap_err();
        assert_eq!(
            e,
            OverBudget {
                limit: "server",
                max: 150
            }
        );
        assert_eq!(b.used(), 0, "a refusal above leaves nothing charged below");
        let cb = b.try_charge(50).unwrap();
        assert_eq!(server.used(), 150);
        drop(ca);
        assert_eq!((a.used(), server.used()), (0, 50));
        drop(cb);
        assert_eq!(server.used(), 0);
    }

    #[test]
    fn growing_is_checked_and_a_refused_growth_keeps_what_is_held() {
        let server = ByteBudget::new("server", 1000);
        let link = server.child("link", 10);
        let mut c = link.try_charge(4).unwrap();
        c.try_grow(6).unwrap();
        assert_eq!((c.bytes(), link.used(), server.used()), (10, 10, 10));
        assert_eq!(c.try_grow(1).unwrap_err().limit, "link");
        assert_eq!((c.bytes(), link.used(), server.used()), (10, 10, 10));
        drop(c);
        assert_eq!((link.used(), server.used()), (0, 0));
    }

    #[test]
    fn forced_charges_count_but_are_never_refused() {
        let b = ByteBudget::new("b", 10);
        let f = b.force_charge(25);
        assert_eq!(b.used(), 25);
        assert!(
            b.try_charge(1).is_err(),
            "later charges see the forced bytes"
        );
        drop(f);
        assert!(b.try_charge(10).is_ok());
    }

    #[test]
    fn none_and_unlimited_never_refuse() {
        let mut n = Charge::none();
        n.try_grow(usize::MAX).unwrap();
        drop(n);
        let u = ByteBudget::unlimited();
        let _a = u.try_charge(1 << 40).unwrap();
        let _b = u.try_charge(1 << 40).unwrap();
    }

    #[test]
    fn concurrent_charges_never_exceed_the_limit() {
        let b = ByteBudget::new("b", 1000);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        if let Ok(c) = b.try_charge(7) {
                            assert!(b.used() <= 1000);
                            drop(c);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(b.used(), 0);
    }
}
