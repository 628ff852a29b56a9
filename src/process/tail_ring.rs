//! The kept tail of a capped stream (`outputCapKeep: "headAndTail"`, `protocol.md` §5): the
//! last bytes a stream wrote past its head, held until the stream ends, and a count of those
//! that fell out of it.
//!
//! Sans-IO: a plain struct fed chunks by the output pump, which sends the count
//! (`process/outputOmitted`) and then the kept bytes when the stream ends. It holds at most
//! its capacity in bytes (the chunks it keeps are slices of the pump's buffers: a trimmed
//! chunk may keep its buffer alive, so memory is at most the capacity plus one chunk buffer).
//! It must never reorder bytes, and never count a byte both kept and omitted.

use std::collections::VecDeque;

use bytes::Bytes;

/// The last `capacity` bytes of a stream and how many bytes before them were dropped.
#[derive(Debug, Default)]
pub struct TailRing {
    capacity: usize,
    chunks: VecDeque<Bytes>,
    len: usize,
    omitted: u64,
}

impl TailRing {
    /// An empty ring keeping the last `capacity` bytes.
    pub fn new(capacity: usize) -> TailRing {
        TailRing {
            capacity,
            ..TailRing::default()
        }
    }

    /// Add `chunk` after what the ring holds; the oldest bytes beyond the capacity are
    /// dropped and counted.
    pub fn push(&mut self, chunk: Bytes) {
        if chunk.is_empty() {
            return;
        }
        self.len += chunk.len();
        self.chunks.push_back(chunk);
        while self.len > self.capacity {
            let excess = self.len - self.capacity;
            let Some(front) = self.chunks.front_mut() else {
                break;
            };
            if front.len() <= excess {
                let n = front.len();
                self.chunks.pop_front();
                self.len -= n;
                self.omitted += n as u64;
            } else {
                let _ = front.split_to(excess);
                self.len -= excess;
                self.omitted += excess as u64;
            }
        }
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes dropped so far (pushed, and no longer held).
    pub fn omitted(&self) -> u64 {
        self.omitted
    }

    /// The stream ended: how many bytes were dropped, and the kept ones in order.
    pub fn finish(self) -> (u64, Vec<Bytes>) {
        (self.omitted, self.chunks.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(range: std::ops::Range<u32>) -> Bytes {
        Bytes::from(range.map(|i| (i % 251) as u8).collect::<Vec<u8>>())
    }

    #[test]
    fn it_keeps_the_last_bytes_in_order_and_counts_the_rest() {
        let mut r = TailRing::new(10);
        r.push(bytes(0..4));
        r.push(Bytes::new());
        assert_eq!((r.len(), r.omitted()), (4, 0));
        r.push(bytes(4..9));
        r.push(bytes(9..15));
        assert_eq!((r.len(), r.omitted()), (10, 5));
        let (omitted, kept) = r.finish();
        assert_eq!(omitted, 5);
        let kept: Vec<u8> = kept.iter().flat_map(|c| c.iter().copied()).collect();
        assert_eq!(kept, bytes(5..15).to_vec());
    }

    #[test]
    fn a_chunk_larger_than_the_ring_keeps_its_end() {
        let mut r = TailRing::new(3);
        r.push(bytes(0..100));
        let (omitted, kept) = r.finish();
        assert_eq!(omitted, 97);
        assert_eq!(kept, vec![bytes(97..100)]);
        let mut r = TailRing::new(0);
        r.push(bytes(0..7));
        assert!(r.is_empty());
        assert_eq!(r.finish(), (7, Vec::new()));
    }

    /// Every byte pushed is either kept or counted, whatever the chunk sizes.
    #[test]
    fn kept_and_omitted_always_add_up() {
        for cap in [1usize, 7, 64, 1000] {
            let mut r = TailRing::new(cap);
            let mut total = 0u64;
            let mut all = Vec::new();
            for n in [1u32, 5, 63, 64, 65, 999, 3, 2000] {
                let c = bytes(total as u32..total as u32 + n);
                all.extend_from_slice(&c);
                total += u64::from(n);
                r.push(c);
                assert!(r.len() <= cap);
                assert_eq!(r.len() as u64 + r.omitted(), total);
            }
            let (omitted, kept) = r.finish();
            let kept: Vec<u8> = kept.iter().flat_map(|c| c.iter().copied()).collect();
            assert_eq!(&kept[..], &all[omitted as usize..]);
        }
    }
}
