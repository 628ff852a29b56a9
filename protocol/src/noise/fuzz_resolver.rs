//! The crypto resolver of fuzz builds only (`cfg(fuzzing)`, set by `cargo fuzz`): the same
//! primitives as snow's default resolver, with X25519 results remembered and ephemeral keys
//! drawn from a fixed sequence, so that a fuzz input that runs two handshakes does not pay
//! for eight scalar multiplications (under the fuzzer's coverage instrumentation, some three
//! milliseconds: the handshake target ran at about 290 inputs a second).
//!
//! What the fuzzer reaches is unchanged: every handshake still runs snow's state machine and
//! this crate's code on real X25519 outputs (a remembered result is the one the default
//! resolver computed for the same two keys), and the AEAD and hash run for real. Only the
//! entropy differs: each ephemeral key is one of [`EPHEMERALS`] fixed keys, taken in turn,
//! so results repeat and are found in the table.
//!
//! Never compiled into a normal build; it must never be: ephemeral keys from a fixed
//! sequence give no forward secrecy at all.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use snow::params::{CipherChoice, DHChoice, HashChoice};
use snow::resolvers::{CryptoResolver, DefaultResolver};
use snow::types::{Cipher, Dh, Hash, Random};

/// How many distinct ephemeral keys the fixed sequence cycles through.
const EPHEMERALS: u8 = 4;

/// Remembered results at most (keys from raw fuzzer bytes never repeat); the table is
/// emptied when full.
const MAX_REMEMBERED: usize = 4096;

thread_local! {
    static PUBLIC: RefCell<HashMap<[u8; 32], [u8; 32]>> = RefCell::new(HashMap::new());
    static SHARED: RefCell<HashMap<([u8; 32], [u8; 32]), [u8; 32]>> =
        RefCell::new(HashMap::new());
    static NEXT_EPHEMERAL: Cell<u8> = const { Cell::new(0) };
}

fn remember<K: std::hash::Hash + Eq, V>(map: &mut HashMap<K, V>, k: K, v: V) {
    if map.len() >= MAX_REMEMBERED {
        map.clear();
    }
    map.insert(k, v);
}

/// Snow's default primitives; X25519 remembered, entropy fixed (module docs).
pub struct FuzzResolver;

impl CryptoResolver for FuzzResolver {
    fn resolve_rng(&self) -> Option<Box<dyn Random>> {
        Some(Box::new(FixedRandom))
    }

    fn resolve_dh(&self, choice: &DHChoice) -> Option<Box<dyn Dh>> {
        match choice {
            DHChoice::Curve25519 => Some(Box::new(RememberedX25519 {
                private: [0; 32],
                public: [0; 32],
            })),
            other => DefaultResolver.resolve_dh(other),
        }
    }

    fn resolve_hash(&self, choice: &HashChoice) -> Option<Box<dyn Hash>> {
        DefaultResolver.resolve_hash(choice)
    }

    fn resolve_cipher(&self, choice: &CipherChoice) -> Option<Box<dyn Cipher>> {
        DefaultResolver.resolve_cipher(choice)
    }
}

/// Fills every request with one of [`EPHEMERALS`] fixed patterns, in turn.
struct FixedRandom;

impl Random for FixedRandom {
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), snow::Error> {
        let n = NEXT_EPHEMERAL.with(|c| {
            let n = c.get();
            c.set((n + 1) % EPHEMERALS);
            n
        });
        for (i, b) in dest.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(31).wrapping_add(0x40 + n);
        }
        Ok(())
    }
}

/// X25519 through snow's default implementation, each result remembered.
struct RememberedX25519 {
    private: [u8; 32],
    public: [u8; 32],
}

fn default_x25519() -> Box<dyn Dh> {
    DefaultResolver
        .resolve_dh(&DHChoice::Curve25519)
        .unwrap_or_else(|| unreachable!("snow's default resolver has X25519"))
}

impl Dh for RememberedX25519 {
    fn name(&self) -> &'static str {
        "25519"
    }

    fn pub_len(&self) -> usize {
        32
    }

    fn priv_len(&self) -> usize {
        32
    }

    fn set(&mut self, privkey: &[u8]) {
        let mut private = [0u8; 32];
        let n = privkey.len().min(32);
        private[..n].copy_from_slice(&privkey[..n]);
        self.private = private;
        self.public = PUBLIC.with(|m| {
            if let Some(p) = m.borrow().get(&private) {
                return *p;
            }
            let mut d = default_x25519();
            d.set(&private);
            let mut public = [0u8; 32];
            public.copy_from_slice(d.pubkey());
            remember(&mut m.borrow_mut(), private, public);
            public
        });
    }

    fn generate(&mut self, rng: &mut dyn Random) -> Result<(), snow::Error> {
        let mut private = [0u8; 32];
        rng.try_fill_bytes(&mut private)?;
        self.set(&private);
        Ok(())
    }

    fn pubkey(&self) -> &[u8] {
        &self.public
    }

    fn privkey(&self) -> &[u8] {
        &self.private
    }

    fn dh(&self, pubkey: &[u8], out: &mut [u8]) -> Result<(), snow::Error> {
        let mut public = [0u8; 32];
        let n = pubkey.len().min(32);
        public[..n].copy_from_slice(&pubkey[..n]);
        let key = (self.private, public);
        let remembered = SHARED.with(|m| m.borrow().get(&key).copied());
        let shared = match remembered {
            Some(s) => s,
            None => {
                let mut d = default_x25519();
                d.set(&self.private);
                let mut s = [0u8; 32];
                d.dh(pubkey, &mut s)?;
                SHARED.with(|m| remember(&mut m.borrow_mut(), key, s));
                s
            }
        };
        let n = out.len().min(32);
        out[..n].copy_from_slice(&shared[..n]);
        Ok(())
    }
}
