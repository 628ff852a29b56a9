"""Noise IK, initiator side, on `cryptography`'s primitives (secure-transport.md §3, §4).

Owns: the handshake state machine of `Noise_IK_25519_{ChaChaPoly,AESGCM}_BLAKE2s` for the
initiator (message 1 out, message 2 in, Split) and the record cipher of both suites with the
explicit nonce layout of each. Sans-IO: bytes in, bytes out; no sockets, no clocks.

Must never: log or expose key material; accept a message 2 that does not authenticate.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Optional, Tuple

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

#: Suite numbers as written in bits 0-1 of an OPEN frame's flags.
SUITE_CHACHAPOLY = 0
SUITE_AESGCM = 1
PROTOCOL_NAMES = {
    SUITE_CHACHAPOLY: b"Noise_IK_25519_ChaChaPoly_BLAKE2s",
    SUITE_AESGCM: b"Noise_IK_25519_AESGCM_BLAKE2s",
}
HASHLEN = 32
DHLEN = 32
TAGLEN = 16
#: Largest Noise message (and so record ciphertext).
MAX_NOISE_MESSAGE = 65535


class NoiseError(Exception):
    """A handshake message or record that does not authenticate or is malformed."""


def _nonce(suite: int, n: int) -> bytes:
    # Noise's nonce layout: 4 zero bytes, then the counter, little-endian for ChaChaPoly and
    # big-endian for AESGCM.
    if suite == SUITE_AESGCM:
        return b"\x00\x00\x00\x00" + n.to_bytes(8, "big")
    return b"\x00\x00\x00\x00" + n.to_bytes(8, "little")


def _aead(suite: int, key: bytes):
    return AESGCM(key) if suite == SUITE_AESGCM else ChaCha20Poly1305(key)


def _hmac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.blake2s).digest()


def _hkdf(ck: bytes, ikm: bytes, n: int) -> Tuple[bytes, ...]:
    temp = _hmac(ck, ikm)
    out1 = _hmac(temp, b"\x01")
    if n == 2:
        return out1, _hmac(temp, out1 + b"\x02")
    out2 = _hmac(temp, out1 + b"\x02")
    return out1, out2, _hmac(temp, out2 + b"\x03")


def public_of(private: bytes) -> bytes:
    """The X25519 public key of a 32-byte private key."""
    key = X25519PrivateKey.from_private_bytes(private)
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _dh(private: X25519PrivateKey, public: bytes) -> bytes:
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(public))
    except ValueError as e:  # a low-order point gives all zeros: refuse it
        raise NoiseError(f"bad X25519 public key: {e}") from None


class CipherState:
    """A record key of one direction: encrypt/decrypt with an explicit nonce."""

    __slots__ = ("_aead", "_suite")

    def __init__(self, suite: int, key: bytes) -> None:
        self._suite = suite
        self._aead = _aead(suite, key)

    def seal(self, n: int, plaintext: bytes, ad: bytes = b"") -> bytes:
        """Encrypt `plaintext` under nonce `n`."""
        return self._aead.encrypt(_nonce(self._suite, n), plaintext, ad or None)

    def open(self, n: int, ciphertext: bytes, ad: bytes = b"") -> bytes:
        """Decrypt and authenticate; NoiseError when it does not."""
        try:
            return self._aead.decrypt(_nonce(self._suite, n), ciphertext, ad or None)
        except InvalidTag:
            raise NoiseError("record did not authenticate") from None


class InitiatorHandshake:
    """`IK` as the initiator: `write_message_1(payload)`, then `read_message_2(msg)`.

    After message 2, `split()` gives (send, receive) CipherStates.
    """

    def __init__(self, suite: int, static_private: bytes, remote_static: bytes,
                 prologue: bytes, ephemeral_private: Optional[bytes] = None) -> None:
        if suite not in PROTOCOL_NAMES:
            raise ValueError(f"unknown Noise suite {suite}")
        if len(remote_static) != DHLEN or len(static_private) != DHLEN:
            raise ValueError("X25519 keys are 32 bytes")
        self.suite = suite
        name = PROTOCOL_NAMES[suite]
        self._h = name.ljust(HASHLEN, b"\x00") if len(name) <= HASHLEN else hashlib.blake2s(name).digest()
        self._ck = self._h
        self._k: Optional[bytes] = None
        self._n = 0
        self._s = X25519PrivateKey.from_private_bytes(static_private)
        self._s_pub = public_of(static_private)
        self._rs = remote_static
        self._e = X25519PrivateKey.from_private_bytes(ephemeral_private or os.urandom(32))
        self._e_pub = self._e.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self._mix_hash(prologue)
        self._mix_hash(remote_static)  # pre-message: <- s
        self._done = False

    # Symmetric state ---------------------------------------------------------------------

    def _mix_hash(self, data: bytes) -> None:
        self._h = hashlib.blake2s(self._h + data).digest()

    def _mix_key(self, ikm: bytes) -> None:
        self._ck, self._k = _hkdf(self._ck, ikm, 2)
        self._n = 0

    def _encrypt_and_hash(self, plaintext: bytes) -> bytes:
        if self._k is None:
            out = plaintext
        else:
            out = _aead(self.suite, self._k).encrypt(_nonce(self.suite, self._n), plaintext, self._h)
            self._n += 1
        self._mix_hash(out)
        return out

    def _decrypt_and_hash(self, ciphertext: bytes) -> bytes:
        if self._k is None:
            out = ciphertext
        else:
            try:
                out = _aead(self.suite, self._k).decrypt(
                    _nonce(self.suite, self._n), ciphertext, self._h)
            except InvalidTag:
                raise NoiseError("handshake message 2 did not authenticate") from None
            self._n += 1
        self._mix_hash(ciphertext)
        return out

    # Messages ------------------------------------------------------------------------------

    def write_message_1(self, payload: bytes) -> bytes:
        """-> e, es, s, ss, then the encrypted payload."""
        out = bytearray(self._e_pub)
        self._mix_hash(self._e_pub)
        self._mix_key(_dh(self._e, self._rs))
        out += self._encrypt_and_hash(self._s_pub)
        self._mix_key(_dh(self._s, self._rs))
        out += self._encrypt_and_hash(payload)
        if len(out) > MAX_NOISE_MESSAGE:
            raise ValueError("handshake message 1 too large")
        return bytes(out)

    def read_message_2(self, message: bytes) -> bytes:
        """<- e, ee, se; returns the decrypted payload."""
        if len(message) < DHLEN + TAGLEN:
            raise NoiseError(f"handshake message 2 of {len(message)} bytes is too short")
        re = bytes(message[:DHLEN])
        self._mix_hash(re)
        self._mix_key(_dh(self._e, re))
        self._mix_key(_dh(self._s, re))
        payload = self._decrypt_and_hash(bytes(message[DHLEN:]))
        self._done = True
        return payload

    def split(self) -> Tuple[CipherState, CipherState]:
        """(initiator -> responder, responder -> initiator) record keys."""
        if not self._done:
            raise RuntimeError("split before the handshake finished")
        k1, k2 = _hkdf(self._ck, b"", 2)
        return CipherState(self.suite, k1), CipherState(self.suite, k2)

    @property
    def handshake_hash(self) -> bytes:
        """The handshake hash `h` (for tests against reference vectors)."""
        return self._h


def cpu_has_fast_aes() -> bool:
    """Hardware AES and carry-less multiply (x86-64 AES-NI + PCLMULQDQ, aarch64 AES + PMULL)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError:
        return False
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("flags", "features"):
            flags = set(value.split())
            if "aes" in flags and ("pclmulqdq" in flags or "pmull" in flags):
                return True
    return False
