//! Running `inferno attest verify --json` from integration tests and reading its report.

#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// `inferno attest verify EVIDENCE --policy POLICY --json ARGS…`: exit code and report.
pub fn attest_verify(evidence: &Path, policy: &Path, args: &[&str]) -> (Option<i32>, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(["attest", "verify"])
        .arg(evidence)
        .arg("--policy")
        .arg(policy)
        .arg("--json")
        .args(args)
        .output()
        .expect("run inferno attest verify");
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), report)
}

/// The check `id` of a JSON appraisal report: (passed, reason).
pub fn check(report: &Value, id: &str) -> (bool, String) {
    let found = report["checks"]
        .as_array()
        .and_then(|checks| checks.iter().find(|c| c["id"] == id))
        .unwrap_or_else(|| panic!("no check {id}: {report:#}"));
    (
        found["passed"] == true,
        found["reason"].as_str().unwrap_or_default().to_owned(),
    )
}

/// The ids of the report's failed checks, in order.
pub fn failed(report: &Value) -> Vec<String> {
    report["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["passed"] == false)
        .map(|c| c["id"].as_str().unwrap_or_default().to_owned())
        .collect()
}
