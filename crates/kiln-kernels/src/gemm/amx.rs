//! Intel AMX: a 32 × 32 block of `C` in four 16 × 16 f32 tiles, `tdpbf16ps` over 32 values of
//! the inner dimension a step. The intrinsics are not stable on the pinned toolchain, so each
//! instruction is one `asm!` statement; tile registers are fixed: `tmm0`–`tmm3` hold `C`,
//! `tmm4`/`tmm5` two 16-row tiles of `A`, `tmm6`/`tmm7` two 16-column tiles of `B`.
#![allow(unsafe_code)]

use std::arch::asm;
use std::ops::Range;
use std::sync::OnceLock;

use super::bf16::{BLOCK, K_STEP, TILE};

/// Whether the CPU has AMX-TILE and AMX-BF16 and Linux granted this process the tile data
/// state (asked once: `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`).
pub(super) fn available() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| cpu_has_amx_bf16() && tile_data_granted())
}

/// CPUID leaf 7: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE.
fn cpu_has_amx_bf16() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    #[allow(unused_unsafe)]
    // SAFETY: CPUID exists on every x86-64 CPU.
    let (max_leaf, edx) = unsafe { (__cpuid(0).eax, __cpuid_count(7, 0).edx) };
    max_leaf >= 7 && edx & (1 << 22) != 0 && edx & (1 << 24) != 0
}

