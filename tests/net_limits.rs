//! Issue 47, defect 2: `inferno proxy` and `inferno keybroker` under file-descriptor exhaustion
//! and slow clients. Each runs as the real binary under `ulimit -n 64`; a burst of idle
//! connections past that limit must not end it (it backs off and serves again once they are
//! gone), and a client that sends half a request's headers is cut after the header timeout
//! (10 s), as the HTTPS server does.

#![cfg(feature = "simulated-tee")]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Starts `inferno ARGS` under `ulimit -n 64` and returns it with the address it printed after
/// `marker`.
fn start_limited(args: &[&str], marker: &str) -> (Child, String) {
    let mut command = String::from("ulimit -n 64 && exec \"$0\"");
    for i in 0..args.len() {
        command.push_str(&format!(" \"${}\"", i + 1));
    }
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(&command)
        .arg(env!("CARGO_BIN_EXE_inferno"))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    let marker = marker.to_owned();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.trim().strip_prefix(&marker) {
                let _ = tx.send(rest.trim().trim_start_matches("http://").to_owned());
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the program listens");
    (child, addr)
}

/// One HTTP/1.1 request on a new connection; the status line, or `None` when the connection
/// fails.
fn status_of(addr: &str, request: &str) -> Option<String> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .ok()?;
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    text.lines().next().map(str::to_owned)
}

/// Exhausts the program's descriptors with idle connections, checks it survives and serves
/// again, and that a half-sent request is cut within the header timeout.
fn exhaust_and_recover(child: &mut Child, addr: &str, request: &str, expected: &str) {
    let first = status_of(addr, request).expect("an answer before the flood");
    assert!(first.contains(expected), "{first}");

    let mut flood = Vec::new();
    for _ in 0..150 {
        if let Ok(stream) = TcpStream::connect(addr) {
            flood.push(stream);
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        child.try_wait().expect("wait").is_none(),
        "the program exited when out of file descriptors"
    );
    drop(flood);
    let deadline = Instant::now() + Duration::from_secs(20);
    let recovered = loop {
        match status_of(addr, request) {
            Some(line) if line.contains(expected) => break line,
            _ if Instant::now() > deadline => panic!("no answer after the flood ended"),
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    assert!(recovered.contains(expected), "{recovered}");
    assert!(child.try_wait().expect("wait").is_none());

    // Half a request: the connection is closed by the program within the header timeout.
    let mut slow = TcpStream::connect(addr).expect("connect");
    slow.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        .expect("write");
    slow.set_read_timeout(Some(Duration::from_secs(25)))
        .expect("timeout");
    let started = Instant::now();
    let mut rest = Vec::new();
    let _ = slow.read_to_end(&mut rest);
    let held = started.elapsed();
    assert!(
        held < Duration::from_secs(15),
        "a half-sent request was held {held:?}"
    );
}

#[test]
fn the_proxy_survives_descriptor_exhaustion_and_cuts_slow_clients() {
    // Nothing listens upstream: every request is answered 502 by the proxy itself.
    let policy = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/client-development.toml");
    let (mut child, addr) = start_limited(
        &[
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "https://127.0.0.1:9",
            "--policy",
            policy.to_str().expect("utf8"),
        ],
        "listening:",
    );
    exhaust_and_recover(
        &mut child,
        &addr,
        "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        " 502 ",
    );
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn the_key_broker_survives_descriptor_exhaustion_and_cuts_slow_clients() {
    let work = tempfile::tempdir().expect("tempdir");
    let policy = work.path().join("release.toml");
    std::fs::write(&policy, "appraisal = \"development\"\n").expect("policy");
    let keys = work.path().join("keys");
    let audit = work.path().join("audit");
    let (mut child, addr) = start_limited(
        &[
            "keybroker",
            "--listen",
            "127.0.0.1:0",
            "--keys",
            keys.to_str().expect("utf8"),
            "--policy",
            policy.to_str().expect("utf8"),
            "--audit",
            audit.to_str().expect("utf8"),
        ],
        "listening:",
    );
    exhaust_and_recover(
        &mut child,
        &addr,
        "GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        " 404 ",
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// Issue 47, minor: a proxy listening beyond loopback warns that the hop to it is plain HTTP;
/// on loopback it does not.
#[test]
fn the_proxy_warns_when_it_listens_beyond_loopback() {
    let policy = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/client-development.toml");
    let banner = |listen: &str| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_inferno"))
            .args([
                "proxy",
                "--listen",
                listen,
                "--upstream",
                "https://127.0.0.1:9",
            ])
            .arg("--policy")
            .arg(&policy)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn proxy");
        let stderr = child.stderr.take().expect("stderr");
        let mut seen = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            seen.push_str(&line);
            seen.push('\n');
            if line.trim().starts_with("listening:") {
                break;
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        seen
    };
    let open = banner("0.0.0.0:0");
    assert!(open.contains("not a loopback address"), "{open}");
    let local = banner("127.0.0.1:0");
    assert!(local.contains("listening:"), "{local}");
    assert!(!local.contains("not a loopback address"), "{local}");
}
