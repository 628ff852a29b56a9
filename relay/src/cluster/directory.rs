//! The directory's subjects and messages, sans-IO: what a relay publishes on NATS and what it
//! makes of what it receives. No socket, no clock (callers pass times).
//!
//! - `execrelay.env.<ID>`: subscribed by the relay holding environment `ID`'s link, exactly
//!   while it holds it. Two messages travel on it:
//!   - a **lookup** (request/reply): `{"op":"lookup"}`; the holder answers with a
//!     [`Holder`] (`{"node","addr","age_ms","since_us"}`);
//!   - a **claim** (published by a relay that has just admitted the environment's link):
//!     `{"op":"claim","node":…,"since_us":…}`. Any other holder compares: the newest link
//!     wins ([`newest_wins`]), the other relay closes its link (`replaced`);
//!   - a **home** notice `{"op":"home","node":…}`: a relay that the cluster's front (HAProxy)
//!     sent one of the environment's clients to, while another holds it: membership changed
//!     and the id now hashes there. The holder asks the environment to move (its link closed
//!     `moved`, at a bounded rate, never younger than a minimum age), so that steady state
//!     needs no forwarding.
//!
//! Unknown fields are ignored (relays of two versions share a cluster during an upgrade).
//! Every message is at most [`MAX_DIRECTORY_MESSAGE_BYTES`]; a larger or unparsable one is
//! ignored (and counted by the caller): NATS is shared infrastructure, not a trusted peer,
//! and an answer only ever names a relay that must still prove its cluster key.

use serde::{Deserialize, Serialize};

/// Subject prefix of environment holders.
pub const SUBJECT_PREFIX: &str = "execrelay.env.";
/// Largest directory message read or written.
pub const MAX_DIRECTORY_MESSAGE_BYTES: usize = 1024;

/// The subject of environment `env` (ids use `A-Z a-z 0-9 - . _ ~` only: never a NATS
/// wildcard, and a `.` only makes more tokens of one literal subject).
pub fn subject(env: &str) -> String {
    format!("{SUBJECT_PREFIX}{env}")
}

/// A message on an environment's subject.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum DirectoryMessage {
    /// Where is the environment? (request; the holder replies with a [`Holder`]).
    Lookup,
    /// The cluster's front (HAProxy) now sends the environment's clients to `node` (they
    /// reached it through the front and it forwards them here): the holder asks the
    /// environment to move there (its link closed `moved`, at a bounded rate).
    Home {
        /// The relay the front routes the environment to.
        node: String,
    },
    /// A relay has just admitted the environment's link, at `since_us` (microseconds since
    /// the Unix epoch).
    Claim {
        /// The claiming relay's node id.
        node: String,
        /// When its link was admitted.
        since_us: u64,
    },
}

/// The holder's answer to a lookup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// The holder's node id (its key is the cluster file's for this id).
    pub node: String,
    /// Its internal address, `ws://HOST:PORT` (its `--advertise`).
    pub addr: String,
    /// How long it has held the link, in milliseconds.
    pub age_ms: u64,
    /// When its link was admitted (microseconds since the Unix epoch).
    pub since_us: u64,
}

/// A directory message that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DirectoryError {
    /// Larger than [`MAX_DIRECTORY_MESSAGE_BYTES`].
    #[error("directory message of {0} bytes is over the {MAX_DIRECTORY_MESSAGE_BYTES}-byte limit")]
    TooLarge(usize),
    /// Not the expected JSON.
    #[error("bad directory message: {0}")]
    Malformed(String),
}

fn bounded(bytes: &[u8]) -> Result<(), DirectoryError> {
    if bytes.len() > MAX_DIRECTORY_MESSAGE_BYTES {
        return Err(DirectoryError::TooLarge(bytes.len()));
    }
    Ok(())
}

impl DirectoryMessage {
    /// The wire form.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parse, bounded.
    pub fn decode(bytes: &[u8]) -> Result<DirectoryMessage, DirectoryError> {
        bounded(bytes)?;
        serde_json::from_slice(bytes).map_err(|e| DirectoryError::Malformed(e.to_string()))
    }
}

impl Holder {
    /// The wire form.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parse, bounded; the node id must be a valid one.
    pub fn decode(bytes: &[u8]) -> Result<Holder, DirectoryError> {
        bounded(bytes)?;
        let h: Holder =
            serde_json::from_slice(bytes).map_err(|e| DirectoryError::Malformed(e.to_string()))?;
        if !super::valid_node_id(&h.node) {
            return Err(DirectoryError::Malformed(format!(
                "bad node id {:?}",
                h.node
            )));
        }
        Ok(h)
    }
}

