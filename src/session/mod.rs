//! Sessions (layer 3): processes and their retained output, outliving connections.
//!
//! # Layout
//!
//! - [`session_registry`]: the [`SessionRegistry`] every connection of a server shares, and
//!   each [`Session`] with its lifecycle (create, attach, detach, resume, expire, close).
//!
//! It must never write to a transport: delivery goes through the attached connection's
//! [`ReadySet`](crate::process::ReadySet).

pub mod session_registry;

pub use session_registry::{ConnHandle, Session, SessionError, SessionRegistry, StartSpec};
