//! `OtlpOptions`: where spans go and how (endpoint, headers, resource, content, bounds), from
//! code, the CLI and the `OTEL_*` environment variables the OTLP exporter spec defines.

use std::fmt;
use std::time::Duration;

/// A refused option or environment variable: what it was, the value, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} = {value:?}: {reason}")]
pub struct OtlpError {
    /// The option (`--otlp`, `OtlpOptions::header`) or the variable (`OTEL_EXPORTER_OTLP_HEADERS`).
    pub what: String,
    /// The value refused (a header's value is never shown: only its name).
    pub value: String,
    /// Why, and what was expected.
    pub reason: String,
}

fn refuse(what: &str, value: &str, reason: impl Into<String>) -> OtlpError {
    OtlpError {
        what: what.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// Where an OTLP/HTTP request goes: `http://host:port/path`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub(crate) host: String,
    pub(crate) port: u16,
    /// Starts with `/`.
    pub(crate) path: String,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "http://[{}]:{}{}", self.host, self.port, self.path)
        } else {
            write!(f, "http://{}:{}{}", self.host, self.port, self.path)
        }
    }
}

impl Endpoint {
    /// `base` is a base URL (`OTEL_EXPORTER_OTLP_ENDPOINT`, `--otlp`): `v1/traces` is appended
    /// to its path. Otherwise it is the traces URL itself (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`).
    fn parse(what: &str, url: &str, base: bool) -> Result<Endpoint, OtlpError> {
        let uri: hyper::Uri = url
            .parse()
            .map_err(|e| refuse(what, url, format!("not a URL: {e}")))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(refuse(
                    what,
                    url,
                    "https is not supported by this exporter (no TLS): send to a collector on http:// (for example a local OpenTelemetry Collector forwarding over TLS)",
                ));
            }
            _ => return Err(refuse(what, url, "expected http://host[:port][/path]")),
        }
        if uri.query().is_some() {
            return Err(refuse(what, url, "a query string is not allowed"));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| refuse(what, url, "no host"))?;
        if authority.as_str().contains('@') {
            return Err(refuse(
                what,
                url,
                "credentials in the URL are not sent: use a header (--otlp-header)",
            ));
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let mut path = uri.path().to_string();
        if base {
            if !path.ends_with('/') {
                path.push('/');
            }
            path.push_str("v1/traces");
        }
        Ok(Endpoint {
            host: host.to_string(),
            port: authority.port_u16().unwrap_or(80),
            path,
        })
    }

    /// `Host` header value.
    pub(crate) fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// How the OpenTelemetry exporter runs ([`HooksBuilder::otlp`](crate::HooksBuilder::otlp),
/// `prx-hooks run --otlp URL`; docs/otel.md § OpenTelemetry traces). Defaults are the OTel SDK's batch
/// span processor's (queue 2,048, batches of 512, every 5 s, 10 s timeout).
#[derive(Clone)]
pub struct OtlpOptions {
    pub(crate) endpoint: Endpoint,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) service_name: String,
    pub(crate) resource: Vec<(String, String)>,
    pub(crate) content: bool,
    pub(crate) queue: usize,
    pub(crate) batch: usize,
    pub(crate) interval: Duration,
    pub(crate) timeout: Duration,
    pub(crate) retry_for: Duration,
    pub(crate) idle_limit: Duration,
    pub(crate) max_open_per_emitter: usize,
    pub(crate) max_emitters: usize,
    pub(crate) max_extras: usize,
    pub(crate) max_value_bytes: usize,
    pub(crate) plugin_spans: u32,
}

/// Header values (API keys) are never shown: only their names.
impl fmt::Debug for OtlpOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self.headers.iter().map(|(k, _)| format!("{k}=…")).collect();
        f.debug_struct("OtlpOptions")
            .field("endpoint", &self.endpoint)
            .field("headers", &names)
            .field("service_name", &self.service_name)
            .field("resource", &self.resource)
            .field("content", &self.content)
            .field("queue", &self.queue)
            .field("batch", &self.batch)
            .field("interval", &self.interval)
            .field("timeout", &self.timeout)
            .field("retry_for", &self.retry_for)
            .field("idle_limit", &self.idle_limit)
            .finish_non_exhaustive()
    }
}

/// The OTLP/HTTP default base endpoint.
pub(crate) const DEFAULT_ENDPOINT: &str = "http://localhost:4318";

