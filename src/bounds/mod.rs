//! Resource bounds shared by several layers (layer 0): byte budgets that travel with what
//! they pay for, the process's descriptor limit and reserve, and the idle clock of
//! connections and links.
//!
//! # What it owns
//!
//! - [`byte_budget`]: [`ByteBudget`] (a limit in bytes, optionally under a parent: a
//!   connection's budget under the server's) and [`Charge`] (bytes held against it, given back
//!   on drop). The connection processor charges each request's message here; the Noise
//!   deframer charges each unfinished message before it grows, through [`reassembly`] (the
//!   budget as the record layer's `ReassemblyBudget`).
//! - [`descriptors`] (`execrelay_io::descriptors`, re-exported: the relay binary uses the
//!   same code): `RLIMIT_NOFILE` (raised to the hard limit at start), the count of open
//!   descriptors, and the [`DescriptorReserve`] that refuses a new connection or link while
//!   fewer than the reserve are free, so a spawn never fails for a connection's sake.
//! - [`idle`]: [`IdleTimer`], the sans-IO rule "idle since when, closed at which deadline"
//!   that connections and link drivers apply.
//! - [`give_back`]: [`GiveBack`], the rule for when the server hands the memory its
//!   allocator keeps back to the system (after a burst, when it becomes idle), and the call.
//!
//! # What it must never do
//!
//! Import another module of the crate (it is below all of them), read a clock itself (callers
//! pass `now`), or block.

pub mod byte_budget;
pub mod give_back;
pub mod idle;
pub mod reassembly;

/// Descriptors live in the shared I/O crate (`execrelay_io`, beneath every layer), shared with
/// the relay binary.
pub use execrelay_io::descriptors;

pub use byte_budget::{ByteBudget, Charge, OverBudget};
pub use descriptors::{DescriptorReserve, LowOnDescriptors, NofileLimit};
pub use give_back::GiveBack;
pub use idle::IdleTimer;
