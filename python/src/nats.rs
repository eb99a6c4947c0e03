//! `NatsPublish` and `NatsConsume`: the NATS bridge's options (docs/nats.md § NATS), for
//! `Hooks(nats=…, from_nats=…)`. A plain URL string there means these with their defaults.

use crate::seconds;
use prx_hooks::nats::{ConsumeOptions, NatsOptions, PublishOptions};
use prx_hooks::ndjson::ParseOptions;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::path::PathBuf;

/// How to reach the server: `url` (several comma-separated), credentials, TLS.
#[derive(Clone, Default)]
struct Connection {
    url: String,
    creds: Option<PathBuf>,
    tls: bool,
    tls_ca: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
}

impl Connection {
    fn new(
        url: String,
        creds: Option<PathBuf>,
        tls: bool,
        tls_ca: Option<PathBuf>,
        tls_cert: Option<PathBuf>,
        tls_key: Option<PathBuf>,
    ) -> PyResult<Connection> {
        if tls_cert.is_some() != tls_key.is_some() {
            return Err(PyValueError::new_err(
                "tls_cert= and tls_key= go together: a client certificate needs its key",
            ));
        }
        Ok(Connection {
            url,
            creds,
            tls,
            tls_ca,
            tls_cert,
            tls_key,
        })
    }

    fn options(&self) -> NatsOptions {
        let mut o = NatsOptions::new(&self.url).require_tls(self.tls);
        if let Some(c) = &self.creds {
            o = o.creds_file(c);
        }
        if let Some(ca) = &self.tls_ca {
            o = o.tls_ca(ca);
        }
        if let (Some(c), Some(k)) = (&self.tls_cert, &self.tls_key) {
            o = o.tls_client_cert(c, k);
        }
        o
    }
}

/// Publish the bus to NATS: `NatsPublish("nats://127.0.0.1:4222", stream="PRX")`.
///
/// `pattern`: which bus messages (the bus's syntax; default `prx.lifecycle.*`); `prefix`:
/// subjects become `<prefix>.<topic>`; `stream`: publish to this JetStream stream and wait
/// for its acks (created if missing); `buffer`: messages held while the server is unreachable
/// (default 65,536; then dropped and counted); `window`: sent but unconfirmed at once
/// (default 4,096).
#[pyclass(frozen, module = "prx_hooks", name = "NatsPublish")]
pub struct PyNatsPublish {
    conn: Connection,
    pattern: Option<String>,
    prefix: Option<String>,
    stream: Option<String>,
    buffer: Option<usize>,
    window: Option<usize>,
}

impl PyNatsPublish {
    pub(crate) fn from_url(url: &str) -> PyNatsPublish {
        PyNatsPublish {
            conn: Connection {
                url: url.into(),
                ..Connection::default()
            },
            pattern: None,
            prefix: None,
            stream: None,
            buffer: None,
            window: None,
        }
    }

    pub(crate) fn options(&self) -> PublishOptions {
        let mut p = PublishOptions::new(self.conn.options());
        if let Some(x) = &self.pattern {
            p = p.pattern(x);
        }
        if let Some(x) = &self.prefix {
            p = p.prefix(x);
        }
        if let Some(x) = &self.stream {
            p = p.stream(x);
        }
        if let Some(x) = self.buffer {
            p = p.buffer(x);
        }
        if let Some(x) = self.window {
            p = p.window(x);
        }
        p
    }
}

#[pymethods]
impl PyNatsPublish {
    #[new]
    #[pyo3(signature = (url, *, pattern=None, prefix=None, stream=None, buffer=None, window=None,
                        creds=None, tls=false, tls_ca=None, tls_cert=None, tls_key=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        url: String,
        pattern: Option<String>,
        prefix: Option<String>,
        stream: Option<String>,
        buffer: Option<usize>,
        window: Option<usize>,
        creds: Option<PathBuf>,
        tls: bool,
        tls_ca: Option<PathBuf>,
        tls_cert: Option<PathBuf>,
        tls_key: Option<PathBuf>,
    ) -> PyResult<PyNatsPublish> {
        Ok(PyNatsPublish {
            conn: Connection::new(url, creds, tls, tls_ca, tls_cert, tls_key)?,
            pattern,
            prefix,
            stream,
            buffer,
            window,
        })
    }

    fn __repr__(&self) -> String {
        format!("<prx_hooks.NatsPublish {:?}>", self.options())
    }
}

