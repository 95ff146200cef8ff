//! The standard `process_*` series, read from the kernel at scrape time.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The process's CPU time, memory, descriptors and start time.
pub(super) struct ProcessMetrics {
    cpu_seconds: Counter<f64, AtomicU64>,
    /// CPU seconds already folded into `cpu_seconds`.
    cpu_seen: std::sync::Mutex<f64>,
    resident_bytes: Gauge,
    virtual_bytes: Gauge,
    open_fds: Gauge,
    max_fds: Gauge,
    start_time: Gauge<f64, AtomicU64>,
}

impl ProcessMetrics {
    /// Registers the series in `registry`; the start time is now (the server's start).
    pub(super) fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            cpu_seconds: Counter::default(),
            cpu_seen: std::sync::Mutex::new(0.0),
            resident_bytes: Gauge::default(),
            virtual_bytes: Gauge::default(),
            open_fds: Gauge::default(),
            max_fds: Gauge::default(),
            start_time: Gauge::default(),
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        metrics.start_time.set(now);
        registry.register(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            metrics.cpu_seconds.clone(),
        );
        for (name, help, gauge) in [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                &metrics.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                &metrics.virtual_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                &metrics.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                &metrics.max_fds,
            ),
        ] {
            registry.register(name, help, gauge.clone());
        }
        registry.register(
            "process_start_time_seconds",
            "Start time of the server since the Unix epoch in seconds",
            metrics.start_time.clone(),
        );
        metrics
    }

    /// Reads the current values (a value that cannot be read keeps its last one).
    pub(super) fn observe(&self) {
        let cpu = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
        let cpu = cpu.tv_sec as f64 + cpu.tv_nsec as f64 / 1e9;
        let mut seen = self
            .cpu_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.cpu_seconds.inc_by((cpu - *seen).max(0.0));
        *seen = seen.max(cpu);
        drop(seen);
        if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
            let kib = |field: &str| {
                status
                    .lines()
                    .find_map(|line| line.strip_prefix(field))
                    .and_then(|rest| rest.trim().strip_suffix("kB"))
                    .and_then(|n| n.trim().parse::<i64>().ok())
                    .map(|n| n.saturating_mul(1024))
            };
            if let Some(rss) = kib("VmRSS:") {
                self.resident_bytes.set(rss);
            }
            if let Some(size) = kib("VmSize:") {
                self.virtual_bytes.set(size);
            }
        }
        if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
            self.open_fds
                .set(i64::try_from(entries.count()).unwrap_or(i64::MAX));
        }
        if let Some(max) = rustix::process::getrlimit(rustix::process::Resource::Nofile).current {
            self.max_fds.set(i64::try_from(max).unwrap_or(i64::MAX));
        }
    }
}
