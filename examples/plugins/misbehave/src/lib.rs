//! `misbehave`: a TEST-ONLY guest whose behaviour is chosen by `[config] mode`.
//!
//! The mode is read once per instance and cached; an unknown or missing mode makes every call
//! return `Err`. Modes:
//!
//! | mode          | on every `on-event`                                                          |
//! |---------------|------------------------------------------------------------------------------|
//! | `noop`        | `Ok(())` (benches)                                                           |
//! | `loop`        | spins forever (fuel / epoch deadline must stop it)                           |
//! | `memhog`      | allocates 1 MiB at a time until refused → `Err("memory refused after N MiB")` |
//! | `trap`        | executes `unreachable` (a real trap)                                         |
//! | `err`         | `Err("guest error: as requested")`                                           |
//! | `republish`   | first call subscribes to `topic` (default `loop.ping`); every call bumps kv `calls` and publishes `{"n":<calls>}` to `topic` |
//! | `subscribe`   | first call subscribes to `pattern` and publishes `{"id":<id>}` to `misbehave.subscribed`; later calls sleep `sleep_ms` (default 0) |
//! | `unsubscribe` | unsubscribes the id found after `"id":` in the payload, publishes `{"id":..,"ok":..}` to `misbehave.unsubscribe` |
//! | `escape`      | tries files, env and network; `Ok` only if everything is denied             |
//! | `stdio`       | one line to stdout and one to stderr                                         |
//! | `config`      | publishes all config pairs as a JSON object to `misbehave.config`             |
//! | `sleep`       | `std::thread::sleep(sleep_ms)` (default an hour): blocks in `wasi:io/poll`    |
//! | `flaky`       | alternates: the 1st, 3rd, 5th… call traps, the others succeed (count in kv `flaky`) |
//! | `logflood`    | `count` (default: until stopped) `log` lines of `size` bytes (default 100), each also to stderr |
//! | `kvfill`      | sets `count` keys `<prefix><n>` (default prefix `k`) with empty values, from kv `next.<prefix>` on (refused → `Err`) |
//! | `count`       | adds 1 to the decimal kv value `n.<event>` (a get then a set)                  |
//! | `kvset`       | sets kv `key` (default `big`) to `size` bytes (default 1 MiB) of `x`           |
//! | `kvget`       | gets kv `key` (default `big`); `Err` with its length (or "absent")             |
//! | `listkeys`    | lists the kv keys starting with `prefix` (default ``); `Err` with their count  |
//! | `random`      | asks `wasi:random` for `size` bytes (default 2 MiB) at once; `Err` with how many came |
//! | `biglog`      | one `log` line of `size` bytes (default 8 MiB)                                 |
//! | `publish`     | publishes `payload` (default `not json`), or `size` bytes of `z`, to `topic` (default `misbehave.out`) |
//! | `handles`     | opens `count` (default 100,000) `wasi:cli/stdout` streams, writes `size` bytes (default 0) of `h` without a newline to each, and never closes them; `Err` with how many |
//!
//! `start = "sleep" | "loop" | "trap"` in `[config]` misbehaves at instantiation instead, in the
//! module's `_initialize` (which the component runs as it starts, before any `on-event`).
//!
//! With `only = "<event>"` in `[config]` the mode applies to that event only; every other event
//! returns `Ok(())` (so a test can check that the call after a fault works). `escape` connects to
//! `connect` (default `127.0.0.1:1`).
//!
//! Build with `examples/build-plugins.sh`.

wit_bindgen::generate!({
    path: "../../../wit",
    world: "hook",
    generate_all,
});

/// `wasi:random/random` called directly (std asks for a few bytes at a time; `random` asks for
/// more than the host allows at once).
mod wasi_random {
    wit_bindgen::generate!({
        inline: "
            package misbehave:random;
            package wasi:random@0.2.0 {
                interface random {
                    get-random-bytes: func(len: u64) -> list<u8>;
                    get-random-u64: func() -> u64;
                }
            }
            world r { import wasi:random/random@0.2.0; }
        ",
        world: "r",
        generate_all,
    });
}