impl OtlpOptions {
    /// Spans to `base_url/v1/traces` (`base_url` is what `OTEL_EXPORTER_OTLP_ENDPOINT` holds).
    pub fn new(base_url: &str) -> Result<OtlpOptions, OtlpError> {
        Ok(OtlpOptions {
            endpoint: Endpoint::parse("--otlp", base_url, true)?,
            headers: Vec::new(),
            service_name: "prx-hooks".to_string(),
            resource: Vec::new(),
            content: false,
            queue: 2048,
            batch: 512,
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(10),
            retry_for: Duration::from_secs(30),
            idle_limit: Duration::from_secs(600),
            max_open_per_emitter: 64,
            max_emitters: 4096,
            max_extras: 32,
            max_value_bytes: 4096,
            plugin_spans: 100,
        })
    }

    /// The options the `OTEL_*` variables give, as the OTLP exporter spec reads them: the
    /// endpoint (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as is, else `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// with `/v1/traces` appended, else `http://localhost:4318/v1/traces`), headers
    /// (`…_HEADERS`, the traces-specific ones winning per key), timeout (`…_TIMEOUT`, ms),
    /// protocol (only `http/protobuf`), compression (only `none`), `OTEL_SERVICE_NAME`,
    /// `OTEL_RESOURCE_ATTRIBUTES` and the batch processor's `OTEL_BSP_*`.
    pub fn from_env() -> Result<OtlpOptions, OtlpError> {
        OtlpOptions::from_vars(|k| std::env::var(k).ok())
    }

