//! Server configuration: every limit of the specification as a named constant with its
//! default, gathered in one [`ServerConfig`] that `execrelay serve` fills from flags and an
//! optional TOML file.
//!
//! Relationships between settings are validated once, in [`ServerConfig::validate`].

use std::time::Duration;

use execrelay_io::http::FrontLimits;
use serde::Deserialize;

/// Largest JSON-RPC message accepted, in bytes (`protocol.md` §1). Large enough for a 1 MiB
/// `process/read` batch in base64 many times over; small enough that a hostile peer cannot
/// make one connection hold much memory.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// Output is cut into chunks of at most this many raw bytes (`protocol.md` §5). One pipe read
/// is at most this large, so a chunk is one read.
pub const MAX_CHUNK_BYTES: usize = 64 * 1024;
/// The most an output pump reads into one chunk: `MAX_CHUNK_BYTES` less 512 bytes, so that a
/// chunk with its binary-message head (at most 268 bytes, `protocol.md` §5.1) and its 4-byte
/// length prefix fits one Noise record (65,518 bytes of plaintext). A bulk stream then costs
/// one record per chunk, not a full one and a 36-byte one (an AEAD operation, a frame and a
/// slot of the link's queue each). Within `MAX_CHUNK_BYTES`, as the protocol requires.
pub const PUMP_CHUNK_BYTES: usize = MAX_CHUNK_BYTES - 512;
/// The most an output pump still reads from a stream once its drain deadline has passed,
/// without waiting: what the child left in its pipe (64 KiB, a pipe's default capacity) is
/// taken even by a pump the runtime first polls after the deadline (an overloaded server),
/// and a descendant that keeps writing cannot hold the exit notice back for more than this.
pub const DRAIN_DEADLINE_READ_BYTES: usize = 64 * 1024;
/// Control requests (`signal`, `terminate`, `server/info`, `process/list`) in flight per
/// connection, apart from `maxPendingRequests`. They finish at once, so a small pool is
/// plenty; it only stops a client that sends them without reading the answers.
pub const CONTROL_REQUEST_SLOTS: usize = 64;
/// Processes per session. Bounds per-session memory together with `retainedOutputBytes`.
pub const MAX_PROCESSES: usize = 256;
/// Sessions per server, attached or detached.
pub const MAX_SESSIONS: usize = 64;
/// Retained output per process, in bytes (`processes.md` §4). When the log holds this much
/// that it may not release, the pump stops reading and the child blocks.
pub const RETAINED_OUTPUT_BYTES: usize = 8 * 1024 * 1024;
/// Output read from children and not yet written to their clients, all processes of the
/// server together (the server-wide output budget, `process/output_budget.rs`). Shared fairly
/// by the processes that are ahead of their clients; each may always hold one chunk beyond it
/// (`GUARANTEED_OUTPUT_BYTES`), so unwritten output stays under this plus 64 KiB per process
/// ahead, whatever the number of processes. 256 MiB keeps a few hundred fast streams busy
/// (about 1 MiB each) on a machine where the server may take a few hundred MB.
pub const OUTPUT_BUDGET_BYTES: usize = 256 * 1024 * 1024;
/// How long a detached session survives (`processes.md` §5) unless its client asked for
/// another TTL (`sessionTtlMs`, `protocol.md` §3).
pub const DETACHED_SESSION_TTL_MS: u64 = 60_000;
/// The longest `sessionTtlMs` a client may ask for: 24 hours, so a command started with
/// `execrelay run --detach` outlives a night, while a forgotten session (its processes, their
/// retained output, its place under `max_sessions`) still goes away by itself within a day.
/// Above it, `initialize` is answered `-32602` naming this setting.
pub const MAX_SESSION_TTL_MS: u64 = 86_400_000;
/// The largest tail `outputCapKeep: "headAndTail"` may keep per stream (half the
/// `outputBytesCap`, rounded up): 8 MiB, the default retention of a whole process. The tail is
/// held in memory until its stream ends (beside the event log), so a client cannot make the
/// server hold more than this per stream: a larger tail is refused with `-32602`.
pub const MAX_OUTPUT_TAIL_BYTES: usize = 8 * 1024 * 1024;
/// Longest `process/read` long poll (`protocol.md` §4).
pub const MAX_READ_WAIT_MS: u64 = 60_000;
/// How long an exited process stays known after its exit notice was written, without acks.
pub const EXITED_RETENTION_MS: u64 = 300_000;
/// How long a process's output may stand still for no reason outside the server (its client
/// reads, owes no acknowledgement, its transport has room) before the stall watchdog reports
/// it (`process/stall_watch.rs`). Far above any scheduling delay: a report is a bug.
pub const STALL_WATCHDOG_MS: u64 = 10_000;
/// Requests in flight per connection; one more is answered `-32004`. Bounds the tasks and the
/// control lane of one connection.
pub const MAX_PENDING_REQUESTS: usize = 1024;
/// `writeId`s remembered per process for deduplication (`protocol.md` §4).
pub const RETAINED_WRITE_IDS: usize = 4096;
/// Default `drainTimeoutMs`.
pub const DEFAULT_DRAIN_TIMEOUT_MS: u64 = 2000;
/// Default `killGraceMs`.
pub const DEFAULT_KILL_GRACE_MS: u64 = 2000;
/// Longest `processId`, in bytes.
pub const MAX_PROCESS_ID_BYTES: usize = 256;
/// Most bytes of a `process/start`'s `argv`, each argument counted with its terminating NUL
/// as the kernel counts it: `-32602` beyond. A process keeps its argv for `process/list` as
/// long as it is known, and one `process/list` answer carries the argv of every process of
/// the session, so this bounds both (`maxProcesses` × 256 KiB = 64 MiB per session, shared
/// between the processes and the answers, never copied per answer). Above `xargs`' default
/// command line (128 KiB); `execve` allows 2 MiB with the default stack limit.
pub const MAX_ARGV_BYTES: usize = 256 * 1024;
/// Longest `writeId`, in bytes: `-32602` beyond. A process remembers
/// [`RETAINED_WRITE_IDS`] of them, so this bounds that memory to 1 MiB per process; a client's
/// ids (`w-17`) are a few bytes.
pub const MAX_WRITE_ID_BYTES: usize = 256;
/// Output bytes the connection writer takes from one process before it looks at the control
/// lane and the other processes again: keeps control replies and other processes from
/// waiting behind one chatty child.
pub const EVENT_BATCH_BYTES: usize = 256 * 1024;
/// Default `maxBytes` of `process/read`.
pub const DEFAULT_READ_MAX_BYTES: u64 = 1024 * 1024;
/// How long shutdown waits for exit notices to reach attached clients after terminating.
pub const SHUTDOWN_DELIVERY_GRACE_MS: u64 = 5_000;

