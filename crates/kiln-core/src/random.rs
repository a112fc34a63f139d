//! Seeds and reproducible random numbers, the same on every platform and every release (no
//! `std` hasher, whose output may change): SplitMix64 (Steele, Lea and Flood 2014), used for
//! trial seeds, per-step seeds, dropout-mask keys and generated data.

/// The golden-ratio increment of SplitMix64's state.
const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// SplitMix64's output for state `x`: a bijection of u64 that mixes every input bit into every
/// output bit, so that `splitmix64(seed ^ part)` chains numbers into unrelated seeds.
///
/// ```
/// // The generator's first output from seed 0.
/// assert_eq!(kiln_core::splitmix64(0), 0xe220_a839_7b1d_cdaf);
/// ```
pub fn splitmix64(x: u64) -> u64 {
    let z = x.wrapping_add(GOLDEN_GAMMA);
    let z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A SplitMix64 stream: a small, fast generator for generated data and tests.
///
/// ```
/// let mut random = kiln_core::SplitMix64::new(0);
/// assert_eq!(random.next_u64(), 0xe220_a839_7b1d_cdaf);
/// assert!((0.0..1.0).contains(&random.unit()));
/// ```
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// The stream seeded `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let out = splitmix64(self.0);
        self.0 = self.0.wrapping_add(GOLDEN_GAMMA);
        out
    }

    /// A uniform number in [0, 1) with 53 random bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}
