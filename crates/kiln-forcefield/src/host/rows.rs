//! Element-wise operations on rows of features, shared by the host kernel's passes: each a
//! function of its own, so that its `&mut` output provably does not alias its inputs and the
//! compiler vectorises the loop (written inline in a pair loop over a dozen rows of different
//! buffers, such loops stayed scalar: 490 against 140 core-ms of a training step's pair loops).
//! Sums of products are `mul_add`s: one fused instruction where `pulp` compiles for FMA (Rust
//! never contracts `a * b + c` by itself).

use super::Real;

/// The three `[f]` parts of a `[3f]` row (q, μ_R, μ_μ: schnetpack's split order), each of
/// length exactly `f` (which lets the loops over them drop bounds checks and vectorise).
#[inline(always)]
pub(super) fn thirds<T>(row: &[T], f: usize) -> (&[T], &[T], &[T]) {
    (&row[..f], &row[f..2 * f], &row[2 * f..3 * f])
}

/// [`thirds`] of a mutable row.
#[inline(always)]
pub(super) fn thirds_mut<T>(row: &mut [T], f: usize) -> (&mut [T], &mut [T], &mut [T]) {
    let (first, rest) = row[..3 * f].split_at_mut(f);
    let (second, third) = rest.split_at_mut(f);
    (first, second, third)
}

/// `Σ a b`, in eight independent partial sums (which the compiler keeps in one vector register).
#[inline(always)]
pub(super) fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    let (a8, a_rest) = a.as_chunks::<8>();
    let (b8, b_rest) = b.as_chunks::<8>();
    let mut sums = [T::zero(); 8];
    for (a, b) in a8.iter().zip(b8) {
        for k in 0..8 {
            sums[k] = a[k].mul_add(b[k], sums[k]);
        }
    }
    let rest = a_rest
        .iter()
        .zip(b_rest)
        .fold(T::zero(), |s, (&a, &b)| s + a * b);
    sums.iter().fold(rest, |s, &v| s + v)
}

#[inline(always)]
pub(super) fn sigmoid<T: Real>(z: T) -> T {
    T::one() / (T::one() + (-z).vexp())
}

#[inline(always)]
pub(super) fn silu<T: Real>(z: &[T]) -> Vec<T> {
    z.iter().map(|&z| z * sigmoid(z)).collect()
}

/// `g ⊙ silu'(z)`, in place on `g`.
#[inline(always)]
pub(super) fn silu_backward<T: Real>(g: &mut [T], z: &[T]) {
    for (g, &z) in g.iter_mut().zip(z) {
        let s = sigmoid(z);
        *g = *g * s * (T::one() + z * (T::one() - s));
    }
}

/// `a += b`.
#[inline(always)]
pub(super) fn add<T: Real>(a: &mut [T], b: &[T]) {
    a.iter_mut().zip(b).for_each(|(a, &b)| *a += b);
}

/// `out = a ⊙ b`.
#[inline(always)]
pub(super) fn product_of<T: Real>(out: &mut [T], a: &[T], b: &[T]) {
    for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
        *o = a * b;
    }
}

/// `out = a ⊘ b`.
#[inline(always)]
pub(super) fn quotient_of<T: Real>(out: &mut [T], a: &[T], b: &[T]) {
    for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
        *o = a / b;
    }
}

/// `out += a ⊙ b`.
#[inline(always)]
pub(super) fn mul_add<T: Real>(out: &mut [T], a: &[T], b: &[T]) {
    for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
        *o = a.mul_add(b, *o);
    }
}

/// `out += a ⊙ b + c ⊙ d`.
#[inline(always)]
pub(super) fn mul_add2<T: Real>(out: &mut [T], a: &[T], b: &[T], c: &[T], d: &[T]) {
    for ((((o, &a), &b), &c), &d) in out.iter_mut().zip(a).zip(b).zip(c).zip(d) {
        *o = c.mul_add(d, a.mul_add(b, *o));
    }
}

/// `out += s a`.
#[inline(always)]
pub(super) fn scaled_add<T: Real>(out: &mut [T], a: &[T], s: T) {
    for (o, &a) in out.iter_mut().zip(a) {
        *o = s.mul_add(a, *o);
    }
}
