//! Issue 47, defect 8: memory after large constraint requests. The attack (eight
//! 50,000-entry `guided_choice` requests at once) grew the server from 140 MB to 1.54 GB and kept
//! 1.4 GB. Each is now refused before compiling; the largest constraints still allowed are
//! compiled on the bounded pool and run. The server's resident memory levels off within a small
//! margin of what it was before (the allocator keeps some freed memory for reuse, about 100 MiB
//! here after the first waves; no request keeps any).

mod spawn_support;

use std::time::Duration;

use serde_json::json;

/// The server's resident set (`VmRSS`), in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .expect("VmRSS")
        * 1024
}

fn choices(count: usize, tag: &str) -> Vec<String> {
    (0..count).map(|i| format!("{tag} choice {i:05}")).collect()
}

async fn ask(client: &reqwest::Client, base: &str, guided_choice: Vec<String>) -> u16 {
    let body = json!({
        "model": inferno::model::EMBEDDED_MODEL_NAME,
        "messages": [{"role": "user", "content": "Pick one."}],
        "max_tokens": 4,
        "guided_choice": guided_choice,
    });
    client
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("request")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_is_handed_back_after_large_constraint_requests() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, base) = spawn_support::spawn_server(
        "[attestation]\nprofile = \"development\"\n",
        dir.path(),
        "warn",
    );
    let client = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    // Warm up: what any constrained request builds once (the token table) is in the baseline.
    assert_eq!(ask(&client, &base, choices(1024, "warm")).await, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = rss(child.id());

    // Four waves: the allocator's arenas grow over the first ones (glibc keeps freed memory
    // for reuse), then level off; nothing is kept per request. The issue saw 1.4 GB kept after
    // one wave of eight.
    let mut after = Vec::new();
    for wave in 0..4 {
        let mut tasks = Vec::new();
        for round in 0..8 {
            let (c, b) = (client.clone(), base.clone());
            // The request: 50,000 choices (3.3 MB in the issue; about 1 MB here).
            tasks.push(tokio::spawn(async move {
                let tag = format!("attack{wave}-{round}");
                (400, ask(&c, &b, choices(50_000, &tag)).await)
            }));
            let (c, b) = (client.clone(), base.clone());
            // The largest allowed: 1,024 choices, each request different (nothing shared).
            tasks.push(tokio::spawn(async move {
                let tag = format!("big{wave}-{round}");
                (200, ask(&c, &b, choices(1024, &tag)).await)
            }));
        }
        for task in tasks {
            let (expected, status) = task.await.unwrap();
            assert_eq!(status, expected);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        after.push(rss(child.id()));
    }
    let _ = child.kill();
    let _ = child.wait();
    let mib = |bytes: u64| bytes >> 20;
    eprintln!(
        "resident memory: {} MiB before, after each wave: {:?} MiB",
        mib(before),
        after.iter().map(|b| mib(*b)).collect::<Vec<_>>()
    );
    let kept = after[3].saturating_sub(before);
    assert!(
        kept < 192 << 20,
        "the server kept {} MiB after four waves ({} MiB before)",
        mib(kept),
        mib(before)
    );
    let late = after[3].saturating_sub(after[1]);
    assert!(
        late < 64 << 20,
        "the last two waves kept another {} MiB: memory grows with the requests",
        mib(late)
    );
}
