//! The two exposition formats `/metrics` serves, chosen by the scraper's `Accept` header:
//! OpenMetrics 1.0.0 (what the `prometheus-client` crate encodes) or the Prometheus text format
//! 0.0.4, derived from it.

/// An exposition format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0.0 text: counters named without `_total` in `# TYPE`, ends with `# EOF`.
    OpenMetrics,
    /// The Prometheus text format 0.0.4: counters named with `_total` in `# TYPE`, no `# EOF`.
    Text,
}

impl Format {
    /// OpenMetrics when `accept` names `application/openmetrics-text` with a non-zero quality,
    /// the 0.0.4 text format otherwise (no header, `*/*`, `text/plain`).
    pub fn negotiate(accept: Option<&str>) -> Self {
        let wants_openmetrics = accept.is_some_and(|accept| {
            accept.split(',').any(|range| {
                let mut parts = range.split(';').map(str::trim);
                let media = parts.next().unwrap_or_default();
                let quality = parts
                    .filter_map(|p| p.strip_prefix("q=").or_else(|| p.strip_prefix("Q=")))
                    .find_map(|q| q.parse::<f64>().ok())
                    .unwrap_or(1.0);
                media.eq_ignore_ascii_case("application/openmetrics-text") && quality > 0.0
            })
        });
        if wants_openmetrics {
            Self::OpenMetrics
        } else {
            Self::Text
        }
    }

    /// The `Content-Type` of a response in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Self::Text => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// The 0.0.4 text of an OpenMetrics exposition (as the `prometheus-client` crate writes it: no
/// exemplars, no `_created` samples): a counter family's `# HELP` and `# TYPE` lines take the
/// `_total` name its samples carry, `# UNIT` lines and the `# EOF` marker are dropped; an info
/// family becomes the gauge its `_info` sample is.
pub fn to_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // The families whose descriptor lines take a suffix: (name, suffix, type in 0.0.4).
    let mut renamed: Vec<(&str, &str, &str)> = Vec::new();
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            match kind {
                "counter" => renamed.push((name, "_total", "counter")),
                "info" => renamed.push((name, "_info", "gauge")),
                _ => {}
            }
        }
    }
    let suffix_of = |name: &str| renamed.iter().find(|(n, ..)| *n == name).copied();
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            match suffix_of(name) {
                Some((_, suffix, _)) => out.push_str(&format!("# HELP {name}{suffix} {help}")),
                None => out.push_str(line),
            }
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, _) = rest.split_once(' ').unwrap_or((rest, ""));
            match suffix_of(name) {
                Some((_, suffix, kind)) => out.push_str(&format!("# TYPE {name}{suffix} {kind}")),
                None => out.push_str(line),
            }
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_is_chosen_only_when_accepted() {
        assert_eq!(Format::negotiate(None), Format::Text);
        assert_eq!(Format::negotiate(Some("*/*")), Format::Text);
        assert_eq!(Format::negotiate(Some("text/plain")), Format::Text);
        // What Prometheus sends.
        let prometheus = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,\
                          text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text; q=0")),
            Format::Text
        );
        assert!(
            Format::OpenMetrics
                .content_type()
                .starts_with("application/openmetrics-text")
        );
        assert!(Format::Text.content_type().contains("version=0.0.4"));
    }

    #[test]
    fn counters_take_their_total_name_and_the_eof_goes() {
        let openmetrics = "# HELP a:b Things.\n# TYPE a:b counter\na:b_total{m=\"x\"} 3\n\
                           # HELP g A gauge.\n# TYPE g gauge\ng 1\n\
                           # HELP i Build.\n# TYPE i info\ni_info{v=\"1\"} 1\n# EOF\n";
        let text = to_text(openmetrics);
        assert_eq!(
            text,
            "# HELP a:b_total Things.\n# TYPE a:b_total counter\na:b_total{m=\"x\"} 3\n\
             # HELP g A gauge.\n# TYPE g gauge\ng 1\n\
             # HELP i_info Build.\n# TYPE i_info gauge\ni_info{v=\"1\"} 1\n"
        );
    }
}
