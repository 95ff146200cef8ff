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

#[test]
fn a_json_schema_file_compiles_against_the_model_tokenizer() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let model = Model::load(&root.join("tests/fixtures/tiny-qwen3")).expect("fixture");
    let schema = root.join("scripts/bench-notes-schema.json");
    let compiled = compile_schema(&model, &schema).expect("the benchmark's schema compiles");
    assert_eq!(compiled.kind(), ConstraintKind::JsonSchema);
    // The first mask allows only the object's opening.
    let mask = compiled.start().mask().expect("a mask");
    let open = model.tokenizer.token_to_id("{").expect("a `{` token");
    assert!(crate::constrain::is_allowed(&mask, open));
    let letter = model.tokenizer.token_to_id("a").expect("an `a` token");
    assert!(!crate::constrain::is_allowed(&mask, letter));

    let not_json = std::env::temp_dir().join(format!("bench-schema-{}.txt", std::process::id()));
    std::fs::write(&not_json, "notes: many").expect("write");
    let err = compile_schema(&model, &not_json).expect_err("not JSON");
    std::fs::remove_file(&not_json).ok();
    assert!(format!("{err:#}").contains("is not JSON"), "{err:#}");
}
