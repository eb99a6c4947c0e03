//! An agent host that serves the HTTP API beside its own loop, without an async runtime of its
//! own: the API creates a hook, and the host's next event runs it.
//!
//! Run with `cargo run --example api`; it prints the requests it makes and what the hook did.

use prx_hooks::http::{HttpOptions, Server, Token};
use prx_hooks::{Event, Hooks};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ws = std::env::temp_dir().join(format!("prx-hooks-api-example-{}", std::process::id()));
    std::fs::create_dir_all(&ws)?;
    let hooks = Arc::new(Hooks::builder().workspace(&ws).build()?);

    // The token would come from your secret store; here, a fresh random one.
    let token = Token::generate()?;
    let server = Server::start(
        hooks.clone(),
        HttpOptions::new(token.clone()),
        "127.0.0.1:0".parse()?,
    )?;
    let addr = server.local_addr();
    println!("API on http://{addr}");

    // A client (any HTTP client; a raw request keeps the example dependency-free).
    let log = ws.join("tool-calls.log");
    let hook = serde_json::json!({
        "id": "log-tool-calls",
        "event": "tool_call",
        "command": "/bin/sh",
        "args": ["-c", format!("cat >> {}; echo >> {}", log.display(), log.display())],
        "stdin_json": true,
    });
    let reply = request(addr, &token, "POST", "/api/hooks", Some(&hook.to_string()))?;
    println!("POST /api/hooks -> {}", reply.lines().next().unwrap_or(""));

    // The hook is live as soon as the API answered: the next event runs it.
    hooks
        .emitter("my-agent", "session-1")
        .emit(Event::ToolCall {
            tool: "shell",
            success: true,
            output: "hello from the agent",
        });
    let deadline = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(&log).is_ok_and(|s| s.ends_with('\n')) {
        if Instant::now() > deadline {
            return Err("the hook did not run".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    print!("the hook wrote: {}", std::fs::read_to_string(&log)?);

    let runs = request(addr, &token, "GET", "/api/hooks/log-tool-calls/runs", None)?;
    println!("GET …/runs -> {}", runs.lines().last().unwrap_or(""));

    drop(server);
    hooks.shutdown(Duration::from_secs(2));
    std::fs::remove_dir_all(&ws)?;
    Ok(())
}

/// One HTTP/1.1 request; returns the status line, headers and body as text.
fn request(
    addr: std::net::SocketAddr,
    token: &Token,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> std::io::Result<String> {
    let mut s = TcpStream::connect(addr)?;
    let body = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        token.as_str(),
        body.len()
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}
