//! The soak's randomness: SplitMix64, seeded, so that one `SEED` replays every decision of a
//! run (the workload, the proxies' faults, the relay's restarts), and the output stream every
//! child writes, which the client checks byte for byte without keeping a copy.
//!
//! SplitMix64 (Steele, Lea and Flood, 2014) is eight lines and passes BigCrush; a crate would
//! only add a dependency whose output could change with its version, and a replay must give
//! the same schedule from the same seed forever.

/// A seeded generator.
#[derive(Debug, Clone)]
pub struct Rng(u64);

/// One SplitMix64 step of `x` (also a good 64-bit mixer).
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A seed for one named part of a run (`derive(seed, "proxy client-3", 17)`): the same inputs
/// give the same seed on every machine.
pub fn derive(seed: u64, name: &str, index: u64) -> u64 {
    let mut h = mix(seed);
    for b in name.bytes() {
        h = mix(h ^ u64::from(b));
    }
    mix(h ^ index)
}

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        // Multiply-shift: unbiased enough for scheduling (bias below 2^-32 for n < 2^32).
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Exponentially distributed with mean `mean` (the gaps of a Poisson process).
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }

    /// Log-uniform in `lo..=hi` (as many small values as large ones per decade).
    pub fn log_uniform(&mut self, lo: u64, hi: u64) -> u64 {
        let l = (lo.max(1) as f64).ln();
        let span = (hi.max(1) as f64).ln() - l;
        ((l + self.unit() * span).exp() as u64).clamp(lo, hi)
    }

    /// An index chosen by `weights` (not all zero).
    pub fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
        let mut pick = self.below(total.max(1));
        for (i, &w) in weights.iter().enumerate() {
            if pick < u64::from(w) {
                return i;
            }
            pick -= u64::from(w);
        }
        weights.len() - 1
    }
}

/// Fill `buf` with the output stream of `seed` from byte `offset` on: byte `p` is byte
/// `p % 8` of `mix(seed ^ p / 8)`, so any range can be produced (or checked) on its own.
pub fn stream_bytes(seed: u64, offset: u64, buf: &mut [u8]) {
    let mut pos = offset;
    let mut i = 0;
    while i < buf.len() {
        let word = mix(seed ^ (pos / 8)).to_le_bytes();
        let from = (pos % 8) as usize;
        let n = (8 - from).min(buf.len() - i);
        buf[i..i + n].copy_from_slice(&word[from..from + n]);
        i += n;
        pos += n as u64;
    }
}

/// Checks a stream against [`stream_bytes`] as it arrives: the first byte that differs is
/// where something was lost, repeated or corrupted.
#[derive(Debug, Clone)]
pub struct StreamCheck {
    seed: u64,
    /// Bytes received and matched so far.
    pub matched: u64,
    /// Offset of the first byte that did not match, and how many bytes arrived after it.
    pub diverged: Option<(u64, u64)>,
    scratch: Vec<u8>,
}

impl StreamCheck {
    /// A check of the stream of `seed` from byte 0.
    pub fn new(seed: u64) -> StreamCheck {
        StreamCheck {
            seed,
            matched: 0,
            diverged: None,
            scratch: Vec::new(),
        }
    }

    /// Take `data`, the next bytes received.
    pub fn push(&mut self, data: &[u8]) {
        if let Some((_, after)) = &mut self.diverged {
            *after += data.len() as u64;
            return;
        }
        self.scratch.resize(data.len(), 0);
        stream_bytes(self.seed, self.matched, &mut self.scratch);
        match data.iter().zip(&self.scratch).position(|(a, b)| a != b) {
            None => self.matched += data.len() as u64,
            Some(i) => {
                self.diverged = Some((self.matched + i as u64, (data.len() - i) as u64));
                self.matched += i as u64;
            }
        }
    }

    /// Received bytes in all.
    pub fn received(&self) -> u64 {
        self.matched + self.diverged.map_or(0, |(_, after)| after)
    }
}
