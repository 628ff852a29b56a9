//! The environment link's handshake (`secure-transport.md` §6.2), sans-IO, both roles.
//!
//! `Noise_IK_25519_ChaChaPoly_BLAKE2s`: the environment (an exec server dialling out) is the
//! initiator and pins the relay's static key; the relay is the responder and admits the
//! environment only if the static key it proves is the one its environments file lists for the
//! id. The prologue is `execrelay/relay/v1` followed by the 2-byte big-endian length of the
//! environment id and the id, so a message 1 made for one id cannot open another. Message 1
//! travels in an `OPEN` frame and message 2 in an `ACCEPT` frame, both on stream id 0
//! ([`LINK_STREAM`]); a refusal is a `RESET` on stream id 0 with a reason, then the relay closes.
//!
//! Payloads (where the spec is silent, decided here):
//!
//! - Message 1: `{"version": 1, "ts": MICROS}`. `ts` works as in §3, with the same replay
//!   cache ([`crate::replay`], per environment id: [`LinkTimestamps`]): microseconds since
//!   the Unix epoch, admitted only within the clock window of the relay's clock, not earlier
//!   than the moment the relay started, and never twice for one id. Without it, anyone who
//!   captured a message 1 (from a plain `ws://` link, or a relay log of raw traffic) could
//!   replay it (before or after a relay restart) and take the environment's id. Refused with
//!   `RESET replayed_handshake`, `RESET clock_skew` (or `busy` past the per-id limit).
//! - Message 2: `{"version": 1, "relayVersion": "…"}`. The environment verifies message 2
//!   (which proves the relay holds the pinned key) before it treats the link as up.
//!
//! After the handshake the link carries frames in the clear (their payloads are end-to-end
//! records): no transport keys are kept, and no secret ever crosses the link.
//!
//! Errors from the cryptography are opaque to the peer (`unauthorized`); the relay's log says
//! which check failed ([`LinkRefusal`]). This module never reads a clock (callers pass `now`)
//! and never logs key material.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::frame::{Frame, FrameType, LINK_STREAM};
use crate::keys::environments::{EnvironmentsFile, NotAdmitted};
use crate::keys::{Keypair, KEY_BYTES};
use crate::replay::{ReplayCache, ReplayError, ReplayLimits};

/// The Noise protocol name (as for streams, §3).
pub const NOISE_PARAMS: &str = "Noise_IK_25519_ChaChaPoly_BLAKE2s";
/// Prologue prefix of the environment link.
pub const PROLOGUE_TAG: &[u8] = b"execrelay/relay/v1";
/// Protocol version in the link handshake payloads.
pub const LINK_HANDSHAKE_VERSION: u32 = 1;
/// Largest payload of either message: `{"version":1,"ts":…}` is under 40 bytes and message 2
/// carries a version string; 1 KiB leaves room for later fields without letting a peer make
/// the relay decrypt much before it knows who it is.
pub const MAX_LINK_PAYLOAD: usize = 1024;
/// Largest message 1: ephemeral key (32) + encrypted static key (32 + 16) + payload + tag (16).
/// Checked before any cryptography runs.
pub const MAX_LINK_MSG1_BYTES: usize = 32 + 48 + MAX_LINK_PAYLOAD + 16;
/// Largest message 2: ephemeral key (32) + payload + tag (16).
pub const MAX_LINK_MSG2_BYTES: usize = 32 + MAX_LINK_PAYLOAD + 16;
/// Environment ids whose accepted stamps a relay remembers. Only admitted environments
/// (listed, key proven) are recorded, and stamps out of the clock window are worth nothing
/// (the clock check refuses their replays anyway) and go first; twice the relay's environment
/// limit.
pub const TRACKED_ENVIRONMENTS: usize = 2 * crate::config::MAX_ENVIRONMENTS;

/// The `RESET` reason of a refused link whose key or id did not check out (§6.2).
pub const REASON_UNAUTHORIZED: &str = "unauthorized";
/// The `RESET` reason of a replayed message 1.
pub const REASON_REPLAYED: &str = "replayed_handshake";
/// The `RESET` reason of a message 1 whose `ts` is too far from the relay's clock.
pub const REASON_CLOCK_SKEW: &str = "clock_skew";
/// The `RESET` reason of a link whose first frame is not a link handshake.
pub const REASON_MALFORMED: &str = "malformed_frame";
/// The `RESET` reason of a link refused because another live link holds the id (two exec
/// servers share the environment's key): the live holder keeps it.
pub const REASON_HELD: &str = "environment_in_use";

