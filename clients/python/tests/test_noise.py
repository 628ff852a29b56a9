"""The Noise IK initiator against an independent implementation (the `noiseprotocol`
package, a test-only dependency) for both suites, and the nonce layouts of §3."""

from __future__ import annotations

import os

import pytest
from noise.connection import Keypair, NoiseConnection

from execrelay._link import prologue
from execrelay._noise import (PROTOCOL_NAMES, SUITE_AESGCM, SUITE_CHACHAPOLY, InitiatorHandshake,
                              NoiseError, public_of)


@pytest.mark.parametrize("suite", [SUITE_CHACHAPOLY, SUITE_AESGCM])
def test_handshake_and_records_interoperate(suite):
    server_priv, client_priv = os.urandom(32), os.urandom(32)
    pro = prologue("env-1", os.urandom(16))
    ours = InitiatorHandshake(suite, client_priv, public_of(server_priv), pro)
    theirs = NoiseConnection.from_name(PROTOCOL_NAMES[suite])
    theirs.set_as_responder()
    theirs.set_keypair_from_private_bytes(Keypair.STATIC, server_priv)
    theirs.set_prologue(pro)
    theirs.start_handshake()

    msg1 = ours.write_message_1(b'{"version":1,"ts":1}')
    assert theirs.read_message(msg1) == b'{"version":1,"ts":1}'
    assert theirs.noise_protocol.handshake_state.rs.public_bytes == public_of(client_priv)
    msg2 = theirs.write_message(b'{"version":1}')
    assert ours.read_message_2(msg2) == b'{"version":1}'
    assert theirs.handshake_finished
    assert ours.handshake_hash == theirs.get_handshake_hash()

    send, recv = ours.split()
    # Their transport counts nonces from 0: sealing ours at n = 0, 1, 2 must match their
    # layout (little-endian for ChaChaPoly, big-endian for AESGCM) record for record; n = 256
    # tells the two byte orders apart.
    for n in range(3):
        assert theirs.decrypt(send.seal(n, b"record %d" % n)) == b"record %d" % n
    for n in range(3):
        assert recv.open(n, theirs.encrypt(b"reply %d" % n)) == b"reply %d" % n


def test_aesgcm_nonce_is_big_endian():
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
    from execrelay._noise import CipherState
    key = os.urandom(32)
    n = 0x0102030405060708
    ct = CipherState(SUITE_AESGCM, key).seal(n, b"x")
    assert AESGCM(key).decrypt(b"\0\0\0\0" + n.to_bytes(8, "big"), ct, None) == b"x"
    ct = CipherState(SUITE_CHACHAPOLY, key).seal(n, b"x")
    assert ChaCha20Poly1305(key).decrypt(b"\0\0\0\0" + n.to_bytes(8, "little"), ct, None) == b"x"


def test_wrong_responder_key_fails_message_2():
    server_priv = os.urandom(32)
    pro = prologue("", os.urandom(16))
    ours = InitiatorHandshake(SUITE_CHACHAPOLY, os.urandom(32), public_of(server_priv), pro)
    theirs = NoiseConnection.from_name(PROTOCOL_NAMES[SUITE_CHACHAPOLY])
    theirs.set_as_responder()
    theirs.set_keypair_from_private_bytes(Keypair.STATIC, server_priv)
    theirs.set_prologue(pro)
    theirs.start_handshake()
    theirs.read_message(ours.write_message_1(b"{}"))
    msg2 = bytearray(theirs.write_message(b"{}"))
    msg2[-1] ^= 1
    with pytest.raises(NoiseError):
        ours.read_message_2(bytes(msg2))
    with pytest.raises(NoiseError):
        CipherStateOpen = __import__("execrelay._noise", fromlist=["CipherState"]).CipherState
        CipherStateOpen(SUITE_CHACHAPOLY, os.urandom(32)).open(1, b"\0" * 20)