    /// [`from_env`](OtlpOptions::from_env) with the variables looked up by `var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<OtlpOptions, OtlpError> {
        let get = |k: &str| var(k).filter(|v| !v.trim().is_empty());
        let mut o = OtlpOptions::new(DEFAULT_ENDPOINT)?;
        if let Some(url) = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            o.endpoint = Endpoint::parse("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &url, false)?;
        } else if let Some(url) = get("OTEL_EXPORTER_OTLP_ENDPOINT") {
            o.endpoint = Endpoint::parse("OTEL_EXPORTER_OTLP_ENDPOINT", &url, true)?;
        }
        for k in [
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        ] {
            if let Some(v) = get(k) {
                for (name, value) in parse_list(k, &v)? {
                    o = o.header_checked(k, &name, &value)?;
                }
            }
        }
        for k in [
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        ] {
            if let Some(v) = get(k)
                && v.trim() != "http/protobuf"
            {
                return Err(refuse(
                    k,
                    &v,
                    "only http/protobuf is supported (not grpc or http/json): unset it or set http/protobuf, and point the endpoint at the receiver's OTLP/HTTP port (4318, path /v1/traces)",
                ));
            }
        }
        // TLS settings: this exporter speaks plain HTTP only, so a certificate asked for would
        // silently not be used.
        for k in [
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
        ] {
            if let Some(v) = get(k)
                && !v.trim().is_empty()
            {
                return Err(refuse(
                    k,
                    &v,
                    "TLS is not supported by this exporter (plain http:// only): unset it and send to a local OpenTelemetry Collector, which forwards over TLS",
                ));
            }
        }
        for k in [
            "OTEL_EXPORTER_OTLP_COMPRESSION",
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
        ] {
            if let Some(v) = get(k)
                && v.trim() != "none"
            {
                return Err(refuse(k, &v, "only none is supported (not gzip)"));
            }
        }
        for k in [
            "OTEL_EXPORTER_OTLP_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        ] {
            if let Some(v) = get(k) {
                o.timeout = Duration::from_millis(positive(k, &v)?);
            }
        }
        if let Some(v) = get("OTEL_RESOURCE_ATTRIBUTES") {
            o.resource = parse_list("OTEL_RESOURCE_ATTRIBUTES", &v)?;
            if let Some((_, name)) = o.resource.iter().find(|(k, _)| k == "service.name") {
                o.service_name = name.clone();
            }
            o.resource.retain(|(k, _)| k != "service.name");
        }
        if let Some(v) = get("OTEL_SERVICE_NAME") {
            o.service_name = v;
        }
        if let Some(v) = get("OTEL_BSP_MAX_QUEUE_SIZE") {
            o.queue = positive("OTEL_BSP_MAX_QUEUE_SIZE", &v)? as usize;
        }
        if let Some(v) = get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") {
            o.batch = positive("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", &v)? as usize;
        }
        if let Some(v) = get("OTEL_BSP_SCHEDULE_DELAY") {
            o.interval = Duration::from_millis(positive("OTEL_BSP_SCHEDULE_DELAY", &v)?);
        }
        o.batch = o.batch.min(o.queue);
        Ok(o)
    }

    /// Sends to `base_url/v1/traces` instead (what `--otlp URL` does over the environment).
    pub fn endpoint(mut self, base_url: &str) -> Result<OtlpOptions, OtlpError> {
        self.endpoint = Endpoint::parse("--otlp", base_url, true)?;
        Ok(self)
    }

    /// Adds a request header (`--otlp-header K=V`; an API key), replacing one of that name.
    pub fn header(self, name: &str, value: &str) -> Result<OtlpOptions, OtlpError> {
        self.header_checked("--otlp-header", name, value)
    }

    fn header_checked(mut self, what: &str, name: &str, value: &str) -> Result<Self, OtlpError> {
        let shown = format!("{name}=…");
        hyper::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| refuse(what, &shown, "not a valid header name"))?;
        hyper::header::HeaderValue::from_str(value)
            .map_err(|_| refuse(what, &shown, "the value is not a valid header value"))?;
        let lower = name.to_ascii_lowercase();
        if ["host", "content-length", "content-type", "connection"].contains(&lower.as_str()) {
            return Err(refuse(what, &shown, "this header is set by the exporter"));
        }
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.push((name.to_string(), value.to_string()));
        Ok(self)
    }

    /// Parses `K=V` (the `--otlp-header` argument).
    pub fn parse_header(arg: &str) -> Result<(String, String), OtlpError> {
        match arg.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
            // The value may be a secret: never echo it.
            _ => Err(refuse("--otlp-header", "…", "expected NAME=VALUE")),
        }
    }

    /// `service.name` of the resource (default `prx-hooks`; `OTEL_SERVICE_NAME`).
    pub fn service_name(mut self, name: &str) -> Self {
        self.service_name = name.to_string();
        self
    }

    /// Adds a resource attribute (`OTEL_RESOURCE_ATTRIBUTES` holds more).
    pub fn resource_attribute(mut self, key: &str, value: &str) -> Self {
        self.resource.retain(|(k, _)| k != key);
        self.resource.push((key.to_string(), value.to_string()));
        self
    }

    /// Exports tool arguments and outputs, error messages' context and hooks' stderr tails
    /// (`--otlp-content`). Off by default: they may hold secrets.
    pub fn content(mut self, on: bool) -> Self {
        self.content = on;
        self
    }

    /// Spans held waiting for export (in batches being sent or retried too); beyond it new
    /// spans are dropped and counted.
    pub fn queue(mut self, spans: usize) -> Self {
        self.queue = spans.max(1);
        self.batch = self.batch.min(self.queue);
        self
    }

    /// Spans per request, and how long a partial batch waits.
    pub fn batch(mut self, spans: usize, interval: Duration) -> Self {
        self.batch = spans.clamp(1, self.queue);
        self.interval = interval.max(Duration::from_millis(1));
        self
    }

    /// One request's timeout (connect, send and answer), and for how long a batch is retried
    /// before it is dropped and counted.
    pub fn timeouts(mut self, request: Duration, retry_for: Duration) -> Self {
        self.timeout = request.max(Duration::from_millis(1));
        self.retry_for = retry_for;
        self
    }

    /// How long an emitter's open spans wait for their ends without any event from it; then
    /// they are ended with an error status and counted (`unmatched_starts`).
    pub fn idle_limit(mut self, limit: Duration) -> Self {
        self.idle_limit = limit;
        self
    }

    /// Bounds of the pairing state: open spans per emitter, emitters tracked.
    pub fn pairing_bounds(mut self, per_emitter: usize, emitters: usize) -> Self {
        self.max_open_per_emitter = per_emitter.max(1);
        self.max_emitters = emitters.max(1);
        self
    }

    /// Extra fields exported per event (as `prx.extra.<name>`), and the bytes kept of any one
    /// string attribute value.
    pub fn extras_bounds(mut self, fields: usize, value_bytes: usize) -> Self {
        self.max_extras = fields;
        self.max_value_bytes = value_bytes.max(16);
        self
    }

    /// Plugin calls exported as a span each, per plugin per second (100): past that rate the
    /// rest of the second's calls of that plugin are one aggregate span with their counts.
    /// 0 aggregates every call.
    pub fn plugin_spans(mut self, per_second: u32) -> Self {
        self.plugin_spans = per_second;
        self
    }

    /// The traces URL (`http://host:port/v1/traces`).
    pub fn traces_url(&self) -> String {
        self.endpoint.to_string()
    }
}