/// Largest `killGraceMs` a client may ask for. Expiry and shutdown wait this long at most for a
/// process that ignores SIGTERM, so a client cannot hold them up with a huge grace.
pub const MAX_KILL_GRACE_MS: u64 = 10_000;
/// Largest `drainTimeoutMs` a client may ask for: bounds how long output is still read after
/// an exit, on the paths the client does not control (expiry, shutdown).
pub const MAX_DRAIN_TIMEOUT_MS: u64 = 10_000;
/// Largest `timeoutMs` a client may ask for: one day.
pub const MAX_TIMEOUT_MS: u64 = 86_400_000;

/// Default `session_pids_max`: 0, no limit beyond the host's (a unit's `TasksMax=` bounds the
/// whole server). A value caps the processes and threads of one session (its cgroup's
/// `pids.max`), so a fork bomb fails inside its own session.
pub const DEFAULT_SESSION_PIDS_MAX: u64 = 0;
/// Default `cgroup_name`: the base name of the server's instance cgroup
/// (`<name>-<pid>-<start time>-<n>`). Servers that share a parent cgroup and this name sweep
/// each other's leftovers after a crash.
pub const DEFAULT_CGROUP_NAME: &str = "execrelay";
/// Longest `cgroup_name`, in bytes (a directory name, with `-<pid>-<start>-<n>` appended).
pub const MAX_CGROUP_NAME_BYTES: usize = 64;

/// Which process-containment backend to use (`containment_backend`; see SECURITY.md,
/// "Process containment"). Declared here, with the other settings; `process/containment/`
/// implements it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// The first of `cgroup2`, `cgroup1`, `none` that works here.
    #[default]
    Auto,
    /// cgroup v2 or fail at start.
    Cgroup2,
    /// cgroup v1 `freezer` (and `pids`) or fail at start.
    Cgroup1,
    /// No cgroups: process-tree tracking only.
    None,
}

impl BackendChoice {
    /// The setting's spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Cgroup2 => "cgroup2",
            BackendChoice::Cgroup1 => "cgroup1",
            BackendChoice::None => "none",
        }
    }
}

impl std::fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for BackendChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "auto" => BackendChoice::Auto,
            "cgroup2" => BackendChoice::Cgroup2,
            "cgroup1" => BackendChoice::Cgroup1,
            "none" => BackendChoice::None,
            _ => {
                return Err(format!(
                    "unknown containment backend {s:?} (auto, cgroup2, cgroup1, none)"
                ))
            }
        })
    }
}

/// The Noise suites (`secure-transport.md` §3) and the `noise_suites` setting's set of them,
/// declared with the record layer in the protocol crate.
pub use execrelay_protocol::noise::suite::{NoiseSuite, NoiseSuites};

/// Check a `cgroup_name`: 1 to [`MAX_CGROUP_NAME_BYTES`] bytes of `[A-Za-z0-9_.-]`, not
/// starting with `.` or `-` (it becomes a directory name next to other cgroups).
pub fn check_cgroup_name(n: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if n.is_empty()
        || n.len() > MAX_CGROUP_NAME_BYTES
        || !n.chars().all(ok_char)
        || n.starts_with('.')
        || n.starts_with('-')
    {
        return Err(format!(
            "cgroup_name must be 1 to {MAX_CGROUP_NAME_BYTES} bytes of [A-Za-z0-9_.-], \
             not starting with '.' or '-'"
        ));
    }
    Ok(())
}

