//! The exec server's [`ByteBudget`] as the record layer's reassembly budget
//! (`execrelay_protocol::noise::budget`): a Noise stream's deframer charges each unfinished
//! message to its link's budget, a child of the server's inbound budget, through these impls.
//! They add nothing: a charge is [`ByteBudget::try_charge`], a growth [`Charge::try_grow`],
//! a release the [`Charge`]'s drop.

use execrelay_protocol::noise::budget::{BudgetCharge, OverBudget, ReassemblyBudget};

use super::byte_budget::{ByteBudget, Charge};

impl ReassemblyBudget for ByteBudget {
    type Charge = Charge;

    fn try_charge(&self, bytes: usize) -> Result<Charge, OverBudget> {
        ByteBudget::try_charge(self, bytes)
    }
}

impl BudgetCharge for Charge {
    fn bytes(&self) -> usize {
        Charge::bytes(self)
    }

    fn try_grow(&mut self, more: usize) -> Result<(), OverBudget> {
        Charge::try_grow(self, more)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use execrelay_protocol::noise::record::{MessageDeframer, RecordError, MAX_MESSAGE_RESERVE};

    /// Unfinished messages are charged before they grow, the link's budget is shared by its
    /// streams, a stream that cannot get bytes fails alone, and a completed message gives
    /// its bytes back.
    #[test]
    fn unfinished_messages_are_charged_to_the_budget() {
        const R: usize = MAX_MESSAGE_RESERVE;
        let server = ByteBudget::new("maxInboundBytes", 1 << 30);
        let link = server.child("maxLinkReassemblyBytes", 3 * R);
        let len = 2 * R;
        let body = vec![7u8; len];
        let mut a = MessageDeframer::with_budget(len, link.clone());
        let mut b = MessageDeframer::with_budget(len, link.clone());
        assert_eq!(a.push(&(len as u32).to_be_bytes()), Ok(vec![]));
        assert_eq!(a.held_bytes(), R, "the first reserve is charged");
        assert_eq!(server.used(), R);
        assert_eq!(a.push(&body[..R]), Ok(vec![]));
        assert_eq!(
            a.held_bytes(),
            R,
            "filling the reserve charges nothing more"
        );
        // One more byte: it doubles to its declared length, charged first.
        assert_eq!(a.push(&body[R..R + 1]), Ok(vec![]));
        assert_eq!(a.held_bytes(), 2 * R);
        // `b` gets the last MiB of the link's budget, then cannot grow: it fails, `a` goes on.
        assert_eq!(b.push(&(len as u32).to_be_bytes()), Ok(vec![]));
        assert_eq!(link.used(), 3 * R);
        assert_eq!(
            b.push(&body[..R + 1]),
            Err(RecordError::OverBudget(OverBudget {
                limit: "maxLinkReassemblyBytes",
                max: 3 * R
            }))
        );
        drop(b);
        assert_eq!(link.used(), 2 * R, "a dropped stream gives back");
        // `a` completes within its charge; the charge goes with the message until taken.
        let got = a.push(&body[R + 1..]).unwrap();
        assert_eq!(got, vec![body]);
        assert_eq!(a.held_bytes(), 0);
        let charge = a.take_charge();
        assert_eq!((charge.bytes(), link.used()), (2 * R, 2 * R));
        assert_eq!(a.take_charge().bytes(), 0, "one charge per message");
        drop(charge);
        assert_eq!((link.used(), server.used()), (0, 0));
        // A charge nobody takes is given back at the next push.
        assert_eq!(a.push(&[0, 0, 0, 1, b'x']), Ok(vec![b"x".to_vec()]));
        assert_eq!(link.used(), 1);
        assert_eq!(a.push(&[0, 0]), Ok(vec![]));
        assert_eq!(link.used(), 0);
    }

    #[test]
    fn a_full_server_budget_fails_the_stream_at_the_prefix() {
        let server = ByteBudget::new("maxInboundBytes", 10);
        let mut d = MessageDeframer::with_budget(100, server.child("link", 100));
        assert_eq!(
            d.push(&[0, 0, 0, 11]),
            Err(RecordError::OverBudget(OverBudget {
                limit: "maxInboundBytes",
                max: 10
            }))
        );
        let mut d = MessageDeframer::with_budget(100, server.child("link", 100));
        assert_eq!(d.push(&[0, 0, 0, 2, b'o', b'k']), Ok(vec![b"ok".to_vec()]));
        drop(d.take_charge());
        assert_eq!(server.used(), 0);
    }
}
