//! Processes: spawning, output pumps, drain, the event log, and control operations.
//!
//! Only this module spawns children (`spawn.rs` holds every `unsafe` line). The event log and
//! the drain state machine are sans-IO; the pump and supervisor are thin tokio tasks over
//! them.

pub mod error;
pub mod event_log;
pub mod managed_process;
pub mod output_drain;
pub mod output_pump;
pub mod ready_set;
pub mod signals;
pub mod spawn;

pub use error::ProcessError;
pub use managed_process::{ManagedProcess, ProcessInfo, ProcessOptions, ReadOutcome, WriteStatus};
pub use ready_set::ReadySet;
