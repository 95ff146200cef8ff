//! `inferno bench offline` end to end, through the built binary, on the CPU backend and the
//! embedded test model.

use std::path::Path;
use std::process::Command;

#[test]
fn offline_bench_runs_every_request_and_reports_the_engine_steps() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let json = dir.path().join("report.json");
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/inferno-tiny");
    let output = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(["bench", "offline", "--device", "cpu", "--model"])
        .arg(&model)
        .args([
            "--concurrency",
            "4",
            "--num-prompts",
            "10",
            "--input-len",
            "8",
            "--output-len",
            "6",
            "--ignore-eos",
            "--json",
        ])
        .arg(&json)
        .output()
        .expect("runs inferno");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("report written")).expect("JSON");
    assert_eq!(report["requests"], 10, "{report}");
    assert_eq!(report["failed"], 0, "{report}");
    assert_eq!(report["total_output_tokens"], 60, "{report}");
    // An offline run is a batch job: no stall limit unless asked for.
    assert_eq!(report["itl_stall_limit"], 0.0, "{report}");
    assert!(
        stdout.contains("ITL stall limit           none"),
        "{stdout}"
    );
    // At most four requests in a step, one token each: at least 15 steps; every step samples a
    // token for some request (an 8-token prompt is never cut into chunks): at most 60.
    let steps = report["engine_steps"].as_u64().expect("steps reported");
    assert!((15..=60).contains(&steps), "{steps} steps");
    let parts: Vec<&str> = report["engine_split"]
        .as_array()
        .expect("engine CPU split")
        .iter()
        .filter_map(|part| part["group"].as_str())
        .collect();
    // The device waits for the engine between steps for part of the run, never all of it.
    let gaps = report["engine_step_gaps_s"]
        .as_f64()
        .expect("step gaps reported");
    let duration = report["duration_s"].as_f64().expect("duration reported");
    assert!(
        gaps > 0.0 && gaps < duration,
        "{gaps} s of gaps in {duration} s"
    );
    assert!(parts.contains(&"engine host work"), "{parts:?}");
    assert!(parts.contains(&"engine backend steps"), "{parts:?}");
    assert!(
        stdout.contains(&format!("engine steps              {steps}:")),
        "{stdout}"
    );
}
