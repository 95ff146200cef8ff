//! The allowed range of every numeric setting, in one table: start-up refuses a value outside
//! its range with an error naming the key and the range, and a test checks the Range column of
//! `docs/configuration.md` against this table.

use super::{Config, ConfigError, ModelKeySource};

/// A bound of a range, written as the operator writes the value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bound {
    /// An integer setting's bound.
    Int(u64),
    /// A fractional setting's bound.
    Float(f64),
}

impl Bound {
    fn value(self) -> f64 {
        match self {
            Self::Int(n) => n as f64,
            Self::Float(x) => x,
        }
    }
}

impl std::fmt::Display for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Int(n) => write!(f, "{n}"),
            Self::Float(x) => write!(f, "{x:?}"),
        }
    }
}

/// One numeric setting: its dotted key, its inclusive range and where its value is read.
pub struct Setting {
    /// The dotted key, e.g. `engine.max_batched_tokens`.
    pub key: &'static str,
    /// The smallest allowed value.
    pub min: Bound,
    /// The largest allowed value.
    pub max: Bound,
    /// The value in a configuration, `None` when the setting is absent (an optional key, or a
    /// key of an absent table).
    value: fn(&Config) -> Option<f64>,
}

impl Setting {
    /// The range as `docs/configuration.md` and the errors write it: `1 to 1048576`.
    pub fn range(&self) -> String {
        format!("{} to {}", self.min, self.max)
    }

    /// The error for `config` when its value is outside the range.
    fn check(&self, config: &Config) -> Result<(), ConfigError> {
        let Some(value) = (self.value)(config) else {
            return Ok(());
        };
        if value.is_nan() || value < self.min.value() || value > self.max.value() {
            return Err(ConfigError::Invalid {
                path: None,
                field: self.key.to_owned(),
                message: format!("{value} is out of range: allowed {}", self.range()),
            });
        }
        Ok(())
    }
}

const GIB: u64 = 1 << 30;
const HOUR: u64 = 3600;

fn int(n: impl TryInto<u64>) -> Option<f64> {
    // A value too large for u64 is out of every range.
    Some(n.try_into().map_or(f64::INFINITY, |n: u64| n as f64))
}

