use super::*;

#[test]
fn percentiles_pick_ranked_values() {
    let p = Percentiles::of(&(1..=100).map(|i| i as f64 / 1e3).collect::<Vec<_>>());
    assert!(
        (p.p50 - 51.0).abs() < 1e-9 || (p.p50 - 50.0).abs() < 1e-9,
        "{p:?}"
    );
    assert!((p.p99 - 99.0).abs() < 1.01, "{p:?}");
    assert!((p.mean - 50.5).abs() < 1e-9);
    assert_eq!(Percentiles::of(&[]).p90, 0.0);
}

#[test]
fn own_cpu_time_is_readable() {
    let cpu = cpu_seconds(None).expect("/proc/self/stat");
    assert!(cpu >= 0.0);
}

#[test]
fn temperature_takes_the_api_range() {
    assert_eq!(temperature("1"), Ok(1.0));
    assert_eq!(temperature("0"), Ok(0.0));
    for bad in ["-0.1", "2.5", "NaN", "warm"] {
        assert!(temperature(bad).is_err(), "{bad}");
    }
}

#[test]
fn batch_size_sets_concurrency_and_count() {
    let load = LoadArgs {
        input_len: 8,
        output_len: 8,
        concurrency: None,
        batch_size: Some(16),
        num_prompts: None,
        ignore_eos: true,
        seed: 0,
        temperature: 0.0,
        json: None,
    };
    assert_eq!((load.concurrency(), load.num_prompts()), (16, 16));
    let prompts = random_prompts(&load, 128_256);
    assert_eq!(prompts.len(), 16);
    assert!(prompts.iter().all(|p| p.len() == 8));
}
