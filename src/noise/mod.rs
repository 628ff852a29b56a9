//! Noise for virtual streams (`secure-transport.md` §2–§5, §8): crypto and sans-IO cores only
//! (layer 1). The link drivers that use them are in [`crate::link`].
//!
//! # Layout
//!
//! - [`keys`]: X25519 key files, public key lines, the authorized-keys file (re-exported from
//!   `execrelay_protocol::keys`, where the relay finds them too).
//! - [`suite`]: the suites (0: `Noise_IK_25519_ChaChaPoly_BLAKE2s`, 1:
//!   `Noise_IK_25519_AESGCM_BLAKE2s`), their protocol names, the client's choice by CPU
//!   features.
//! - [`handshake`]: sans-IO Noise IK in either suite with the stream-binding prologue; a
//!   handshake state that turns into transport keys.
//! - [`cipher`]: the directional record keys from the handshake's split, and the in-place
//!   AEAD on records, ChaCha20-Poly1305 or AES-256-GCM with the suite's nonce layout (the hot
//!   path of every encrypted byte).
//! - [`record`]: sans-IO records with explicit nonces, the replay window, the authenticated
//!   close, and length-prefixed messages cut into records.
//! - [`timestamp`]: the `ts` of handshake message 1: the client's increasing stamp and the
//!   server's replay check (sans-IO, a bounded LRU per client key).
//! - [`authorizer`]: the async authorization trait and the authorized-keys implementation.
//! - `fuzz_resolver` (fuzz builds only, `cfg(fuzzing)`): snow's primitives with X25519
//!   results remembered and fixed ephemeral keys, so the handshake fuzz target is cheap.
//!
//! The frame codec itself lives in the `execrelay-relay` crate (`execrelay_protocol::frame`), so
//! that the relay routes exactly the frames these modules produce.

pub mod authorizer;
pub mod cipher;
#[cfg(fuzzing)]
pub mod fuzz_resolver;
pub mod handshake;
pub use execrelay_protocol::keys;
pub mod record;
pub mod suite;
pub mod timestamp;
