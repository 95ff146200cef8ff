//! The production profile's process hardening: `inferno serve` refuses to start without an audit
//! log, and the hardening steps (no core dumps, not dumpable, no_new_privs, locked memory, user
//! drop) take effect, as read back from `/proc/self` of a spawned process.

use std::process::Command;

/// Set in the child process that applies the hardening and reports its `/proc/self` state.
const CHILD_ENV: &str = "INFERNO_HARDENING_CHILD";

#[test]
fn production_serve_refuses_to_start_without_an_audit_log() {
    let work = tempfile::tempdir().expect("tempdir");
    let config = work.path().join("inferno.toml");
    std::fs::write(
        &config,
        "[server]\nlisten = \"127.0.0.1:0\"\n[attestation]\nprofile = \"production\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(["serve", "--device", "cpu", "--config"])
        .arg(&config)
        .env("RUST_LOG", "off")
        .output()
        .expect("run inferno serve");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains("refuses to serve without an audit log"),
        "{stderr}"
    );
}

#[test]
fn development_serve_is_not_refused_for_lack_of_an_audit_log() {
    // The same configuration in the development profile gets past the audit check (and fails
    // later, on the model directory that does not exist).
    let work = tempfile::tempdir().expect("tempdir");
    let config = work.path().join("inferno.toml");
    std::fs::write(
        &config,
        "[server]\nlisten = \"127.0.0.1:0\"\n[attestation]\nprofile = \"development\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(["serve", "--device", "cpu", "--model"])
        .arg(work.path().join("no-such-model"))
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "off")
        .output()
        .expect("run inferno serve");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("audit log"), "{stderr}");
    assert!(stderr.contains("no-such-model"), "{stderr}");
}

/// Runs `child_name` of this test binary in a new process with [`CHILD_ENV`] set and returns
/// its standard output.
fn run_child(child_name: &str) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            child_name,
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .output()
        .expect("spawn the child test");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "child failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The value of `key` in a `/proc/self/status`-style dump.
fn status_field<'a>(dump: &'a str, key: &str) -> &'a str {
    dump.lines()
        .find_map(|line| line.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in {dump}"))
        .trim()
}

#[test]
#[ignore = "the child of hardening_is_visible_in_proc_self; it hardens its own process"]
fn hardening_child() {
    assert!(
        std::env::var_os(CHILD_ENV).is_some(),
        "run by its parent test"
    );
    // The harness printed "test NAME ... " without a newline: report on lines of their own.
    println!();
    inferno::harden::deny_dumps_and_ptrace().expect("deny dumps and ptrace");
    let locked = inferno::harden::lock_resident_memory();
    println!("lock: {locked:?}");
    println!(
        "dumpable: {:?}",
        rustix::process::dumpable_behavior().expect("PR_GET_DUMPABLE")
    );
    // no_new_privs is per thread (inferno sets it on the main thread before any other starts);
    // the harness runs this test on a thread of its own.
    print!(
        "{}",
        std::fs::read_to_string("/proc/thread-self/status").expect("status")
    );
    print!(
        "{}",
        std::fs::read_to_string("/proc/self/limits").expect("limits")
    );
}

#[test]
fn hardening_is_visible_in_proc_self() {
    let dump = run_child("hardening_child");
    assert_eq!(status_field(&dump, "dumpable:"), "NotDumpable", "{dump}");
    assert_eq!(status_field(&dump, "NoNewPrivs:"), "1", "{dump}");
    let core = status_field(&dump, "Max core file size");
    assert!(core.split_whitespace().take(2).all(|v| v == "0"), "{core}");
    let lock = status_field(&dump, "lock:");
    if rustix::process::geteuid().is_root() {
        assert_eq!(lock, "Ok(())", "{dump}");
        let locked_kb: u64 = status_field(&dump, "VmLck:")
            .trim_end_matches("kB")
            .trim()
            .parse()
            .unwrap();
        assert!(locked_kb > 0, "{dump}");
    } else {
        // Unprivileged, with the default RLIMIT_MEMLOCK: a clear error names the remedy.
        assert!(lock == "Ok(())" || lock.contains("LimitMEMLOCK"), "{dump}");
    }
}

#[test]
#[ignore = "the child of dropping_privileges_switches_every_id; it changes its own user"]
fn drop_privileges_child() {
    assert!(
        std::env::var_os(CHILD_ENV).is_some(),
        "run by its parent test"
    );
    // The harness printed "test NAME ... " without a newline: report on lines of their own.
    println!();
    // A second thread started before the drop must be switched too.
    let (started, wait) = std::sync::mpsc::channel();
    let (release, done) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        started.send(()).unwrap();
        done.recv().unwrap();
        std::fs::read_to_string("/proc/thread-self/status").expect("thread status")
    });
    wait.recv().unwrap();
    let dropped = inferno::harden::drop_privileges("nobody");
    println!("drop: {dropped:?}");
    release.send(()).unwrap();
    let thread_status = thread.join().unwrap();
    println!("thread {}", status_field(&thread_status, "Uid:"));
    print!(
        "{}",
        std::fs::read_to_string("/proc/self/status").expect("status")
    );
    println!(
        "dumpable: {:?}",
        rustix::process::dumpable_behavior().expect("PR_GET_DUMPABLE")
    );
}

#[test]
fn dropping_privileges_switches_every_id() {
    let dump = run_child("drop_privileges_child");
    if rustix::process::geteuid().is_root() {
        assert_eq!(status_field(&dump, "drop:"), "Ok(())", "{dump}");
        let nobody = "65534\t65534\t65534\t65534";
        assert_eq!(status_field(&dump, "Uid:"), nobody, "{dump}");
        assert_eq!(status_field(&dump, "Gid:"), nobody, "{dump}");
        assert_eq!(status_field(&dump, "thread"), nobody, "{dump}");
        assert_eq!(status_field(&dump, "dumpable:"), "NotDumpable", "{dump}");
    } else {
        assert!(
            status_field(&dump, "drop:").contains("cannot switch to user"),
            "{dump}"
        );
    }
}

#[test]
fn dropping_to_an_unknown_user_fails_naming_it() {
    let err = inferno::harden::drop_privileges("no-such-user-inferno").unwrap_err();
    assert_eq!(err.to_string(), "no user named \"no-such-user-inferno\"");
}
