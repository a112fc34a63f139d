//! One seed per (model, T, trial), derived from the experiment's master seed: stable across
//! runs, processes and platforms (no `std` hasher, whose output may change between releases).

use kiln_core::splitmix64;

/// The seed of trial `trial` of `passes` passes of `model` in an experiment seeded `master`.
///
/// FNV-1a over the model name, then SplitMix64 finalisation of every component in turn: a
/// change to any one gives an unrelated seed.
///
/// ```
/// let a = kiln_mc::trial_seed(42, "clip_b32", 16, 0);
/// assert_eq!(a, kiln_mc::trial_seed(42, "clip_b32", 16, 0));
/// assert_ne!(a, kiln_mc::trial_seed(42, "clip_b32", 16, 1));
/// ```
pub fn trial_seed(master: u64, model: &str, passes: u32, trial: u32) -> u64 {
    let name = model.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    [name, u64::from(passes), u64::from(trial)]
        .into_iter()
        .fold(splitmix64(master), |state, part| splitmix64(state ^ part))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_component_changes_the_seed() {
        let base = trial_seed(7, "siglip2_b16", 32, 3);
        let others = [
            trial_seed(8, "siglip2_b16", 32, 3),
            trial_seed(7, "siglip2_b32", 32, 3),
            trial_seed(7, "siglip2_b16", 64, 3),
            trial_seed(7, "siglip2_b16", 32, 4),
        ];
        for other in others {
            assert_ne!(other, base);
            // Unrelated, not just different: about half the bits flip.
            let flipped = (other ^ base).count_ones();
            assert!((16..=48).contains(&flipped), "{flipped}");
        }
    }

    /// A change here changes every published result: it must be deliberate. The value is
    /// Python's, from the definition above (FNV-1a, then SplitMix64 over master, name, T, trial).
    #[test]
    fn seeds_are_pinned() {
        assert_eq!(trial_seed(42, "clip_b32", 16, 0), 0xf426_29c7_85f6_a40d);
    }
}