/// Established JSON-RPC connections over `ws://` at once. One more is refused before the
/// upgrade with `503`; a connection that ends frees its slot. Each connection holds tasks, a
/// control lane and up to `max_message_bytes` of one inbound message, so the cap bounds what
/// connections can take together.
pub const MAX_CONNECTIONS: usize = 256;
/// Noise physical links (`noise+ws://`) at once. One more is refused before the upgrade with
/// `503`. A link carries up to `max_streams_per_link` streams, so few links serve many clients
/// (every client in one process shares one link per server).
pub const MAX_LINKS: usize = 256;
/// A new TCP connection must deliver its whole HTTP request head (and, for an upgrade, finish
/// it) within this time, however slowly it sends: the deadline is fixed at accept and never
/// extended, so a client trickling bytes is cut at it. Real clients take milliseconds.
pub const REQUEST_HEAD_TIMEOUT_MS: u64 = 10_000;
/// Connections accepted but not yet upgraded or answered, per listener. Each holds at most
/// [`MAX_REQUEST_HEAD_BYTES`] for at most [`REQUEST_HEAD_TIMEOUT_MS`]; beyond the cap a new
/// connection is closed at once (256 × 16 KiB = 4 MiB at most).
pub const MAX_PENDING_HANDSHAKES: usize = 256;
/// Connections not yet upgraded or answered from one peer address (an IPv4 address, or the
/// /64 prefix of an IPv6 address, which one host usually owns whole), per listener. Well below
/// [`MAX_PENDING_HANDSHAKES`], so one address trickling request heads cannot take every slot:
/// it takes at most 32 of 256, and connections over its cap are closed at once.
pub const MAX_PENDING_HANDSHAKES_PER_ADDRESS: usize = 32;

/// Handshakes waiting for authorization per Noise link; more are reset (`busy`) unprocessed.
pub const MAX_PENDING_AUTHORIZATIONS: usize = 32;
/// Established streams per Noise link; more are reset (`too_many_streams`).
pub const MAX_STREAMS_PER_LINK: usize = 1024;
/// Handshake failures tolerated back to back on one link (the token bucket's size); an empty
/// bucket closes the link.
pub const HANDSHAKE_FAILURE_BURST: u32 = 8;
/// One handshake failure is forgiven per this many milliseconds (the bucket's refill).
pub const HANDSHAKE_FAILURE_REFILL_MS: u64 = 2_000;
/// The environment link's last-resort budget of handshake failures (`secure-transport.md`
/// §8). Through a relay, every failure is charged to the client link and address that caused
/// it (the relay closes that link, and forwards an address's `OPEN`s only while its failure
/// tokens cover them: at most `address_handshake_failure_burst` = 256 back to back, then one
/// a second); this budget, of which an empty bucket refuses every client's new streams for
/// 10 s, must never empty for one client's sake: 16 times the relay's per-address burst, and
/// a refill a hundred times its rate. It empties only when more than 16 addresses burst at
/// once, or more than 100 keep failing a second each: a many-address attack, where refusing
/// new streams for a while protects the server (a failure costs it two X25519 operations).
pub const RELAY_LINK_HANDSHAKE_FAILURE_BURST: u32 = 4096;
/// One failure of the environment link's last-resort budget forgiven per this interval.
pub const RELAY_LINK_HANDSHAKE_FAILURE_REFILL_MS: u64 = 10;
/// Streams one Noise client key may hold on this server at once (pending and open, over all
/// its links: the environment link, direct links), so that one key cannot take the streams
/// of the environment link (`max_streams_per_link`, shared by every client of a relay) from
/// the others: once 996 of 1024. Four per session of `max_sessions_per_key` (a resume briefly
/// takes a second stream per session); more are refused `too_many_streams`.
pub const MAX_STREAMS_PER_KEY: usize = 64;
/// How far a message 1's `ts` may be from the server's clock, either way
/// (`secure-transport.md` §3 `HANDSHAKE_CLOCK_WINDOW`): 2 minutes. Accepted stamps are kept
/// this long (the replay cache).
pub const HANDSHAKE_CLOCK_WINDOW_MS: u64 = 120_000;
/// Handshakes of one client key remembered within the clock window (§3
/// `MAX_HANDSHAKES_PER_KEY_WINDOW`); more are refused `busy` until older ones age out (that
/// key alone).
pub const MAX_HANDSHAKES_PER_KEY_WINDOW: usize =
    execrelay_protocol::replay::MAX_HANDSHAKES_PER_KEY_WINDOW;
/// Interval of WebSocket pings on every link and WebSocket of the server (`noise+ws://`
/// links, the environment link, plain `ws://` connections; `secure-transport.md` §6.4), less
/// a jitter of up to a tenth.
pub const KEEPALIVE_INTERVAL_MS: u64 = 15_000;
/// A link or WebSocket whose oldest unanswered ping is this old is dead, even if it keeps
/// sending data; a write that has not completed after this long kills it too (§6.4).
pub const PONG_TIMEOUT_MS: u64 = 30_000;
/// First delay before the environment link dials its relay again (§6.1: 1 s).
pub const RELAY_BACKOFF_INITIAL_MS: u64 = 1_000;
/// Longest delay between two dials of the relay (§6.1: doubling to 30 s).
pub const RELAY_BACKOFF_MAX_MS: u64 = 30_000;
/// An environment link that lived this long sets the delay back to the first one (§6.1:
/// 60 s); one that died younger keeps doubling it, so a relay that accepts and drops at once
/// is not hammered.
pub const RELAY_BACKOFF_RESET_MS: u64 = 60_000;
/// Longest delay between two dials of the relay after the relay *refused* the environment
/// link (its key not listed for the id, the relay's key not the pinned one, clocks apart):
/// 5 minutes. Such a refusal lasts until an operator fixes a file, so the retries slow down
/// further than after a network failure, and still pick up the fix without a restart.
pub const RELAY_REFUSED_BACKOFF_MAX_MS: u64 = 300_000;

