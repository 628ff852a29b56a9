//! The Noise handshake of `secure-transport.md` §3, sans-IO: a handshake state that turns into
//! a transport state.
//!
//! `Noise_IK_25519_ChaChaPoly_BLAKE2s` (suite 0) or `Noise_IK_25519_AESGCM_BLAKE2s` (suite 1,
//! [`super::suite`]), the client initiating with the server's static key pinned. The suite is
//! carried outside (the `OPEN` frame's flags) and is the first input of the handshake hash, so
//! both sides must build with the same one or message 1 does not decrypt. The prologue binds the handshake to its environment and stream id, so a message 1
//! captured on one stream cannot be spliced onto another. Errors from the cryptography are
//! deliberately opaque ([`HandshakeError::Rejected`]): they are never explained to the peer.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::suite::{protocol_name, NoiseSuite};
use crate::frame::StreamId;
use crate::keys::{Keypair, KEY_BYTES};

/// The Noise protocol name of suite 0 (every other suite's: [`protocol_name`]).
pub const NOISE_PARAMS: &str = protocol_name(NoiseSuite::ChaChaPoly);
/// Prologue prefix.
pub const PROLOGUE_TAG: &[u8] = b"execrelay/noise/v1";
/// Largest message-1 payload (JSON), in bytes.
pub const MAX_HANDSHAKE_PAYLOAD: usize = 4096;
/// Largest message 1: ephemeral key (32) + encrypted static key (32 + 16) + payload + tag (16).
/// Checked before any cryptography runs.
pub const MAX_MSG1_BYTES: usize = 32 + 48 + MAX_HANDSHAKE_PAYLOAD + 16;
/// Largest message 2 accepted by the client (ephemeral 32 + payload + tag).
pub const MAX_MSG2_BYTES: usize = 32 + MAX_HANDSHAKE_PAYLOAD + 16;
/// Protocol version in the handshake payloads.
pub const HANDSHAKE_VERSION: u32 = 1;

/// A failed handshake step.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandshakeError {
    /// Larger than the protocol allows: rejected before decryption.
    #[error("handshake message too large")]
    TooLarge,
    /// Decryption or authentication failed. Never explained further.
    #[error("handshake rejected")]
    Rejected,
    /// The payload is not the expected JSON.
    #[error("bad handshake payload: {0}")]
    Payload(String),
}

/// Message 1 payload.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Hello {
    /// Must be 1.
    pub version: u32,
    /// Microseconds since the Unix epoch, larger for every handshake of the client key
    /// (required; checked by the server against replays, in [`crate::replay`]).
    pub ts: u64,
    /// Optional bearer token for deployments that require one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// Message 2 payload.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Welcome {
    /// Must be 1.
    pub version: u32,
    /// The server's version.
    pub server_version: String,
}

/// The transport keys after a handshake, shareable between the sending and the receiving half
/// of a stream. Records use them with explicit nonces ([`super::cipher`]).
pub type TransportKeys = Arc<super::cipher::TransportKeys>;

/// `Split()` of a finished handshake into the directional record keys.
fn split(
    suite: NoiseSuite,
    hs: &mut snow::HandshakeState,
) -> Result<TransportKeys, HandshakeError> {
    if !hs.is_handshake_finished() {
        return Err(HandshakeError::Rejected);
    }
    let initiator = hs.is_initiator();
    let (c1, c2) = hs.dangerously_get_raw_split();
    super::cipher::TransportKeys::from_split_suite(suite, initiator, c1, c2)
        .map(Arc::new)
        .map_err(|_| HandshakeError::Rejected)
}

/// The prologue for `env_id` (empty for a direct connection) and `stream`.
pub fn prologue(env_id: &str, stream: &StreamId) -> Vec<u8> {
    let mut p = Vec::with_capacity(PROLOGUE_TAG.len() + 4 + env_id.len() + stream.len());
    p.extend_from_slice(PROLOGUE_TAG);
    for field in [env_id.as_bytes(), &stream[..]] {
        // Environment ids are bounded far below 65,535 bytes by the relay; clamp anyway.
        let len = field.len().min(u16::MAX as usize);
        p.extend_from_slice(&(len as u16).to_be_bytes());
        p.extend_from_slice(&field[..len]);
    }
    p
}