/// Every numeric setting of the configuration file and its allowed range.
pub const SETTINGS: &[Setting] = &[
    Setting {
        key: "server.max_model_len",
        min: Bound::Int(1),
        max: Bound::Int(1 << 24),
        value: |c| c.server.max_model_len.and_then(int),
    },
    Setting {
        key: "server.shutdown_grace_secs",
        min: Bound::Int(0),
        max: Bound::Int(HOUR),
        value: |c| int(c.server.shutdown_grace_secs),
    },
    Setting {
        key: "limits.max_body_bytes",
        min: Bound::Int(1),
        max: Bound::Int(GIB),
        value: |c| int(c.limits.max_body_bytes),
    },
    Setting {
        key: "limits.header_read_timeout_secs",
        min: Bound::Int(1),
        max: Bound::Int(HOUR),
        value: |c| int(c.limits.header_read_timeout_secs),
    },
    Setting {
        key: "limits.body_read_timeout_secs",
        min: Bound::Int(1),
        max: Bound::Int(HOUR),
        value: |c| int(c.limits.body_read_timeout_secs),
    },
    Setting {
        key: "limits.max_connections",
        min: Bound::Int(1),
        max: Bound::Int(1 << 20),
        value: |c| int(c.limits.max_connections),
    },
    Setting {
        key: "limits.max_completion_tokens",
        min: Bound::Int(1),
        max: Bound::Int(1 << 24),
        value: |c| int(c.limits.max_completion_tokens),
    },
    Setting {
        key: "limits.max_n",
        min: Bound::Int(1),
        max: Bound::Int(1024),
        value: |c| int(c.limits.max_n),
    },
    Setting {
        key: "limits.retry_after_secs",
        min: Bound::Int(1),
        max: Bound::Int(HOUR),
        value: |c| int(c.limits.retry_after_secs),
    },
    Setting {
        key: "engine.max_num_seqs",
        min: Bound::Int(1),
        max: Bound::Int(4096),
        value: |c| c.engine.max_num_seqs.and_then(int),
    },
    Setting {
        key: "engine.max_batched_tokens",
        min: Bound::Int(1),
        max: Bound::Int(1 << 20),
        value: |c| int(c.engine.max_batched_tokens),
    },
    Setting {
        key: "engine.itl_stall_limit",
        min: Bound::Float(0.0),
        max: Bound::Float(1000.0),
        value: |c| Some(c.engine.itl_stall_limit),
    },
    Setting {
        key: "engine.max_waiting",
        min: Bound::Int(1),
        max: Bound::Int(1 << 24),
        value: |c| int(c.engine.max_waiting),
    },
    Setting {
        key: "speculative.num_speculative_tokens",
        min: Bound::Int(1),
        max: Bound::Int(crate::engine::speculative::MAX_SPECULATIVE_TOKENS as u64),
        value: |c| int(c.speculative.num_speculative_tokens),
    },
    Setting {
        key: "speculative.prompt_lookup_min",
        min: Bound::Int(1),
        max: Bound::Int(64),
        value: |c| int(c.speculative.prompt_lookup_min),
    },
    Setting {
        key: "speculative.prompt_lookup_max",
        min: Bound::Int(1),
        max: Bound::Int(64),
        value: |c| int(c.speculative.prompt_lookup_max),
    },
    Setting {
        key: "speculative.forced_acceptance",
        min: Bound::Float(0.0),
        max: Bound::Float(1.0),
        value: |c| c.speculative.forced_acceptance,
    },
    Setting {
        key: "engine.kv_cache_bytes",
        min: Bound::Int(1 << 20),
        max: Bound::Int(1 << 40),
        value: |c| int(c.engine.kv_cache_bytes),
    },
    Setting {
        key: "engine.gpu_memory_fraction",
        min: Bound::Float(0.01),
        max: Bound::Float(1.0),
        value: |c| Some(c.engine.gpu_memory_fraction),
    },
    Setting {
        key: "audit.checkpoint_every_records",
        min: Bound::Int(0),
        max: Bound::Int(1 << 30),
        value: |c| {
            c.audit
                .as_ref()
                .and_then(|a| int(a.checkpoint_every_records))
        },
    },
    Setting {
        key: "audit.checkpoint_every_seconds",
        min: Bound::Int(0),
        max: Bound::Int(24 * HOUR),
        value: |c| {
            c.audit
                .as_ref()
                .and_then(|a| int(a.checkpoint_every_seconds))
        },
    },
    Setting {
        key: "audit.segment_max_bytes",
        min: Bound::Int(4096),
        max: Bound::Int(64 * GIB),
        value: |c| c.audit.as_ref().and_then(|a| int(a.segment_max_bytes)),
    },
    Setting {
        key: "audit.commit_interval_ms",
        min: Bound::Int(0),
        max: Bound::Int(1000),
        value: |c| c.audit.as_ref().and_then(|a| int(a.commit_interval_ms)),
    },
    Setting {
        key: "attestation.fresh_evidence_burst",
        min: Bound::Int(1),
        max: Bound::Int(10_000),
        value: |c| int(c.attestation.fresh_evidence_burst),
    },
    Setting {
        key: "attestation.fresh_evidence_per_minute",
        min: Bound::Int(1),
        max: Bound::Int(1_000_000),
        value: |c| int(c.attestation.fresh_evidence_per_minute),
    },
    Setting {
        key: "model.key.retries",
        min: Bound::Int(0),
        max: Bound::Int(100),
        value: |c| match &c.model.key {
            Some(ModelKeySource::Broker { retries, .. }) => int(*retries),
            _ => None,
        },
    },
];

