//! [`Batch`]: frames gathered to be handled at once, bounded in bytes and in count. A link's
//! reader hands the core every message that has already arrived as one batch (one lock of the
//! core, one wake of each destination's writer, however many frames), and its writer takes
//! one batch of transmits from the core before it writes them.
//!
//! Sans-IO: a plain container; the driver decides what goes in. It owns the two bounds and
//! never looks inside an item.
//!
//! # Bound
//!
//! A batch takes items while it holds fewer than `max_bytes` and fewer than `max_items`
//! ([`Batch::has_room`]); an item is only known once it is taken (a message read, a transmit
//! popped from the core), so a batch holds at most `max_items` items and less than
//! `max_bytes` plus one item's bytes.

/// Items gathered to be handled at once, with their byte count.
#[derive(Debug)]
pub struct Batch<T> {
    items: Vec<T>,
    bytes: usize,
    max_bytes: usize,
    max_items: usize,
}

impl<T> Batch<T> {
    /// An empty batch that takes items while it holds under `max_bytes` bytes and under
    /// `max_items` items (each at least 1).
    pub fn new(max_bytes: usize, max_items: usize) -> Self {
        Batch {
            items: Vec::new(),
            bytes: 0,
            max_bytes: max_bytes.max(1),
            max_items: max_items.max(1),
        }
    }

    /// Whether another item may be taken.
    pub fn has_room(&self) -> bool {
        self.bytes < self.max_bytes && self.items.len() < self.max_items
    }

    /// Add `item` of `bytes` bytes. Only while [`has_room`](Self::has_room): the caller
    /// checks before it takes the item from its source.
    pub fn push(&mut self, item: T, bytes: usize) {
        debug_assert!(self.has_room(), "an item pushed into a full batch");
        self.bytes = self.bytes.saturating_add(bytes);
        self.items.push(item);
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Items held.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Whether any held item satisfies `f`.
    pub fn any(&self, f: impl FnMut(&T) -> bool) -> bool {
        self.items.iter().any(f)
    }

    /// Take every item, in the order they were pushed; the batch is empty again (its
    /// allocation is kept for the next batch).
    pub fn drain(&mut self) -> std::vec::Drain<'_, T> {
        self.bytes = 0;
        self.items.drain(..)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::MAX_FRAME_BYTES;

    /// Fill a batch the way a driver does: look for room, then take the next item.
    fn fill(batch: &mut Batch<usize>, sizes: &mut impl Iterator<Item = usize>) {
        while batch.has_room() {
            let Some(n) = sizes.next() else { break };
            batch.push(n, n);
        }
    }

    #[test]
    fn a_batch_stops_at_its_byte_bound_and_never_holds_a_frame_more() {
        let max = 256 << 10;
        let mut batch = Batch::new(max, 1024);
        // Full-size frames: 256 KiB / 65,579 bytes = 3.99…, so the fourth crosses the bound.
        let mut sizes = std::iter::repeat(MAX_FRAME_BYTES);
        fill(&mut batch, &mut sizes);
        assert_eq!(batch.len(), 4);
        assert_eq!(batch.bytes(), 4 * MAX_FRAME_BYTES);
        assert!(batch.bytes() < max + MAX_FRAME_BYTES);
        assert!(!batch.has_room());
    }

    #[test]
    fn a_batch_stops_at_its_count_bound() {
        let mut batch = Batch::new(256 << 10, 64);
        let mut sizes = std::iter::repeat(44);
        fill(&mut batch, &mut sizes);
        assert_eq!(batch.len(), 64);
        assert_eq!(batch.bytes(), 64 * 44);
        assert!(!batch.has_room());
    }

    #[test]
    fn no_mix_of_sizes_passes_the_bound() {
        let (max, most, largest) = (1000, 16, 300);
        let mut seed = 7u64;
        let mut sizes = std::iter::from_fn(|| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            Some((seed >> 33) as usize % largest)
        });
        for _ in 0..500 {
            let mut batch = Batch::new(max, most);
            fill(&mut batch, &mut sizes);
            assert!(batch.len() <= most);
            let items: Vec<usize> = batch.drain().collect();
            let before_last: usize = items[..items.len() - 1].iter().sum();
            // It had room before its last item, so it holds at most the bound plus one item.
            assert!(before_last < max);
            assert!(before_last + items[items.len() - 1] < max + largest);
        }
    }

    #[test]
    fn draining_gives_every_item_in_order_and_empties_the_batch() {
        let mut batch = Batch::new(100, 10);
        for i in 0..5 {
            batch.push(i, 10);
        }
        assert!(batch.any(|&i| i == 3));
        assert_eq!(batch.drain().collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
        assert!(batch.is_empty());
        assert_eq!(batch.bytes(), 0);
        assert!(batch.has_room());
    }

    #[test]
    fn zero_bounds_still_take_one_item() {
        let mut batch = Batch::new(0, 0);
        assert!(batch.has_room());
        batch.push((), 5);
        assert!(!batch.has_room());
    }
}
