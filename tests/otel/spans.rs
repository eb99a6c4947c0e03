//! Lifecycle events → GenAI spans: names, kinds, attributes per the conventions, links, times,
//! isolation of interleaved sessions, content off by default, unmatched starts and ends,
//! the pairing bounds.

use crate::receiver::{Receiver, attr};
use crate::*;
use prx_hooks::{Emit, Event, Extras};
use std::time::Duration;

#[test]
fn an_agent_run_becomes_invoke_agent_with_chat_and_execute_tool_children_at_the_events_times() {
    let rx = Receiver::start();
    let hooks = hooks_with(options(&rx.url()).service_name("agents-under-test"));
    let bus = hooks.bus().subscribe("prx.lifecycle.*").unwrap();
    let em = hooks.emitter("coder", "demo-1");
    em.emit(Event::AgentStart {
        agent: "coder",
        session: "demo-1",
    });
    em.emit(Event::LlmRequest {
        provider: "anthropic",
        model: "claude-sonnet",
        messages_count: 3,
    });
    em.emit(Event::LlmResponse {
        provider: "anthropic",
        model: "claude-sonnet",
        duration_ms: 1840,
        success: true,
    });
    let extras = Extras::fields(r#"{"tool_call_id":"call-7","cwd":"/src/app","user_id":"u-42"}"#);
    em.emit_with_extras(
        Event::ToolCallStart {
            tool: "shell",
            arguments: r#"{"cmd":"cargo test"}"#,
        },
        &extras,
    )
    .unwrap();
    em.emit(Event::ToolCall {
        tool: "shell",
        success: false,
        output: "1 failed",
    });
    em.emit(Event::Error {
        component: "tool",
        message: "shell exited with status 101",
    });
    em.emit(Event::TurnComplete);
    em.emit(Event::AgentEnd {
        success: true,
        messages_count: 9,
    });
    let times: Vec<u64> = (0..8)
        .map(|_| nanos(bus.recv().unwrap().timestamp()))
        .collect();
    let spans = rx.wait_spans(3, Duration::from_secs(20));
    assert_eq!(spans.len(), 3, "{:?}", names(&spans));

    let agent = one(&spans, "invoke_agent coder");
    assert_eq!(agent.kind, 1, "INTERNAL");
    assert!(agent.parent_span_id.is_empty());
    assert_eq!(
        attr(agent, "gen_ai.operation.name").as_deref(),
        Some("invoke_agent")
    );
    assert_eq!(attr(agent, "gen_ai.agent.name").as_deref(), Some("coder"));
    assert_eq!(
        attr(agent, "gen_ai.conversation.id").as_deref(),
        Some("demo-1")
    );
    assert_eq!(attr(agent, "session.id").as_deref(), Some("demo-1"));
    assert_eq!(attr(agent, "prx.messages_count").as_deref(), Some("9"));
    // The agent names no provider: its first model call's.
    assert_eq!(
        attr(agent, "gen_ai.provider.name").as_deref(),
        Some("anthropic")
    );
    assert_eq!(
        (agent.start_time_unix_nano, agent.end_time_unix_nano),
        (times[0], times[7])
    );
    assert!(!is_error(agent));
    let events: Vec<&str> = agent.events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        events,
        ["exception", "turn_complete"],
        "the error after the tool ended lands on the agent"
    );
    let exc = &agent.events[0];
    assert_eq!(exc.time_unix_nano, times[5]);
    let exc_attrs: Vec<&str> = exc.attributes.iter().map(|a| a.key.as_str()).collect();
    assert_eq!(exc_attrs, ["exception.type", "exception.message"]);

    let chat = one(&spans, "chat claude-sonnet");
    assert_eq!(chat.kind, 3, "CLIENT");
    assert_eq!(chat.trace_id, agent.trace_id);
    assert_eq!(chat.parent_span_id, agent.span_id);
    assert_eq!(attr(chat, "gen_ai.operation.name").as_deref(), Some("chat"));
    assert_eq!(
        attr(chat, "gen_ai.provider.name").as_deref(),
        Some("anthropic")
    );
    assert_eq!(
        attr(chat, "gen_ai.request.model").as_deref(),
        Some("claude-sonnet")
    );
    assert_eq!(
        attr(chat, "gen_ai.response.model").as_deref(),
        Some("claude-sonnet")
    );
    assert_eq!(
        (chat.start_time_unix_nano, chat.end_time_unix_nano),
        (times[1], times[2])
    );
    assert!(!is_error(chat));

    let tool = one(&spans, "execute_tool shell");
    assert_eq!(tool.kind, 1);
    assert_eq!(tool.parent_span_id, agent.span_id);
    assert_eq!(attr(tool, "gen_ai.tool.name").as_deref(), Some("shell"));
    assert_eq!(attr(tool, "gen_ai.tool.call.id").as_deref(), Some("call-7"));
    // A path may say too much: without content, extras not on docs/otel.md's list stay out.
    assert_eq!(attr(tool, "prx.extra.cwd"), None);
    assert_eq!(
        attr(tool, "prx.extra.tool_call_id").as_deref(),
        Some("call-7")
    );
    assert_eq!(attr(tool, "prx.content_withheld").as_deref(), Some("1"));
    assert_eq!(attr(tool, "user.id").as_deref(), Some("u-42"));
    assert_eq!(attr(tool, "error.type").as_deref(), Some("tool_error"));
    assert!(is_error(tool));
    assert_eq!(
        (tool.start_time_unix_nano, tool.end_time_unix_nano),
        (times[3], times[4])
    );
    // Content is off by default.
    assert_eq!(attr(tool, "gen_ai.tool.call.arguments"), None);
    assert_eq!(attr(tool, "gen_ai.tool.call.result"), None);

    let resource = rx.resource();
    let service = resource.iter().find(|k| k.key == "service.name").unwrap();
    assert!(format!("{service:?}").contains("agents-under-test"));
    assert!(
        rx.paths().iter().all(|p| p == "/v1/traces"),
        "{:?}",
        rx.paths()
    );
    assert!(
        rx.headers()
            .contains(&("content-type".into(), "application/x-protobuf".into()))
    );
    hooks.shutdown(Duration::from_secs(5));
    let o = otel(&hooks.stats());
    assert_eq!(
        (o.spans, o.exported, o.unmatched_starts, o.unmatched_ends),
        (3, 3, 0, 0)
    );
    assert!(balanced(&o), "{o:?}");
}

