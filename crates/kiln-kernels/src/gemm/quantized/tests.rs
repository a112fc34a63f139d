//! Each stored type's product against the same product on the dequantized weights (kiln-core's
//! dequantization, bit for bit the `gguf` package's) and the dequantized activations, in f64:
//! equal to within the f32 accumulation's rounding.

use half::{bf16, f16};
use kiln_core::gguf::GgmlType;
use proptest::prelude::*;

use super::*;

/// The byte offsets of each block's f16 scale and minimum.
fn half_fields(kind: GgmlType) -> &'static [usize] {
    match kind {
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => &[0],
    }
}

/// Random blocks of `kind` for `rows` rows of `columns` values, every f16 field a finite value
/// of either sign, so every bit pattern of the integers and scales is reached (for the
/// [`HALVES`], every value finite).
fn random_matrix(kind: GgmlType, rows: usize, columns: usize, seed: u64) -> QuantMatrix {
    let (per_block, block_bytes) = kind.block();
    let blocks = rows * columns / per_block;
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut bytes: Vec<u8> = (0..blocks * block_bytes).map(|_| next() as u8).collect();
    for block in bytes.chunks_exact_mut(block_bytes) {
        for &at in half_fields(kind) {
            let unit = (next() % 2001) as f32 / 1000.0 - 1.0;
            let value = match kind {
                GgmlType::BF16 => bf16::from_f32(unit * 0.05).to_bits(),
                _ => f16::from_f32(unit * 0.05).to_bits(),
            };
            let value = value.to_le_bytes();
            block[at..at + 2].copy_from_slice(&value);
        }
    }
    QuantMatrix::new(kind, rows, columns, bytes).expect("whole blocks")
}

fn random_rows(rows: usize, columns: usize, seed: u64) -> Vec<f32> {
    let mut state = seed ^ 0xD1B5_4A32_D192_ED03;
    (0..rows * columns)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
        })
        .collect()
}

/// The activations the products with `w` read: the rows as given for the halves, else the
/// quantized rows' values.
fn activations(w: &QuantMatrix, x: &QuantizedRows) -> Vec<f32> {
    if HALVES.contains(&w.kind()) {
        return x.floats.clone();
    }
    if w.kind().block().0 == SUPER_BLOCK {
        let blocks = x.super_blocks();
        let steps = blocks.values.chunks_exact(SUPER_BLOCK).zip(&blocks.scales);
        return steps
            .flat_map(|(q, &d)| q.iter().map(move |&q| f32::from(q) * d))
            .collect();
    }
    x.dequantize()
}

/// `x Wᵀ` in f64 from the dequantized values, with the bound on f32 accumulation's error: the
/// kernels sum `a · q` and the offset `b` apart (each as large as the row's largest weight, and
/// cancelling in `a · q + b`), so a few ulps of `Σ |x| · max |w|`.
fn reference(w: &QuantMatrix, inputs: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let weights = w.dequantize();
    let columns = w.columns();
    let mut values = Vec::new();
    let mut bounds = Vec::new();
    for xi in inputs.chunks_exact(columns) {
        let magnitude: f64 = xi.iter().map(|&a| f64::from(a).abs()).sum();
        for wr in weights.chunks_exact(columns) {
            let largest = wr.iter().fold(0f64, |m, &b| m.max(f64::from(b).abs()));
            let pairs = xi
                .iter()
                .zip(wr)
                .map(|(&a, &b)| f64::from(a) * f64::from(b));
            values.push(pairs.sum());
            bounds.push(magnitude * largest * 1e-5 + 1e-9);
        }
    }
    (values, bounds)
}

fn check(kind: GgmlType, rows: usize, outputs: usize, blocks: usize, seed: u64) {
    // The halves' rows of any length: whole 16-value steps and a tail.
    let columns = match HALVES.contains(&kind) {
        true => blocks * 19,
        false => blocks * kind.block().0,
    };
    let w = random_matrix(kind, outputs, columns, seed);
    let x = QuantizedRows::new(&random_rows(rows, columns, seed), columns);
    let (want, bounds) = reference(&w, &activations(&w, &x));
    for kernel in kernels() {
        let mut sums = vec![0f32; 4 * outputs];
        let mut got = vec![0f32; rows * outputs];
        for start in (0..rows).step_by(4) {
            let tile = start..(start + 4).min(rows);
            kernel.run(&w, 0..outputs, &x, tile.clone(), &mut sums);
            for (t, i) in tile.enumerate() {
                got[i * outputs..][..outputs].copy_from_slice(&sums[t * outputs..][..outputs]);
            }
        }
        for (at, ((&got, &want), &bound)) in got.iter().zip(&want).zip(&bounds).enumerate() {
            assert!(
                (f64::from(got) - want).abs() <= bound,
                "{} on {kernel:?}: [{}, {}] = {got}, not {want} (± {bound})",
                kind.name(),
                at / outputs,
                at % outputs
            );
        }
    }
}

