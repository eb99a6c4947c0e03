//! The library in a few lines: build the pipeline, subscribe, emit, read.
//!
//! Run with `cargo run --example subscribe`.

use prx_hooks::{Event, Hooks};
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let hooks = Hooks::builder().build()?;
    let sub = hooks.bus().subscribe("prx.lifecycle.*")?;
    let em = hooks.emitter("my-agent", "session-42");

    em.emit(Event::ToolCallStart {
        tool: "shell",
        arguments: r#"{"cmd":"ls"}"#,
    });
    em.emit(Event::ToolCall {
        tool: "shell",
        success: true,
        output: "Cargo.toml\nsrc\n",
    });

    for _ in 0..2 {
        let msg = sub.recv_timeout(Duration::from_secs(1))?;
        println!("{} #{} {}", msg.topic(), msg.seq(), msg.json_str());
    }
    hooks.shutdown(Duration::from_secs(2));
    println!("{}", serde_json::to_string_pretty(&hooks.stats())?);
    Ok(())
}
