//! Processes (layer 2): spawning, output pumps, drain, the event log, control operations,
//! and the ready queue a connection's writer pulls from.
//!
//! # Layout
//!
//! - [`spawn`]: `setsid`, parent-death signal, pipes or PTY, the child's pidfd and its scope;
//!   with `containment/sys.rs`, every `unsafe` line.
//! - [`spawn_spec`]: what to start ([`SpawnSpec`](spawn_spec::SpawnSpec)), plain data.
//! - [`containment`]: finds and kills everything a session started (cgroups, subreaper,
//!   pidfds, the crash sweep).
//! - [`event_log`]: sans-IO seq numbering, retention, delivery cursor, acks.
//! - [`output_budget`]: the server-wide budget of unwritten output, its guaranteed and fair
//!   shares, and the queue of pumps waiting for room.
//! - [`output_drain`]: sans-IO drain deadline.
//! - [`output_pump`]: the pump and supervisor tasks.
//! - [`managed_process`]: one process's state and control operations.
//! - [`exit_delivery`]: who learns that an exit notice was written or acknowledged (waits,
//!   and the finisher run right where it happens).
//! - [`ready_set`]: the queue of processes with unwritten events, one per connection, and
//!   what that connection's writer is doing.
//! - [`stall_watch`]: sans-IO rule of the stall watchdog (output stopped for no reason
//!   outside the server).
//! - [`write_ids`]: the `writeId`s a process remembers (each stored once).
//! - [`start_error`]: why a spawn failed (program, cwd, pty, other) and the OS error's name.
//! - [`tail_ring`]: the kept tail of a capped stream (`outputCapKeep: "headAndTail"`).
//! - [`signals`]: signal names (signalling itself is by identity: `managed_process.rs` through
//!   `containment/`).
//! - [`error`]: the typed [`ProcessError`].
//!
//! Only this module spawns children. It returns typed values and errors: it must never build
//! a JSON-RPC error or shape a JSON result (the connection layer does), nor write to a
//! transport.

pub mod containment;
pub mod error;
pub mod event_log;
pub mod exit_delivery;
pub mod managed_process;
pub mod output_budget;
pub mod output_drain;
pub mod output_pump;
pub mod output_source;
pub mod ready_set;
pub mod signals;
pub mod spawn;
pub mod spawn_spec;
pub mod stall_watch;
pub mod start_error;
pub mod tail_ring;
pub mod write_ids;

pub use error::ProcessError;
pub use managed_process::{
    check_term_size, ManagedProcess, ProcessInfo, ProcessOptions, ReadOutcome, WriteStatus,
};
pub use output_budget::OutputBudget;
pub use ready_set::ReadySet;
pub use start_error::{StartError, StartWhat};
