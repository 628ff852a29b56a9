//! What the record layer charges the bytes of unfinished messages to: a [`ReassemblyBudget`]
//! hands out [`BudgetCharge`]s, held while the bytes are and given back when dropped.
//!
//! The record layer only needs to ask for bytes before it holds them and to grow what it
//! holds; what the limits are and who shares them is the caller's. The exec server implements
//! the trait for its shared byte budget (a link's reassembly budget under the server's inbound
//! budget, `execrelay::bounds::ByteBudget`); a client, whose server's messages are bounded by
//! its own requests, uses [`Unlimited`].
//!
//! # What it must never do
//!
//! Wait for bytes: a charge that does not fit is refused at once with [`OverBudget`], and the
//! record layer fails the one stream that asked.

/// A charge that did not fit: which limit was full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("limit reached: {limit} ({max} bytes)")]
pub struct OverBudget {
    /// The name of the full budget (the limit's name as clients see it in `data.limit`).
    pub limit: &'static str,
    /// Its size in bytes.
    pub max: usize,
}

/// Bytes held against a budget; given back when dropped. `Default` is a charge of nothing,
/// against nothing (what a deframer holds between messages).
pub trait BudgetCharge: Default + std::fmt::Debug {
    /// The bytes held.
    fn bytes(&self) -> usize;

    /// Hold `more` bytes on the same budget, or refuse (and keep what is held).
    fn try_grow(&mut self, more: usize) -> Result<(), OverBudget>;
}

/// A limit the record layer charges unfinished messages to.
pub trait ReassemblyBudget {
    /// What a successful charge holds.
    type Charge: BudgetCharge;

    /// Hold `bytes`, or refuse, naming the full limit.
    fn try_charge(&self, bytes: usize) -> Result<Self::Charge, OverBudget>;
}

/// A budget that never refuses (a client's opener, fuzzing, tests). Its charges still count
/// their bytes, so a deframer reports what it holds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unlimited;

/// Bytes held against [`Unlimited`].
#[derive(Debug, Default)]
pub struct UnlimitedCharge {
    bytes: usize,
}

/// The name an [`Unlimited`] budget would report: only if a charge's count overflowed.
const UNLIMITED: &str = "unlimited";

impl BudgetCharge for UnlimitedCharge {
    fn bytes(&self) -> usize {
        self.bytes
    }

    fn try_grow(&mut self, more: usize) -> Result<(), OverBudget> {
        self.bytes = self.bytes.checked_add(more).ok_or(OverBudget {
            limit: UNLIMITED,
            max: usize::MAX,
        })?;
        Ok(())
    }
}

impl ReassemblyBudget for Unlimited {
    type Charge = UnlimitedCharge;

    fn try_charge(&self, bytes: usize) -> Result<UnlimitedCharge, OverBudget> {
        Ok(UnlimitedCharge { bytes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlimited_counts_and_never_refuses_what_fits_in_a_usize() {
        let mut c = Unlimited.try_charge(1 << 40).unwrap();
        c.try_grow(5).unwrap();
        assert_eq!(c.bytes(), (1 << 40) + 5);
        let mut none = UnlimitedCharge::default();
        assert_eq!(none.bytes(), 0);
        none.try_grow(usize::MAX).unwrap();
        assert_eq!(
            none.try_grow(1),
            Err(OverBudget {
                limit: "unlimited",
                max: usize::MAX
            }),
            "a count past usize::MAX is refused, never wrapped"
        );
        assert_eq!(
            none.bytes(),
            usize::MAX,
            "a refused growth keeps what is held"
        );
    }
}