fn builder<'a>(
    suite: NoiseSuite,
    keys: &'a Keypair,
    prologue: &'a [u8],
) -> Result<snow::Builder<'a>, HandshakeError> {
    let params = protocol_name(suite)
        .parse()
        .map_err(|_| HandshakeError::Rejected)?;
    new_builder(params)
        .local_private_key(&keys.private)
        .and_then(|b| b.prologue(prologue))
        .map_err(|_| HandshakeError::Rejected)
}

/// Snow's builder with its default primitives.
#[cfg(not(fuzzing))]
fn new_builder<'a>(params: snow::params::NoiseParams) -> snow::Builder<'a> {
    snow::Builder::new(params)
}

/// In a fuzz build, the same primitives with X25519 results remembered and fixed ephemeral
/// keys ([`super::fuzz_resolver`]): the fuzzer reaches the same code many times faster.
#[cfg(fuzzing)]
fn new_builder<'a>(params: snow::params::NoiseParams) -> snow::Builder<'a> {
    snow::Builder::with_resolver(params, Box::new(super::fuzz_resolver::FuzzResolver))
}

/// The client's side, between message 1 and message 2.
pub struct ClientHandshake {
    hs: snow::HandshakeState,
    suite: NoiseSuite,
}

impl ClientHandshake {
    /// Build a suite 0 message 1 for `stream`, stamped `ts` (a client takes it from
    /// `execrelay::noise::timestamp::next_hello_ts`).
    pub fn start(
        keys: &Keypair,
        server_public: &[u8; KEY_BYTES],
        env_id: &str,
        stream: &StreamId,
        token: Option<&str>,
        ts: u64,
    ) -> Result<(ClientHandshake, Vec<u8>), HandshakeError> {
        Self::start_suite(
            NoiseSuite::ChaChaPoly,
            keys,
            server_public,
            env_id,
            stream,
            token,
            ts,
        )
    }

    /// Build message 1 in `suite` (the caller writes the suite's number in the `OPEN`'s
    /// flags).
    pub fn start_suite(
        suite: NoiseSuite,
        keys: &Keypair,
        server_public: &[u8; KEY_BYTES],
        env_id: &str,
        stream: &StreamId,
        token: Option<&str>,
        ts: u64,
    ) -> Result<(ClientHandshake, Vec<u8>), HandshakeError> {
        let pro = prologue(env_id, stream);
        let mut hs = builder(suite, keys, &pro)?
            .remote_public_key(server_public)
            .and_then(|b| b.build_initiator())
            .map_err(|_| HandshakeError::Rejected)?;
        let payload = serde_json::to_vec(&Hello {
            version: HANDSHAKE_VERSION,
            ts,
            token: token.map(str::to_string),
        })
        .map_err(|e| HandshakeError::Payload(e.to_string()))?;
        if payload.len() > MAX_HANDSHAKE_PAYLOAD {
            return Err(HandshakeError::TooLarge);
        }
        let mut msg = vec![0u8; MAX_MSG1_BYTES];
        let n = hs
            .write_message(&payload, &mut msg)
            .map_err(|_| HandshakeError::Rejected)?;
        msg.truncate(n);
        Ok((ClientHandshake { hs, suite }, msg))
    }

    /// The suite of this handshake.
    pub fn suite(&self) -> NoiseSuite {
        self.suite
    }

    /// Verify message 2 and switch to transport mode.
    pub fn finish(mut self, msg2: &[u8]) -> Result<(TransportKeys, Welcome), HandshakeError> {
        if msg2.len() > MAX_MSG2_BYTES {
            return Err(HandshakeError::TooLarge);
        }
        let mut payload = vec![0u8; msg2.len()];
        let n = self
            .hs
            .read_message(msg2, &mut payload)
            .map_err(|_| HandshakeError::Rejected)?;
        let welcome: Welcome = serde_json::from_slice(&payload[..n])
            .map_err(|e| HandshakeError::Payload(e.to_string()))?;
        if welcome.version != HANDSHAKE_VERSION {
            return Err(HandshakeError::Payload(format!(
                "unsupported version {}",
                welcome.version
            )));
        }
        let t = split(self.suite, &mut self.hs)?;
        Ok((t, welcome))
    }
}