/// Checks every setting of `config` against its range; the first one outside it is the error.
pub(super) fn check(config: &Config) -> Result<(), ConfigError> {
    SETTINGS
        .iter()
        .try_for_each(|setting| setting.check(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(text: &str) -> String {
        Config::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn zero_max_batched_tokens_is_refused_with_the_key_and_range() {
        let msg = error_of("[engine]\nmax_batched_tokens = 0\n");
        assert!(msg.contains("engine.max_batched_tokens"), "{msg}");
        assert!(msg.contains("1 to 1048576"), "{msg}");
    }

    #[test]
    fn a_gpu_memory_fraction_above_one_is_refused() {
        let msg = error_of("[engine]\ngpu_memory_fraction = 1.7\n");
        assert!(msg.contains("engine.gpu_memory_fraction"), "{msg}");
        assert!(msg.contains("0.01 to 1.0"), "{msg}");
        let msg = error_of("[engine]\ngpu_memory_fraction = nan\n");
        assert!(msg.contains("engine.gpu_memory_fraction"), "{msg}");
    }

    #[test]
    fn zero_max_waiting_is_refused() {
        let msg = error_of("[engine]\nmax_waiting = 0\n");
        assert!(msg.contains("engine.max_waiting"), "{msg}");
        assert!(msg.contains("1 to 16777216"), "{msg}");
    }

    #[test]
    fn the_defaults_are_within_every_range() {
        let mut config = Config {
            audit: Some(inferno_audit::AuditConfig::default()),
            ..Config::default()
        };
        config.engine.max_num_seqs = Some(256);
        config.server.max_model_len = Some(8192);
        config.speculative.forced_acceptance = Some(0.5);
        config.model.key = Some(ModelKeySource::Broker {
            url: "http://k".to_owned(),
            retries: super::super::DEFAULT_BROKER_RETRIES,
        });
        for setting in SETTINGS {
            assert!(
                (setting.value)(&config).is_some(),
                "{} is read",
                setting.key
            );
            setting.check(&config).unwrap();
        }
    }

    #[test]
    fn settings_of_optional_tables_are_checked_when_present() {
        let msg = error_of("[audit]\ndir = \"/a\"\nsegment_max_bytes = 10\n");
        assert!(msg.contains("audit.segment_max_bytes"), "{msg}");
        let msg =
            error_of("[model.key]\nsource = \"broker\"\nurl = \"http://k\"\nretries = 1000\n");
        assert!(msg.contains("model.key.retries"), "{msg}");
        let msg = error_of("[engine]\nmax_num_seqs = 0\n");
        assert!(msg.contains("engine.max_num_seqs"), "{msg}");
    }

    /// The rows of `docs/configuration.md`'s tables: (`table.key`, range column).
    fn documented_ranges() -> Vec<(String, String)> {
        let doc = include_str!("../../docs/configuration.md");
        let mut table = String::new();
        let mut rows = Vec::new();
        let mut range_column = None;
        for line in doc.lines() {
            if let Some(name) = line
                .strip_prefix("## `[")
                .and_then(|rest| rest.strip_suffix("]`"))
            {
                table = name.to_owned();
                range_column = None;
                continue;
            }
            if !line.starts_with('|') {
                continue;
            }
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            if cells.first() == Some(&"Key") {
                range_column = cells.iter().position(|c| *c == "Range");
                continue;
            }
            let (Some(column), Some(key)) = (
                range_column,
                cells
                    .first()
                    .and_then(|k| k.strip_prefix('`')?.strip_suffix('`')),
            ) else {
                continue;
            };
            rows.push((format!("{table}.{key}"), cells[column].to_owned()));
        }
        rows
    }

    #[test]
    fn the_documented_ranges_are_the_checked_ranges() {
        let documented = documented_ranges();
        for setting in SETTINGS {
            let row = documented
                .iter()
                .find(|(key, _)| key == setting.key)
                .unwrap_or_else(|| panic!("{} has no row in docs/configuration.md", setting.key));
            assert_eq!(
                row.1,
                setting.range(),
                "the documented range of {}",
                setting.key
            );
        }
        for (key, range) in &documented {
            if range != "—" {
                assert!(
                    SETTINGS.iter().any(|s| s.key == key),
                    "{key} documents range {range}, which the configuration does not check"
                );
            }
        }
    }
}