fn kernels() -> Vec<Kernel> {
    let mut kernels = vec![Kernel::Scalar];
    #[cfg(target_arch = "x86_64")]
    if avx2::supported() {
        kernels.push(Kernel::Avx2);
    }
    kernels
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Every stored type and half type, one row (decoding) to several tiles of rows (a prompt).
    #[test]
    fn each_type_multiplies_as_its_dequantized_values(
        kind in proptest::sample::select([STORED.as_slice(), &HALVES].concat()),
        rows in 1usize..10,
        outputs in 1usize..20,
        blocks in 1usize..4,
        seed in any::<u64>(),
    ) {
        check(kind, rows, outputs, blocks, seed);
    }
}

/// Decoding (one row of x) multiplies eight weight rows at a time where it can: every type
/// over two groups of eight rows and three more, each row's sum in its place.
#[test]
fn one_row_reads_weights_eight_rows_at_a_time() {
    for kind in STORED.into_iter().chain(HALVES) {
        check(kind, 1, 19, 3, 17);
    }
}

/// What [`prompt_product`] multiplies: the rows as given for the halves (the f32 product on
/// decoded panels), else the rows quantized per 32 values, the k-quants' too (on AVX2, the
/// byte products on panels; elsewhere as given).
fn prompt_activations(w: &QuantMatrix, x: &QuantizedRows) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if avx2::supported() && STORED.contains(&w.kind()) {
        return x.dequantize();
    }
    let _ = w;
    x.floats.clone()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A prompt's rows against every type, in whole panels of eight weight rows and a last
    /// panel of fewer, each sum in its place.
    #[test]
    fn prompts_multiply_as_their_dequantized_values(
        kind in proptest::sample::select([STORED.as_slice(), &HALVES].concat()),
        rows in 1usize..11,
        outputs in 1usize..27,
        blocks in 1usize..3,
        seed in any::<u64>(),
    ) {
        let columns = blocks * kind.block().0.max(GROUP);
        let w = random_matrix(kind, outputs, columns, seed);
        let x = QuantizedRows::new(&random_rows(rows, columns, seed), columns);
        let (want, bounds) = reference(&w, &prompt_activations(&w, &x));
        let mut got = vec![0f32; rows * outputs];
        prompt_product(&mut got, outputs, &x, &[&w], Write::Overwrite);
        for (at, ((&got, &want), &bound)) in got.iter().zip(&want).zip(&bounds).enumerate() {
            prop_assert!(
                (f64::from(got) - want).abs() <= bound,
                "{}: [{}, {}] = {got}, not {want} (± {bound})",
                kind.name(),
                at / outputs,
                at % outputs
            );
        }
    }
}

/// The threaded products write each output where it belongs (a second matrix's after the
/// first's), over or onto what `out` held, and leave the columns past them: the byte products
/// (a few rows) and the prompts' products (many rows: panels in bytes, or decoded to f32).
#[test]
fn products_land_in_their_columns_and_add_when_told() {
    for (kind, rows, prompt) in [
        (GgmlType::Q4_K, 5, false),
        (GgmlType::Q4_K, 37, true),
        (GgmlType::BF16, 20, true),
        (GgmlType::Q8_0, 16, true),
    ] {
        let (outputs, columns, width, first) = (300, 256, 310, 7);
        let w = random_matrix(kind, outputs, columns, 3);
        let x = QuantizedRows::new(&random_rows(rows, columns, 3), columns);
        let inputs = match prompt {
            true => prompt_activations(&w, &x),
            false => activations(&w, &x),
        };
        let (want, bounds) = reference(&w, &inputs);
        // `first` columns of another matrix before this one's.
        let before = random_matrix(GgmlType::Q8_0, first, columns, 4);
        let mut out = vec![1.0f32; rows * width];
        for write in [Write::Overwrite, Write::Add] {
            match prompt {
                true => prompt_product(&mut out, width, &x, &[&before, &w], write),
                false => product(&mut out, width, &x, &[&before, &w], write),
            }
        }
        for i in 0..rows {
            for c in 0..width {
                let got = f64::from(out[i * width + c]);
                match c.checked_sub(first).filter(|&r| r < outputs) {
                    None if c < first => {}
                    None => assert_eq!(got, 1.0, "{}: [{i}, {c}] untouched", kind.name()),
                    Some(r) => {
                        let at = i * outputs + r;
                        assert!(
                            (got - 2.0 * want[at]).abs() <= 2.0 * bounds[at],
                            "{} ({rows} rows): [{i}, {c}] = {got}, not {}",
                            kind.name(),
                            2.0 * want[at]
                        );
                    }
                }
            }
        }
    }
}

