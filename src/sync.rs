//! Small shared primitives every layer may use (layer 0): the poison-tolerant [`lock`],
//! [`read`] and [`write()`], the one place a std lock is taken (the protocol crate's
//! `execrelay_protocol::sync`, shared by both crates).
//!
//! It owns nothing but helpers over `std`; it must never import another module of the crate.

pub(crate) use execrelay_protocol::sync::{lock, read, write};
