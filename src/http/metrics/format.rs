//! The two exposition formats `/metrics` speaks and how a scrape picks one: OpenMetrics
//! (rendered by `prometheus-client`) when `Accept` asks for `application/openmetrics-text`,
//! the classic Prometheus text format (version 0.0.4, written here: `prometheus-client` 0.24
//! renders OpenMetrics only) otherwise — as the Prometheus Go client negotiates.

use super::Family;
use axum::http::{HeaderMap, header};
use std::fmt::Write;

/// An exposition format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// `text/plain; version=0.0.4`: what curl, `promtool check metrics` and Prometheus
    /// servers before OpenMetrics read.
    Classic,
    /// `application/openmetrics-text; version=1.0.0`: what Prometheus asks for first.
    OpenMetrics,
}

impl Format {
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Format::Classic => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    /// The format for a request's `Accept` (every `Accept` line, as one list): among the
    /// media ranges naming one of the two formats in a version we write (`text/plain` with no
    /// version or 0.0.4; `application/openmetrics-text` with none, 0.0.1 or 1.0.0), the one
    /// with the highest `q`, the first listed among equals; `q=0` means "not this" (RFC 9110
    /// § 12.4.2). Anything else (`*/*`, `text/*`, no `Accept`, a malformed one): classic.
    ///
    /// The Go client (`expfmt.NegotiateIncludingOpenMetrics`) picks the same, except that it
    /// would take a `q=0` range for a wish.
    pub(crate) fn negotiate(headers: &HeaderMap) -> Format {
        let mut best: Option<(f32, Format)> = None;
        let ranges = headers
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','));
        for range in ranges {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let (mut q, mut version) = (1.0f32, "");
            for p in parts {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                let v = v.trim().trim_matches('"');
                match k.trim().to_ascii_lowercase().as_str() {
                    "q" => {
                        q = v
                            .parse()
                            .ok()
                            .filter(|q: &f32| q.is_finite())
                            .unwrap_or(0.0)
                    }
                    "version" => version = v,
                    _ => {}
                }
            }
            let format = match (media.as_str(), version) {
                ("text/plain", "" | "0.0.4") => Format::Classic,
                ("application/openmetrics-text", "" | "0.0.1" | "1.0.0") => Format::OpenMetrics,
                _ => continue,
            };
            if q > 0.0 && best.is_none_or(|(b, _)| q > b) {
                best = Some((q, format));
            }
        }
        best.map_or(Format::Classic, |(_, f)| f)
    }
}

/// The classic text format: per family `# HELP`, `# TYPE` and its samples, counters named
/// with their `_total` (the family's name there, unlike OpenMetrics); families without
/// samples left out (as `prometheus-client` and the Go client leave them out).
pub(crate) fn classic(prefix: &str, families: &[Family]) -> String {
    let mut out = String::new();
    for f in families.iter().filter(|f| !f.samples.is_empty()) {
        let (kind, suffix) = if f.gauge {
            ("gauge", "")
        } else {
            ("counter", "_total")
        };
        let name = format!("{prefix}_{}{suffix}", f.name);
        let _ = writeln!(out, "# HELP {name} {}", escape(&f.help, false));
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value) in &f.samples {
            out.push_str(&name);
            for (i, (k, v)) in labels.iter().enumerate() {
                out.push(if i == 0 { '{' } else { ',' });
                let _ = write!(out, "{k}=\"{}\"", escape(v, true));
            }
            if !labels.is_empty() {
                out.push('}');
            }
            let value = if f.gauge {
                super::clamp(*value).to_string()
            } else {
                value.to_string()
            };
            let _ = writeln!(out, " {value}");
        }
    }
    out
}

/// The classic format's escapes: `\` and newline in help text, and `"` too in label values.
fn escape(s: &str, quote: bool) -> std::borrow::Cow<'_, str> {
    let special = |c: char| c == '\\' || c == '\n' || (quote && c == '"');
    if !s.contains(special) {
        return s.into();
    }
    let mut e = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => e.push_str("\\\\"),
            '\n' => e.push_str("\\n"),
            '"' if quote => e.push_str("\\\""),
            c => e.push(c),
        }
    }
    e.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn pick(accept: &[&str]) -> Format {
        let mut h = HeaderMap::new();
        for a in accept {
            h.append(header::ACCEPT, HeaderValue::from_str(a).unwrap());
        }
        Format::negotiate(&h)
    }

    #[test]
    fn accept_picks_openmetrics_only_when_it_is_asked_for() {
        use Format::*;
        for (accept, want) in [
            (&[][..], Classic),
            (&["*/*"], Classic),
            (&["text/plain"], Classic),
            (&["application/openmetrics-text"], OpenMetrics),
            (
                &["Application/OpenMetrics-Text; Version=\"1.0.0\""],
                OpenMetrics,
            ),
            (&["application/openmetrics-text;version=2.0.0"], Classic),
            (&["application/openmetrics-text;q=0"], Classic),
            (&["application/openmetrics-text;q=x"], Classic),
            (
                &["application/openmetrics-text;q=0.4, text/plain;q=0.5"],
                Classic,
            ),
            (
                &["text/plain;q=0.5", "application/openmetrics-text"],
                OpenMetrics,
            ),
            (&["text/plain, application/openmetrics-text"], Classic),
            (&["application/json, text/plain;version=0.0.5"], Classic),
            (&["garbage;;;=, ;q=1"], Classic),
        ] {
            assert_eq!(pick(accept), want, "{accept:?}");
        }
    }

    #[test]
    fn the_classic_format_names_counters_with_total_and_escapes() {
        let families = [
            Family {
                name: "a".into(),
                help: "back\\slash\nnew \"line\"".into(),
                gauge: false,
                labelled: true,
                samples: vec![(vec![("k", "q\"\\\n".into()), ("j", "x".into())], 3)],
            },
            Family {
                name: "g".into(),
                help: "h".into(),
                gauge: true,
                labelled: false,
                samples: vec![(vec![], u64::MAX)],
            },
            Family {
                name: "empty".into(),
                help: "h".into(),
                gauge: false,
                labelled: true,
                samples: vec![],
            },
        ];
        assert_eq!(
            classic("p", &families),
            "# HELP p_a_total back\\\\slash\\nnew \"line\"\n\
             # TYPE p_a_total counter\n\
             p_a_total{k=\"q\\\"\\\\\\n\",j=\"x\"} 3\n\
             # HELP p_g h\n\
             # TYPE p_g gauge\n\
             p_g 9223372036854775807\n"
        );
    }
}