/// Bytes of requests one connection may have read and not yet answered (their JSON-RPC
/// messages, charged when read and given back when answered or skipped): 64 MiB, four
/// messages of the largest size. One more is answered `-32004` at once, so a client that
/// pipelines large writes to a child that does not read holds at most this much, and its
/// `process/terminate` still gets through. At least `max_message_bytes`.
pub const MAX_PENDING_REQUEST_BYTES: usize = 64 * 1024 * 1024;
/// Bytes of what peers sent that the whole server may hold at once: requests read and not
/// yet answered (every connection's, charged under its own budget) plus Noise messages still
/// being reassembled or queued for their connection: 256 MiB. Above it, new requests are answered `-32004` and a Noise stream
/// whose message cannot grow is reset (`busy`), so one client holds at most its own budget
/// and the others keep theirs.
pub const MAX_INBOUND_BYTES: usize = 256 * 1024 * 1024;
/// Bytes of Noise messages one link's streams may hold together, unfinished or queued for
/// their connection: 64 MiB. The deframer charges a message before it grows, and the charge
/// goes with the message until its connection takes it; a stream that cannot get the bytes
/// is reset alone (`busy`). 40 streams each holding 15 MiB of a message once took 620 MiB.
pub const MAX_LINK_REASSEMBLY_BYTES: usize = 64 * 1024 * 1024;
/// Sessions one Noise client key may hold at once (attached or detached), well below
/// [`MAX_SESSIONS`] so that one client cannot lock the others out.
pub const MAX_SESSIONS_PER_KEY: usize = 16;
/// Sessions created from one peer address (IPv4 address, or IPv6 /64) that may exist at once.
/// Above the per-key quota: several clients may share an address (NAT).
pub const MAX_SESSIONS_PER_ADDRESS: usize = 32;
/// Processes (running, or exited and still retained) of all the sessions of one Noise client
/// key: one full session's worth.
pub const MAX_PROCESSES_PER_KEY: usize = 256;
/// Processes of all the sessions created from one peer address.
pub const MAX_PROCESSES_PER_ADDRESS: usize = 512;
/// File descriptors kept free for spawns: a new connection or link is refused while this few
/// are free, so connections run out before a spawn can fail for want of a descriptor. A spawn
/// needs up to eight for a moment (pipes, the exec-error pipe, a pidfd); 128 covers a burst.
pub const DESCRIPTOR_RESERVE: usize = 128;
/// A `ws://` connection or Noise stream idle this long is closed (its session detaches): no
/// inbound message, no request in flight, and no process of its session running or with
/// output still to write. 5 minutes; a client that wants to keep an idle connection sends
/// something (`server/info`).
pub const IDLE_CONNECTION_TIMEOUT_MS: u64 = 300_000;
/// A direct `noise+ws://` link without any stream (pending or open) for this long is closed:
/// 1,000 links that never open a stream, kept alive by their pongs, once held 1,000
/// descriptors forever. The environment link to a relay is never closed for idleness (it is
/// how clients reach the server at all; the relay bounds its own links).
pub const IDLE_LINK_TIMEOUT_MS: u64 = 60_000;
/// How long a `process/approve` request may stay unanswered before it is withdrawn and its
/// `process/start` fails with `-32006` (`protocol.md` §7): five minutes, a person's time to
/// read a prompt and decide. A pending approval holds its process id and a request slot.
pub const APPROVAL_TIMEOUT_MS: u64 = 300_000;
/// Largest exec policy file (`--exec-policy`), 1 MiB: far above any hand-written policy, and
/// read whole on every change.
pub const MAX_POLICY_FILE_BYTES: usize = 1024 * 1024;
/// Rules in an exec policy: 1024. Each `process/start` matches `argv[0]` and its resolved path
/// against all of them (two compiled glob sets, so the cost grows slowly), and a longer list
/// is not one a person can review.
pub const MAX_POLICY_RULES: usize = 1024;
/// Longest `program` glob or `reason` of a policy rule, in bytes: 1 KiB. The reason is sent to
/// clients in every `process/approve` and shown in prompts.
pub const MAX_POLICY_RULE_TEXT_BYTES: usize = 1024;

/// Client → server messages queued on an in-process connection (`Client::in_process`) before
/// a request is answered `-32004` (`inProcessQueue`) at once: 256. The processor's reader takes
/// them as fast as it can spawn their tasks, so a full queue means the server is behind (its
/// control lane to an application that reads nothing is full).
pub const IN_PROCESS_REQUEST_QUEUE: usize = 256;
/// Events (output deltas, exit notices) queued for an in-process client before the writer
/// waits: 256 events, at most 16 MiB of chunks (each at most `MAX_CHUNK_BYTES`), shared
/// with the event logs (the chunks are the logs' own `Bytes`).
pub const IN_PROCESS_EVENT_QUEUE: usize = 256;
/// How long `Client::shutdown` of an in-process client may take, 5 s: terminate every
/// process, then kill what is left and wait for it, even when both queues are full and the
/// application stopped reading.
pub const IN_PROCESS_SHUTDOWN_MS: u64 = 5_000;

/// How a setting reads (`--help`, the README table): shared with the relay's settings.
pub use execrelay_io::setting::{Setting, Unit};

/// One setting of [`ServerConfig`] whose value is a word, not a number (a backend, a name).
pub use execrelay_io::setting::TextSetting;