/// `wasi:cli/stdout` (and `wasi:io`, which it uses), called directly (std opens one
/// stream; `handles` opens many and keeps them).
mod wasi_stdout {
    wit_bindgen::generate!({
        inline: "
            package misbehave:stdout;
            package wasi:io@0.2.0 {
                interface error {
                    resource error {
                        to-debug-string: func() -> string;
                    }
                }
                interface poll {
                    resource pollable {
                        ready: func() -> bool;
                        block: func();
                    }
                    poll: func(in: list<borrow<pollable>>) -> list<u32>;
                }
                interface streams {
                    use error.{error};
                    use poll.{pollable};
                    variant stream-error {
                        last-operation-failed(error),
                        closed,
                    }
                    resource input-stream {
                        read: func(len: u64) -> result<list<u8>, stream-error>;
                        blocking-read: func(len: u64) -> result<list<u8>, stream-error>;
                        skip: func(len: u64) -> result<u64, stream-error>;
                        blocking-skip: func(len: u64) -> result<u64, stream-error>;
                        subscribe: func() -> pollable;
                    }
                    resource output-stream {
                        check-write: func() -> result<u64, stream-error>;
                        write: func(contents: list<u8>) -> result<_, stream-error>;
                        blocking-write-and-flush: func(contents: list<u8>) -> result<_, stream-error>;
                        flush: func() -> result<_, stream-error>;
                        blocking-flush: func() -> result<_, stream-error>;
                        subscribe: func() -> pollable;
                        write-zeroes: func(len: u64) -> result<_, stream-error>;
                        blocking-write-zeroes-and-flush: func(len: u64) -> result<_, stream-error>;
                        splice: func(src: borrow<input-stream>, len: u64) -> result<u64, stream-error>;
                        blocking-splice: func(src: borrow<input-stream>, len: u64) -> result<u64, stream-error>;
                    }
                }
            }
            package wasi:cli@0.2.0 {
                interface stdout {
                    use wasi:io/streams@0.2.0.{output-stream};
                    get-stdout: func() -> output-stream;
                }
            }
            world s { import wasi:cli/stdout@0.2.0; }
        ",
        world: "s",
        generate_all,
    });
}

use exports::prx::plugin::hook_exports::Guest;
use prx::host::{config, events, kv};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

enum Mode {
    Noop,
    Loop,
    Memhog,
    Trap,
    Err,
    Republish,
    Subscribe,
    Unsubscribe,
    Escape,
    Stdio,
    Config,
    Sleep,
    Flaky,
    LogFlood,
    KvFill,
    Count,
    Publish,
    KvSet,
    KvGet,
    ListKeys,
    Random,
    BigLog,
    Handles,
    Unknown(String),
}

static MODE: OnceLock<Mode> = OnceLock::new();
/// `republish` / `subscribe`: whether the first call's subscription succeeded.
static SUBSCRIBED: AtomicBool = AtomicBool::new(false);

fn mode() -> &'static Mode {
    MODE.get_or_init(|| match config::get("mode").as_deref() {
        Some("noop") => Mode::Noop,
        Some("loop") => Mode::Loop,
        Some("memhog") => Mode::Memhog,
        Some("trap") => Mode::Trap,
        Some("err") => Mode::Err,
        Some("republish") => Mode::Republish,
        Some("subscribe") => Mode::Subscribe,
        Some("unsubscribe") => Mode::Unsubscribe,
        Some("escape") => Mode::Escape,
        Some("stdio") => Mode::Stdio,
        Some("config") => Mode::Config,
        Some("sleep") => Mode::Sleep,
        Some("flaky") => Mode::Flaky,
        Some("logflood") => Mode::LogFlood,
        Some("kvfill") => Mode::KvFill,
        Some("count") => Mode::Count,
        Some("publish") => Mode::Publish,
        Some("kvset") => Mode::KvSet,
        Some("kvget") => Mode::KvGet,
        Some("listkeys") => Mode::ListKeys,
        Some("random") => Mode::Random,
        Some("biglog") => Mode::BigLog,
        Some("handles") => Mode::Handles,
        Some(other) => Mode::Unknown(format!("misbehave: unknown mode {}", json_string(other))),
        None => Mode::Unknown("misbehave: config key `mode` is missing".into()),
    })
}

struct Misbehave;

