//! Relays past one machine: NATS core as the directory of which relay holds which
//! environment's link, and relay-to-relay links that carry a misrouted client link's streams
//! to the holder over the relay's own link engine.
//!
//! - [`ClusterSpec`] / [`ClusterKeys`]: `--cluster nats://… --node-id ID --advertise ws://ADDR
//!   --cluster-keys FILE`, checked at start (every error names its flag and what to do).
//! - [`directory`] (sans-IO): the subjects, the messages on them and their bounds, and who
//!   wins when two relays hold one environment (the newest link).
//! - [`relay_link`] (sans-IO): the relay-to-relay link's handshake (Noise_IK on stream id 0,
//!   both relays' keys from the cluster file).
//! - [`node`] (tokio): one relay's membership: its NATS connection, its subscriptions (one per
//!   environment link it holds), lookups, and the relay-to-relay links it dials.
//! - [`trusted_front`] (sans-IO): which peers' `X-Execrelay-Front` header is honoured
//!   (`trusted_front`; nobody's by default).
//!
//! # What this module owns
//!
//! Which relay is asked where an environment is, and how a relay proves to another that it
//! is one. Data never travels over NATS: a lookup answers with an address, and the streams go
//! over a relay-to-relay link, which the holder serves as one more client link (flow control,
//! keepalive and budgets apply across the hop) and the forwarder as the environment's link.
//!
//! # What it must never do
//!
//! Read a payload (the forwarder routes by frame header as for any link); keep state in NATS
//! that could go stale (a subscription lives exactly as long as the link it stands for, and a
//! relay that dies loses them with its connection); let a client without a cluster key pose
//! as a relay (the holder admits a relay link only after a handshake proving a listed key).

pub mod directory;
pub mod node;
pub mod relay_link;
pub mod trusted_front;

use std::path::{Path, PathBuf};

use execrelay_protocol::keys::environments::{
    parse_environments, valid_environment_id, Environments,
};
use execrelay_protocol::keys::{fingerprint, Keypair, KEY_BYTES};

/// How long a relay waits for the directory's answer to a lookup (NATS request/reply).
/// Holders answer from memory at once; 1 s covers a loaded NATS server and stays well under a
/// client's connect timeout, so a misroute with no answer fails fast.
pub const CLUSTER_LOOKUP_TIMEOUT_MS: u64 = 1_000;
/// Directory lookups in flight at once on one relay: a flood of client links for unknown
/// environments cannot make a relay hold unbounded requests open on NATS.
pub const MAX_CLUSTER_LOOKUPS: usize = 64;
/// Directory lookups one relay starts per second (burst the same): bounds what a client can
/// make a relay ask the cluster (only the holder answers, but NATS carries each request).
pub const CLUSTER_LOOKUPS_PER_SECOND: u32 = 200;
/// Relay-to-relay links one relay holds at once in each direction. One forwarding link serves
/// every misrouted client link of one environment, so this bounds environments reached through
/// a misroute at once; with stable membership there are none.
pub const MAX_RELAY_LINKS: usize = 1024;
/// Environment links one relay asks to move per second at most (their exec servers re-dial
/// through the front to their new home). After a membership change every moved environment
/// re-dials and its clients resume: a bounded rate spreads that over time instead of a storm.
pub const MOVES_PER_SECOND: u32 = 5;
/// An environment link younger than this is never asked to move: an environment whose link
/// the front keeps sending elsewhere (a membership still settling) moves at most once per
/// this period. Only a trusted front's header counts (`trusted_front`).
pub const MOVE_MIN_LINK_AGE_MS: u64 = 10_000;
/// Moves waiting for their turn on one relay; a `home` notice past it is dropped (the next
/// misrouted client sends another).
pub const MAX_PENDING_MOVES: usize = 4096;
/// Times one holding claims an environment again when an older holder's claim arrives
/// (directory.rs, `Verdict::Reassert`). One answer settles two holders; the cap bounds what a
/// publisher replaying old claims on NATS can make a relay send.
pub const MAX_CLAIM_REASSERTS: u32 = 8;
/// How long connecting to NATS may take at start before the relay goes on without it (it
/// keeps trying in the background; affine traffic never needs it).
pub const NATS_CONNECT_TIMEOUT_MS: u64 = 2_000;
/// Longest node id (it travels in every directory answer).
pub const MAX_NODE_ID_BYTES: usize = 64;