/// Which of two holders of one environment keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The claim is our own echo: nothing to do.
    Keep,
    /// Ours is the newest, and the claimant holds an older link: keep ours and claim again.
    /// Only the older side acts on a claim, and the older side may have subscribed after our
    /// claim went by (NATS keeps nothing for late subscribers); its claim reaching us proves it
    /// is subscribed now, so our answer reaches it.
    Reassert,
    /// The claimant's link is newer: close ours (`replaced`).
    Yield,
}

/// We (`ours_node`, link admitted at `ours_since_us`) hold an environment and see a claim.
/// The newest link wins: an environment that re-dialled during a membership change is on its
/// new link, and the old one is what a stale route still points at. Equal stamps (two clocks
/// agreeing to the microsecond) are broken by node id, so that exactly one side yields.
pub fn newest_wins(
    ours_node: &str,
    ours_since_us: u64,
    claim_node: &str,
    claim_since_us: u64,
) -> Verdict {
    if claim_node == ours_node {
        return Verdict::Keep;
    }
    if (claim_since_us, claim_node) > (ours_since_us, ours_node) {
        Verdict::Yield
    } else {
        Verdict::Reassert
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_unknown_shapes_are_refused() {
        for m in [
            DirectoryMessage::Lookup,
            DirectoryMessage::Home {
                node: "relay-3".into(),
            },
            DirectoryMessage::Claim {
                node: "relay-1".into(),
                since_us: 42,
            },
        ] {
            assert_eq!(DirectoryMessage::decode(&m.encode()).unwrap(), m);
        }
        assert_eq!(
            DirectoryMessage::Lookup.encode(),
            br#"{"op":"lookup"}"#.to_vec()
        );
        assert!(matches!(
            DirectoryMessage::decode(br#"{"op":"steal"}"#),
            Err(DirectoryError::Malformed(_))
        ));
        // Fields a later version adds are ignored (relays of two versions share a cluster
        // during an upgrade).
        assert_eq!(
            DirectoryMessage::decode(br#"{"op":"lookup","x":1}"#).unwrap(),
            DirectoryMessage::Lookup
        );
        assert!(matches!(
            DirectoryMessage::decode(br#"{"op":"claim","node":"a"}"#),
            Err(DirectoryError::Malformed(_))
        ));
        let h = Holder {
            node: "relay-2".into(),
            addr: "ws://127.0.0.1:1".into(),
            age_ms: 5,
            since_us: 9,
        };
        assert_eq!(Holder::decode(&h.encode()).unwrap(), h);
        let bad = Holder {
            node: "no spaces".into(),
            ..h
        };
        assert!(Holder::decode(&bad.encode()).is_err());
    }

    #[test]
    fn messages_are_bounded_at_the_limit() {
        let pad = |n: usize| {
            let base = br#"{"op":"claim","node":"","since_us":1}"#.len();
            DirectoryMessage::Claim {
                node: "a".repeat(n - base),
                since_us: 1,
            }
            .encode()
        };
        let at = pad(MAX_DIRECTORY_MESSAGE_BYTES);
        assert_eq!(at.len(), MAX_DIRECTORY_MESSAGE_BYTES);
        assert!(DirectoryMessage::decode(&at).is_ok());
        let over = pad(MAX_DIRECTORY_MESSAGE_BYTES + 1);
        assert_eq!(
            DirectoryMessage::decode(&over),
            Err(DirectoryError::TooLarge(MAX_DIRECTORY_MESSAGE_BYTES + 1))
        );
    }

    #[test]
    fn the_newest_link_wins_and_exactly_one_side_yields() {
        assert_eq!(newest_wins("a", 10, "b", 20), Verdict::Yield);
        assert_eq!(newest_wins("b", 20, "a", 10), Verdict::Reassert);
        // Our own claim echoed back.
        assert_eq!(newest_wins("a", 10, "a", 10), Verdict::Keep);
        // A tie: one side yields, never both, never neither.
        let ab = newest_wins("a", 10, "b", 10);
        let ba = newest_wins("b", 10, "a", 10);
        assert_ne!(ab, ba);
    }

    #[test]
    fn subjects_are_literal() {
        assert_eq!(subject("sandbox-1"), "execrelay.env.sandbox-1");
        assert_eq!(subject("a.b"), "execrelay.env.a.b");
    }
}
