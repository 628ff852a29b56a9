//! Every limit of the specification as a named constant with its default: what
//! [`ServerConfig`](super::ServerConfig) starts from and what the docs' bounds tables name.
//! Plain values only; which may be changed, and how, is declared in `config/mod.rs`.

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
/// Control-lane slots beyond the request limits, for errors a connection's reader sends
/// itself (parse errors, limit errors). A connection's writer queue holds at most
/// `maxPendingRequests + CONTROL_REQUEST_SLOTS + CONTROL_LANE_SLACK` replies; when even these
/// are full the reader waits: its client is not reading its responses.
pub const CONTROL_LANE_SLACK: usize = 64;
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
/// [`MAX_REQUEST_HEAD_BYTES`](execrelay_io::http::limits::MAX_REQUEST_HEAD_BYTES) for at most [`REQUEST_HEAD_TIMEOUT_MS`]; beyond the cap a new
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
/// The receive window of each Noise stream: records (of at most 64 KiB) a client may send past
/// what the server consumed (`secure-transport.md` §7's default). What the server holds per
/// stream of records not yet opened is one window, so this is memory per stream; a client far
/// away uploads at most one window per round trip.
pub const NOISE_WINDOW_RECORDS: u32 = execrelay_protocol::config::STREAM_WINDOW_RECORDS;
/// The largest `noise_window_records`: what a relay passes on by default
/// (`MAX_RELAY_WINDOW_RECORDS`), 4 MiB per stream.
pub const MAX_NOISE_WINDOW_RECORDS: u32 = execrelay_protocol::config::MAX_RELAY_WINDOW_RECORDS;
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
