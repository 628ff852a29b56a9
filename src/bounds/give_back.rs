//! Memory handed back to the system after a burst. The C library's allocator (glibc's
//! `malloc`) keeps what a process freed in its arenas for the next allocation, and returns it
//! only from the top of each arena: an exec server that held its whole output budget for a
//! moment (hundreds of MiB of chunks) kept that much resident for the rest of its life, though
//! none of it was in use (the soak measured 300 MiB resident at rest, 25 MiB after
//! `malloc_trim`). [`GiveBack`] is the rule for when to ask the allocator to return what it
//! keeps; [`give_back`] asks.
//!
//! The rule is sans-IO (fed what the server holds now and whether it is idle, by a driver that
//! looks every [`GIVE_BACK_CHECK_MS`]): it never reads a clock or the allocator itself.

/// How often the server's driver looks (ms).
pub const GIVE_BACK_CHECK_MS: u64 = 5_000;

/// Output the server let go of since its last high-water mark before it hands memory back
/// (bytes): large enough that a steady load never pays for it, small beside the output budget.
pub const GIVE_BACK_AFTER_BYTES: u64 = 32 << 20;

/// When to hand memory back: after the output held fell by [`GIVE_BACK_AFTER_BYTES`] from its
/// highest since the last time, and once the server has been idle (no session) for
/// [`IDLE_LOOKS`] looks in a row after it was not (by then the last connections' buffers are
/// gone too).
#[derive(Debug, Default, Clone)]
pub struct GiveBack {
    high: u64,
    idle_looks: u32,
    busy_since: bool,
}

/// Looks in a row an idle server waits before it hands memory back.
pub const IDLE_LOOKS: u32 = 2;

impl GiveBack {
    /// A rule that has seen nothing yet (an idle server).
    pub fn new() -> GiveBack {
        GiveBack::default()
    }

    /// One look: `held` bytes of output held now, `idle` no session at all. Whether to hand
    /// memory back now.
    pub fn observe(&mut self, held: u64, idle: bool) -> bool {
        self.high = self.high.max(held);
        self.idle_looks = if idle {
            self.idle_looks.saturating_add(1)
        } else {
            0
        };
        self.busy_since |= !idle;
        let fell = self.high - held >= GIVE_BACK_AFTER_BYTES;
        let settled = self.busy_since && self.idle_looks == IDLE_LOOKS;
        if fell || settled {
            self.high = held;
            self.busy_since = !idle;
            return true;
        }
        false
    }
}

/// Ask the allocator to return the memory it keeps (glibc's `malloc_trim`); nothing where
/// the C library has no such call.
pub fn give_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only releases free memory of the allocator; it has no
    // precondition and is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    #[test]
    fn a_steady_load_never_gives_back() {
        let mut g = GiveBack::new();
        for held in [10 * MB, 40 * MB, 20 * MB, 45 * MB, 14 * MB] {
            assert!(!g.observe(held, false), "{held}");
        }
    }

    #[test]
    fn a_fall_by_the_threshold_from_the_high_water_mark_gives_back_once() {
        let mut g = GiveBack::new();
        assert!(!g.observe(200 * MB, false));
        assert!(!g.observe(169 * MB, false), "31 MiB below: not yet");
        assert!(g.observe(168 * MB, false), "32 MiB below");
        assert!(
            !g.observe(150 * MB, false),
            "the mark starts again from there"
        );
        assert!(g.observe(136 * MB, false));
    }

    #[test]
    fn an_idle_server_gives_back_once_it_settled_and_never_again() {
        let mut g = GiveBack::new();
        assert!(!g.observe(0, true), "idle from the start: nothing was used");
        assert!(!g.observe(0, true));
        assert!(!g.observe(MB, false));
        assert!(!g.observe(0, true), "the last session just went");
        assert!(g.observe(0, true), "idle for two looks");
        for _ in 0..5 {
            assert!(!g.observe(0, true));
        }
        assert!(!g.observe(0, false));
        assert!(!g.observe(0, true));
        assert!(g.observe(0, true), "busy again, then settled again");
    }
}