/// Asks Linux for the AMX tile data state; other systems are not asked (no AMX here).
fn tile_data_granted() -> bool {
    #[cfg(target_os = "linux")]
    {
        const SYS_ARCH_PRCTL: i64 = 158;
        const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
        const XFEATURE_XTILEDATA: i64 = 18;
        let status: i64;
        // SAFETY: arch_prctl(ARCH_REQ_XCOMP_PERM) only changes which state the process may
        // use; the syscall clobbers rcx and r11, declared.
        unsafe {
            asm!(
                "syscall",
                inlateout("rax") SYS_ARCH_PRCTL => status,
                in("rdi") ARCH_REQ_XCOMP_PERM,
                in("rsi") XFEATURE_XTILEDATA,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        status == 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// The tile configuration: palette 1, eight tiles of 16 rows of 64 bytes.
#[repr(C, align(64))]
struct Config([u8; 64]);

const CONFIG: Config = {
    let mut bytes = [0u8; 64];
    bytes[0] = 1;
    let mut tile = 0;
    while tile < 8 {
        // Bytes per row (u16 at 16 + 2t), rows (u8 at 48 + t).
        bytes[16 + 2 * tile] = 64;
        bytes[48 + tile] = 16;
        tile += 1;
    }
    Config(bytes)
};

/// Loads the tile configuration on this thread, for the [`block`]s that follow until
/// [`release`].
///
/// # Safety
/// [`available`] returned true.
pub(super) unsafe fn configure() {
    // SAFETY: the configuration is valid (palette 1, rows ≤ 16, 64 bytes a row).
    unsafe { asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack)) };
}

/// Releases this thread's tile state (so that a context switch does not save 8 kB of it).
///
/// # Safety
/// [`configure`] ran on this thread.
pub(super) unsafe fn release() {
    // SAFETY: tilerelease only clears the tile state.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// `out (+)= A · B` for one 32 × 32 block over the inner-dimension steps `steps` (32 values
/// each): `a` the block's packed rows, step after step 32 rows of 32 bf16 values, `b` two
/// neighbouring packed 16-column panels of `depth / 2` pair rows; `out` row-major 32 × 32,
/// added to when `add`, else overwritten.
///
/// # Safety
/// [`configure`] ran on this thread; `depth` is a multiple of [`K_STEP`] and `steps` lies
/// within `depth / K_STEP`; `a` holds `BLOCK · depth` values and `b` `2 · TILE · depth`.
pub(super) unsafe fn block(
    a: *const u16,
    b: *const u16,
    depth: usize,
    steps: Range<usize>,
    out: &mut [f32],
    add: bool,
) {
    // A step's two tiles: 32 rows of 32 values, 1 kB each, side by side.
    let a_tiles = |step: usize| {
        let upper = a.wrapping_add(step * BLOCK * K_STEP);
        [upper, upper.wrapping_add(TILE * K_STEP)]
    };
    // SAFETY: the packed tiles are those the caller promises.
    unsafe { block_in_place(a_tiles, K_STEP * 2, b, depth, steps, (out, BLOCK), add) }
}

/// [`block`] with `A`'s tiles read where they lie rather than packed: `a_tiles(step)` gives the
/// first row of the block's upper and lower 16-row tiles at step `step`, rows `a_stride` bytes
/// apart (a padded bf16 image's pixels, 32 channels a tile row); `out` is the block's first
/// row and the f32 values from one row to the next (32 in a block of its own).
///
/// # Safety
/// As [`block`]; each tile `a_tiles` gives holds 16 rows of 64 readable bytes, `a_stride` apart.
pub(super) unsafe fn block_in_place(
    a_tiles: impl Fn(usize) -> [*const u16; 2],
    a_stride: usize,
    b: *const u16,
    depth: usize,
    steps: Range<usize>,
    (out, row_stride): (&mut [f32], usize),
    add: bool,
) {
    debug_assert!(row_stride >= BLOCK && out.len() >= (BLOCK - 1) * row_stride + BLOCK);
    debug_assert!(depth.is_multiple_of(K_STEP));
    let right_b = b.wrapping_add(TILE * depth);
    let out_stride = row_stride * 4;
    let out = out.as_mut_ptr();
    let [c0, c1, c2, c3] =
        [0, TILE, TILE * row_stride, TILE * row_stride + TILE].map(|at| out.wrapping_add(at));
    // SAFETY (every statement): as in `block`, the tiles of `A` as the caller promises.
    unsafe {
        if add {
            asm!(
                "tileloadd tmm0, [{c0} + {stride}*1]",
                "tileloadd tmm1, [{c1} + {stride}*1]",
                "tileloadd tmm2, [{c2} + {stride}*1]",
                "tileloadd tmm3, [{c3} + {stride}*1]",
                c0 = in(reg) c0,
                c1 = in(reg) c1,
                c2 = in(reg) c2,
                c3 = in(reg) c3,
                stride = in(reg) out_stride,
                options(nostack, readonly),
            );
        } else {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            );
        }
        for step in steps {
            let [upper, lower] = a_tiles(step);
            let b_offset = step * K_STEP * TILE;
            asm!(
                "tileloadd tmm4, [{upper} + {stride}*1]",
                "tileloadd tmm6, [{left} + {sixty_four}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tileloadd tmm7, [{right} + {sixty_four}*1]",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tileloadd tmm5, [{lower} + {stride}*1]",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                upper = in(reg) upper,
                lower = in(reg) lower,
                left = in(reg) b.add(b_offset),
                right = in(reg) right_b.add(b_offset),
                stride = in(reg) a_stride,
                sixty_four = in(reg) 64usize,
                options(nostack, readonly),
            );
        }
        asm!(
            "tilestored [{c0} + {stride}*1], tmm0",
            "tilestored [{c1} + {stride}*1], tmm1",
            "tilestored [{c2} + {stride}*1], tmm2",
            "tilestored [{c3} + {stride}*1], tmm3",
            c0 = in(reg) c0,
            c1 = in(reg) c1,
            c2 = in(reg) c2,
            c3 = in(reg) c3,
            stride = in(reg) out_stride,
            options(nostack),
        );
    }
}

/// FLOP of one step of [`resident_products`]: four 16 × 16 × 32 multiply-adds.
pub(super) const RESIDENT_FLOP_PER_STEP: f64 = 4.0 * 16.0 * 16.0 * 32.0 * 2.0;

/// `steps` times four `tdpbf16ps` on tiles already in registers, no memory traffic: the
/// engine's own rate, what a product's rate is read against.
///
/// # Safety
/// [`configure`] ran on this thread.
pub(super) unsafe fn resident_products(steps: usize) {
    // SAFETY: tile-register operations only.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "tilezero tmm4",
            "tilezero tmm5",
            "tilezero tmm6",
            "tilezero tmm7",
            options(nostack, nomem),
        );
        for _ in 0..steps {
            asm!(
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                options(nostack, nomem),
            );
        }
    }
}
