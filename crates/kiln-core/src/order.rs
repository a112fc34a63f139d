//! The order of a dataset's items in a pass: as stored, or a seeded shuffle per epoch (the same
//! on every platform, so a resumed run reads the same batches).

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

/// The order of items in a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// 0, 1, …, N − 1.
    Sequential,
    /// A permutation drawn from ChaCha8 seeded with `seed`, stream `epoch`.
    Shuffled {
        /// The run's seed.
        seed: u64,
        /// The epoch: each gets its own permutation.
        epoch: u64,
    },
}

impl Order {
    /// The items of a dataset of `len` in this order.
    pub fn indices(self, len: usize) -> Vec<usize> {
        let mut indices: Vec<usize> = (0..len).collect();
        if let Order::Shuffled { seed, epoch } = self {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            rng.set_stream(epoch);
            indices.shuffle(&mut rng);
        }
        indices
    }
}