/// A cluster setting that cannot be used. Each names the flag (or TOML key) and what to do.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClusterError {
    /// `--cluster` is not a NATS URL.
    #[error("bad --cluster {0:?}: expected nats://HOST:PORT (the NATS server every relay of the cluster connects to)")]
    BadNatsUrl(String),
    /// `--advertise` is not `ws://HOST:PORT`.
    #[error("bad --advertise {0:?}: expected ws://HOST:PORT, the address other relays dial for relay-to-relay links (reachable from them; wss:// is not supported for relay-to-relay links yet)")]
    BadAdvertise(String),
    /// `--advertise` names the unspecified address (`0.0.0.0`, `::`): where a relay listens,
    /// not where another can dial it.
    #[error("bad --advertise {0:?}: {1} means every address of this host, which other relays cannot dial: give this relay's own address as the other relays reach it (ws://10.0.0.1:7000)")]
    UnspecifiedAdvertise(String, String),
    /// `--node-id` is not a valid id.
    #[error("bad --node-id {0:?}: expected 1 to 64 characters of A-Z a-z 0-9 - . _ ~")]
    BadNodeId(String),
    /// Some of the cluster flags are missing.
    #[error("--cluster needs --node-id, --advertise and --cluster-keys (missing: {0})")]
    Incomplete(String),
    /// A cluster flag without `--cluster`.
    #[error(
        "{0} goes with --cluster nats://HOST:PORT (without --cluster the relay is standalone)"
    )]
    WithoutCluster(String),
    /// The cluster keys file cannot be read or parsed.
    #[error("--cluster-keys {path}: {error}: it lists every relay of the cluster, one `NODE_ID execrelay-x25519 <base64>` line each (`echo \"NODE_ID $(cat NODE_KEY.pub)\" >> FILE`), the same file on every relay")]
    KeysFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        error: String,
    },
    /// This relay's node id is not in the cluster keys file.
    #[error("--node-id {node:?} is not listed in --cluster-keys {path}: add the line `{node} <this relay's public key line>` (from `execrelay-relay keygen`) to the file on every relay")]
    NodeNotListed {
        /// The node id.
        node: String,
        /// The file.
        path: PathBuf,
    },
    /// The node key file cannot be read.
    #[error("--node-key {path}: {error}")]
    NodeKey {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        error: String,
    },
    /// The cluster keys file lists another key for this node than its node key.
    #[error("--cluster-keys {path} lists node {node:?} with key {listed}, but this relay's node key is {own}: {fix}")]
    KeyMismatch {
        /// The node id.
        node: String,
        /// The file.
        path: PathBuf,
        /// Fingerprint of the listed key.
        listed: String,
        /// Fingerprint of the relay's key, and where it came from (`--node-key FILE`, or
        /// `--key` when no `--node-key` was given).
        own: String,
        /// What to do.
        fix: String,
    },
}

/// The cluster flags, as given (`--cluster`, `--node-id`, `--advertise`, `--cluster-keys`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterFlags {
    /// `--cluster nats://HOST:PORT`.
    pub cluster: Option<String>,
    /// `--node-id ID`.
    pub node_id: Option<String>,
    /// `--advertise ws://HOST:PORT`.
    pub advertise: Option<String>,
    /// `--cluster-keys FILE`.
    pub cluster_keys: Option<PathBuf>,
    /// `--node-key FILE`: this relay's own key for relay-to-relay links (default: `--key`).
    pub node_key: Option<PathBuf>,
}

/// A relay's place in a cluster, checked.
#[derive(Clone)]
pub struct ClusterSpec {
    /// The NATS server's URL.
    pub nats_url: String,
    /// This relay's node id (listed in the keys file with its own key).
    pub node_id: String,
    /// `ws://HOST:PORT`: where other relays dial this one.
    pub advertise: String,
    /// Every relay's key, by node id.
    pub keys: ClusterKeys,
    /// This relay's node key (its line in `keys`): `--node-key`, else its `--key`.
    pub node_keys: Keypair,
}

impl std::fmt::Debug for ClusterSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterSpec")
            .field("nats_url", &self.nats_url)
            .field("node_id", &self.node_id)
            .field("advertise", &self.advertise)
            .field("node_key", &fingerprint(&self.node_keys.public))
            .finish_non_exhaustive()
    }
}

/// The cluster keys file: one `NODE_ID execrelay-x25519 <base64> [comment]` line per relay
/// (the environments file's format), the public line each relay's `keygen` printed.
#[derive(Debug, Clone)]
pub struct ClusterKeys {
    path: PathBuf,
    nodes: Environments,
}

impl ClusterKeys {
    /// Read and parse `path`.
    pub fn load(path: &Path) -> Result<ClusterKeys, ClusterError> {
        let err = |error: String| ClusterError::KeysFile {
            path: path.to_path_buf(),
            error,
        };
        let text = execrelay_protocol::keys::read_bounded(path).map_err(|e| {
            err(match e {
                // The path is in the message already.
                execrelay_protocol::keys::KeyError::Io { source, .. } => source.to_string(),
                e => e.to_string(),
            })
        })?;
        let nodes = parse_environments(&text, &path.display().to_string())
            .map_err(|e| err(e.to_string()))?;
        if nodes.is_empty() {
            return Err(err(
                "lists no relay: one `NODE_ID execrelay-x25519 <base64>` line per relay".into(),
            ));
        }
        Ok(ClusterKeys {
            path: path.to_path_buf(),
            nodes,
        })
    }

