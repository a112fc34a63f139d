//! Flex's matrix multiply must run on rayon's thread pool: burn's default features turn that on,
//! and a build without them silently runs on one core. This is its own test binary because it
//! inspects the process-wide pool.

use burn::backend::Flex;
use burn::tensor::Tensor;

#[test]
fn flex_matmul_runs_on_the_rayon_pool() {
    let device = Default::default();
    let a = Tensor::<Flex, 2>::ones([512, 512], &device);
    let c = a.clone().matmul(a);
    assert_eq!(c.slice([0..1, 0..1]).into_scalar(), 512.0);
    // The global pool can only be built once; if the matmul already started it, this fails.
    let built_here = rayon::ThreadPoolBuilder::new().build_global().is_ok();
    assert!(
        !built_here,
        "Flex ran single-threaded: enable burn's default features (rayon)"
    );
}
