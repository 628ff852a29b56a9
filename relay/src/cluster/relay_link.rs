//! The relay-to-relay link's handshake, sans-IO: how a forwarding relay proves to the holder
//! that it is a relay of the cluster, and the holder proves it back.
//!
//! The environment link's handshake (`execrelay_protocol::env_handshake`) with other keys and another
//! prologue: `Noise_IK_25519_ChaChaPoly_BLAKE2s` on stream id 0 of `GET /v1/relay/ID`, the
//! forwarding relay as initiator with its own static key (its `--key`), pinning the holder's
//! key as the cluster keys file lists it for the node id the directory named; prologue
//! `execrelay/cluster/v1` + the 2-byte length of the environment id + the id. The holder
//! admits the link only if the proven key is listed in its cluster keys file for a node other
//! than itself, and the message's `ts` is fresh (the same replay cache as environment links,
//! per `node/environment`): the link's frames travel in the clear after the handshake (their
//! payloads are end-to-end records), so without `ts` a captured message 1 could be replayed
//! by anyone on the path to open a relay link.
//!
//! Why it matters: a relay link is served as a client link without per-address limits and is
//! never reaped for idleness (it carries many clients of one environment). A client without a
//! cluster key cannot get one: it cannot produce a message 1 that decrypts with a listed key,
//! and a bogus directory answer (anyone on NATS can publish) gains nothing, since the
//! forwarder pins the key the cluster file lists for the named node, and message 2 proves the
//! holder holds it. The distinct prologue means a relay link's message 1 never opens an
//! environment link and an environment's never opens a relay link.

use execrelay_protocol::env_handshake::{
    prologue_tagged, read_open_with_prologue, EnvironmentHandshake, LinkRefusal, LinkTimestamps,
};
use execrelay_protocol::frame::Frame;
use execrelay_protocol::keys::environments::NotAdmitted;
use execrelay_protocol::keys::{Keypair, KEY_BYTES};

use super::ClusterKeys;

/// Prologue prefix of relay-to-relay links.
pub const PROLOGUE_TAG: &[u8] = b"execrelay/cluster/v1";
/// The path prefix of relay-to-relay links: `/v1/relay/ID`.
pub const RELAY_PATH_PREFIX: &str = "/v1/relay/";

/// The prologue of a relay link for environment `env`.
pub fn prologue(env: &str) -> Vec<u8> {
    prologue_tagged(PROLOGUE_TAG, env)
}

/// The forwarding relay's message 1 for `env`, with its `own` keys, pinning `holder_public`,
/// stamped `ts` (microseconds since the epoch, never reused by this relay).
pub fn start(
    own: &Keypair,
    holder_public: &[u8; KEY_BYTES],
    env: &str,
    ts: u64,
) -> Result<(EnvironmentHandshake, Frame), LinkRefusal> {
    EnvironmentHandshake::start_with_prologue(own, holder_public, &prologue(env), ts)
}

/// A relay link the holder admitted.
#[derive(Debug, Clone)]
pub struct AdmittedRelay {
    /// Message 2 (`ACCEPT` on stream id 0).
    pub accept: Frame,
    /// The forwarding relay's node id.
    pub node: String,
}

/// The holder's admission of a relay link for `env`: message 1 decrypts with its `own` key
/// (the forwarder pinned it, and the prologue binds `env`); the proven key is listed in
/// `keys` for a node other than `own_node`; `ts` is fresh for that node and environment
/// (`stamps`, recorded on success); then message 2. On `Err`, send its reset frame and close.
#[allow(clippy::too_many_arguments)]
pub fn admit(
    own: &Keypair,
    own_node: &str,
    env: &str,
    open: &Frame,
    keys: &ClusterKeys,
    stamps: &mut LinkTimestamps,
    now_us: u64,
    version: &str,
) -> Result<AdmittedRelay, LinkRefusal> {
    let hs = read_open_with_prologue(own, &prologue(env), open)?;
    let node = match keys.node_of(&hs.env_key) {
        Some(n) if n != own_node => n.to_string(),
        _ => return Err(LinkRefusal::NotAdmitted(NotAdmitted::UnknownId)),
    };
    stamps.admit(&format!("{node}/{env}"), hs.ts, now_us)?;
    let accept = hs.accept(version)?;
    Ok(AdmittedRelay { accept, node })
}

#[cfg(test)]
mod tests {
    use super::*;
    use execrelay_protocol::env_handshake::{link_timestamps, read_link_open, REASON_REPLAYED};
    use execrelay_protocol::keys::environments::parse_environments;
    use execrelay_protocol::keys::public_line;
    use std::time::Duration;

    struct Cluster {
        a: Keypair,
        b: Keypair,
        keys: ClusterKeys,
    }

