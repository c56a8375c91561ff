//! splitmix64, the random numbers of the core's randomized tests and benches (shared through
//! `#[path]` by `tests/bounds.rs` and the benches): seeded, so a run can be repeated, and a few
//! nanoseconds a number, the same cost on both sides of every bench comparison.

/// A splitmix64 generator; the seed is its state.
pub struct Rng(pub u64);

impl Rng {
    /// The next number, uniform over `u64`.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (multiply-shift, no division); 0 when `n` is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}
