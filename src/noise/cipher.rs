//! The transport keys of one stream after its handshake, and the in-place AEAD on records.
//!
//! `snow` runs the handshake; after it, `Split()` (Noise §5.2) yields one ChaCha20-Poly1305 key
//! per direction, and records are sealed and opened here, **in place**, with `ring`'s
//! ChaCha20-Poly1305. That is the same AEAD `snow` would apply (Noise's nonce layout: four zero
//! bytes, then the record number as 64-bit little-endian; empty associated data), so any Noise
//! implementation interoperates (tests/noise_interop.rs checks one). It exists because this is
//! the hot path of every encrypted byte: `snow`'s stateless transport copies the plaintext to
//! its output before encrypting and needs a zeroed output buffer, which cost a copy and a memset
//! per record on each end.
//!
//! This module holds key material: it never logs, formats or exposes it (no `Debug` output of
//! the keys). Wiping is best effort: the raw split keys handed to us are zeroed once `ring`
//! holds them, but `snow` does not wipe its own copies of the chaining key and split output,
//! and `ring` does not wipe its key schedule on drop.

use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, CHACHA20_POLY1305};
use zeroize::Zeroize;

/// Length of a ChaCha20-Poly1305 key.
pub const KEY_LEN: usize = 32;

/// The AEAD failed: wrong key, wrong record number, or tampered bytes. Deliberately opaque.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("AEAD failure")]
pub struct AeadError;

/// One stream's two directional keys. Shared by its sending and receiving halves (`Arc`).
pub struct TransportKeys {
    send: LessSafeKey,
    recv: LessSafeKey,
}

impl std::fmt::Debug for TransportKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TransportKeys(..)")
    }
}

fn nonce(n: u64) -> Nonce {
    let mut b = [0u8; 12];
    b[4..].copy_from_slice(&n.to_le_bytes());
    Nonce::assume_unique_for_key(b)
}

fn key(raw: &[u8; KEY_LEN]) -> Result<LessSafeKey, AeadError> {
    UnboundKey::new(&CHACHA20_POLY1305, raw)
        .map(LessSafeKey::new)
        .map_err(|_| AeadError)
}

impl TransportKeys {
    /// Keys from the raw `Split()` output: `c1` protects initiator → responder, `c2` the
    /// reverse. Both arrays are wiped (this copy only; see the module docs).
    pub fn from_split(
        initiator: bool,
        mut c1: [u8; KEY_LEN],
        mut c2: [u8; KEY_LEN],
    ) -> Result<Self, AeadError> {
        let built = (key(&c1), key(&c2));
        c1.zeroize();
        c2.zeroize();
        let (k1, k2) = (built.0?, built.1?);
        Ok(if initiator {
            TransportKeys { send: k1, recv: k2 }
        } else {
            TransportKeys { send: k2, recv: k1 }
        })
    }

    /// Encrypt `in_out` in place as record `n`; returns the tag to append.
    pub fn seal_in_place(&self, n: u64, in_out: &mut [u8]) -> Result<Tag, AeadError> {
        self.send
            .seal_in_place_separate_tag(nonce(n), Aad::empty(), in_out)
            .map_err(|_| AeadError)
    }

    /// Decrypt record `n` (`ciphertext ‖ tag`) in place; returns the plaintext, a prefix of
    /// `in_out`.
    pub fn open_in_place<'a>(
        &self,
        n: u64,
        in_out: &'a mut [u8],
    ) -> Result<&'a mut [u8], AeadError> {
        self.recv
            .open_in_place(nonce(n), Aad::empty(), in_out)
            .map_err(|_| AeadError)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Our nonce is "4 zero bytes ‖ n little-endian" (Noise's ChaChaPoly). The byte-for-byte
    /// comparison with `snow`'s own transport is in `handshake.rs`'s tests.
    #[test]
    fn nonce_layout_is_noise_chachapoly() {
        let raw = [0x42u8; KEY_LEN];
        let keys = TransportKeys::from_split(true, raw, [0u8; KEY_LEN]).unwrap();
        let mut ours = b"record body".to_vec();
        let tag = keys
            .seal_in_place(0x0102_0304_0506_0708, &mut ours)
            .unwrap();
        ours.extend_from_slice(tag.as_ref());

        let direct = key(&raw).unwrap();
        let mut theirs = b"record body".to_vec();
        let n = [0, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1];
        direct
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(n), Aad::empty(), &mut theirs)
            .unwrap();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn directions_are_crossed_and_tampering_fails() {
        let (c1, c2) = ([1u8; KEY_LEN], [2u8; KEY_LEN]);
        let client = TransportKeys::from_split(true, c1, c2).unwrap();
        let server = TransportKeys::from_split(false, c1, c2).unwrap();
        let mut rec = b"hello".to_vec();
        let tag = client.seal_in_place(7, &mut rec).unwrap();
        rec.extend_from_slice(tag.as_ref());
        let mut copy = rec.clone();
        assert_eq!(server.open_in_place(7, &mut copy).unwrap(), b"hello");
        // Not the client's own receive key, not another record number, not tampered bytes.
        assert_eq!(client.open_in_place(7, &mut rec.clone()), Err(AeadError));
        assert_eq!(server.open_in_place(8, &mut rec.clone()), Err(AeadError));
        rec[0] ^= 1;
        assert_eq!(server.open_in_place(7, &mut rec), Err(AeadError));
    }
}