// Every setting, declared once by the settings macro both servers share (its docs say what
// it generates).
execrelay_io::settings! {
    /// Limits and timings of one exec server. Every field has a flag of `execrelay serve`
    /// (the same name in kebab-case) and a key (the same name) in the `--config` TOML file;
    /// flags win over the file. Each field's default is the named constant in its doc.
    #[derive(Debug, Clone, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct ServerConfig;
    /// The flags of `execrelay serve` that set [`ServerConfig`] fields: one per field, each
    /// `None` unless given (a given flag wins over the TOML file). Help lines come from
    /// [`SETTINGS`], with the real default.
    #[derive(Debug, Clone, Default, clap::Args)]
    #[allow(missing_docs)] // Each field is documented on `ServerConfig`.
    pub struct ConfigFlags;
    /// See [`MAX_MESSAGE_BYTES`].
    max_message_bytes: usize = MAX_MESSAGE_BYTES, Bytes,
        "one JSON-RPC message; a larger one is a framing error (`-32600`, then close), detected before more than the limit is buffered";
    /// See [`MAX_PROCESSES`].
    max_processes: usize = MAX_PROCESSES, Count,
        "processes per session (exited ones count until released) → `-32004`";
    /// See [`MAX_SESSIONS`].
    max_sessions: usize = MAX_SESSIONS, Count,
        "sessions per server, attached or detached → `-32004`";
    /// See [`RETAINED_OUTPUT_BYTES`].
    retained_output_bytes: usize = RETAINED_OUTPUT_BYTES, Bytes,
        "event log per process; beyond it written (or acked) events are released, oldest first";
    /// See [`OUTPUT_BUDGET_BYTES`].
    output_budget_bytes: usize = OUTPUT_BUDGET_BYTES, Bytes,
        "unwritten output of all processes together, shared fairly by those ahead of their clients; each may always hold one 64 KiB chunk beyond it (a pump then waits, its child blocks)";
    /// See [`DETACHED_SESSION_TTL_MS`].
    detached_session_ttl_ms: u64 = DETACHED_SESSION_TTL_MS, Millis,
        "how long a detached session survives";
    /// See [`MAX_SESSION_TTL_MS`].
    max_session_ttl_ms: u64 = MAX_SESSION_TTL_MS, Millis,
        "longest `sessionTtlMs` a client may ask for in `initialize` (also `--max-session-ttl DURATION`) → `-32602`";
    /// See [`MAX_OUTPUT_TAIL_BYTES`].
    max_output_tail_bytes: usize = MAX_OUTPUT_TAIL_BYTES, Bytes,
        "largest tail `outputCapKeep: \"headAndTail\"` keeps per stream (half the cap), held in memory until the stream ends → `-32602`";
    /// See [`MAX_READ_WAIT_MS`].
    max_read_wait_ms: u64 = MAX_READ_WAIT_MS, Millis,
        "longest `process/read` long poll";
    /// See [`EXITED_RETENTION_MS`].
    exited_retention_ms: u64 = EXITED_RETENTION_MS, Millis,
        "how long an exited process stays known after its exit notice was written (without acks)";
    /// See [`STALL_WATCHDOG_MS`].
    stall_watchdog_ms: u64 = STALL_WATCHDOG_MS, Millis,
        "output standing still this long while nothing outside the server holds it back is reported as a stall (a log line with the stream's flow-control state, `execrelay_stalled_streams`); 0 turns the watchdog off";
    /// See [`MAX_PENDING_REQUESTS`].
    max_pending_requests: usize = MAX_PENDING_REQUESTS, Count,
        "requests in flight per connection → `-32004`";
    /// See [`MAX_KILL_GRACE_MS`].
    max_kill_grace_ms: u64 = MAX_KILL_GRACE_MS, Millis,
        "largest `killGraceMs` a client may ask for (bounds expiry and shutdown)";
    /// See [`MAX_DRAIN_TIMEOUT_MS`].
    max_drain_timeout_ms: u64 = MAX_DRAIN_TIMEOUT_MS, Millis,
        "largest `drainTimeoutMs` a client may ask for (bounds expiry and shutdown)";
    /// See [`MAX_TIMEOUT_MS`].
    max_timeout_ms: u64 = MAX_TIMEOUT_MS, Millis,
        "largest `timeoutMs` a client may ask for";
    /// See [`MAX_CONNECTIONS`].
    max_connections: usize = MAX_CONNECTIONS, Count,
        "established JSON-RPC connections over `ws://`; one more is refused with `503` before the upgrade";
    /// See [`MAX_LINKS`].
    max_links: usize = MAX_LINKS, Count,
        "Noise links over `noise+ws://`; one more is refused with `503` before the upgrade";
    /// See [`REQUEST_HEAD_TIMEOUT_MS`].
    request_head_timeout_ms: u64 = REQUEST_HEAD_TIMEOUT_MS, Millis,
        "total time a new connection has to send its whole HTTP request head and finish its upgrade, however slowly it trickles";
    /// See [`MAX_PENDING_HANDSHAKES`].
    max_pending_handshakes: usize = MAX_PENDING_HANDSHAKES, Count,
        "connections per listener not yet upgraded or answered; more are closed at once";
    /// See [`MAX_PENDING_HANDSHAKES_PER_ADDRESS`].
    max_pending_handshakes_per_address: usize = MAX_PENDING_HANDSHAKES_PER_ADDRESS, Count,
        "the same, from one peer address (IPv4 address or IPv6 /64); more are closed at once";
    /// See [`MAX_PENDING_AUTHORIZATIONS`].
    max_pending_authorizations: usize = MAX_PENDING_AUTHORIZATIONS, Count,
        "Noise handshakes waiting for authorization per link; more are reset (`busy`)";
    /// See [`MAX_STREAMS_PER_LINK`].
    max_streams_per_link: usize = MAX_STREAMS_PER_LINK, Count,
        "Noise streams per link (pending ones count); more are reset (`too_many_streams`)";
    /// See [`MAX_STREAMS_PER_KEY`].
    max_streams_per_key: usize = MAX_STREAMS_PER_KEY, Count,
        "Noise streams one client key holds at once over all links (pending ones count); more are reset (`too_many_streams`)";
    /// See [`HANDSHAKE_FAILURE_BURST`].
    handshake_failure_burst: u32 = HANDSHAKE_FAILURE_BURST, Count,
        "Noise handshake failures tolerated back to back per direct link; the one that takes the last token closes it";
    /// See [`HANDSHAKE_FAILURE_REFILL_MS`].
    handshake_failure_refill_ms: u64 = HANDSHAKE_FAILURE_REFILL_MS, Millis,
        "one Noise handshake failure of a direct link forgiven per this interval";
    /// See [`RELAY_LINK_HANDSHAKE_FAILURE_BURST`].
    relay_link_handshake_failure_burst: u32 = RELAY_LINK_HANDSHAKE_FAILURE_BURST, Count,
        "last-resort budget of handshake failures of the environment link (the relay charges each to the client that caused it); once empty, every new stream is refused (`busy`) for 10 s";
    /// See [`RELAY_LINK_HANDSHAKE_FAILURE_REFILL_MS`].
    relay_link_handshake_failure_refill_ms: u64 = RELAY_LINK_HANDSHAKE_FAILURE_REFILL_MS, Millis,
        "one failure of the environment link's last-resort budget forgiven per this interval";
    /// See [`HANDSHAKE_CLOCK_WINDOW_MS`].
    handshake_clock_window_ms: u64 = HANDSHAKE_CLOCK_WINDOW_MS, Millis,
        "how far a Noise message 1's `ts` may be from the server's clock, either way (`clock_skew` beyond); accepted stamps are remembered this long, and nothing stamped before the server started is accepted";
    /// See [`MAX_HANDSHAKES_PER_KEY_WINDOW`].
    max_handshakes_per_key_window: usize = MAX_HANDSHAKES_PER_KEY_WINDOW, Count,
        "Noise handshakes of one client key remembered within the clock window; more are reset (`busy`) until older ones age out";
    /// See [`KEEPALIVE_INTERVAL_MS`].
    keepalive_interval_ms: u64 = KEEPALIVE_INTERVAL_MS, Millis,
        "WebSocket ping interval on every link and WebSocket (`noise+ws://`, the relay link, `ws://`)";
    /// See [`PONG_TIMEOUT_MS`].
    pong_timeout_ms: u64 = PONG_TIMEOUT_MS, Millis,
        "a link whose ping is unanswered this long is closed (data does not count), and so is one whose write takes this long";
    /// See [`RELAY_BACKOFF_INITIAL_MS`].
    relay_backoff_initial_ms: u64 = RELAY_BACKOFF_INITIAL_MS, Millis,
        "first delay before dialling the relay again (`serve --relay`); doubles after each failure";
    /// See [`RELAY_BACKOFF_MAX_MS`].
    relay_backoff_max_ms: u64 = RELAY_BACKOFF_MAX_MS, Millis,
        "longest delay between two dials of the relay";
    /// See [`RELAY_BACKOFF_RESET_MS`].
    relay_backoff_reset_ms: u64 = RELAY_BACKOFF_RESET_MS, Millis,
        "a relay link that lived this long sets the delay back to the first";
    /// See [`RELAY_REFUSED_BACKOFF_MAX_MS`].
    relay_refused_backoff_max_ms: u64 = RELAY_REFUSED_BACKOFF_MAX_MS, Millis,
        "longest delay between two dials after the relay refused the link (unauthorized, wrong relay key, clocks apart)";
    /// See [`MAX_PENDING_REQUEST_BYTES`].
    max_pending_request_bytes: usize = MAX_PENDING_REQUEST_BYTES, Bytes,
        "bytes of requests read and not yet answered per connection → `-32004`";
    /// See [`MAX_INBOUND_BYTES`].
    max_inbound_bytes: usize = MAX_INBOUND_BYTES, Bytes,
        "bytes of requests not yet answered and of Noise messages not yet taken by their connection, server-wide → `-32004` (a Noise stream: reset `busy`)";
    /// See [`MAX_LINK_REASSEMBLY_BYTES`].
    max_link_reassembly_bytes: usize = MAX_LINK_REASSEMBLY_BYTES, Bytes,
        "bytes of Noise messages one link holds for its streams (unfinished, or not yet taken by their connection); a stream that would pass it is reset (`busy`)";
    /// See [`MAX_SESSIONS_PER_KEY`].
    max_sessions_per_key: usize = MAX_SESSIONS_PER_KEY, Count,
        "sessions per Noise client key → `-32004`";
    /// See [`MAX_SESSIONS_PER_ADDRESS`].
    max_sessions_per_address: usize = MAX_SESSIONS_PER_ADDRESS, Count,
        "sessions per peer address (IPv4 address or IPv6 /64) → `-32004`";
    /// See [`MAX_PROCESSES_PER_KEY`].
    max_processes_per_key: usize = MAX_PROCESSES_PER_KEY, Count,
        "processes of all the sessions of one Noise client key → `-32004`";
    /// See [`MAX_PROCESSES_PER_ADDRESS`].
    max_processes_per_address: usize = MAX_PROCESSES_PER_ADDRESS, Count,
        "processes of all the sessions of one peer address → `-32004`";
    /// See [`DESCRIPTOR_RESERVE`].
    descriptor_reserve: usize = DESCRIPTOR_RESERVE, Count,
        "file descriptors kept free for spawns; below it new connections and links are refused";
    /// See [`IDLE_CONNECTION_TIMEOUT_MS`].
    idle_connection_timeout_ms: u64 = IDLE_CONNECTION_TIMEOUT_MS, Millis,
        "a `ws://` connection or Noise stream with no inbound message, request, running process or unwritten output this long is closed";
    /// See [`IDLE_LINK_TIMEOUT_MS`].
    idle_link_timeout_ms: u64 = IDLE_LINK_TIMEOUT_MS, Millis,
        "a direct `noise+ws://` link without any stream this long is closed (never the environment link to a relay)";
    /// See [`APPROVAL_TIMEOUT_MS`].
    approval_timeout_ms: u64 = APPROVAL_TIMEOUT_MS, Millis,
        "an unanswered `process/approve` is withdrawn after this long and its start fails (`-32006`)";
    /// See [`DEFAULT_SESSION_PIDS_MAX`].
    session_pids_max: u64 = DEFAULT_SESSION_PIDS_MAX, Count,
        "processes and threads of one session at once (its cgroup's `pids.max`; a fork fails beyond it); 0: no limit. Needs the `pids` controller, or start fails";
@text:
    /// See [`BackendChoice`].
    containment_backend: BackendChoice = BackendChoice::Auto, shown "auto",
        values "auto|cgroup2|cgroup1|none",
        "how a session's processes are found and killed (SECURITY.md, \"Process containment\"): `auto` takes the first of `cgroup2`, `cgroup1`, `none` that works; a named cgroup backend that cannot work here fails the start";
    /// See [`DEFAULT_CGROUP_NAME`].
    cgroup_name: String = String::from(DEFAULT_CGROUP_NAME), shown DEFAULT_CGROUP_NAME,
        values "NAME",
        "base name of the server's instance cgroup (`NAME-<pid>-<start time>-<n>`, one child per session); servers sharing a parent cgroup and a name remove each other's leftovers after a crash";
    /// See [`NoiseSuites`].
    noise_suites: NoiseSuites = NoiseSuites::ALL, shown "chachapoly,aesgcm",
        values "chachapoly,aesgcm",
        "the Noise suites a `noise+ws://` stream may use (`chachapoly` = suite 0, `aesgcm` = suite 1, comma-separated); an `OPEN` with another is reset `unsupported_suite` and a client retries with suite 0";
}