/// AVX2's quantization of the activations gives plain Rust's bits, ties (values half-way
/// between two steps) and a block of zeros included.
#[cfg(target_arch = "x86_64")]
#[test]
fn activations_quantize_alike_on_avx2() {
    if !avx2::supported() {
        eprintln!("SKIPPED (no avx2)");
        return;
    }
    let mut x = random_rows(3, 256, 5);
    // Block 1: the largest 127, so that k + 0.5 are ties.
    x[32] = 127.0;
    for (k, v) in x[33..64].iter_mut().enumerate() {
        *v = k as f32 - 15.5;
    }
    x[64..96].fill(0.0);
    for block in x.chunks_exact(GROUP).chain(x.chunks_exact(SUPER_BLOCK)) {
        let (mut fast, mut portable) = (vec![0i8; block.len()], vec![0i8; block.len()]);
        // SAFETY: the CPU has AVX2 (checked above).
        #[allow(unsafe_code)]
        let d = unsafe { avx2::quantize_block(block, &mut fast) };
        assert_eq!(d, quantize_block_portably(block, &mut portable));
        assert_eq!(fast, portable);
    }
}

/// The activations' quantization is llama.cpp's `q8_0` (and per super-block its `q8_K`): each
/// value within half a step of its block's scale, the largest magnitude exactly ±127 steps, a
/// block of zeros all zero; the super-blocks' 16-value sums are their values' sums.
#[test]
fn activations_round_to_their_blocks_steps() {
    let mut x = random_rows(2, 512, 9);
    x[32..64].fill(0.0);
    let q = QuantizedRows::new(&x, 512);
    let super_blocks = q.super_blocks();
    for (b, (values, sums)) in (super_blocks.values.chunks(SUPER_BLOCK))
        .zip(&super_blocks.sums)
        .enumerate()
    {
        let d = super_blocks.scales[b];
        let largest = x[b * SUPER_BLOCK..][..SUPER_BLOCK]
            .iter()
            .fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(d, largest / 127.0);
        for (run, &sum) in values.chunks(16).zip(sums) {
            assert_eq!(run.iter().map(|&v| i16::from(v)).sum::<i16>(), sum);
        }
        for (j, &v) in values.iter().enumerate() {
            let value = x[b * SUPER_BLOCK + j];
            assert!((value - f32::from(v) * d).abs() <= d / 2.0 * 1.0001);
        }
    }
    let back = q.dequantize();
    for (block, (x, back)) in x.chunks(32).zip(back.chunks(32)).enumerate() {
        let d = q.blocks().scales[block];
        let largest = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(d, largest / 127.0);
        for (x, back) in x.iter().zip(back) {
            assert!(
                (x - back).abs() <= d / 2.0 * 1.0001,
                "block {block}: {x} → {back}"
            );
        }
    }
    assert!(back[32..64].iter().all(|&v| v == 0.0));
}

/// A reordered matrix holds the rows it was told, and dequantizes as the `gguf` package does.
#[test]
fn reordered_rows_are_the_rows_named() {
    let w = random_matrix(GgmlType::Q6_K, 3, 256, 5);
    let all = w.dequantize();
    let moved = w.with_rows_from(&[2, 0, 1]);
    let mut row = vec![0.0; 256];
    for (i, source) in [2, 0, 1].into_iter().enumerate() {
        moved.dequantize_row_into(i, &mut row);
        assert_eq!(row, all[source * 256..][..256]);
    }
    let rounded = QuantMatrix::bf16(1, 3, &[1.0, 1.0 + 1.0 / 256.0, -3.0e-3]);
    let mut row = vec![0.0; 3];
    rounded.dequantize_row_into(0, &mut row);
    // 1 + 2⁻⁸ is halfway between bf16's 1 and 1 + 2⁻⁷: to the even one.
    assert_eq!(row, [1.0, 1.0, bf16::from_f32(-3.0e-3).to_f32()]);
    let refused = QuantMatrix::new(GgmlType::Q2_K, 1, 256, vec![0; 84]).unwrap_err();
    assert!(
        refused.contains("Q2_K weights are not multiplied as stored"),
        "{refused}"
    );
}

/// Rows decoded for the f32 product (on AVX2 `a · q + b` with one rounding) are the `gguf`
/// package's values to within an ulp or two of the larger of `a · q` and `b`.
#[test]
fn decoded_rows_are_the_packages_values() {
    // The 16-bit types exactly, rows of any length (8-value steps and a tail).
    for kind in HALVES {
        let w = random_matrix(kind, 2, 19, 5);
        let mut got = vec![0.0; 2 * 19];
        w.dequantize_rows_into(0..2, &mut got);
        assert_eq!(got, w.dequantize(), "{}", kind.name());
    }
    for kind in STORED.into_iter().chain(HALVES) {
        let w = random_matrix(kind, 3, 512, 11);
        let want = w.dequantize();
        let mut got = vec![0.0; 2 * 512];
        w.dequantize_rows_into(1..3, &mut got);
        let want = &want[512..];
        for (at, (&got, &value)) in got.iter().zip(want).enumerate() {
            let group = &want[at / GROUP * GROUP..][..GROUP];
            // `a · q` and `b` are each at most twice the group's largest value.
            let largest = 2.0 * group.iter().fold(0f32, |m, v| m.max(v.abs()));
            let want = value;
            assert!(
                (got - want).abs() <= largest * f32::EPSILON * 2.0,
                "{} [{}]: {got} vs {want}",
                kind.name(),
                at
            );
        }
    }
}
