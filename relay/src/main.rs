//! `execrelay-relay`: the relay binary. Tunes the allocator, then parses flags
//! ([`execrelay_relay::server::cli`]) and runs [`execrelay_relay::server::RelayServer`];
//! nothing else lives here. (The library forbids `unsafe`; the one `mallopt` call is here.)

/// Freed memory the allocator keeps instead of handing it back to the kernel at once: every
/// forwarded frame moves through 64 KiB buffers (the WebSocket message, the encoded frame),
/// and glibc's default trim and mmap thresholds made the kernel fault in and zero those pages
/// again for every frame (a tenth of the relay's CPU in `perf`). The exec server does the
/// same (`execrelay::cli::tune_allocator`).
const ALLOCATOR_KEEP_BYTES: libc::c_int = 64 * 1024 * 1024;

fn main() {
    // SAFETY: mallopt only adjusts allocator parameters, and runs before any other thread.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, ALLOCATOR_KEEP_BYTES);
        libc::mallopt(libc::M_MMAP_THRESHOLD, ALLOCATOR_KEEP_BYTES);
    }
    std::process::exit(execrelay_relay::server::cli::main());
}