/// A configuration that cannot work.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

impl ServerConfig {
    /// Check relationships between settings once, at start.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let min_message = 4096;
        if self.max_message_bytes < min_message {
            return Err(ConfigError(format!(
                "max_message_bytes must be at least {min_message}"
            )));
        }
        // One base64-encoded chunk in a notification must fit in a message.
        if self.max_message_bytes < MAX_CHUNK_BYTES * 4 / 3 + 1024 {
            return Err(ConfigError(
                "max_message_bytes must hold one base64 output chunk (about 88 KiB)".into(),
            ));
        }
        for (name, v) in [
            ("max_processes", self.max_processes),
            ("max_sessions", self.max_sessions),
            ("retained_output_bytes", self.retained_output_bytes),
            ("output_budget_bytes", self.output_budget_bytes),
            ("max_pending_requests", self.max_pending_requests),
            ("max_connections", self.max_connections),
            ("max_links", self.max_links),
            ("max_pending_handshakes", self.max_pending_handshakes),
            (
                "max_pending_handshakes_per_address",
                self.max_pending_handshakes_per_address,
            ),
            (
                "max_pending_authorizations",
                self.max_pending_authorizations,
            ),
            ("max_streams_per_link", self.max_streams_per_link),
            ("max_streams_per_key", self.max_streams_per_key),
            (
                "max_handshakes_per_key_window",
                self.max_handshakes_per_key_window,
            ),
            ("max_sessions_per_key", self.max_sessions_per_key),
            ("max_sessions_per_address", self.max_sessions_per_address),
            ("max_processes_per_key", self.max_processes_per_key),
            ("max_processes_per_address", self.max_processes_per_address),
        ] {
            if v == 0 {
                return Err(ConfigError(format!("{name} must be greater than 0")));
            }
        }
        // Zero would make a timer fire at once (or, for the refill, never forgive).
        for (name, v) in [
            ("request_head_timeout_ms", self.request_head_timeout_ms),
            (
                "handshake_failure_refill_ms",
                self.handshake_failure_refill_ms,
            ),
            (
                "relay_link_handshake_failure_refill_ms",
                self.relay_link_handshake_failure_refill_ms,
            ),
            ("handshake_clock_window_ms", self.handshake_clock_window_ms),
            ("keepalive_interval_ms", self.keepalive_interval_ms),
            ("pong_timeout_ms", self.pong_timeout_ms),
            ("relay_backoff_initial_ms", self.relay_backoff_initial_ms),
            ("relay_backoff_max_ms", self.relay_backoff_max_ms),
            (
                "relay_refused_backoff_max_ms",
                self.relay_refused_backoff_max_ms,
            ),
            (
                "idle_connection_timeout_ms",
                self.idle_connection_timeout_ms,
            ),
            ("idle_link_timeout_ms", self.idle_link_timeout_ms),
            ("approval_timeout_ms", self.approval_timeout_ms),
        ] {
            if v == 0 {
                return Err(ConfigError(format!("{name} must be greater than 0")));
            }
        }
        // A message of the largest size must fit in every budget that holds one whole.
        for (name, v) in [
            ("max_pending_request_bytes", self.max_pending_request_bytes),
            ("max_link_reassembly_bytes", self.max_link_reassembly_bytes),
            ("max_inbound_bytes", self.max_inbound_bytes),
        ] {
            if v < self.max_message_bytes {
                return Err(ConfigError(format!(
                    "{name} must be at least max_message_bytes ({})",
                    self.max_message_bytes
                )));
            }
        }
        if self.detached_session_ttl_ms > self.max_session_ttl_ms {
            return Err(ConfigError(format!(
                "detached_session_ttl_ms ({}) must be at most max_session_ttl_ms ({})",
                self.detached_session_ttl_ms, self.max_session_ttl_ms
            )));
        }
        check_cgroup_name(&self.cgroup_name).map_err(ConfigError)?;
        if self.noise_suites.is_empty() {
            return Err(ConfigError(
                "noise_suites must list at least one suite (chachapoly, aesgcm)".into(),
            ));
        }
        Ok(())
    }

    /// [`Self::max_kill_grace_ms`] as a duration: the longest SIGTERM-to-SIGKILL grace on any
    /// path, and the most expiry, close and shutdown wait for a process that ignores SIGTERM.
    pub fn max_kill_grace(&self) -> Duration {
        Duration::from_millis(self.max_kill_grace_ms)
    }

    /// [`Self::max_drain_timeout_ms`] as a duration.
    pub fn max_drain_timeout(&self) -> Duration {
        Duration::from_millis(self.max_drain_timeout_ms)
    }

    /// [`Self::session_pids_max`] as a limit: `None` for 0 (no limit).
    pub fn session_pids_limit(&self) -> Option<u64> {
        (self.session_pids_max > 0).then_some(self.session_pids_max)
    }

    /// [`Self::request_head_timeout_ms`] as a duration.
    pub fn request_head_timeout(&self) -> Duration {
        Duration::from_millis(self.request_head_timeout_ms)
    }

    /// The HTTP front limits of a WebSocket listener (`ws://`, `noise+ws://`).
    pub fn websocket_front_limits(&self) -> FrontLimits {
        FrontLimits::websocket(
            self.request_head_timeout(),
            self.max_pending_handshakes,
            self.max_pending_handshakes_per_address,
        )
    }

    /// The HTTP front limits of the metrics listener.
    pub fn metrics_front_limits(&self) -> FrontLimits {
        FrontLimits::metrics(self.request_head_timeout())
    }

    /// [`Self::idle_connection_timeout_ms`] as a duration.
    pub fn idle_connection_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_connection_timeout_ms)
    }

    /// [`Self::idle_link_timeout_ms`] as a duration.
    pub fn idle_link_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_link_timeout_ms)
    }

    /// [`Self::approval_timeout_ms`] as a duration.
    pub fn approval_timeout(&self) -> Duration {
        Duration::from_millis(self.approval_timeout_ms)
    }

    /// `detachedSessionTtlMs` as a duration.
    pub fn detached_ttl(&self) -> Duration {
        Duration::from_millis(self.detached_session_ttl_ms)
    }

    /// Parse a TOML configuration file's contents.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let cfg: ServerConfig = toml::from_str(text).map_err(|e| ConfigError(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The settings of a TOML table already parsed (the caller took out its own keys).
    pub fn from_toml_table(table: toml::Table) -> Result<Self, ConfigError> {
        let cfg: ServerConfig = table.try_into().map_err(|e| ConfigError(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_the_spec() {
        let c = ServerConfig::default();
        c.validate().unwrap();
        assert_eq!(c.max_message_bytes, 16_777_216);
        assert_eq!(c.retained_output_bytes, 8_388_608);
        assert_eq!(c.detached_session_ttl_ms, 60_000);
    }

    #[test]
    fn toml_overrides_and_rejects_unknown_keys() {
        let c = ServerConfig::from_toml("max_processes = 3\n").unwrap();
        assert_eq!(c.max_processes, 3);
        assert!(ServerConfig::from_toml("max_procs = 3\n").is_err());
        assert!(ServerConfig::from_toml("max_sessions = 0\n").is_err());
        assert!(ServerConfig::from_toml("max_message_bytes = 100\n").is_err());
        assert!(ServerConfig::from_toml("max_connections = 0\n").is_err());
        assert!(ServerConfig::from_toml("pong_timeout_ms = 0\n").is_err());
        let c = ServerConfig::from_toml("max_pending_handshakes_per_address = 1\n").unwrap();
        assert_eq!(c.max_pending_handshakes_per_address, 1);
    }

    #[test]
    fn values_read_for_people() {
        assert_eq!(Unit::Bytes.display(16 * 1024 * 1024), "16 MiB");
        assert_eq!(Unit::Bytes.display(16 * 1024), "16 KiB");
        assert_eq!(Unit::Bytes.display(1000), "1 000 bytes");
        assert_eq!(Unit::Millis.display(86_400_000), "86 400 000 ms");
        assert_eq!(Unit::Millis.display(500), "500 ms");
        assert_eq!(Unit::Count.display(1024), "1 024");
        assert_eq!(Unit::Count.display(64), "64");
    }

    #[test]
    fn every_setting_is_listed_once_and_readable_by_name() {
        let c = ServerConfig::default();
        let mut names: Vec<&str> = SETTINGS.iter().map(|s| s.name).collect();
        for s in SETTINGS {
            assert_eq!(c.value_of(s.name), Some(s.default), "{}", s.name);
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SETTINGS.len());
        assert_eq!(c.value_of("no_such_setting"), None);
    }
}