#[test]
fn content_is_exported_only_when_asked_for() {
    let rx = Receiver::start();
    let hooks = hooks_with(options(&rx.url()).content(true));
    let em = hooks.emitter("a", "s");
    em.emit(Event::ToolCallStart {
        tool: "read",
        arguments: r#"{"path":"/etc/hosts"}"#,
    });
    em.emit(Event::ToolCall {
        tool: "read",
        success: true,
        output: "127.0.0.1 localhost",
    });
    em.emit(Event::TurnComplete);
    let spans = rx.wait_spans(2, Duration::from_secs(20));
    let tool = one(&spans, "execute_tool read");
    assert_eq!(
        attr(tool, "gen_ai.tool.call.arguments").as_deref(),
        Some(r#"{"path":"/etc/hosts"}"#)
    );
    assert_eq!(
        attr(tool, "gen_ai.tool.call.result").as_deref(),
        Some("127.0.0.1 localhost")
    );
    // No agent_start: the turn is an implicit invoke_agent span, ended by turn_complete.
    let agent = one(&spans, "invoke_agent a");
    assert_eq!(tool.parent_span_id, agent.span_id);
    assert!(!is_error(agent));
    hooks.shutdown(Duration::from_secs(5));
}

#[test]
fn interleaved_sessions_stay_in_their_own_traces() {
    let rx = Receiver::start();
    let hooks = hooks_with(options(&rx.url()));
    let one_em = hooks.emitter("agent", "s1");
    let two_em = hooks.emitter("agent", "s2");
    // Another agent in a session of the same name: an emitter of its own too.
    let other_em = hooks.emitter("reviewer", "s1");
    let all = [&one_em, &two_em, &other_em];
    for em in all {
        em.emit(Event::AgentStart {
            agent: "agent",
            session: "x",
        });
    }
    for round in 0..5 {
        for em in all {
            em.emit(Event::ToolCallStart {
                tool: "grep",
                arguments: "{}",
            });
        }
        // The same tool name in every emitter: each end pairs with its own emitter's start.
        one_em.emit(Event::ToolCall {
            tool: "grep",
            success: round % 2 == 0,
            output: "",
        });
        two_em.emit(Event::ToolCall {
            tool: "grep",
            success: round % 2 == 1,
            output: "",
        });
        other_em.emit(Event::ToolCall {
            tool: "grep",
            success: true,
            output: "",
        });
    }
    for em in all {
        em.emit(Event::AgentEnd {
            success: true,
            messages_count: 1,
        });
    }
    // An error with no span open: a span of its own, in a trace of its own.
    other_em.emit(Event::Error {
        component: "transport",
        message: "connection lost",
    });
    let spans = rx.wait_spans(19, Duration::from_secs(20));
    let seen: Vec<_> = spans
        .iter()
        .map(|s| (s.name.clone(), attr(s, "gen_ai.conversation.id")))
        .collect();
    assert_eq!(spans.len(), 19, "{seen:?} {:?}", otel(&hooks.stats()));
    let mut agents = by_name(&spans, "invoke_agent agent");
    assert_eq!(agents.len(), 2);
    assert_ne!(agents[0].trace_id, agents[1].trace_id);
    let reviewer = one(&spans, "invoke_agent reviewer");
    assert!(agents.iter().all(|a| a.trace_id != reviewer.trace_id));
    agents.push(reviewer);
    for a in agents {
        let agent = attr(a, "gen_ai.agent.name").unwrap();
        let session = attr(a, "gen_ai.conversation.id").unwrap();
        let tools: Vec<_> = spans
            .iter()
            .filter(|s| s.trace_id == a.trace_id && s.name == "execute_tool grep")
            .collect();
        assert_eq!(tools.len(), 5, "{agent} {session}");
        for t in &tools {
            assert_eq!(t.parent_span_id, a.span_id);
            assert_eq!(
                attr(t, "gen_ai.conversation.id").as_deref(),
                Some(session.as_str())
            );
            assert_eq!(
                attr(t, "gen_ai.agent.name").as_deref(),
                Some(agent.as_str())
            );
            assert!(t.start_time_unix_nano <= t.end_time_unix_nano);
        }
        let failed = tools.iter().filter(|t| is_error(t)).count();
        let want = match (agent.as_str(), session.as_str()) {
            ("agent", "s1") => 2,
            ("agent", _) => 3,
            _ => 0,
        };
        assert_eq!(failed, want, "{agent} {session}");
    }
    let error = one(&spans, "error transport");
    assert!(error.parent_span_id.is_empty());
    assert!(
        spans
            .iter()
            .filter(|s| s.name != "error transport")
            .all(|s| s.trace_id != error.trace_id)
    );
    assert!(is_error(error));
    assert_eq!(
        attr(error, "gen_ai.agent.name").as_deref(),
        Some("reviewer")
    );
    assert_eq!(error.events.len(), 1);
    assert_eq!(error.events[0].name, "exception");
    assert_eq!(error.start_time_unix_nano, error.end_time_unix_nano);
    hooks.shutdown(Duration::from_secs(5));
    let o = otel(&hooks.stats());
    assert_eq!((o.unmatched_starts, o.unmatched_ends), (0, 0), "{o:?}");
}

#[test]
fn unmatched_starts_end_with_an_error_and_ends_without_starts_are_zero_length_all_counted() {
    let rx = Receiver::start();
    let hooks = hooks_with(options(&rx.url()).idle_limit(Duration::from_millis(300)));
    let idle = hooks.emitter("crashy", "idle");
    idle.emit(Event::AgentStart {
        agent: "crashy",
        session: "idle",
    });
    idle.emit(Event::LlmRequest {
        provider: "openai",
        model: "gpt",
        messages_count: 1,
    });
    // Nothing more from it: the idle limit ends both.
    let spans = rx.wait_spans(2, Duration::from_secs(20));
    assert_eq!(spans.len(), 2, "{:?}", names(&spans));
    assert!(spans.iter().all(is_error));
    assert!(
        spans
            .iter()
            .all(|s| attr(s, "error.type").as_deref() == Some("unfinished"))
    );

    let late = hooks.emitter("late", "s");
    late.emit(Event::ToolCall {
        tool: "edit",
        success: true,
        output: "",
    });
    late.emit(Event::LlmResponse {
        provider: "p",
        model: "m",
        duration_ms: 5,
        success: false,
    });
    late.emit(Event::ToolCallStart {
        tool: "never-ends",
        arguments: "{}",
    });
    let tx_wait = rx.wait_spans(4, Duration::from_secs(20));
    let edit = one(&tx_wait, "execute_tool edit");
    assert_eq!(
        edit.start_time_unix_nano, edit.end_time_unix_nano,
        "zero-length"
    );
    let chat = one(&tx_wait, "chat m");
    assert!(is_error(chat));
    // An end without its start that says how long it took starts that long before it.
    assert_eq!(
        chat.end_time_unix_nano - chat.start_time_unix_nano,
        5_000_000,
        "placed by its duration_ms"
    );
    hooks.shutdown(Duration::from_secs(5));
    let spans = rx.wait_spans(6, Duration::from_secs(5));
    let never = one(&spans, "execute_tool never-ends");
    assert!(is_error(never));
    let o = otel(&hooks.stats());
    // crashy's agent + chat, late's tool + implicit agent at shutdown; two ends without start.
    assert_eq!(o.unmatched_starts, 4, "{o:?}");
    assert_eq!(o.unmatched_ends, 2, "{o:?}");
    assert_eq!(o.exported, o.spans);
    assert!(balanced(&o), "{o:?}");
}

#[test]
fn the_pairing_state_is_bounded_per_emitter_and_in_total() {
    let rx = Receiver::start();
    let hooks = hooks_with(options(&rx.url()).pairing_bounds(6, 3));
    let em = hooks.emitter("busy", "s");
    for _ in 0..10 {
        assert_eq!(
            em.emit(Event::ToolCallStart {
                tool: "t",
                arguments: "{}"
            }),
            Emit::Queued
        );
    }
    // 6 open at most: the root and 4 tools; the 6 oldest tool starts gave way.
    let spans = rx.wait_spans(6, Duration::from_secs(20));
    assert_eq!(spans.len(), 6, "{:?}", names(&spans));
    for i in 0..5 {
        let e = hooks.emitter("many", &format!("s{i}"));
        e.emit(Event::AgentStart {
            agent: "many",
            session: "x",
        });
    }
    // 3 emitters at most: busy (least recently seen) and two of many's were evicted.
    let spans = rx.wait_spans(6 + 5 + 2, Duration::from_secs(20));
    assert_eq!(spans.len(), 13, "{:?}", names(&spans));
    hooks.shutdown(Duration::from_secs(5));
    let o = otel(&hooks.stats());
    assert_eq!(o.unmatched_starts, 6 + 5 + 5, "{o:?}");
    assert!(balanced(&o), "{o:?}");
}

#[test]
fn a_coding_agents_span_names_its_provider_before_any_model_call() {
    let rx = Receiver::start();
    let hooks = hooks_with(options(&rx.url()));
    for (agent, provider) in [
        ("claude-code", Some("anthropic")),
        ("codex", Some("openai")),
        ("gemini-cli", Some("gcp.gemini")),
        ("cursor", None),
    ] {
        let em = hooks.emitter(agent, "s");
        em.emit(Event::ToolCallStart {
            tool: "Bash",
            arguments: "{}",
        });
        em.emit(Event::ToolCall {
            tool: "Bash",
            success: true,
            output: "",
        });
        em.emit(Event::TurnComplete);
        let spans = rx.wait_spans(2, Duration::from_secs(20));
        let root = one(&spans, &format!("invoke_agent {agent}"));
        assert_eq!(
            attr(root, "gen_ai.provider.name").as_deref(),
            provider,
            "{agent}"
        );
        rx.clear();
    }
    hooks.shutdown(Duration::from_secs(5));
}

/// An interrupted turn is neither a failure nor a clean end: what it leaves open ends with
/// status UNSET and `prx.end_reason = interrupted`, never as `unfinished`.
#[test]
fn an_interrupt_ends_what_is_open_as_interrupted_not_failed() {
    let rx = Receiver::start();
    let hooks = hooks_with(options(&rx.url()));
    let em = hooks.emitter("codex", "s");
    em.emit(Event::AgentStart {
        agent: "codex",
        session: "s",
    });
    // A tool the user stopped (Claude Code's PostToolUseFailure with is_interrupt).
    em.emit(Event::ToolCallStart {
        tool: "Bash",
        arguments: "{}",
    });
    em.emit_with_extras(
        Event::ToolCall {
            tool: "Bash",
            success: false,
            output: "",
        },
        &Extras::fields(r#"{"is_interrupt":true}"#),
    )
    .unwrap();
    // Another still running when Codex's Interrupt hook ends the turn.
    em.emit(Event::ToolCallStart {
        tool: "apply_patch",
        arguments: "{}",
    });
    em.emit_with_extras(
        Event::AgentEnd {
            success: false,
            messages_count: 2,
        },
        &Extras::fields(r#"{"hook_event_name":"Interrupt"}"#),
    )
    .unwrap();
    let spans = rx.wait_spans(3, Duration::from_secs(20));
    for name in [
        "execute_tool Bash",
        "execute_tool apply_patch",
        "invoke_agent codex",
    ] {
        let s = one(&spans, name);
        assert!(!is_error(s), "{name}: {:?}", s.status);
        assert_eq!(
            attr(s, "prx.end_reason").as_deref(),
            Some("interrupted"),
            "{name}"
        );
    }
    let o = otel(&hooks.stats());
    assert_eq!(o.unmatched_starts, 0, "{o:?}");
    hooks.shutdown(Duration::from_secs(5));
}