/// The server's side after a valid message 1, waiting for authorization.
pub struct PendingHandshake {
    hs: snow::HandshakeState,
    suite: NoiseSuite,
    /// The client's static key, authenticated by message 1.
    pub client_key: [u8; KEY_BYTES],
    /// The decoded payload.
    pub hello: Hello,
}

impl std::fmt::Debug for PendingHandshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingHandshake").finish_non_exhaustive()
    }
}

/// Read a suite 0 message 1; see [`read_hello_suite`].
pub fn read_hello(
    keys: &Keypair,
    env_id: &str,
    stream: &StreamId,
    msg1: &[u8],
) -> Result<PendingHandshake, HandshakeError> {
    read_hello_suite(NoiseSuite::ChaChaPoly, keys, env_id, stream, msg1)
}

/// Read message 1 of `suite` (the number the `OPEN` carried; whether the server accepts it is
/// the caller's check, before this one), checking in order: size, decryption (which
/// authenticates the client key), payload size and shape (a missing `ts` is refused here).
/// The `ts` check against replays ([`crate::replay`]) and authorization are the caller's
/// next steps.
pub fn read_hello_suite(
    suite: NoiseSuite,
    keys: &Keypair,
    env_id: &str,
    stream: &StreamId,
    msg1: &[u8],
) -> Result<PendingHandshake, HandshakeError> {
    if msg1.len() > MAX_MSG1_BYTES {
        return Err(HandshakeError::TooLarge);
    }
    let pro = prologue(env_id, stream);
    let mut hs = builder(suite, keys, &pro)?
        .build_responder()
        .map_err(|_| HandshakeError::Rejected)?;
    let mut payload = vec![0u8; msg1.len()];
    let n = hs
        .read_message(msg1, &mut payload)
        .map_err(|_| HandshakeError::Rejected)?;
    if n > MAX_HANDSHAKE_PAYLOAD {
        return Err(HandshakeError::TooLarge);
    }
    let hello: Hello = serde_json::from_slice(&payload[..n])
        .map_err(|e| HandshakeError::Payload(e.to_string()))?;
    if hello.version != HANDSHAKE_VERSION {
        return Err(HandshakeError::Payload(format!(
            "unsupported version {}",
            hello.version
        )));
    }
    let mut client_key = [0u8; KEY_BYTES];
    match hs.get_remote_static() {
        Some(k) if k.len() == KEY_BYTES => client_key.copy_from_slice(k),
        _ => return Err(HandshakeError::Rejected),
    }
    Ok(PendingHandshake {
        hs,
        suite,
        client_key,
        hello,
    })
}

