//! Event intake from outside the process: the session map and the NDJSON line ingest that
//! every ingest path shares (`run --events`, and whatever else feeds lines in).
//!
//! * [`Sessions`] ([`Hooks::sessions`](crate::Hooks::sessions)): one [`Emitter`](crate::Emitter)
//!   per (agent, session), shared by every ingest path of one `Hooks`, held while it is in use
//!   or has events in the ring and released when idle, bounded in number and in bytes, with
//!   each key's `seq` remembered across a release.
//! * [`LineIngest`]: an NDJSON line → [`ndjson::parse_line_with`](crate::ndjson::parse_line_with)
//!   (agent and session names of at most [`MAX_NAME_BYTES`](crate::ndjson::MAX_NAME_BYTES))
//!   → the oversize check → an emit through [`Sessions`], counted per line in an
//!   [`IngestReport`] (what an HTTP route answers: `{"queued", "dropped", "skipped",
//!   "refused", "errors", "more_errors"}`).
//!
//! The rules and what proves them: ARCHITECTURE.md § Ingest.

mod lines;
mod memory;
pub(crate) mod pace;
mod seen;
mod sessions;
mod tokens;
mod transcripts;

pub use lines::{
    IngestError, IngestErrorKind, IngestOptions, IngestReport, Ingested, LineIngest, LineOrigin,
    OnSettled, Outcome,
};
pub(crate) use seen::Seen;
pub use seen::{EventIdStats, MAX_ID_BYTES, STATS_SECTION as EVENT_IDS_SECTION};
pub use sessions::{
    ENTRY_BYTES, HeldSession, Refused, STATS_SECTION, SessionEmitter, SessionOptions, Sessions,
    SessionsStats,
};
pub use tokens::{AgentTokens, MAX_AGENTS as MAX_TOKEN_AGENTS, OTHER_AGENTS, Tokens};
pub use transcripts::{
    DerivedLine, MAX_FILES as MAX_TRANSCRIPTS, MAX_READ_BYTES as MAX_TRANSCRIPT_READ_BYTES,
    STATS_SECTION as TRANSCRIPTS_SECTION, TranscriptStats, Transcripts,
};

#[cfg(all(test, loom))]
mod loom_tests;