    /// Keys from already parsed lines (tests).
    pub fn from_nodes(path: PathBuf, nodes: Environments) -> ClusterKeys {
        ClusterKeys { path, nodes }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `node`'s key.
    pub fn key(&self, node: &str) -> Option<&[u8; KEY_BYTES]> {
        self.nodes.key(node)
    }

    /// The node whose key is `key`.
    pub fn node_of(&self, key: &[u8; KEY_BYTES]) -> Option<&str> {
        self.nodes.ids().find(|id| self.nodes.is_listed(id, key))
    }

    /// How many relays are listed.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

/// Check `nats://HOST:PORT` (also `tls://`, which async-nats understands; a bare `HOST:PORT`
/// is refused so that a typo is not taken for a host).
pub fn parse_nats_url(s: &str) -> Result<String, ClusterError> {
    let bad = || ClusterError::BadNatsUrl(s.to_string());
    let rest = s
        .strip_prefix("nats://")
        .or_else(|| s.strip_prefix("tls://"))
        .ok_or_else(bad)?;
    let hostport = rest.rsplit('@').next().unwrap_or(rest);
    let (host, port) = hostport.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(bad());
    }
    Ok(s.to_string())
}

/// Check `ws://HOST:PORT` (no path): the base other relays dial.
pub fn parse_advertise(s: &str) -> Result<String, ClusterError> {
    let bad = || ClusterError::BadAdvertise(s.to_string());
    let rest = s.strip_prefix("ws://").ok_or_else(bad)?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || host.contains('/') || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(bad());
    }
    let ip = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = ip.parse::<std::net::IpAddr>() {
        if ip.is_unspecified() {
            return Err(ClusterError::UnspecifiedAdvertise(
                s.to_string(),
                ip.to_string(),
            ));
        }
    }
    Ok(format!("ws://{rest}"))
}

/// A valid node id: the environment id rule, at most [`MAX_NODE_ID_BYTES`].
pub fn valid_node_id(id: &str) -> bool {
    id.len() <= MAX_NODE_ID_BYTES && valid_environment_id(id)
}

impl ClusterFlags {
    /// `None` when standalone (no `--cluster` and no other cluster flag); the checked spec
    /// otherwise, its keys file read and this relay's entry found in it with its node key
    /// (`--node-key`, else `own`, the relay's `--key`).
    pub fn resolve(&self, own: &Keypair) -> Result<Option<ClusterSpec>, ClusterError> {
        let Some(url) = &self.cluster else {
            let given: Vec<&str> = [
                ("--node-key", self.node_key.is_some()),
                ("--node-id", self.node_id.is_some()),
                ("--advertise", self.advertise.is_some()),
                ("--cluster-keys", self.cluster_keys.is_some()),
            ]
            .iter()
            .filter(|(_, g)| *g)
            .map(|(f, _)| *f)
            .collect();
            if given.is_empty() {
                return Ok(None);
            }
            return Err(ClusterError::WithoutCluster(given.join(", ")));
        };
        let nats_url = parse_nats_url(url)?;
        let missing: Vec<&str> = [
            ("--node-id", self.node_id.is_none()),
            ("--advertise", self.advertise.is_none()),
            ("--cluster-keys", self.cluster_keys.is_none()),
        ]
        .iter()
        .filter(|(_, m)| *m)
        .map(|(f, _)| *f)
        .collect();
        let (Some(node), Some(advertise), Some(keys_path)) =
            (&self.node_id, &self.advertise, &self.cluster_keys)
        else {
            return Err(ClusterError::Incomplete(missing.join(", ")));
        };
        if !valid_node_id(node) {
            return Err(ClusterError::BadNodeId(node.clone()));
        }
        let advertise = parse_advertise(advertise)?;
        let keys = ClusterKeys::load(keys_path)?;
        let node_keys = match &self.node_key {
            Some(path) => Keypair::load(path).map_err(|e| ClusterError::NodeKey {
                path: path.clone(),
                error: e.to_string(),
            })?,
            None => own.clone(),
        };
        let own_public = &node_keys.public;
        match keys.key(node) {
            None => {
                return Err(ClusterError::NodeNotListed {
                    node: node.clone(),
                    path: keys_path.clone(),
                })
            }
            Some(k) if k != own_public => {
                let (from, fix) = match &self.node_key {
                    Some(p) => (
                        format!("--node-key {}", p.display()),
                        format!(
                            "put {}.pub's line on the {node} line of the file (on every relay), or give the --node-key whose public line is listed there",
                            p.display()
                        ),
                    ),
                    None => (
                        "--key, as no --node-key was given".to_string(),
                        "give --node-key FILE, the node key whose public line is listed for this node (relays that share --key need one each), or list this relay's --key's public line there".to_string(),
                    ),
                };
                return Err(ClusterError::KeyMismatch {
                    node: node.clone(),
                    path: keys_path.clone(),
                    listed: fingerprint(k),
                    own: format!("{} ({from})", fingerprint(own_public)),
                    fix,
                });
            }
            Some(_) => {}
        }
        Ok(Some(ClusterSpec {
            nats_url,
            node_id: node.clone(),
            advertise,
            keys,
            node_keys,
        }))
    }
}

#[cfg(test)]
mod tests;