/// Message 1 payload.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LinkHello {
    /// Must be 1.
    pub version: u32,
    /// Microseconds since the Unix epoch, larger for every link handshake of the environment.
    pub ts: u64,
}

/// Message 2 payload.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LinkWelcome {
    /// Must be 1.
    pub version: u32,
    /// The relay's version.
    pub relay_version: String,
}

/// Why an environment link is refused, on either side. The relay logs it; the environment
/// learns only the `RESET` reason ([`LinkRefusal::reset_reason`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LinkRefusal {
    /// The first frame is not an `OPEN` on stream id 0 (or message 2 is not an `ACCEPT`).
    #[error("expected {expected} on stream id 0, got {got}")]
    UnexpectedFrame {
        /// What was expected.
        expected: &'static str,
        /// What came (type and whether on stream 0).
        got: String,
    },
    /// Larger than the protocol allows: refused before decryption.
    #[error("handshake message of {0} bytes is too large")]
    TooLarge(usize),
    /// Decryption failed: the environment pins another relay key, or its prologue names
    /// another environment id than the path, or the message was tampered with.
    #[error(
        "message 1 did not decrypt: the environment pins another relay key (check its \
         --relay-key), names another environment id than its path, or was tampered with"
    )]
    Undecryptable,
    /// The payload is not the expected JSON.
    #[error("bad link handshake payload: {0}")]
    Payload(String),
    /// The id is not listed, or listed with another key, or the file is unusable.
    #[error("{0}")]
    NotAdmitted(#[from] NotAdmitted),
    /// The `ts` of message 1 is refused by the replay cache: a replay, a stamp from before
    /// the relay started, a clock too far from the relay's, or too many handshakes of the id
    /// within the window.
    #[error("{0}")]
    Stamp(#[from] ReplayError),
    /// Another exec server holds the id with this key, and it answered the relay's ping: two
    /// servers share an environment key. The live holder keeps the id.
    #[error("environment id held by a live link: two exec servers share this environment key")]
    Held,
    /// The relay refused the link (seen by the environment): the `RESET` reason.
    #[error("the relay refused the link: {0}")]
    Refused(String),
    /// Message 2 did not verify: this is not the relay whose key is pinned.
    #[error("message 2 did not verify: the relay does not hold the pinned --relay-key")]
    WrongRelay,
}

impl LinkRefusal {
    /// The `RESET` reason the relay sends for this refusal (never more detail: the
    /// environment's operator reads the relay's log for that).
    pub fn reset_reason(&self) -> &'static str {
        match self {
            LinkRefusal::Stamp(e) => e.reset_reason(),
            LinkRefusal::Held => REASON_HELD,
            LinkRefusal::UnexpectedFrame { .. } | LinkRefusal::Payload(_) => REASON_MALFORMED,
            _ => REASON_UNAUTHORIZED,
        }
    }

    /// The `RESET` frame on stream id 0 that tells the environment.
    pub fn reset_frame(&self) -> Frame {
        Frame::reset(LINK_STREAM, self.reset_reason())
    }
}

/// The prologue for environment `env_id`.
pub fn prologue(env_id: &str) -> Vec<u8> {
    prologue_tagged(PROLOGUE_TAG, env_id)
}

/// `tag` followed by the 2-byte big-endian length of `env_id` and the id: the environment
/// link's prologue with [`PROLOGUE_TAG`], the relay-to-relay link's with its own tag
/// (`execrelay_relay::cluster`), so that a message 1 made for one kind of link never opens the other.
pub fn prologue_tagged(tag: &[u8], env_id: &str) -> Vec<u8> {
    let id = env_id.as_bytes();
    // Environment ids are at most 128 bytes (the route's rule); clamp anyway.
    let len = id.len().min(u16::MAX as usize);
    let mut p = Vec::with_capacity(tag.len() + 2 + len);
    p.extend_from_slice(tag);
    p.extend_from_slice(&(len as u16).to_be_bytes());
    p.extend_from_slice(&id[..len]);
    p
}

fn builder<'a>(keys: &'a Keypair, prologue: &'a [u8]) -> Result<snow::Builder<'a>, LinkRefusal> {
    let params = NOISE_PARAMS
        .parse()
        .map_err(|_| LinkRefusal::Undecryptable)?;
    snow::Builder::new(params)
        .local_private_key(&keys.private)
        .and_then(|b| b.prologue(prologue))
        .map_err(|_| LinkRefusal::Undecryptable)
}

