//! kiln-mc's statistics against independent computations: Welford and Chan's merge against a
//! two-pass f64 computation, and the nested statistics of an iid synthetic pass generator
//! against what theory says they must be.

use kiln_mc::{EmbeddingStats, NestedStats};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

/// Relative difference, against the larger magnitude.
fn close(a: f64, b: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs()).max(f64::MIN_POSITIVE)
}

#[test]
fn welford_and_merge_equal_two_pass_statistics() {
    let (images, dims) = (7, 5);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    // Passes arrive in batches of varying images (some twice in a batch), split over 3 shards.
    // Values about 90 standard deviations from 0, where Σx² − n·x̄² would lose 4 digits.
    let mut shards = vec![EmbeddingStats::new(images, dims); 3];
    let mut seen: Vec<Vec<Vec<f64>>> = vec![Vec::new(); images];
    for batch in 0..60 {
        let items: Vec<usize> = (0..rng.random_range(1..10))
            .map(|_| rng.random_range(0..images))
            .collect();
        let rows: Vec<f32> = (0..items.len() * dims)
            .map(|_| 50.0 + rng.random_range(-1.0..1.0f32))
            .collect();
        shards[batch % 3].add_pass(&items, &rows).unwrap();
        for (&image, row) in items.iter().zip(rows.chunks(dims)) {
            seen[image].push(row.iter().map(|&v| f64::from(v)).collect());
        }
    }
    let mut total = shards[0].clone();
    total.merge(&shards[1]).unwrap();
    total.merge(&shards[2]).unwrap();
    for (image, rows) in seen.iter().enumerate() {
        assert_eq!(total.count(image), rows.len() as u64);
        let n = rows.len() as f64;
        for d in 0..dims {
            let mean = rows.iter().map(|r| r[d]).sum::<f64>() / n;
            let variance = rows.iter().map(|r| (r[d] - mean).powi(2)).sum::<f64>() / (n - 1.0);
            assert!(
                close(total.mean(image)[d], mean) < 1e-12,
                "mean {image} {d}"
            );
            assert!(
                close(total.variance(image)[d], variance) < 1e-12,
                "variance {image} {d}"
            );
        }
    }
}

/// K trials of T iid passes per image, N(μ_image,dim, σ²) each: the between-trial variance of
/// the T-pass mean is dims · σ² / T, the uncertainty score dims · σ², and the ranking of images
/// whose true spreads differ is stable.
#[test]
fn iid_passes_give_the_theoretical_nested_statistics() {
    let (images, dims, trials, sigma) = (200, 8, 12, 0.5);
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let centres: Vec<f64> = (0..images * dims)
        .map(|_| rng.random_range(-3.0..3.0))
        .collect();
    let nested = |passes: usize, spread: &dyn Fn(usize) -> f64, rng: &mut ChaCha8Rng| {
        let runs: Vec<EmbeddingStats> = (0..trials)
            .map(|_| {
                let mut stats = EmbeddingStats::new(images, dims);
                let items: Vec<usize> = (0..images).collect();
                for _ in 0..passes {
                    let rows: Vec<f32> = (0..images * dims)
                        .map(|i| {
                            let noise = Normal::new(0.0, spread(i / dims)).unwrap();
                            (centres[i] + noise.sample(rng)) as f32
                        })
                        .collect();
                    stats.add_pass(&items, &rows).unwrap();
                }
                stats
            })
            .collect();
        NestedStats::new(&runs).unwrap()
    };
    let mut scaled = Vec::new();
    for passes in [4, 16, 64] {
        let stats = nested(passes, &|_| sigma, &mut rng);
        let expected = dims as f64 * sigma * sigma / passes as f64;
        // The estimate averages images · dims variances of `trials` samples each: relative
        // standard error √(2 / (trials − 1)) / √(images · dims) ≈ 1%; 6% is six of them.
        assert!(
            close(stats.mean_variance, expected) < 0.06,
            "T={passes}: {stats:?}"
        );
        assert!(
            close(stats.uncertainty, dims as f64 * sigma * sigma) < 0.06,
            "T={passes}"
        );
        scaled.push(stats.mean_variance * passes as f64);
    }
    // 1/T: the scaled figures agree with each other.
    assert!(close(scaled[0], scaled[2]) < 0.08, "{scaled:?}");
    // Images with spreads from 0.1 to 2.0 are ranked alike by every trial...
    let ranked = nested(
        32,
        &|image| 0.1 + 1.9 * image as f64 / images as f64,
        &mut rng,
    );
    assert!(ranked.rank_stability > 0.95, "{ranked:?}");
    // ...while equal spreads give rankings that are noise.
    let unranked = nested(32, &|_| sigma, &mut rng);
    assert!(unranked.rank_stability.abs() < 0.15, "{unranked:?}");
}

#[test]
fn identical_passes_have_zero_variance() {
    let mut stats = EmbeddingStats::new(3, 4);
    let rows: Vec<f32> = (0..12).map(|i| i as f32 * 0.25).collect();
    for _ in 0..5 {
        stats.add_pass(&[0, 1, 2], &rows).unwrap();
    }
    assert!(stats.variances().iter().all(|&v| v == 0.0));
    let nested = NestedStats::new(&[stats.clone(), stats]).unwrap();
    assert_eq!(
        (
            nested.mean_variance,
            nested.uncertainty,
            nested.uncertainty_spread
        ),
        (0.0, 0.0, 0.0)
    );
    assert!(nested.rank_stability.is_nan());
}
