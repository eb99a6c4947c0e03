//! Fake model servers for the agents' real CLIs (tests/agents): Anthropic's Messages API (SSE),
//! OpenAI's Responses API (SSE) and Chat Completions API (SSE or JSON), and Gemini's
//! `streamGenerateContent` (SSE) with its `generateContent` (JSON), each on a loopback port of
//! its own.
//!
//! Each answers a [`Script`]: while the conversation holds no tool result, a request that offers
//! the agent's shell tool gets one call of it with the script's command; every other request gets
//! the script's final text. Every request is recorded (method, path, headers, JSON body, what was
//! answered) for the tests' assertions and for the failure messages.

#![allow(dead_code)] // each test binary uses a different subset

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// The wire format a server speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/messages` (Claude Code), streamed as server-sent events.
    Anthropic,
    /// `POST /v1/responses` (Codex's `wire_api = "responses"`), streamed.
    OpenAiResponses,
    /// `POST /v1/chat/completions` (the OpenAI-compatible providers of Qwen Code, Cline and
    /// Factory Droid), streamed or not as the request asks.
    OpenAiChat,
    /// `POST /v1beta/models/M:streamGenerateContent?alt=sse` (Gemini CLI), and the JSON
    /// `:generateContent` its model router asks first.
    Gemini,
}

/// What the model does in one session.
#[derive(Clone, Debug)]
pub struct Script {
    /// The shell command of the one tool call.
    pub command: String,
    /// The final text, after the tool's result came back.
    pub answer: String,
    /// How long each answer of the script (the tool call, the final text) waits before it is
    /// sent: it puts time between the agent's events before a model call and those after.
    pub pause: Duration,
    /// How many times the shell tool is called, one call per model request, before the final
    /// text (Anthropic's Messages API only; the others call it once).
    pub calls: usize,
}

impl Script {
    /// One call of the shell tool running `command`, then `answer`.
    pub fn shell(command: &str, answer: &str) -> Script {
        Script {
            command: command.into(),
            answer: answer.into(),
            pause: Duration::ZERO,
            calls: 1,
        }
    }
}

/// What a request got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The script's tool call.
    ToolCall,
    /// The script's final text.
    Text,
    /// Gemini's router: a JSON verdict.
    Route,
    /// A token count.
    Count,
    /// 404 (a path this fake does not serve).
    NotFound,
}

/// One request as the server read it.
#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    /// The request target, query included.
    pub path: String,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    /// The body parsed as JSON (`Null` when empty or not JSON).
    pub body: Value,
    pub answer: Answer,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A fake model server on `127.0.0.1:<port>`; stopped when dropped.
pub struct ModelServer {
    api: Api,
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl ModelServer {
    pub fn start(api: Api, script: Script) -> ModelServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let script = Arc::new(script);
        let acceptor = {
            let (requests, stop) = (requests.clone(), stop.clone());
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(conn) = conn else { continue };
                    let (requests, script) = (requests.clone(), script.clone());
                    std::thread::spawn(move || serve(api, conn, &script, &requests));
                }
            })
        };
        ModelServer {
            api,
            addr,
            requests,
            stop,
            acceptor: Some(acceptor),
        }
    }

    /// `http://127.0.0.1:PORT` (no path: each agent adds its own).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request so far, in the order they were read.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }

    /// The requests, one line each (method, path, answer), for failure messages.
    pub fn summary(&self) -> String {
        self.requests()
            .iter()
            .map(|r| format!("{:?}: {} {} -> {:?}", self.api, r.method, r.path, r.answer))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the acceptor, which then sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }
}

/// The most a request's head or body may hold (an agent's request carries its whole prompt and
/// tool list: hundreds of KiB).
const MAX_BODY: usize = 64 << 20;

/// Serves one connection: requests one after another (keep-alive) until the client closes it.
fn serve(api: Api, conn: TcpStream, script: &Script, requests: &Mutex<Vec<Request>>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(120)));
    let mut writer = match conn.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut reader = BufReader::new(conn);
    while let Some((method, path, headers, body)) = read_request(&mut reader) {
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let (answer, status, content_type, text) = respond(api, &method, &path, &body, script);
        if matches!(answer, Answer::ToolCall | Answer::Text) {
            std::thread::sleep(script.pause);
        }
        requests.lock().unwrap().push(Request {
            method,
            path,
            headers,
            body,
            answer,
        });
        let head = format!(
            "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\ncache-control: no-cache\r\n\r\n",
            text.len()
        );
        if writer.write_all(head.as_bytes()).is_err() || writer.write_all(text.as_bytes()).is_err()
        {
            break;
        }
        let _ = writer.flush();
    }
    let _ = writer.shutdown(Shutdown::Both);
}