/// Feed events from NATS into this pipeline: `NatsConsume("nats://…", durable="hooks")`.
///
/// `subject`: NATS's syntax (default `prx.lifecycle.>`); `durable`: a JetStream durable pull
/// consumer of this name (acks, redelivery, back-pressure); `stream`: the stream it reads
/// (default: the one holding the subject); `dedup_ids` / `dedup_age`: message ids remembered
/// to skip duplicates (100,000, 3600 s); `dedup_file`: keep them across restarts;
/// `max_deliver`: deliveries before a durable consumer gives up on a message (5); `lenient`:
/// accept events missing documented fields; `insecure`: consume from a server beyond this
/// machine without credentials.
#[pyclass(frozen, module = "prx_hooks", name = "NatsConsume")]
pub struct PyNatsConsume {
    conn: Connection,
    insecure: bool,
    subject: Option<String>,
    durable: Option<String>,
    stream: Option<String>,
    dedup: Option<(usize, std::time::Duration)>,
    dedup_file: Option<PathBuf>,
    max_deliver: Option<u32>,
    lenient: bool,
}

impl PyNatsConsume {
    pub(crate) fn from_url(url: &str) -> PyNatsConsume {
        PyNatsConsume {
            conn: Connection {
                url: url.into(),
                ..Connection::default()
            },
            insecure: false,
            subject: None,
            durable: None,
            stream: None,
            dedup: None,
            dedup_file: None,
            max_deliver: None,
            lenient: false,
        }
    }

    pub(crate) fn options(&self) -> ConsumeOptions {
        let mut c = ConsumeOptions::new(self.conn.options().insecure(self.insecure));
        if let Some(x) = &self.subject {
            c = c.subject(x);
        }
        if let Some(x) = &self.durable {
            c = c.durable(x);
        }
        if let Some(x) = &self.stream {
            c = c.stream(x);
        }
        if let Some((ids, age)) = self.dedup {
            c = c.dedup_window(ids, age);
        }
        if let Some(x) = &self.dedup_file {
            c = c.dedup_file(x);
        }
        if let Some(x) = self.max_deliver {
            c = c.max_deliver(x);
        }
        if self.lenient {
            c = c.parse_options(ParseOptions::lenient());
        }
        c
    }
}

#[pymethods]
impl PyNatsConsume {
    #[new]
    #[pyo3(signature = (url, *, subject=None, durable=None, stream=None, dedup_ids=100_000,
                        dedup_age=3600.0, dedup_file=None, max_deliver=None, lenient=false,
                        insecure=false, creds=None, tls=false, tls_ca=None, tls_cert=None,
                        tls_key=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        url: String,
        subject: Option<String>,
        durable: Option<String>,
        stream: Option<String>,
        dedup_ids: usize,
        dedup_age: f64,
        dedup_file: Option<PathBuf>,
        max_deliver: Option<u32>,
        lenient: bool,
        insecure: bool,
        creds: Option<PathBuf>,
        tls: bool,
        tls_ca: Option<PathBuf>,
        tls_cert: Option<PathBuf>,
        tls_key: Option<PathBuf>,
    ) -> PyResult<PyNatsConsume> {
        Ok(PyNatsConsume {
            conn: Connection::new(url, creds, tls, tls_ca, tls_cert, tls_key)?,
            insecure,
            subject,
            durable,
            stream,
            dedup: Some((dedup_ids, seconds(dedup_age, "dedup_age")?)),
            dedup_file,
            max_deliver,
            lenient,
        })
    }

    fn __repr__(&self) -> String {
        format!("<prx_hooks.NatsConsume {:?}>", self.options())
    }
}
