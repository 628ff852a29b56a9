//! Processes: spawning, output pumps, drain, the event log, and control operations.
//!
//! Only this module spawns children (`spawn.rs` and `containment/sys.rs` hold every `unsafe`
//! line); `containment/` finds and kills everything a session started. The event log and
//! the drain state machine are sans-IO; the pump and supervisor are thin tokio tasks over
//! them.

pub mod containment;
pub mod event_log;
pub mod managed_process;
pub mod output_drain;
pub mod output_pump;
pub mod signals;
pub mod spawn;

pub use managed_process::{ManagedProcess, ProcessOptions, WriteStatus};