type Head = (String, String, Vec<(String, String)>, Vec<u8>);

/// One request: method, target, headers (names lower-cased), body (by `content-length` or
/// chunked). `None` at the end of the connection or on anything malformed.
fn read_request(r: &mut BufReader<TcpStream>) -> Option<Head> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let path = parts.next()?.to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (n, v) = h.split_once(':')?;
        headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let get = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if get("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).ok()?;
            let size = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
            if body.len() + size > MAX_BODY {
                return None;
            }
            let mut chunk = vec![0; size + 2];
            r.read_exact(&mut chunk).ok()?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(n) = get("content-length") {
        let n: usize = n.parse().ok()?;
        if n > MAX_BODY {
            return None;
        }
        body.resize(n, 0);
        r.read_exact(&mut body).ok()?;
    }
    Some((method, path, headers, body))
}

/// The answer to one request: (what, status line, content type, body).
fn respond(
    api: Api,
    method: &str,
    path: &str,
    body: &Value,
    script: &Script,
) -> (Answer, &'static str, &'static str, String) {
    const OK: &str = "200 OK";
    const SSE: &str = "text/event-stream";
    const JSON: &str = "application/json";
    let not_found = (
        Answer::NotFound,
        "404 Not Found",
        JSON,
        json!({"error": {"message": format!("the fake model serves no {method} {path}")}})
            .to_string(),
    );
    if method != "POST" {
        return not_found;
    }
    match api {
        Api::Anthropic if path.starts_with("/v1/messages/count_tokens") => (
            Answer::Count,
            OK,
            JSON,
            json!({"input_tokens": 1}).to_string(),
        ),
        Api::Anthropic if path.starts_with("/v1/messages") => {
            let call = offers(body, "/tools", "/name", &["Bash"]).is_some()
                && results(body) < script.calls;
            let answer = if call { Answer::ToolCall } else { Answer::Text };
            if body["stream"] == true {
                (answer, OK, SSE, anthropic_stream(body, call, script))
            } else {
                (
                    answer,
                    OK,
                    JSON,
                    anthropic_message(body, call, script).to_string(),
                )
            }
        }
        Api::OpenAiResponses if path.starts_with("/v1/responses") => {
            let tool = offers(
                body,
                "/tools",
                "/name",
                &["exec_command", "shell_command", "shell"],
            );
            let call = tool.filter(|_| !holds(body, "/input", "function_call_output"));
            let answer = if call.is_some() {
                Answer::ToolCall
            } else {
                Answer::Text
            };
            (answer, OK, SSE, responses_stream(call, script))
        }
        Api::OpenAiChat if path.starts_with("/v1/chat/completions") => {
            let tool = offers(body, "/tools", "/function/name", SHELL_TOOLS);
            let call = tool.filter(|_| !chat_has_result(body));
            let answer = if call.is_some() {
                Answer::ToolCall
            } else {
                Answer::Text
            };
            if body["stream"] == true {
                (answer, OK, SSE, chat_stream(body, call, script))
            } else {
                (
                    answer,
                    OK,
                    JSON,
                    chat_message(body, call, script).to_string(),
                )
            }
        }
        Api::Gemini if path.contains(":streamGenerateContent") => {
            let call = offers(
                body,
                "/tools",
                "/functionDeclarations",
                &["run_shell_command"],
            )
            .is_some()
                && !gemini_has_response(body);
            let answer = if call { Answer::ToolCall } else { Answer::Text };
            (answer, OK, SSE, gemini_stream(call, script))
        }
        Api::Gemini if path.contains(":generateContent") => {
            (Answer::Route, OK, JSON, gemini_route().to_string())
        }
        Api::Gemini if path.contains(":countTokens") => (
            Answer::Count,
            OK,
            JSON,
            json!({"totalTokens": 1}).to_string(),
        ),
        _ => not_found,
    }
}

