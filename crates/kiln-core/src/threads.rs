//! Which thread drives host computation.

use burn::tensor::backend::Backend;

use crate::is_host_backend;

/// Runs `work` on one of rayon's worker threads when `B` keeps its tensors in host memory (see
/// [`is_host_backend`]), on this thread otherwise.
///
/// burn's host backends split each operation across rayon's pool. Issued from a thread outside
/// the pool, an operation is handed to the pool and waited for, and between operations the pool's
/// threads keep looking for work while the issuing thread does the serial part (autodiff's
/// bookkeeping, small operations): with a pool as large as the machine, one thread too many
/// competes for the cores. Issued from a pool thread, an operation is shared with that thread
/// itself. The training step of `examples/train_classifier` on 2 cores: 7.5 ms from outside the
/// pool, 7.0 ms with a pool of one thread, 6.2 ms from inside a pool of two
/// (`cargo bench --bench train`, docs/PERFORMANCE.md).
///
/// ```
/// use burn::backend::Flex;
///
/// let device = Default::default();
/// let sum = kiln_core::on_host_pool::<Flex, _>(&device, || {
///     assert!(rayon::current_thread_index().is_some());
///     1 + 1
/// });
/// assert_eq!(sum, 2);
/// ```
pub fn on_host_pool<B: Backend, R: Send>(device: &B::Device, work: impl FnOnce() -> R + Send) -> R {
    if is_host_backend::<B>(device) {
        rayon::scope(|_| work())
    } else {
        work()
    }
}