    fn cluster() -> Cluster {
        let a = Keypair::generate().unwrap();
        let b = Keypair::generate().unwrap();
        let text = format!(
            "relay-a {}\nrelay-b {}\n",
            public_line(&a.public, "a"),
            public_line(&b.public, "b")
        );
        let nodes = parse_environments(&text, "cluster").unwrap();
        Cluster {
            a,
            b,
            keys: ClusterKeys::from_nodes("cluster".into(), nodes),
        }
    }

    const NOW: u64 = 1_700_000_000_000_000;

    fn stamps() -> LinkTimestamps {
        link_timestamps(Duration::from_secs(30), NOW - 1_000_000)
    }

    #[test]
    fn a_listed_relay_is_admitted_and_proves_the_holder() {
        let c = cluster();
        let (hs, open) = start(&c.b, &c.a.public, "sandbox-1", NOW).unwrap();
        let mut st = stamps();
        let ok = admit(
            &c.a,
            "relay-a",
            "sandbox-1",
            &open,
            &c.keys,
            &mut st,
            NOW,
            "v",
        )
        .unwrap();
        assert_eq!(ok.node, "relay-b");
        assert!(hs.finish(&ok.accept).is_ok());
        // The same message 1 again: a replay.
        let again = admit(
            &c.a,
            "relay-a",
            "sandbox-1",
            &open,
            &c.keys,
            &mut st,
            NOW,
            "v",
        );
        assert_eq!(again.unwrap_err().reset_reason(), REASON_REPLAYED);
    }

    #[test]
    fn a_key_not_in_the_cluster_file_is_unauthorized() {
        let c = cluster();
        let stranger = Keypair::generate().unwrap();
        let (_, open) = start(&stranger, &c.a.public, "sandbox-1", NOW).unwrap();
        let err = admit(
            &c.a,
            "relay-a",
            "sandbox-1",
            &open,
            &c.keys,
            &mut stamps(),
            NOW,
            "v",
        )
        .unwrap_err();
        assert_eq!(err.reset_reason(), "unauthorized");
        // The holder's own key (a copy of its key file elsewhere) is no relay of the cluster
        // either.
        let (_, open) = start(&c.a, &c.a.public, "sandbox-1", NOW).unwrap();
        let err = admit(
            &c.a,
            "relay-a",
            "sandbox-1",
            &open,
            &c.keys,
            &mut stamps(),
            NOW,
            "v",
        )
        .unwrap_err();
        assert_eq!(err.reset_reason(), "unauthorized");
    }

    #[test]
    fn a_message_for_another_id_key_or_link_kind_does_not_open() {
        let c = cluster();
        // Bound to another environment id.
        let (_, open) = start(&c.b, &c.a.public, "sandbox-2", NOW).unwrap();
        let err = admit(
            &c.a,
            "relay-a",
            "sandbox-1",
            &open,
            &c.keys,
            &mut stamps(),
            NOW,
            "v",
        );
        assert!(matches!(err, Err(LinkRefusal::Undecryptable)));
        // Pinning another holder: the directory named a node whose key is not this relay's.
        let (_, open) = start(&c.b, &c.b.public, "sandbox-1", NOW).unwrap();
        let err = admit(
            &c.a,
            "relay-a",
            "sandbox-1",
            &open,
            &c.keys,
            &mut stamps(),
            NOW,
            "v",
        );
        assert!(matches!(err, Err(LinkRefusal::Undecryptable)));
        // A relay link's message 1 is no environment link's, and the other way round.
        let (_, open) = start(&c.b, &c.a.public, "sandbox-1", NOW).unwrap();
        assert!(matches!(
            read_link_open(&c.a, "sandbox-1", &open),
            Err(LinkRefusal::Undecryptable)
        ));
        let (_, env_open) =
            EnvironmentHandshake::start(&c.b, &c.a.public, "sandbox-1", NOW).unwrap();
        let err = admit(
            &c.a,
            "relay-a",
            "sandbox-1",
            &env_open,
            &c.keys,
            &mut stamps(),
            NOW,
            "v",
        );
        assert!(matches!(err, Err(LinkRefusal::Undecryptable)));
    }

    #[test]
    fn message_2_from_a_relay_without_the_pinned_key_is_refused() {
        let c = cluster();
        let (hs, _) = start(&c.b, &c.a.public, "sandbox-1", NOW).unwrap();
        // An impostor answers with its own handshake for a message 1 pinning itself.
        let impostor = Keypair::generate().unwrap();
        let (_, open2) = start(&c.b, &impostor.public, "sandbox-1", NOW + 1).unwrap();
        let keys = ClusterKeys::from_nodes(
            "x".into(),
            parse_environments(&format!("relay-b {}\n", public_line(&c.b.public, "b")), "x")
                .unwrap(),
        );
        let theirs = admit(
            &impostor,
            "relay-x",
            "sandbox-1",
            &open2,
            &keys,
            &mut stamps(),
            NOW,
            "v",
        )
        .unwrap();
        assert!(hs.finish(&theirs.accept).is_err());
    }
}
