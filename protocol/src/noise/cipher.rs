//! The transport keys of one stream after its handshake, and the in-place AEAD on records.
//!
//! `snow` runs the handshake; after it, `Split()` (Noise §5.2) yields one 32-byte key per
//! direction, and records are sealed and opened here, **in place**, with `ring`'s AEAD of the
//! stream's suite: ChaCha20-Poly1305 (suite 0) or AES-256-GCM (suite 1). That is the same AEAD
//! `snow` would apply, with Noise's nonce layout for it (four zero bytes, then the record
//! number as 64-bit **little**-endian for ChaChaPoly, **big**-endian for AESGCM; empty
//! associated data), so any Noise implementation interoperates (tests/noise_interop.rs checks
//! one in both suites). It exists because this is
//! the hot path of every encrypted byte: `snow`'s stateless transport copies the plaintext to
//! its output before encrypting and needs a zeroed output buffer, which cost a copy and a memset
//! per record on each end.
//!
//! This module holds key material: it never logs, formats or exposes it (no `Debug` output of
//! the keys). Wiping is best effort: the raw split keys handed to us are zeroed once `ring`
//! holds them, but `snow` does not wipe its own copies of the chaining key and split output,
//! and `ring` does not wipe its key schedule on drop.

use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM, CHACHA20_POLY1305};
use zeroize::Zeroize;

use super::suite::NoiseSuite;

/// Length of a record key (both suites: ChaCha20-Poly1305 and AES-256-GCM).
pub const KEY_LEN: usize = 32;

/// The AEAD failed: wrong key, wrong record number, or tampered bytes. Deliberately opaque.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("AEAD failure")]
pub struct AeadError;

/// One stream's two directional keys. Shared by its sending and receiving halves (`Arc`).
pub struct TransportKeys {
    send: LessSafeKey,
    recv: LessSafeKey,
    suite: NoiseSuite,
}

impl std::fmt::Debug for TransportKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TransportKeys(..)")
    }
}

/// Noise's nonce for record `n` in `suite`: four zero bytes, then `n` little-endian
/// (ChaChaPoly) or big-endian (AESGCM).
fn nonce(suite: NoiseSuite, n: u64) -> Nonce {
    let mut b = [0u8; 12];
    b[4..].copy_from_slice(&match suite {
        NoiseSuite::ChaChaPoly => n.to_le_bytes(),
        NoiseSuite::AesGcm => n.to_be_bytes(),
    });
    Nonce::assume_unique_for_key(b)
}

fn key(suite: NoiseSuite, raw: &[u8; KEY_LEN]) -> Result<LessSafeKey, AeadError> {
    let alg = match suite {
        NoiseSuite::ChaChaPoly => &CHACHA20_POLY1305,
        NoiseSuite::AesGcm => &AES_256_GCM,
    };
    UnboundKey::new(alg, raw)
        .map(LessSafeKey::new)
        .map_err(|_| AeadError)
}

impl TransportKeys {
    /// Suite 0 (ChaCha20-Poly1305) keys from the raw `Split()` output; see
    /// [`from_split_suite`](Self::from_split_suite).
    pub fn from_split(
        initiator: bool,
        c1: [u8; KEY_LEN],
        c2: [u8; KEY_LEN],
    ) -> Result<Self, AeadError> {
        Self::from_split_suite(NoiseSuite::ChaChaPoly, initiator, c1, c2)
    }

    /// Keys of `suite` from the raw `Split()` output: `c1` protects initiator → responder,
    /// `c2` the reverse. Both arrays are wiped (this copy only; see the module docs).
    pub fn from_split_suite(
        suite: NoiseSuite,
        initiator: bool,
        mut c1: [u8; KEY_LEN],
        mut c2: [u8; KEY_LEN],
    ) -> Result<Self, AeadError> {
        let built = (key(suite, &c1), key(suite, &c2));
        c1.zeroize();
        c2.zeroize();
        let (k1, k2) = (built.0?, built.1?);
        let (send, recv) = if initiator { (k1, k2) } else { (k2, k1) };
        Ok(TransportKeys { send, recv, suite })
    }

    /// The suite these keys belong to.
    pub fn suite(&self) -> NoiseSuite {
        self.suite
    }

    /// Encrypt `in_out` in place as record `n`; returns the tag to append.
    pub fn seal_in_place(&self, n: u64, in_out: &mut [u8]) -> Result<Tag, AeadError> {
        self.send
            .seal_in_place_separate_tag(nonce(self.suite, n), Aad::empty(), in_out)
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
            .open_in_place(nonce(self.suite, n), Aad::empty(), in_out)
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

        let direct = key(NoiseSuite::ChaChaPoly, &raw).unwrap();
        let mut theirs = b"record body".to_vec();
        let n = [0, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1];
        direct
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(n), Aad::empty(), &mut theirs)
            .unwrap();
        assert_eq!(ours, theirs);
    }

    /// Suite 1's nonce is "4 zero bytes ‖ n big-endian" (Noise's AESGCM), with AES-256-GCM.
    #[test]
    fn nonce_layout_is_noise_aesgcm() {
        let raw = [0x42u8; KEY_LEN];
        let keys =
            TransportKeys::from_split_suite(NoiseSuite::AesGcm, true, raw, [0u8; KEY_LEN]).unwrap();
        assert_eq!(keys.suite(), NoiseSuite::AesGcm);
        let mut ours = b"record body".to_vec();
        let tag = keys
            .seal_in_place(0x0102_0304_0506_0708, &mut ours)
            .unwrap();
        ours.extend_from_slice(tag.as_ref());
        let direct = UnboundKey::new(&AES_256_GCM, &raw)
            .map(LessSafeKey::new)
            .unwrap();
        let mut theirs = b"record body".to_vec();
        let n = [0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        direct
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(n), Aad::empty(), &mut theirs)
            .unwrap();
        assert_eq!(ours, theirs);
        // The other suite's keys from the same split do not open it.
        let chacha = TransportKeys::from_split(false, raw, [0u8; KEY_LEN]).unwrap();
        assert_eq!(
            chacha.open_in_place(0x0102_0304_0506_0708, &mut ours.clone()),
            Err(AeadError)
        );
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
