//! The routing table behind a small interface: one entry per stream id per environment,
//! holding the link that opened the stream and the flow-control counters of both directions.
//!
//! The [`Router`](super::Router) reads and writes entries only through [`RoutingTable`], so a
//! later table can live in a fabric shared by several relays behind one load balancer (each
//! entry then also names the relay holding each link); [`MemoryTable`] is the one-relay table.

use std::collections::HashMap;
use std::sync::Arc;

use crate::flow::RelayFlow;
use crate::frame::StreamId;

/// A relay-local link number.
pub type LinkId = u64;

/// Where a stream is routed: its environment and its id (unique per environment, §6.3).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RouteKey {
    /// The environment id.
    pub env: Arc<str>,
    /// The stream id.
    pub stream: StreamId,
}

/// One routed stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The client link that opened it.
    pub client: LinkId,
    /// The environment link it was opened on (the environment's link at the time).
    pub env_link: LinkId,
    /// Whether the environment's `ACCEPT` went through.
    pub accepted: bool,
    /// Client → environment: the environment's report, the client's highest record.
    pub to_env: RelayFlow,
    /// Environment → client: the client's report, the environment's highest record.
    pub to_client: RelayFlow,
}

/// The relay's routing entries.
pub trait RoutingTable: Send {
    /// The entry for `key`, to read or update.
    fn get_mut(&mut self, key: &RouteKey) -> Option<&mut Route>;
    /// Add an entry; `Err` with the route back if the key is taken (the holder is untouched).
    fn insert(&mut self, key: RouteKey, route: Route) -> Result<(), Route>;
    /// Remove an entry.
    fn remove(&mut self, key: &RouteKey) -> Option<Route>;
    /// Entries held.
    fn len(&self) -> usize;
    /// Whether none is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The routing table of one relay, in memory.
#[derive(Debug, Default)]
pub struct MemoryTable(HashMap<RouteKey, Route>);

impl RoutingTable for MemoryTable {
    fn get_mut(&mut self, key: &RouteKey) -> Option<&mut Route> {
        self.0.get_mut(key)
    }

    fn insert(&mut self, key: RouteKey, route: Route) -> Result<(), Route> {
        match self.0.entry(key) {
            std::collections::hash_map::Entry::Occupied(_) => Err(route),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(route);
                Ok(())
            }
        }
    }

    fn remove(&mut self, key: &RouteKey) -> Option<Route> {
        self.0.remove(key)
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}
