//! A small deterministic generator for the crate's seeded tests (xorshift64*): each
//! test prints its seed, and the same seed gives the same sequence.

/// xorshift64* over a nonzero state.
pub(crate) struct Rng(pub u64);

impl Rng {
    /// A generator from `seed` (any value: it is mixed and made nonzero).
    pub fn seeded(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next value, below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}