/// `k=v,k2=v2`, values percent-decoded (the format of `OTEL_EXPORTER_OTLP_HEADERS` and
/// `OTEL_RESOURCE_ATTRIBUTES`).
fn parse_list(what: &str, list: &str) -> Result<Vec<(String, String)>, OtlpError> {
    let mut out = Vec::new();
    for (i, item) in list.split(',').enumerate() {
        if item.trim().is_empty() {
            continue;
        }
        let Some((k, v)) = item.split_once('=') else {
            return Err(refuse(
                what,
                "…",
                format!("item {} has no '=' (expected key=value,…)", i + 1),
            ));
        };
        let v = percent_encoding::percent_decode_str(v.trim())
            .decode_utf8()
            .map_err(|_| refuse(what, "…", format!("item {}: the value is not UTF-8", i + 1)))?;
        out.push((k.trim().to_string(), v.into_owned()));
    }
    Ok(out)
}

fn positive(what: &str, v: &str) -> Result<u64, OtlpError> {
    match v.trim().parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(refuse(what, v, "expected a positive integer")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(list: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = list
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn the_base_endpoint_gets_v1_traces_and_the_traces_endpoint_is_kept() {
        let o = OtlpOptions::new("http://collector:4318").unwrap();
        assert_eq!(o.traces_url(), "http://collector:4318/v1/traces");
        let o = OtlpOptions::new("http://collector/otlp/").unwrap();
        assert_eq!(o.traces_url(), "http://collector:80/otlp/v1/traces");
        let o = OtlpOptions::from_vars(vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://b:2/custom"),
        ]))
        .unwrap();
        assert_eq!(o.traces_url(), "http://b:2/custom");
        let o = OtlpOptions::from_vars(vars(&[])).unwrap();
        assert_eq!(o.traces_url(), "http://localhost:4318/v1/traces");
    }

    #[test]
    fn headers_resource_and_bsp_variables_are_read_as_the_spec_says() {
        let o = OtlpOptions::from_vars(vars(&[
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=a%20b, x-team=one"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-team=two"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.name=svc,deployment.environment=dev",
            ),
            ("OTEL_SERVICE_NAME", "agents"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "100"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1000"),
        ]))
        .unwrap();
        assert_eq!(
            o.headers,
            vec![
                ("api-key".to_string(), "a b".to_string()),
                ("x-team".to_string(), "two".to_string())
            ]
        );
        assert_eq!(o.service_name, "agents");
        assert_eq!(
            o.resource,
            vec![("deployment.environment".to_string(), "dev".to_string())]
        );
        assert_eq!(o.timeout, Duration::from_millis(2500));
        assert_eq!((o.queue, o.batch), (100, 100));
    }

    #[test]
    fn refusals_name_the_variable_or_option_and_never_echo_a_header_value() {
        let e = OtlpOptions::new("https://api.honeycomb.io").unwrap_err();
        assert_eq!(e.what, "--otlp");
        assert!(e.reason.contains("TLS"), "{e}");
        let e =
            OtlpOptions::from_vars(vars(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")])).unwrap_err();
        assert_eq!(e.what, "OTEL_EXPORTER_OTLP_PROTOCOL");
        assert!(e.reason.contains("4318"), "{e}");
        let e = OtlpOptions::from_vars(vars(&[("OTEL_EXPORTER_OTLP_CERTIFICATE", "/ca.pem")]))
            .unwrap_err();
        assert_eq!(e.what, "OTEL_EXPORTER_OTLP_CERTIFICATE");
        assert!(e.reason.contains("TLS"), "{e}");
        let e = OtlpOptions::from_vars(vars(&[("OTEL_EXPORTER_OTLP_HEADERS", "a=1,secret")]))
            .unwrap_err();
        assert_eq!(e.what, "OTEL_EXPORTER_OTLP_HEADERS");
        assert!(e.reason.contains("item 2"), "{e}");
        assert!(!e.to_string().contains("secret"), "{e}");
        let e = OtlpOptions::from_vars(vars(&[("OTEL_BSP_SCHEDULE_DELAY", "soon")])).unwrap_err();
        assert_eq!(e.what, "OTEL_BSP_SCHEDULE_DELAY");
        let e = OtlpOptions::parse_header("novalue").unwrap_err();
        assert_eq!(e.what, "--otlp-header");
        let e = OtlpOptions::new("http://x:1")
            .unwrap()
            .header("bad name", "token-123")
            .unwrap_err();
        assert!(!e.to_string().contains("token-123"), "{e}");
        let o = OtlpOptions::new("http://x:1")
            .unwrap()
            .header("x-api-key", "key-456")
            .unwrap();
        let shown = format!("{o:?}");
        assert!(
            shown.contains("x-api-key") && !shown.contains("key-456"),
            "{shown}"
        );
        let e = OtlpOptions::new("http://user:pw@x:1").unwrap_err();
        assert!(e.reason.contains("header"), "{e}");
    }
}