/// The first of `names` that the array at `list` offers as a tool (each element's `name` at
/// `name`, or, for Gemini, a `functionDeclarations` array of them).
fn offers(body: &Value, list: &str, name: &str, names: &[&'static str]) -> Option<&'static str> {
    let tools = body.pointer(list)?.as_array()?;
    let mut offered = Vec::new();
    for t in tools {
        match t.pointer(name) {
            Some(Value::String(n)) => offered.push(n.as_str()),
            Some(Value::Array(decls)) => {
                offered.extend(decls.iter().filter_map(|d| d["name"].as_str()));
            }
            _ => {}
        }
    }
    names.iter().copied().find(|n| offered.contains(n))
}

/// Whether any item (or any item's `content` element) of the array at `list` has `type` `ty`.
fn holds(body: &Value, list: &str, ty: &str) -> bool {
    let Some(items) = body.pointer(list).and_then(Value::as_array) else {
        return false;
    };
    items.iter().any(|m| {
        m["type"] == ty
            || m["content"]
                .as_array()
                .is_some_and(|c| c.iter().any(|b| b["type"] == ty))
    })
}

/// The shell tools of the agents that speak Chat Completions, by the name each offers.
const SHELL_TOOLS: &[&str] = &[
    "run_shell_command",
    "execute_command",
    "run_commands",
    "Execute",
    "bash",
];

/// Whether the conversation holds a tool's result (a `tool` message).
fn chat_has_result(body: &Value) -> bool {
    body["messages"]
        .as_array()
        .is_some_and(|ms| ms.iter().any(|m| m["role"] == "tool"))
}

/// The arguments of the scripted call of `tool`.
fn chat_arguments(tool: &str, script: &Script) -> Value {
    match tool {
        "run_commands" => json!({"commands": [script.command]}),
        "execute_command" => json!({"command": script.command, "requires_approval": false}),
        _ => json!({"command": script.command, "description": "Run the scripted command"}),
    }
}

fn chat_usage() -> Value {
    json!({"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19})
}

fn chat_stream(body: &Value, tool: Option<&str>, script: &Script) -> String {
    let model = body["model"].as_str().unwrap_or("gpt-fake");
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-prx-fake", "object": "chat.completion.chunk", "created": 1,
               "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut events = vec![(
        "",
        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
    )];
    let finish = if let Some(name) = tool {
        let call = json!([{"index": 0, "id": CALL_ID, "type": "function", "function":
            {"name": name, "arguments": chat_arguments(name, script).to_string()}}]);
        events.push(("", chunk(json!({"tool_calls": call}), Value::Null)));
        "tool_calls"
    } else {
        events.push(("", chunk(json!({"content": script.answer}), Value::Null)));
        "stop"
    };
    let mut last = chunk(json!({}), json!(finish));
    last["usage"] = chat_usage();
    events.push(("", last));
    let mut out = sse(&events);
    out.push_str("data: [DONE]\n\n");
    out
}

fn chat_message(body: &Value, tool: Option<&str>, script: &Script) -> Value {
    let (message, finish) = match tool {
        Some(name) => (
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": CALL_ID, "type": "function",
                   "function": {"name": name, "arguments": chat_arguments(name, script).to_string()}}]}),
            "tool_calls",
        ),
        None => (
            json!({"role": "assistant", "content": script.answer}),
            "stop",
        ),
    };
    json!({"id": "chatcmpl-prx-fake", "object": "chat.completion", "created": 1,
           "model": body["model"].as_str().unwrap_or("gpt-fake"),
           "choices": [{"index": 0, "message": message, "finish_reason": finish}],
           "usage": chat_usage()})
}

fn gemini_has_response(body: &Value) -> bool {
    body["contents"].as_array().is_some_and(|cs| {
        cs.iter().any(|c| {
            c["parts"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p.get("functionResponse").is_some()))
        })
    })
}

/// Server-sent events: `event: NAME` (when named) and one `data:` line each.
fn sse(events: &[(&str, Value)]) -> String {
    let mut out = String::new();
    for (name, data) in events {
        if !name.is_empty() {
            out.push_str(&format!("event: {name}\n"));
        }
        out.push_str(&format!("data: {data}\n\n"));
    }
    out
}

pub const TOOL_USE_ID: &str = "toolu_prx_fake_1";

/// The id of the conversation's next tool call: [`TOOL_USE_ID`] for the first.
fn tool_use_id(body: &Value) -> String {
    match results(body) {
        0 => TOOL_USE_ID.to_string(),
        n => format!("toolu_prx_fake_{}", n + 1),
    }
}

/// How many tool results the Messages API conversation holds.
fn results(body: &Value) -> usize {
    let Some(items) = body.pointer("/messages").and_then(Value::as_array) else {
        return 0;
    };
    items
        .iter()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .filter(|b| b["type"] == "tool_result")
        .count()
}
pub const CALL_ID: &str = "call_prx_fake_1";