impl Guest for Misbehave {
    fn on_event(event: String, payload_json: String) -> Result<(), String> {
        // `only = "<event>"`: misbehave for that event, succeed quietly for every other one.
        static ONLY: OnceLock<Option<String>> = OnceLock::new();
        if ONLY
            .get_or_init(|| config::get("only"))
            .as_ref()
            .is_some_and(|only| *only != event)
        {
            return Ok(());
        }
        match mode() {
            Mode::Noop => Ok(()),
            Mode::Loop => spin(),
            Mode::Memhog => memhog(),
            Mode::Trap => core::arch::wasm32::unreachable(),
            Mode::Err => Err("guest error: as requested".into()),
            Mode::Republish => republish(),
            Mode::Subscribe => subscribe(),
            Mode::Unsubscribe => unsubscribe(&payload_json),
            Mode::Escape => escape(),
            Mode::Stdio => {
                println!("stdout line from misbehave");
                eprintln!("stderr line from misbehave");
                Ok(())
            }
            Mode::Config => {
                let pairs: Vec<String> = config::get_all()
                    .iter()
                    .map(|(k, v)| format!("{}:{}", json_string(k), json_string(v)))
                    .collect();
                events::publish("misbehave.config", &format!("{{{}}}", pairs.join(",")))
            }
            Mode::Sleep => {
                std::thread::sleep(std::time::Duration::from_millis(number(
                    "sleep_ms", 3_600_000,
                )));
                Ok(())
            }
            Mode::Flaky => {
                // The count lives in kv: a trap replaces the instance (and its statics).
                let n = kv_number("flaky");
                kv::set("flaky", (n + 1).to_string().as_bytes())?;
                if n.is_multiple_of(2) {
                    core::arch::wasm32::unreachable()
                }
                Ok(())
            }
            Mode::LogFlood => {
                let line = "x".repeat(number("size", 100) as usize);
                for _ in 0..number("count", u64::MAX) {
                    prx::host::log::log(prx::host::log::Level::Info, &line);
                    eprintln!("{line}");
                }
                Ok(())
            }
            Mode::KvFill => {
                let prefix = config::get("prefix").unwrap_or_else(|| "k".into());
                let next = format!("next.{prefix}");
                let from = kv_number(&next);
                let count = number("count", 1000);
                for n in from..from + count {
                    kv::set(&format!("{prefix}{n}"), &[])?;
                }
                kv::set(&next, (from + count).to_string().as_bytes())
            }
            Mode::Count => {
                let key = format!("n.{event}");
                kv::set(&key, (kv_number(&key) + 1).to_string().as_bytes())
            }
            Mode::KvSet => kv::set(
                &config::get("key").unwrap_or_else(|| "big".into()),
                &vec![b'x'; number("size", 1 << 20) as usize],
            ),
            Mode::KvGet => {
                let key = config::get("key").unwrap_or_else(|| "big".into());
                Err(match kv::get(&key) {
                    Some(v) => format!("kv.get {key}: {} bytes", v.len()),
                    None => format!("kv.get {key}: absent"),
                })
            }
            Mode::ListKeys => Err(format!(
                "list-keys: {} keys",
                kv::list_keys(&config::get("prefix").unwrap_or_default()).len()
            )),
            Mode::Random => Err(format!(
                "random: {} bytes",
                wasi_random::wasi::random::random::get_random_bytes(number("size", 2 << 20)).len()
            )),
            Mode::BigLog => {
                let line = "y".repeat(number("size", 8 << 20) as usize);
                prx::host::log::log(prx::host::log::Level::Info, &line);
                Ok(())
            }
            Mode::Publish => events::publish(
                &config::get("topic").unwrap_or_else(|| "misbehave.out".into()),
                &match config::get("size") {
                    Some(_) => "z".repeat(number("size", 0) as usize),
                    None => config::get("payload").unwrap_or_else(|| "not json".into()),
                },
            ),
            Mode::Handles => {
                let bytes = vec![b'h'; number("size", 0) as usize];
                let count = number("count", 100_000);
                for n in 0..count {
                    let out = wasi_stdout::wasi::cli::stdout::get_stdout();
                    if !bytes.is_empty() && out.write(&bytes).is_err() {
                        return Err(format!("handles: write {n} failed"));
                    }
                    // Never closed: the host keeps the stream until the instance goes.
                    std::mem::forget(out);
                }
                Err(format!("handles: {count} opened"))
            }
            Mode::Unknown(message) => Err(message.clone()),
        }
    }
}

