//! Scalar functions written to vectorise (no branches, no libm calls) for kiln's host kernels:
//! e^x, erf and the activations built on them. Accurate to a few f32 ulps (e^x) and 1.5e-7
//! absolute (erf); kiln-vision's host tests check them against f64 references.

/// eˣ: `x = n·ln 2 + r` with `|r| ≤ ln 2 / 2`, a degree-6 Taylor polynomial for eʳ, and 2ⁿ
/// written into the exponent bits. Inputs are clamped to where 2ⁿ stays a normal f32.
///
/// Every step vectorises: the clamp is two selects (`f32::clamp`'s NaN rule made the compiler
/// compare lane by lane) and `n` is read from the bits of the rounded sum rather than converted
/// (a saturating float-to-int cast does not vectorise either).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n · LN2_HI is exact for the n that occur.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding 1.5 · 2²³ rounds to the nearest integer without a rounding instruction (baseline
    // x86-64 has none that vectorises) and leaves that integer in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let x = if x < -87.0 { -87.0 } else { x };
    let x = if x > 88.0 { 88.0 } else { x };
    let shifted = x * LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // n + 127 in the exponent field: |n| ≤ 127, so the wrapping difference is n's two's complement.
    let biased = shifted
        .to_bits()
        .wrapping_sub(ROUND.to_bits())
        .wrapping_add(127);
    p * f32::from_bits(biased << 23)
}

/// `x · σ(x)` (SiLU, swish).
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// tanh x: near 0 (|x| < ¼) its odd Taylor polynomial to x⁹, elsewhere `(1 − e) / (1 + e)` with
/// `e = e^(−2|x|)`, the sign restored; both are computed and one selected, so it vectorises.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs();
    let e = exp(-2.0 * a);
    let far = (1.0 - e) / (1.0 + e);
    let a2 = a * a;
    let near = a
        * (1.0
            + a2 * (-1.0 / 3.0 + a2 * (2.0 / 15.0 + a2 * (-17.0 / 315.0 + a2 * (62.0 / 2835.0)))));
    let t = if a < 0.25 { near } else { far };
    t.copysign(x)
}

/// `x · σ(1.702 x)` (CLIP's quick GELU).
#[inline(always)]
pub fn quick_gelu(x: f32) -> f32 {
    x / (1.0 + exp(-1.702 * x))
}

/// `½x(1 + tanh(√(2/π)(x + 0.044715 x³)))`, written as `x · σ(2·√(2/π)(x + 0.044715 x³))`.
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    const TWO_SQRT_2_OVER_PI: f32 = 1.595_769;
    x / (1.0 + exp(-TWO_SQRT_2_OVER_PI * x * (1.0 + 0.044_715 * x * x)))
}

/// `½x(1 + erf(x/√2))`, the exact GELU.
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// erf through Abramowitz & Stegun 7.1.26 on |x|, sign restored.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    erf_given_gaussian(x, exp(-x * x))
}

/// [`erf`] of `x` given `e^(−x²)`, for callers that need that value too.
#[inline(always)]
fn erf_given_gaussian(x: f32, gaussian: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152_1 + t * 1.061_405_4))));
    (1.0 - poly * gaussian).copysign(x)
}

/// The exact GELU's derivative, `Φ(x) + x·φ(x)`: `½(1 + erf(x/√2)) + x·e^(−x²/2)/√(2π)`, one
/// `e^(−x²/2)` serving both terms.
#[inline(always)]
pub fn gelu_derivative(x: f32) -> f32 {
    const INV_SQRT_2PI: f32 = 0.398_942_3;
    let scaled = x * std::f32::consts::FRAC_1_SQRT_2;
    let gaussian = exp(-scaled * scaled);
    0.5 * (1.0 + erf_given_gaussian(scaled, gaussian)) + x * INV_SQRT_2PI * gaussian
}