fn frame_kind(f: &Frame) -> String {
    let on = if f.stream == LINK_STREAM {
        "stream id 0"
    } else {
        "another stream id"
    };
    if f.ftype == FrameType::Reset {
        let reason = String::from_utf8_lossy(&f.payload);
        let reason: String = reason
            .chars()
            .filter(|c| !c.is_control())
            .take(64)
            .collect();
        format!("RESET ({reason}) on {on}")
    } else if f.flags != 0 {
        format!("{:?} with flags {:#06x} on {on}", f.ftype, f.flags)
    } else {
        format!("{:?} on {on}", f.ftype)
    }
}

fn handshake_frame(ftype: FrameType, msg: Vec<u8>) -> Frame {
    Frame::new(ftype, LINK_STREAM, 0, Bytes::from(msg))
}

// ---- environment (initiator) -----------------------------------------------------------------

/// The environment's side, between message 1 and message 2.
pub struct EnvironmentHandshake {
    hs: snow::HandshakeState,
}

impl std::fmt::Debug for EnvironmentHandshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvironmentHandshake")
            .finish_non_exhaustive()
    }
}

impl EnvironmentHandshake {
    /// Build message 1 for environment `env_id` with the environment's `keys`, pinning
    /// `relay_public`, stamped `ts` (microseconds since the Unix epoch, above every earlier
    /// stamp of this environment: the exec server's `next_hello_ts`). Returns the `OPEN`
    /// frame to send.
    pub fn start(
        keys: &Keypair,
        relay_public: &[u8; KEY_BYTES],
        env_id: &str,
        ts: u64,
    ) -> Result<(EnvironmentHandshake, Frame), LinkRefusal> {
        Self::start_with(keys, relay_public, env_id, ts, None)
    }

    /// [`start`](Self::start) with another prologue ([`prologue_tagged`]): the initiator of a
    /// relay-to-relay link (`execrelay_relay::cluster`), pinning the holder relay's key.
    pub fn start_with_prologue(
        keys: &Keypair,
        relay_public: &[u8; KEY_BYTES],
        prologue: &[u8],
        ts: u64,
    ) -> Result<(EnvironmentHandshake, Frame), LinkRefusal> {
        Self::start_raw(keys, relay_public, prologue, ts, None)
    }

    fn start_with(
        keys: &Keypair,
        relay_public: &[u8; KEY_BYTES],
        env_id: &str,
        ts: u64,
        ephemeral: Option<&[u8; KEY_BYTES]>,
    ) -> Result<(EnvironmentHandshake, Frame), LinkRefusal> {
        Self::start_raw(keys, relay_public, &prologue(env_id), ts, ephemeral)
    }

    fn start_raw(
        keys: &Keypair,
        relay_public: &[u8; KEY_BYTES],
        pro: &[u8],
        ts: u64,
        ephemeral: Option<&[u8; KEY_BYTES]>,
    ) -> Result<(EnvironmentHandshake, Frame), LinkRefusal> {
        let mut b = builder(keys, pro)?;
        if let Some(e) = ephemeral {
            b = b.fixed_ephemeral_key_for_testing_only(e);
        }
        let mut hs = b
            .remote_public_key(relay_public)
            .and_then(|b| b.build_initiator())
            .map_err(|_| LinkRefusal::Undecryptable)?;
        let payload = serde_json::to_vec(&LinkHello {
            version: LINK_HANDSHAKE_VERSION,
            ts,
        })
        .map_err(|e| LinkRefusal::Payload(e.to_string()))?;
        let mut msg = vec![0u8; MAX_LINK_MSG1_BYTES];
        let n = hs
            .write_message(&payload, &mut msg)
            .map_err(|_| LinkRefusal::Undecryptable)?;
        msg.truncate(n);
        Ok((
            EnvironmentHandshake { hs },
            handshake_frame(FrameType::Open, msg),
        ))
    }

