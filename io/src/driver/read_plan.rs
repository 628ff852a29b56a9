//! How large the next read of a WebSocket is, and whether it goes into a fresh buffer: the
//! sans-IO rule behind [`poll_fill`](super::socket::poll_fill), tested here without a socket.
//!
//! Why it exists: payloads are handed on as slices of the read buffer, so a frame left half
//! read at the end of a buffer had to be copied into the next one (the old buffer stays alive
//! through the slices taken from it). On the relay that `memmove` of about half a frame per
//! read was the largest cost of its own (8 % of its CPU in a profile of the relay bench; 5 % of
//! the fan-in server's). Now a fresh buffer has room for one more frame beyond its read, and
//! while the frame in progress fits where it is, the next read asks for its rest only: the
//! buffer then ends at a frame's end and the read after it starts a fresh one with nothing to
//! move. The price is one more, smaller read per buffer.
//!
//! Owns only the arithmetic. It must never let a frame's declared length alone reserve memory
//! (a frame larger than a read grows the buffer by at most doubling what has arrived), and a
//! buffer is never larger than a read's worth plus one frame or what has arrived
//! (SECURITY.md, "read buffer of the link").

use execrelay_protocol::frame::MAX_FRAME_BYTES;
use execrelay_protocol::websocket::MAX_HEADER_BYTES;

/// Room a fresh buffer keeps beyond its read: one whole link frame with its WebSocket
/// header, so that a frame that begins inside the read can be completed in place.
pub const FRAME_HEADROOM_BYTES: usize = MAX_FRAME_BYTES + MAX_HEADER_BYTES;

/// The next read: at most `limit` bytes, into a fresh buffer of `fresh` bytes of capacity (the
/// bytes buffered moved into it first) when set, else into the spare room of the buffer as
/// it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadPlan {
    /// Most bytes to read.
    pub limit: usize,
    /// The capacity of a fresh buffer to read into, or `None` to read where the buffer is.
    pub fresh: Option<usize>,
}

/// Plan the next read of a buffer holding `buffered` bytes not yet decoded, whose first frame
/// (when its header is whole) needs `frame_remaining` more (0 when no header is whole), with
/// `spare` bytes of room left; a read's worth is `read_bytes`.
pub fn plan_read(
    buffered: usize,
    frame_remaining: usize,
    spare: usize,
    read_bytes: usize,
) -> ReadPlan {
    if frame_remaining > 0 && frame_remaining <= spare {
        // The frame in progress fits where it is: read its rest and no more, so that this
        // buffer ends at a frame's end.
        return ReadPlan {
            limit: frame_remaining,
            fresh: None,
        };
    }
    // A read's worth, more when a frame needs it but never more than doubling what has
    // arrived: a declared length alone reserves nothing.
    let want = frame_remaining
        .min(buffered.max(read_bytes))
        .max(read_bytes);
    if spare >= want {
        return ReadPlan {
            limit: want,
            fresh: None,
        };
    }
    ReadPlan {
        limit: want,
        // What is buffered is moved in first; the room beyond the read is at least one frame
        // (a link frame left half read is smaller than that, so it never adds to the bound).
        fresh: Some(want + FRAME_HEADROOM_BYTES.max(buffered)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const READ: usize = 128 << 10;
    const FRAME: usize = 64 << 10;

    #[test]
    fn an_empty_buffer_gets_a_fresh_one_with_a_frame_of_room_beyond_the_read() {
        assert_eq!(
            plan_read(0, 0, 0, READ),
            ReadPlan {
                limit: READ,
                fresh: Some(READ + FRAME_HEADROOM_BYTES),
            }
        );
    }

    #[test]
    fn a_frame_that_fits_where_it_is_reads_exactly_its_rest() {
        // 29 KiB of a 64 KiB frame at the end of a buffer with 101 KiB of room left.
        let rest = FRAME + 4 - (29 << 10);
        assert_eq!(
            plan_read(29 << 10, rest, 101 << 10, READ),
            ReadPlan {
                limit: rest,
                fresh: None,
            }
        );
        // At the edge: exactly as much room as the rest needs.
        assert_eq!(
            plan_read(10, rest, rest, READ),
            ReadPlan {
                limit: rest,
                fresh: None,
            }
        );
    }

    #[test]
    fn a_frame_one_byte_too_large_for_the_room_moves_to_a_fresh_buffer() {
        let rest = 40 << 10;
        assert_eq!(
            plan_read(24 << 10, rest, rest - 1, READ),
            ReadPlan {
                limit: READ,
                fresh: Some(READ + FRAME_HEADROOM_BYTES),
            }
        );
    }

    #[test]
    fn a_header_not_yet_whole_reads_a_reads_worth() {
        // Three bytes of a header: nothing known of the frame.
        assert_eq!(plan_read(3, 0, READ, READ).limit, READ);
        assert_eq!(plan_read(3, 0, READ, READ).fresh, None);
        assert_eq!(
            plan_read(3, 0, 100, READ).fresh,
            Some(READ + FRAME_HEADROOM_BYTES)
        );
    }

    #[test]
    fn a_large_declared_frame_grows_the_buffer_by_at_most_doubling_what_arrived() {
        // A 16 MiB JSON message declared, 10 bytes of it here: a read's worth, no more.
        let plan = plan_read(10, (16 << 20) - 10, 0, READ);
        assert_eq!(plan.limit, READ);
        assert_eq!(plan.fresh, Some(READ + FRAME_HEADROOM_BYTES));
        // 1 MiB of it arrived: the next buffer may take as much again, and holds what arrived.
        let plan = plan_read(1 << 20, (15 << 20) - 10, 0, READ);
        assert_eq!(plan.limit, 1 << 20);
        assert_eq!(plan.fresh, Some((1 << 20) + (1 << 20)));
    }

    #[test]
    fn a_fresh_link_buffer_never_exceeds_a_read_and_one_frame() {
        // Whatever is left of a link frame (smaller than one frame), the bound in SECURITY.md.
        for buffered in [0, 1, FRAME / 2, FRAME_HEADROOM_BYTES - 1] {
            for spare in [0, 1, 1000] {
                let plan = plan_read(buffered, 0, spare, READ);
                if let Some(cap) = plan.fresh {
                    assert!(
                        cap <= READ + FRAME_HEADROOM_BYTES,
                        "{buffered} {spare}: {cap}"
                    );
                    assert!(cap >= buffered + plan.limit, "{buffered} {spare}: {cap}");
                }
            }
        }
    }
}
