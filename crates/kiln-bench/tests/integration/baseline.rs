//! Baseline files and comparisons.

use kiln_bench::{
    BaselineStore, BenchError, BenchResult, Comparison, Environment, Peaks, Setting, SuiteRun,
    Timings, Verdict, Work,
};

fn result(name: &str, median: f64, spread: f64) -> BenchResult {
    let setting = Setting {
        backend: "flex".into(),
        device: "cpu".into(),
        dtype: "f32".into(),
    };
    // 41 samples spread evenly over median·(1 ± spread).
    let samples = (0..41)
        .map(|i| median * (1.0 + spread * (i as f64 - 20.0) / 20.0))
        .collect();
    let timings = Timings {
        cold: median * 10.0,
        samples,
        peak_host_bytes: Some(1 << 20),
        device_bytes: None,
    };
    let peaks = Peaks {
        flop_per_s: 1e11,
        bytes_per_s: 1e10,
        bf16_flop_per_s: None,
    };
    BenchResult::new(
        name.into(),
        &setting,
        Work::items(2).with_flops(1e9),
        timings,
        Some(&peaks),
    )
    .unwrap()
}

fn run(results: Vec<BenchResult>) -> SuiteRun {
    SuiteRun {
        environment: Environment::current(),
        peaks: None,
        results,
    }
}

#[test]
fn a_saved_baseline_loads_back_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let store = BaselineStore::new(dir.path().join("baselines"));
    let original = run(vec![
        result("gemm", 0.01, 0.02),
        result("attention", 0.5, 0.1),
    ]);
    let path = store.save("main", &original).unwrap();
    assert_eq!(path, dir.path().join("baselines/main.json"));
    assert_eq!(store.load("main").unwrap(), original);

    // Saving again replaces it; the temporary file does not linger or count as a baseline.
    let replaced = run(vec![result("gemm", 0.02, 0.02)]);
    store.save("main", &replaced).unwrap();
    store.save("other", &replaced).unwrap();
    assert_eq!(store.load("main").unwrap(), replaced);
    assert_eq!(store.names(), ["main", "other"]);
}

#[test]
fn missing_bad_and_corrupt_baselines_are_explained() {
    let dir = tempfile::tempdir().unwrap();
    let store = BaselineStore::new(dir.path());
    store.save("main", &run(vec![])).unwrap();
    let err = store.load("nightly").unwrap_err().to_string();
    assert!(
        err.contains("no baseline `nightly`") && err.contains("saved: main"),
        "{err}"
    );
    assert!(matches!(
        store.save("../escape", &run(vec![])),
        Err(BenchError::BadName(_))
    ));
    std::fs::write(dir.path().join("broken.json"), "{ not json").unwrap();
    let err = store.load("broken").unwrap_err().to_string();
    assert!(err.contains("is not a kiln-bench baseline"), "{err}");
}

#[test]
fn verdicts_weigh_the_change_against_threshold_and_noise() {
    let old = run(vec![
        result("same", 0.010, 0.01),
        result("slower", 0.010, 0.01),
        result("slightly-slower", 0.010, 0.01),
        result("noisy-slower", 0.010, 0.9),
        result("faster", 0.010, 0.01),
        result("gone", 0.010, 0.01),
    ]);
    let new = run(vec![
        result("same", 0.010, 0.01),
        result("slower", 0.011, 0.01),
        result("slightly-slower", 0.0103, 0.01),
        result("noisy-slower", 0.011, 0.9),
        result("faster", 0.008, 0.01),
        result("added", 0.010, 0.01),
    ]);
    let comparison = Comparison::new("main", &old, &new, 0.05);
    let verdict = |name: &str| {
        comparison
            .rows
            .iter()
            .find(|r| r.result.name == name)
            .unwrap()
            .verdict
    };
    assert_eq!(verdict("same"), Verdict::Unchanged);
    assert_eq!(verdict("slower"), Verdict::Regressed);
    assert_eq!(verdict("slightly-slower"), Verdict::Unchanged);
    assert_eq!(verdict("noisy-slower"), Verdict::Unchanged);
    assert_eq!(verdict("faster"), Verdict::Improved);
    assert_eq!(verdict("added"), Verdict::New);
    assert_eq!(verdict("gone"), Verdict::Missing);
    assert!(comparison.regressed());
    let slower = comparison
        .rows
        .iter()
        .find(|r| r.result.name == "slower")
        .unwrap();
    assert!((slower.change.unwrap() - 0.1).abs() < 1e-12);

    let table = comparison.to_string();
    let header = table.lines().next().unwrap();
    assert_eq!(
        header,
        "| benchmark | backend | device | dtype | median | p90 | throughput | change | verdict |"
    );
    assert!(
        table.contains("| slower | flex | cpu | f32 | 11.000 ms |"),
        "{table}"
    );
    assert!(
        table.contains("+10.0% ±") && table.contains("REGRESSED"),
        "{table}"
    );
    assert!(table.contains("1 regression(s)"), "{table}");
    assert!(!Comparison::new("main", &old, &old, 0.05).regressed());
}