    /// The relay's answer: an `ACCEPT` carrying message 2 (verified here: it proves the relay
    /// holds the pinned key) or a `RESET` with the reason of the refusal.
    pub fn finish(mut self, answer: &Frame) -> Result<LinkWelcome, LinkRefusal> {
        if answer.stream == LINK_STREAM && answer.ftype == FrameType::Reset {
            let reason = String::from_utf8_lossy(&answer.payload);
            let reason: String = reason.chars().filter(|c| !c.is_control()).collect();
            return Err(LinkRefusal::Refused(reason));
        }
        if answer.stream != LINK_STREAM || answer.ftype != FrameType::Accept {
            return Err(LinkRefusal::UnexpectedFrame {
                expected: "ACCEPT",
                got: frame_kind(answer),
            });
        }
        let msg2 = &answer.payload;
        if msg2.len() > MAX_LINK_MSG2_BYTES {
            return Err(LinkRefusal::TooLarge(msg2.len()));
        }
        let mut payload = vec![0u8; msg2.len()];
        let n = self
            .hs
            .read_message(msg2, &mut payload)
            .map_err(|_| LinkRefusal::WrongRelay)?;
        let welcome: LinkWelcome = serde_json::from_slice(&payload[..n])
            .map_err(|e| LinkRefusal::Payload(e.to_string()))?;
        if welcome.version != LINK_HANDSHAKE_VERSION {
            return Err(LinkRefusal::Payload(format!(
                "unsupported version {}",
                welcome.version
            )));
        }
        if !self.hs.is_handshake_finished() {
            return Err(LinkRefusal::WrongRelay);
        }
        Ok(welcome)
    }
}

// ---- relay (responder) ---------------------------------------------------------------------

/// The relay's side after a message 1 that decrypted: the environment's proven key and its
/// `ts`, waiting for the admission checks.
pub struct RelayHandshake {
    hs: snow::HandshakeState,
    /// The environment's static key, authenticated by message 1.
    pub env_key: [u8; KEY_BYTES],
    /// The message's `ts`.
    pub ts: u64,
}

impl std::fmt::Debug for RelayHandshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayHandshake")
            .field("env_key", &crate::keys::fingerprint(&self.env_key))
            .field("ts", &self.ts)
            .finish_non_exhaustive()
    }
}

/// Read the environment's first frame, checking in order: an `OPEN` on stream id 0, its size,
/// decryption (which authenticates the environment's key and binds `env_id`), the payload's
/// shape. The admission (key listed for the id, [`LinkTimestamps`]) is the caller's next step,
/// then [`RelayHandshake::accept`].
pub fn read_link_open(
    relay_keys: &Keypair,
    env_id: &str,
    open: &Frame,
) -> Result<RelayHandshake, LinkRefusal> {
    read_open_with_prologue(relay_keys, &prologue(env_id), open)
}

/// [`read_link_open`] with another prologue ([`prologue_tagged`]): the holder's side of a
/// relay-to-relay link (`execrelay_relay::cluster`). The proven key is `env_key` (the forwarding
/// relay's key there).
pub fn read_open_with_prologue(
    relay_keys: &Keypair,
    pro: &[u8],
    open: &Frame,
) -> Result<RelayHandshake, LinkRefusal> {
    // The environment link's handshake is always suite 0 (§3): an OPEN with suite bits is
    // not one.
    if open.stream != LINK_STREAM
        || open.ftype != FrameType::Open
        || open.seq != 0
        || open.flags != 0
    {
        return Err(LinkRefusal::UnexpectedFrame {
            expected: "OPEN (flags 0)",
            got: frame_kind(open),
        });
    }
    let msg1 = &open.payload;
    if msg1.len() > MAX_LINK_MSG1_BYTES {
        return Err(LinkRefusal::TooLarge(msg1.len()));
    }
    let mut hs = builder(relay_keys, pro)?
        .build_responder()
        .map_err(|_| LinkRefusal::Undecryptable)?;
    let mut payload = vec![0u8; msg1.len()];
    let n = hs
        .read_message(msg1, &mut payload)
        .map_err(|_| LinkRefusal::Undecryptable)?;
    if n > MAX_LINK_PAYLOAD {
        return Err(LinkRefusal::TooLarge(n));
    }
    let hello: LinkHello =
        serde_json::from_slice(&payload[..n]).map_err(|e| LinkRefusal::Payload(e.to_string()))?;
    if hello.version != LINK_HANDSHAKE_VERSION {
        return Err(LinkRefusal::Payload(format!(
            "unsupported version {}",
            hello.version
        )));
    }
    let mut env_key = [0u8; KEY_BYTES];
    match hs.get_remote_static() {
        Some(k) if k.len() == KEY_BYTES => env_key.copy_from_slice(k),
        _ => return Err(LinkRefusal::Undecryptable),
    }
    Ok(RelayHandshake {
        hs,
        env_key,
        ts: hello.ts,
    })
}

