//! A process's CPU time split by thread group, from `/proc/PID/task/*/stat`, so a benchmark can
//! tell the serving path (the async runtime's threads) from the engine thread and from the
//! compute pool.

use std::collections::BTreeMap;
use std::collections::HashMap;

use serde::Serialize;

/// Linux reports thread times in clock ticks of 1/100 s (`USER_HZ`).
const TICKS_PER_SECOND: f64 = 100.0;

/// The group a thread belongs to, by the name the server gives it.
pub fn group_of(name: &str) -> &'static str {
    if name == "inferno-engine" {
        "engine"
    } else if name.starts_with("tokio") {
        "tokio"
    } else if name.starts_with("rayon") {
        "rayon"
    } else {
        "other"
    }
}

/// The CPU time (user + system, in ticks) of a process and of each of its live threads.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    process: u64,
    threads: HashMap<u32, (String, u64)>,
}

/// Utime + stime (fields 14 and 15) of a `stat` file, in ticks, and the thread's name.
fn parse_stat(stat: &str) -> Option<(String, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_owned();
    let fields: Vec<&str> = stat.get(close + 2..)?.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((name, utime + stime))
}

impl Snapshot {
    /// Reads the times of process `pid` and its threads; `None` if the process is not readable.
    pub fn of(pid: u32) -> Option<Self> {
        let (_, process) = parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)?;
        let mut threads = HashMap::new();
        for entry in std::fs::read_dir(format!("/proc/{pid}/task"))
            .ok()?
            .flatten()
        {
            let Some(tid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            // A thread can exit between the listing and the read: it counts as exited.
            if let Some(times) = std::fs::read_to_string(entry.path().join("stat"))
                .ok()
                .and_then(|stat| parse_stat(&stat))
            {
                threads.insert(tid, times);
            }
        }
        Some(Self { process, threads })
    }
}

/// The CPU seconds each thread group spent between two snapshots; threads that exited in
/// between count as `exited` (the process total keeps their time, their own entry is gone).
pub fn split(before: &Snapshot, after: &Snapshot) -> BTreeMap<&'static str, f64> {
    let mut groups: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut seen = 0u64;
    for (tid, (name, ticks)) in &after.threads {
        let earlier = before.threads.get(tid).map_or(0, |(_, t)| *t);
        let spent = ticks.saturating_sub(earlier);
        seen += spent;
        *groups.entry(group_of(name)).or_default() += spent;
    }
    let total = after.process.saturating_sub(before.process);
    if total > seen {
        *groups.entry("exited").or_default() += total - seen;
    }
    groups
        .into_iter()
        .map(|(group, ticks)| (group, ticks as f64 / TICKS_PER_SECOND))
        .collect()
}

/// One thread group's share of a run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GroupCpu {
    /// `tokio` (the async runtime: HTTP, TLS, SSE), `engine` (the engine thread), `rayon` (the
    /// compute pool), `other`, or `exited` (threads gone by the end of the run).
    pub group: &'static str,
    /// CPU seconds.
    pub seconds: f64,
    /// Cores busy on average over the run.
    pub cores: f64,
    /// Milliseconds of CPU per output token.
    pub ms_per_output_token: Option<f64>,
}

/// Each group's CPU over a run of `wall_s` seconds that produced `tokens` output tokens.
pub fn per_group(
    groups: &BTreeMap<&'static str, f64>,
    wall_s: f64,
    tokens: usize,
) -> Vec<GroupCpu> {
    groups
        .iter()
        .map(|(&group, &seconds)| GroupCpu {
            group,
            seconds,
            cores: if wall_s > 0.0 { seconds / wall_s } else { 0.0 },
            ms_per_output_token: (tokens > 0).then(|| seconds * 1e3 / tokens as f64),
        })
        .collect()
}

/// The engine thread's CPU seconds from a Prometheus text exposition: (host work, inside
/// backend steps), summed over models; `None` without the metric.
pub fn engine_cpu_from_metrics(text: &str) -> Option<(f64, f64)> {
    let (mut host, mut backend, mut found) = (0.0, 0.0, false);
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("inferno:engine_thread_cpu_seconds_total{") else {
            continue;
        };
        let Some(value) = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        if rest.contains("part=\"host\"") {
            host += value;
            found = true;
        } else if rest.contains("part=\"backend_step\"") {
            backend += value;
            found = true;
        }
    }
    found.then_some((host, backend))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_split_is_read_from_the_metrics_text() {
        let text = "# HELP inferno:engine_thread_cpu_seconds CPU time\n\
            inferno:engine_thread_cpu_seconds_total{model_name=\"m\",part=\"backend_step\"} 2.5\n\
            inferno:engine_thread_cpu_seconds_total{model_name=\"m\",part=\"host\"} 0.25\n\
            vllm:num_requests_running{model_name=\"m\"} 3\n";
        assert_eq!(engine_cpu_from_metrics(text), Some((0.25, 2.5)));
        assert_eq!(engine_cpu_from_metrics("vllm:x 1\n"), None);
    }

    #[test]
    fn stat_lines_with_spaces_and_parentheses_in_the_name_parse() {
        let line = "42 (tokio (rt) w) S 1 42 42 0 -1 4194368 10 0 0 0 123 45 0 0 20 0 9 0 100";
        assert_eq!(parse_stat(line), Some(("tokio (rt) w".into(), 168)));
        assert_eq!(parse_stat("42 (x) S 1"), None);
    }

    #[test]
    fn threads_are_grouped_by_name_and_exited_ones_keep_their_time() {
        let snapshot = |process, threads: &[(u32, &str, u64)]| Snapshot {
            process,
            threads: threads
                .iter()
                .map(|&(tid, name, ticks)| (tid, (name.to_owned(), ticks)))
                .collect(),
        };
        let before = snapshot(
            100,
            &[
                (1, "inferno", 10),
                (2, "tokio-rt-worker", 40),
                (3, "inferno-engine", 50),
            ],
        );
        // Thread 4 started and thread 5 started and exited during the run (7 ticks).
        let after = snapshot(
            300,
            &[
                (1, "inferno", 10),
                (2, "tokio-rt-worker", 100),
                (3, "inferno-engine", 150),
                (4, "rayon-0", 33),
            ],
        );
        let groups = split(&before, &after);
        assert_eq!(groups.get("tokio"), Some(&0.6));
        assert_eq!(groups.get("engine"), Some(&1.0));
        assert_eq!(groups.get("rayon"), Some(&0.33));
        assert_eq!(groups.get("other"), Some(&0.0));
        assert_eq!(groups.get("exited"), Some(&0.07));
        let rows = per_group(&groups, 2.0, 1000);
        let engine = rows.iter().find(|r| r.group == "engine").expect("engine");
        assert_eq!(engine.cores, 0.5);
        assert_eq!(engine.ms_per_output_token, Some(1.0));
    }

    #[test]
    fn this_process_and_its_threads_are_readable() {
        let before = Snapshot::of(std::process::id()).expect("/proc/self");
        assert!(before.threads.contains_key(&std::process::id()));
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(30) {
            std::hint::black_box(0u64);
        }
        let after = Snapshot::of(std::process::id()).expect("/proc/self");
        let total: f64 = split(&before, &after).values().sum();
        assert!(total >= 0.0);
    }
}
