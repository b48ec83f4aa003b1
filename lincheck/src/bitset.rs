//! A fixed-size set of operation indices: which operations a partial linearization holds.

/// A bit per operation of one partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bitset(Box<[u64]>);

/// MurmurHash3's 64-bit finalizer constant, as Porcupine's bitset hash uses.
const PRIME: u64 = 0xff51_afd7_ed55_8ccd;

impl Bitset {
    /// An empty set with room for `bits` members.
    pub fn new(bits: usize) -> Bitset {
        Bitset(vec![0; bits.div_ceil(64)].into_boxed_slice())
    }

    /// Adds `pos` (which must be below the size given to [`Bitset::new`]).
    pub fn set(&mut self, pos: usize) {
        if let Some(word) = self.0.get_mut(pos / 64) {
            *word |= 1 << (pos % 64);
        }
    }

    /// Removes `pos`.
    pub fn clear(&mut self, pos: usize) {
        if let Some(word) = self.0.get_mut(pos / 64) {
            *word &= !(1 << (pos % 64));
        }
    }

    /// Whether `pos` is in the set.
    pub fn contains(&self, pos: usize) -> bool {
        self.0
            .get(pos / 64)
            .is_some_and(|word| word & (1 << (pos % 64)) != 0)
    }

    /// A hash of the members.
    pub fn hash(&self) -> u64 {
        self.0
            .iter()
            .fold(0u64, |h, &w| (h ^ w).wrapping_mul(PRIME))
    }

    /// The number of 64-bit words it takes (its share of the cache's memory).
    pub fn words(&self) -> usize {
        self.0.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_clear_contains_and_hash() {
        let mut b = Bitset::new(130);
        assert_eq!(b.words(), 3);
        let empty = b.hash();
        b.set(0);
        b.set(129);
        assert!(b.contains(0) && b.contains(129) && !b.contains(64));
        assert_ne!(b.hash(), empty);
        b.clear(0);
        b.clear(129);
        assert_eq!(b, Bitset::new(130));
        assert_eq!(b.hash(), empty);
        b.set(500); // out of range: ignored
        assert_eq!(b, Bitset::new(130));
    }
}