fn anthropic_usage() -> Value {
    json!({"input_tokens": 12, "output_tokens": 7})
}

fn anthropic_stream(body: &Value, call: bool, script: &Script) -> String {
    let model = body["model"].as_str().unwrap_or("claude-fake");
    let mut events = vec![(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": "msg_prx_fake", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null, "usage": anthropic_usage()}}),
    )];
    let stop = if call {
        let input = json!({"command": script.command, "description": "Run the scripted command"});
        events.extend([
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block":
                    {"type": "tool_use", "id": tool_use_id(body), "name": "Bash", "input": {}}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta":
                    {"type": "input_json_delta", "partial_json": input.to_string()}}),
            ),
        ]);
        "tool_use"
    } else {
        events.extend([
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": script.answer}}),
            ),
        ]);
        "end_turn"
    };
    events.extend([
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
                   "usage": {"output_tokens": 7}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ]);
    sse(&events)
}

fn anthropic_message(body: &Value, call: bool, script: &Script) -> Value {
    let (content, stop) = if call {
        (
            json!([{"type": "tool_use", "id": tool_use_id(body), "name": "Bash",
                    "input": {"command": script.command, "description": "Run the scripted command"}}]),
            "tool_use",
        )
    } else {
        (json!([{"type": "text", "text": script.answer}]), "end_turn")
    };
    json!({"id": "msg_prx_fake", "type": "message", "role": "assistant",
           "model": body["model"].as_str().unwrap_or("claude-fake"), "content": content,
           "stop_reason": stop, "stop_sequence": null, "usage": anthropic_usage()})
}

fn responses_stream(tool: Option<&str>, script: &Script) -> String {
    let created = json!({"type": "response.created", "response": {"id": "resp_prx_fake"}});
    let mut events = vec![("response.created", created)];
    if let Some(name) = tool {
        let arguments = match name {
            "exec_command" => json!({"cmd": script.command}),
            "shell_command" => json!({"command": script.command}),
            _ => json!({"command": ["bash", "-lc", script.command]}),
        };
        let item = json!({"type": "function_call", "id": "fc_prx_fake", "name": name,
                          "arguments": arguments.to_string(), "call_id": CALL_ID});
        events.extend([
            (
                "response.output_item.added",
                json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
            ),
            (
                "response.output_item.done",
                json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
            ),
        ]);
    } else {
        let empty =
            json!({"type": "message", "id": "msg_prx_fake", "role": "assistant", "content": []});
        let item = json!({"type": "message", "id": "msg_prx_fake", "role": "assistant",
                          "content": [{"type": "output_text", "text": script.answer, "annotations": []}]});
        events.extend([
            (
                "response.output_item.added",
                json!({"type": "response.output_item.added", "output_index": 0, "item": empty}),
            ),
            (
                "response.output_text.delta",
                json!({"type": "response.output_text.delta", "item_id": "msg_prx_fake",
                       "output_index": 0, "content_index": 0, "delta": script.answer}),
            ),
            (
                "response.output_item.done",
                json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
            ),
        ]);
    }
    events.push((
        "response.completed",
        json!({"type": "response.completed", "response": {"id": "resp_prx_fake", "usage": {
            "input_tokens": 12, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 19}}}),
    ));
    sse(&events)
}

fn gemini_usage() -> Value {
    json!({"promptTokenCount": 12, "candidatesTokenCount": 7, "totalTokenCount": 19})
}

fn gemini_stream(call: bool, script: &Script) -> String {
    let parts = if call {
        json!([{"functionCall": {"name": "run_shell_command",
                                 "args": {"command": script.command, "description": "Run the scripted command"}}}])
    } else {
        json!([{"text": script.answer}])
    };
    let chunk = json!({"candidates": [{"content": {"role": "model", "parts": parts},
                                       "finishReason": "STOP", "index": 0}],
                       "usageMetadata": gemini_usage(), "modelVersion": "gemini-fake"});
    sse(&[("", chunk)])
}

/// The model router's verdict, in both shapes its strategies parse (a model choice, and a
/// complexity score).
fn gemini_route() -> Value {
    let verdict = json!({"reasoning": "a scripted session", "model_choice": "flash",
                         "complexity_reasoning": "a scripted session", "complexity_score": 1});
    json!({"candidates": [{"content": {"role": "model", "parts": [{"text": verdict.to_string()}]},
                           "finishReason": "STOP", "index": 0}],
           "usageMetadata": gemini_usage()})
}
