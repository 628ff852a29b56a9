//! The Noise record layer of virtual streams (`secure-transport.md` §2–§4): the stream
//! handshake, the record keys and AEAD, and records with their reassembly, sans-IO. The
//! exec server and the client seal and open stream payloads with these; the relay never
//! does (it routes the same frames without keys).
//!
//! # Layout
//!
//! - [`suite`]: the suites (0: `Noise_IK_25519_ChaChaPoly_BLAKE2s`, 1:
//!   `Noise_IK_25519_AESGCM_BLAKE2s`), the set a server accepts, their protocol names, the
//!   client's choice by CPU features.
//! - [`handshake`]: Noise IK in either suite with the stream-binding prologue; a handshake
//!   state that turns into transport keys.
//! - [`cipher`]: the directional record keys from the handshake's split, and the in-place
//!   AEAD on records, ChaCha20-Poly1305 or AES-256-GCM with the suite's nonce layout (the hot
//!   path of every encrypted byte).
//! - [`record`]: records with explicit nonces, the replay window, the authenticated close,
//!   and length-prefixed messages cut into records.
//! - [`budget`]: what the record layer charges unfinished messages to (the exec server's
//!   byte budget implements it; [`budget::Unlimited`] on a client).
//! - `fuzz_resolver` (fuzz builds only, `cfg(fuzzing)`): snow's primitives with X25519
//!   results remembered and fixed ephemeral keys, so the handshake fuzz target is cheap.
//!
//! The `ts` of message 1 is checked by [`crate::replay`]; the exec server's clock and
//! per-listener cache around it (`execrelay::noise::timestamp`) and its authorization of a
//! client key (`execrelay::noise::authorizer`, async) stay with the exec server.
//!
//! # What it must never do
//!
//! Log, format or expose key material or plaintext; read a clock; wait for a budget.

pub mod budget;
pub mod cipher;
#[cfg(fuzzing)]
pub mod fuzz_resolver;
pub mod handshake;
pub mod record;
pub mod suite;
