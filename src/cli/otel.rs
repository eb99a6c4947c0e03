//! `prx-hooks run --otlp [URL] …`: the CLI side of the OpenTelemetry exporter (docs/otel.md).
//! The flags, the `OTEL_*` variables and the builder wiring in one place.

#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

use clap::Args;
use prx_hooks::HooksBuilder;
use prx_hooks::otel::OtlpOptions;
use std::time::Duration;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The OpenTelemetry flags of `run`.
#[derive(Args, Default, Debug)]
pub(crate) struct OtelArgs {
    /// Export the lifecycle as OpenTelemetry GenAI spans (and every hook run as a child span)
    /// over OTLP/HTTP protobuf to URL/v1/traces. Without URL: OTEL_EXPORTER_OTLP_ENDPOINT,
    /// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or http://localhost:4318. The other OTEL_EXPORTER_OTLP_*,
    /// OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES and OTEL_BSP_* variables are read too.
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    pub(crate) otlp: Option<String>,
    /// A request header for the OTLP receiver (an API key), NAME=VALUE; repeatable. Wins over
    /// OTEL_EXPORTER_OTLP_HEADERS for the same name.
    #[arg(long, value_name = "NAME=VALUE", requires = "otlp")]
    pub(crate) otlp_header: Vec<String>,
    /// Export tool arguments and outputs and hooks' stderr tails (they may hold secrets).
    #[arg(long, requires = "otlp")]
    pub(crate) otlp_content: bool,
}

/// How long `run` gives the exporter to send what it holds when the input ends.
pub(crate) const FLUSH: Duration = Duration::from_secs(2);

impl OtelArgs {
    /// Whether `--otlp` was given.
    pub(crate) fn exports(&self) -> bool {
        self.otlp.is_some()
    }

    /// Adds the exporter to `builder`: options from the `OTEL_*` variables, then the flags.
    pub(crate) fn apply(&self, builder: HooksBuilder) -> Result<HooksBuilder, BoxError> {
        let Some(url) = &self.otlp else {
            return Ok(builder);
        };
        let mut o = OtlpOptions::from_env()?;
        if !url.is_empty() {
            o = o.endpoint(url)?;
        }
        for h in &self.otlp_header {
            let (name, value) = OtlpOptions::parse_header(h)?;
            o = o.header(&name, &value)?;
        }
        o = o.content(self.otlp_content);
        tracing::info!("OpenTelemetry: spans to {}", o.traces_url());
        Ok(builder.otlp(o))
    }
}