impl PendingHandshake {
    /// Authorized: build message 2 and switch to transport mode.
    pub fn accept(
        mut self,
        server_version: &str,
    ) -> Result<(Vec<u8>, TransportKeys), HandshakeError> {
        let payload = serde_json::to_vec(&Welcome {
            version: HANDSHAKE_VERSION,
            server_version: server_version.to_string(),
        })
        .map_err(|e| HandshakeError::Payload(e.to_string()))?;
        let mut msg = vec![0u8; MAX_MSG2_BYTES];
        let n = self
            .hs
            .write_message(&payload, &mut msg)
            .map_err(|_| HandshakeError::Rejected)?;
        msg.truncate(n);
        let t = split(self.suite, &mut self.hs)?;
        Ok((msg, t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prologue_layout() {
        let p = prologue("env", &[7u8; 16]);
        let mut want = b"execrelay/noise/v1".to_vec();
        want.extend_from_slice(&[0, 3]);
        want.extend_from_slice(b"env");
        want.extend_from_slice(&[0, 16]);
        want.extend_from_slice(&[7u8; 16]);
        assert_eq!(p, want);
        assert_eq!(&prologue("", &[0; 16])[18..20], &[0, 0]);
    }

    fn pair() -> (Keypair, Keypair) {
        (Keypair::generate().unwrap(), Keypair::generate().unwrap())
    }

    #[test]
    fn handshake_round_trip_and_transport() {
        let (client, server) = pair();
        let sid = [1u8; 16];
        let (c, m1) =
            ClientHandshake::start(&client, &server.public, "", &sid, Some("tok"), 7).unwrap();
        let pending = read_hello(&server, "", &sid, &m1).unwrap();
        assert_eq!(pending.client_key, client.public);
        assert_eq!(pending.hello.token.as_deref(), Some("tok"));
        assert_eq!(pending.hello.ts, 7);
        let (m2, st) = pending.accept("9.9").unwrap();
        let (ct, welcome) = c.finish(&m2).unwrap();
        assert_eq!(welcome.server_version, "9.9");
        let mut rec = b"hello".to_vec();
        let tag = ct.seal_in_place(1, &mut rec).unwrap();
        rec.extend_from_slice(tag.as_ref());
        assert_eq!(st.open_in_place(1, &mut rec).unwrap(), b"hello");
    }

    /// Known-answer cross-check: records sealed with our split keys are byte for byte what
    /// `snow`'s own transport produces from the same handshake, in both directions, in every
    /// suite (so the nonce layout of each is Noise's).
    #[test]
    fn records_match_snows_own_transport() {
        for suite in NoiseSuite::ALL {
            let (client, server) = pair();
            let pro = prologue("env", &[4u8; 16]);
            let mut i = builder(suite, &client, &pro)
                .unwrap()
                .remote_public_key(&server.public)
                .unwrap()
                .build_initiator()
                .unwrap();
            let mut r = builder(suite, &server, &pro)
                .unwrap()
                .build_responder()
                .unwrap();
            let (mut m, mut p) = (vec![0u8; 1024], vec![0u8; 1024]);
            let n = i.write_message(b"", &mut m).unwrap();
            r.read_message(&m[..n], &mut p).unwrap();
            let n = r.write_message(b"", &mut m).unwrap();
            i.read_message(&m[..n], &mut p).unwrap();
            let (ours_i, ours_r) = (split(suite, &mut i).unwrap(), split(suite, &mut r).unwrap());
            assert_eq!(ours_i.suite(), suite);
            let snow_i = i.into_stateless_transport_mode().unwrap();
            let snow_r = r.into_stateless_transport_mode().unwrap();
            for n in [1u64, 2, 0x0102_0304_0506_0708] {
                let mut theirs = vec![0u8; 64];
                let len = snow_i
                    .write_message(n, b"to the server", &mut theirs)
                    .unwrap();
                let mut mine = b"to the server".to_vec();
                let tag = ours_i.seal_in_place(n, &mut mine).unwrap();
                mine.extend_from_slice(tag.as_ref());
                assert_eq!(mine, &theirs[..len], "{suite} record {n}");
                let len = snow_r
                    .write_message(n, b"to the client", &mut theirs)
                    .unwrap();
                let mut mine = b"to the client".to_vec();
                let tag = ours_r.seal_in_place(n, &mut mine).unwrap();
                mine.extend_from_slice(tag.as_ref());
                assert_eq!(mine, &theirs[..len], "{suite} record {n}");
                assert_eq!(
                    ours_i.open_in_place(n, &mut mine).unwrap(),
                    b"to the client"
                );
            }
        }
    }

    /// The suite is the first input of the handshake hash: a message 1 read as another suite
    /// than the one it was written in does not decrypt (what a flag flipped on the path
    /// meets), and a suite 1 handshake completes like a suite 0 one.
    #[test]
    fn a_message_1_read_in_another_suite_is_rejected() {
        let (client, server) = pair();
        let sid = [3u8; 16];
        for (wrote, read) in [
            (NoiseSuite::AesGcm, NoiseSuite::ChaChaPoly),
            (NoiseSuite::ChaChaPoly, NoiseSuite::AesGcm),
        ] {
            let (_, m1) =
                ClientHandshake::start_suite(wrote, &client, &server.public, "", &sid, None, 7)
                    .unwrap();
            assert_eq!(
                read_hello_suite(read, &server, "", &sid, &m1).unwrap_err(),
                HandshakeError::Rejected
            );
        }
        let (c, m1) = ClientHandshake::start_suite(
            NoiseSuite::AesGcm,
            &client,
            &server.public,
            "",
            &sid,
            None,
            7,
        )
        .unwrap();
        assert_eq!(c.suite(), NoiseSuite::AesGcm);
        let pending = read_hello_suite(NoiseSuite::AesGcm, &server, "", &sid, &m1).unwrap();
        let (m2, st) = pending.accept("1").unwrap();
        let (ct, _) = c.finish(&m2).unwrap();
        assert_eq!(
            (ct.suite(), st.suite()),
            (NoiseSuite::AesGcm, NoiseSuite::AesGcm)
        );
        let mut rec = b"fast".to_vec();
        let tag = st.seal_in_place(9, &mut rec).unwrap();
        rec.extend_from_slice(tag.as_ref());
        assert_eq!(ct.open_in_place(9, &mut rec).unwrap(), b"fast");
    }

    /// `secure-transport.md` §3: a message 1 without `ts` (or with one that is not a
    /// non-negative integer) is refused with the payload's shape, before authorization.
    #[test]
    fn a_message_1_without_a_ts_is_refused() {
        let (client, server) = pair();
        let sid = [6u8; 16];
        for payload in [
            &br#"{"version":1}"#[..],
            br#"{"version":1,"ts":-1}"#,
            br#"{"version":1,"ts":"1764547200123456"}"#,
        ] {
            let pro = prologue("", &sid);
            let mut i = builder(NoiseSuite::ChaChaPoly, &client, &pro)
                .unwrap()
                .remote_public_key(&server.public)
                .unwrap()
                .build_initiator()
                .unwrap();
            let mut m1 = vec![0u8; 1024];
            let n = i.write_message(payload, &mut m1).unwrap();
            let err = read_hello(&server, "", &sid, &m1[..n]).unwrap_err();
            assert!(matches!(&err, HandshakeError::Payload(_)), "{err:?}");
            if payload == br#"{"version":1}"# {
                assert!(err.to_string().contains("missing field `ts`"), "{err}");
            }
        }
    }

    #[test]
    fn a_message_1_replayed_on_another_stream_fails() {
        let (client, server) = pair();
        let (_, m1) =
            ClientHandshake::start(&client, &server.public, "", &[1; 16], None, 7).unwrap();
        assert_eq!(
            read_hello(&server, "", &[2; 16], &m1).unwrap_err(),
            HandshakeError::Rejected
        );
        assert_eq!(
            read_hello(&server, "other-env", &[1; 16], &m1).unwrap_err(),
            HandshakeError::Rejected
        );
    }

    #[test]
    fn wrong_server_key_and_tampering_are_rejected() {
        let (client, server) = pair();
        let impostor = Keypair::generate().unwrap();
        let (_, m1) =
            ClientHandshake::start(&client, &impostor.public, "", &[1; 16], None, 7).unwrap();
        assert_eq!(
            read_hello(&server, "", &[1; 16], &m1).unwrap_err(),
            HandshakeError::Rejected
        );
        let (_, mut m1) =
            ClientHandshake::start(&client, &server.public, "", &[1; 16], None, 7).unwrap();
        let last = m1.len() - 1;
        m1[last] ^= 1;
        assert_eq!(
            read_hello(&server, "", &[1; 16], &m1).unwrap_err(),
            HandshakeError::Rejected
        );
        assert_eq!(
            read_hello(&server, "", &[1; 16], &vec![0u8; MAX_MSG1_BYTES + 1]).unwrap_err(),
            HandshakeError::TooLarge
        );
    }
}