/// A decimal `[config]` value, or `default`.
fn number(key: &str, default: u64) -> u64 {
    config::get(key)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// A decimal kv value (0 when absent).
fn kv_number(key: &str) -> u64 {
    kv::get(key)
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// `start = "…"`: runs while the component is instantiated, before any export: wit-component
/// makes a core module's `_initialize` export the component's start function.
#[unsafe(export_name = "_initialize")]
pub extern "C" fn at_start() {
    match config::get("start").as_deref() {
        Some("sleep") => std::thread::sleep(std::time::Duration::from_secs(3600)),
        Some("loop") => spin(),
        Some("trap") => core::arch::wasm32::unreachable(),
        _ => {}
    }
}

fn spin() -> ! {
    let mut i = 0u64;
    loop {
        i = core::hint::black_box(i.wrapping_add(1));
    }
}

fn memhog() -> Result<(), String> {
    const MIB: usize = 1 << 20;
    // 1 MiB chunks rather than one growing Vec: reallocating a single buffer needs old + new at
    // once, so it would be refused at about half the limit; chunks get within ~1 MiB of it.
    let mut hog: Vec<Vec<u8>> = Vec::with_capacity(4096);
    for n in 0..4096 {
        let mut chunk = Vec::new();
        if chunk.try_reserve_exact(MIB).is_err() {
            return Err(format!("memory refused after {n} MiB"));
        }
        // Touch the new MiB so it is really backed.
        chunk.resize(MIB, 0xA5);
        hog.push(core::hint::black_box(chunk));
    }
    Ok(())
}

fn republish() -> Result<(), String> {
    let topic = config::get("topic").unwrap_or_else(|| "loop.ping".into());
    if !SUBSCRIBED.load(Ordering::Relaxed) {
        events::subscribe(&topic).map_err(|e| format!("subscribe {topic}: {e}"))?;
        SUBSCRIBED.store(true, Ordering::Relaxed);
    }
    let calls = kv::get("calls")
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0)
        + 1;
    kv::set("calls", calls.to_string().as_bytes())?;
    events::publish(&topic, &format!(r#"{{"n":{calls}}}"#))
}

fn subscribe() -> Result<(), String> {
    if SUBSCRIBED.load(Ordering::Relaxed) {
        // Later calls (the subscription's messages among them) take `sleep_ms` (default 0),
        // so that a test can fill the instance's subscription queue.
        let ms = number("sleep_ms", 0);
        if ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        return Ok(());
    }
    let pattern = config::get("pattern").ok_or("misbehave: config key `pattern` is missing")?;
    let id = events::subscribe(&pattern).map_err(|e| format!("subscribe {pattern}: {e}"))?;
    SUBSCRIBED.store(true, Ordering::Relaxed);
    events::publish("misbehave.subscribed", &format!(r#"{{"id":{id}}}"#))
}

fn unsubscribe(payload: &str) -> Result<(), String> {
    let id = find_id(payload).ok_or("misbehave: no \"id\":<u64> in payload")?;
    let message = match events::unsubscribe(id) {
        Ok(()) => format!(r#"{{"id":{id},"ok":true}}"#),
        Err(e) => format!(r#"{{"id":{id},"ok":false,"error":{}}}"#, json_string(&e)),
    };
    events::publish("misbehave.unsubscribe", &message)?;
    Ok(())
}

/// The first unsigned integer that follows a `"id":` (whitespace allowed after the colon).
fn find_id(json: &str) -> Option<u64> {
    let mut rest = json;
    while let Some(at) = rest.find("\"id\":") {
        rest = &rest[at + 5..];
        let value = rest.trim_start_matches([' ', '\t', '\n', '\r']);
        let digits = value.len() - value.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if let Ok(id) = value[..digits].parse() {
            return Some(id);
        }
    }
    None
}

fn escape() -> Result<(), String> {
    let mut leaks = Vec::new();
    if let Ok(s) = std::fs::read_to_string("/etc/hostname") {
        leaks.push(format!("read /etc/hostname ({} bytes)", s.len()));
    }
    if let Ok(dir) = std::fs::read_dir("/") {
        leaks.push(format!("listed / ({} entries)", dir.count()));
    }
    let vars = std::env::vars().count();
    if vars > 0 {
        leaks.push(format!("{vars} environment variables"));
    }
    // `connect`: an address the test listens on (so a refusal means the sandbox, not a closed port).
    let addr = config::get("connect").unwrap_or_else(|| "127.0.0.1:1".into());
    if std::net::TcpStream::connect(addr.as_str()).is_ok() {
        leaks.push(format!("connected to {addr}"));
    }
    if leaks.is_empty() {
        Ok(())
    } else {
        Err(format!("sandbox leaked: {}", leaks.join("; ")))
    }
}

/// `s` as a quoted JSON string (RFC 8259: escapes `"`, `\` and control characters).
fn json_string(s: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c < ' ' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

export!(Misbehave);