impl RelayHandshake {
    /// Admitted: build message 2 (`ACCEPT` on stream id 0).
    pub fn accept(mut self, relay_version: &str) -> Result<Frame, LinkRefusal> {
        let payload = serde_json::to_vec(&LinkWelcome {
            version: LINK_HANDSHAKE_VERSION,
            relay_version: relay_version.to_string(),
        })
        .map_err(|e| LinkRefusal::Payload(e.to_string()))?;
        let mut msg = vec![0u8; MAX_LINK_MSG2_BYTES];
        let n = self
            .hs
            .write_message(&payload, &mut msg)
            .map_err(|_| LinkRefusal::Undecryptable)?;
        msg.truncate(n);
        Ok(handshake_frame(FrameType::Accept, msg))
    }
}

/// An environment link the relay admitted: the `ACCEPT` to send, and who it is.
#[derive(Debug, Clone)]
pub struct AdmittedLink {
    /// The `ACCEPT` frame (message 2) on stream id 0.
    pub accept: Frame,
    /// The environment's proven static key.
    pub env_key: [u8; KEY_BYTES],
    /// Its message 1's `ts` (now the last accepted for the id).
    pub ts: u64,
}

/// The relay's whole admission of an environment link, in order: the first frame is an
/// `OPEN` on stream id 0; the id is listed (checked before any cryptography, so an unlisted
/// id costs no Diffie-Hellman); message 1 decrypts (the key is proven and the id bound by the
/// prologue); the key is the one listed for the id; the `ts` is fresh ([`LinkTimestamps`],
/// recorded on success); then message 2. `now` is the relay's clock in microseconds since the
/// Unix epoch. On `Err`, send [`LinkRefusal::reset_frame`] and close.
pub fn admit_link(
    relay_keys: &Keypair,
    env_id: &str,
    open: &Frame,
    environments: &EnvironmentsFile,
    timestamps: &mut LinkTimestamps,
    now: u64,
    relay_version: &str,
) -> Result<AdmittedLink, LinkRefusal> {
    precheck_link_open(env_id, open, environments)?;
    let hs = read_link_open(relay_keys, env_id, open)?;
    finish_admission(hs, env_id, environments, timestamps, now, relay_version)
}

/// [`admit_link`]'s checks before any cryptography: the first frame is an `OPEN` on stream
/// id 0 and the id is listed. A caller that holds a lock on the environments file releases it
/// for [`read_link_open`] (two Diffie-Hellman operations a stranger can ask for at its
/// connection rate), then calls [`finish_admission`] under the lock again.
pub fn precheck_link_open(
    env_id: &str,
    open: &Frame,
    environments: &EnvironmentsFile,
) -> Result<(), LinkRefusal> {
    if open.stream != LINK_STREAM || open.ftype != FrameType::Open || open.flags != 0 {
        return Err(LinkRefusal::UnexpectedFrame {
            expected: "OPEN (flags 0)",
            got: frame_kind(open),
        });
    }
    if !environments.lists(env_id) {
        return Err(match environments.broken() {
            Some(e) => NotAdmitted::FileUnusable(e.to_string()),
            None => NotAdmitted::UnknownId,
        }
        .into());
    }
    Ok(())
}

/// [`admit_link`]'s checks after message 1 decrypted, against the environments file as it
/// is now (it may have changed since [`precheck_link_open`]): the proven key is the one
/// listed for the id, the `ts` is fresh (recorded on success); then message 2.
pub fn finish_admission(
    hs: RelayHandshake,
    env_id: &str,
    environments: &EnvironmentsFile,
    timestamps: &mut LinkTimestamps,
    now: u64,
    relay_version: &str,
) -> Result<AdmittedLink, LinkRefusal> {
    environments.admits(env_id, &hs.env_key)?;
    timestamps.admit(&env_id.to_string(), hs.ts, now)?;
    let (env_key, ts) = (hs.env_key, hs.ts);
    let accept = hs.accept(relay_version)?;
    Ok(AdmittedLink {
        accept,
        env_key,
        ts,
    })
}

/// The relay's replay cache of link-handshake stamps, per environment id ([`crate::replay`]).
pub type LinkTimestamps = ReplayCache<String>;

/// An empty [`LinkTimestamps`] for a relay that started at `started` (microseconds since the
/// epoch), with the clock window `window`.
pub fn link_timestamps(window: std::time::Duration, started: u64) -> LinkTimestamps {
    ReplayCache::new(
        ReplayLimits {
            window,
            ..ReplayLimits::with_keys(TRACKED_ENVIRONMENTS)
        },
        started,
    )
}

#[cfg(test)]
mod tests;
