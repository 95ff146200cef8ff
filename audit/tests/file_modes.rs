//! Issue 14 defect 5: the log's files are 0600 and its directory 0700 whatever the umask, and a
//! log left world-readable (written under a lax umask) is tightened when it is opened.
//!
//! The umask is process-wide, so this test binary holds this one test only.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use inferno_audit::AuditConfig;

mod support;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn open_and_stop(dir: &Path) {
    let cfg = AuditConfig {
        dir: dir.to_path_buf(),
        ..AuditConfig::default()
    };
    let log = support::open(&cfg);
    support::runtime()
        .block_on(log.shutdown("test over"))
        .expect("clean stop");
}

#[test]
fn files_are_0600_and_the_directory_0700_under_umask_000() {
    rustix::process::umask(rustix::fs::Mode::empty());
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("audit");
    open_and_stop(&dir);
    assert_eq!(mode(&dir), 0o700, "the log directory");
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        assert_eq!(mode(&path), 0o600, "{}", path.display());
        files += 1;
    }
    assert!(files >= 2, "a segment and the checkpoints at least");

    // A log whose directory and files were opened up is tightened at the next open.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let some_file = std::fs::read_dir(&dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::set_permissions(&some_file, std::fs::Permissions::from_mode(0o666)).unwrap();
    open_and_stop(&dir);
    assert_eq!(mode(&dir), 0o700, "the reopened log directory");
    assert_eq!(mode(&some_file), 0o600, "{}", some_file.display());
}
