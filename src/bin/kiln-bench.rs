//! kiln's benchmark suite: GEMM and attention on the chosen device, with a batch-scaling check,
//! and on a CPU kiln's own host products in the operands the policy asks for (`host-gemm/bf16`
//! under `--policy mixed-bf16` where the CPU has AMX or AVX512-BF16, read against the calibrated
//! bf16 peak).
//!
//! ```text
//! cargo xtask bench --save main          # cargo run --release --bin kiln-bench -- --save main
//! cargo xtask bench --compare main       # exits 1 on a regression
//! cargo xtask bench --device cuda --policy mixed-bf16 --filter gemm --compare main
//! ```

use std::process::ExitCode;

use kiln::bench::{Attention, BenchError, Gemm, HostGemm, Runner, Suite, batch_sizes, cli};
use kiln::burn::tensor::backend::Backend;
use kiln::core::is_host_backend;
use kiln::kernels::gemm::Products;

/// Test hook: `KILN_BENCH_SLOWDOWN=N` makes every GEMM run N multiplications while declaring one,
/// so tests can check that a slower build is caught. Never set it for real measurements.
const SLOWDOWN_VAR: &str = "KILN_BENCH_SLOWDOWN";

struct Harness {
    gemm_repeat: usize,
}

impl Suite for Harness {
    fn run<B: Backend>(&self, runner: &mut Runner<'_, B>) -> Result<(), BenchError> {
        let policy = runner.policy();
        for n in [512, 1024, 2048] {
            let gemm = Gemm {
                repeat: self.gemm_repeat,
                ..Gemm::new(n, policy)
            };
            runner.bench(&gemm)?;
        }
        if is_host_backend::<B>(runner.device()) {
            for n in [512, 1024, 2048] {
                let gemm = HostGemm {
                    n,
                    products: Products::under(&policy),
                };
                if gemm.supported() {
                    runner.bench(&gemm)?;
                }
            }
        }
        runner.bench(&Attention::vit_base(8, policy))?;
        runner.batch_scaling("attention/vit-base", &batch_sizes(8), |batch| {
            Attention::vit_base(batch, policy)
        })
    }
}

fn main() -> ExitCode {
    let gemm_repeat = std::env::var(SLOWDOWN_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1usize)
        .max(1);
    cli::main(Harness { gemm_repeat })
}
