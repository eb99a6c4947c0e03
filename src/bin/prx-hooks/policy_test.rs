//! `prx-hooks policy test`: a payload against the workspace's policies.json, offline — which
//! policies matched and why, the decision and its time (docs/policies.md § Testing a payload).

use crate::BoxError;
use clap::{Args, Subcommand};
use prx_hooks::agents::Agent;
use prx_hooks::policy::{self, DecisionPoint};
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Args)]
pub(crate) struct PolicyArgs {
    #[command(subcommand)]
    command: PolicyCommand,
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Decide one payload read from stdin: each policy of its decision point, whether it
    /// matched and why, then the decision and how long it took. Writes nothing, emits nothing.
    Test(TestArgs),
}

#[derive(Args)]
struct TestArgs {
    /// The agent asking. An agent whose hook payloads prx-hooks reads (claude-code, codex,
    /// gemini-cli) makes stdin that agent's hook object (its event gives the decision
    /// point); any other name is matched by `agent` and stdin is the payload hooks receive.
    #[arg(long, default_value = "prx-hooks")]
    agent: String,
    /// The decision point of a payload that is not an agent's hook object.
    #[arg(
        long,
        value_name = "tool_call_start|prompt|permission",
        default_value = "tool_call_start"
    )]
    point: String,
    /// The workspace directory (policies.json).
    #[arg(long, default_value = ".")]
    workspace: PathBuf,
    /// Also run the command policies and ask the WASM policies (plugins/) the question
    /// selects, each within its deadline, and show what each answered and how long it took;
    /// the decision is then every source's. Guards are programs: they run contained as under
    /// `run`, with its default limits (`core_bytes=0`).
    #[arg(long)]
    run_guards: bool,
}

pub(crate) fn policy(args: PolicyArgs) -> Result<ExitCode, BoxError> {
    match args.command {
        PolicyCommand::Test(args) => test(args),
    }
}

/// The decision with every source, the guards' and WASM policies' answers printed one per
/// line (`command` or `wasm`, id, what it gave, how it ended, its time), from a hook system
/// on the workspace that emits nothing. The decision's time is the whole decision's.
fn run_guards(
    args: &TestArgs,
    point: DecisionPoint,
    payload: &serde_json::Value,
) -> Result<(prx_hooks::policy::Verdict, std::time::Duration), BoxError> {
    // `run`'s default limits for the guards (docs/policies.md § Command policies).
    let mut limits = prx_hooks::shell::ShellLimits::default();
    limits.hook_limits.core_bytes = Some(0);
    let hooks = prx_hooks::Hooks::builder()
        .workspace(&args.workspace)
        .shell_limits(limits)
        .build()?;
    let start = Instant::now();
    let (verdict, sources) = hooks.decide_traced(point, &args.agent, payload);
    let elapsed = start.elapsed();
    for s in &sources {
        let gave = s.decision.map_or("none", |d| d.as_str());
        out!(
            "{:<7}  {}  {gave}  {}  ({} µs)",
            s.source,
            s.policy,
            s.outcome,
            s.elapsed.as_micros()
        );
    }
    hooks.shutdown(std::time::Duration::from_secs(2));
    Ok((verdict, elapsed))
}

fn test(args: TestArgs) -> Result<ExitCode, BoxError> {
    let table = match policy::load(&args.workspace) {
        Ok(t) => t,
        Err(errors) => {
            for e in errors.iter() {
                out!("{e}");
            }
            return Err(format!("policies.json has {} error(s)", errors.len()).into());
        }
    };
    let mut bytes = Vec::new();
    std::io::stdin()
        .take(policy::MAX_PAYLOAD_BYTES as u64 + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() > policy::MAX_PAYLOAD_BYTES {
        return Err(format!(
            "stdin: the payload is larger than {} bytes (the limit)",
            policy::MAX_PAYLOAD_BYTES
        )
        .into());
    }
    let (point, payload) = match Agent::from_name(&args.agent) {
        Some(agent) => match policy::question(agent, &bytes) {
            Some(q) => {
                say!("{} {} is {}", agent, q.event, q.point);
                (q.point, q.payload)
            }
            None => {
                return Err(format!(
                    "stdin: not a {agent} hook object of an event policies decide \
                     (a JSON object whose hook_event_name is PreToolUse, PermissionRequest, \
                     UserPromptSubmit, BeforeTool or BeforeAgent)"
                )
                .into());
            }
        },
        None => {
            let point = DecisionPoint::from_name(&args.point).ok_or_else(|| {
                format!(
                    "--point {}: expected tool_call_start, prompt or permission",
                    args.point
                )
            })?;
            let text = std::str::from_utf8(&bytes).map_err(|e| format!("stdin: {e}"))?;
            let value: serde_json::Value = serde_json::from_str(text)
                .map_err(|e| format!("stdin:{}:{}: {e}", e.line(), e.column()))?;
            if !value.is_object() {
                return Err("stdin: expected a JSON object (the payload)".into());
            }
            (point, value)
        }
    };
    let start = Instant::now();
    let (verdict, traces) = table.explain(point, &args.agent, &payload);
    let mut elapsed = start.elapsed();
    for t in &traces {
        let mark = if t.matched { "match" } else { "-" };
        out!("{mark:<5}  {}  {}  {}", t.policy, t.decision, t.why);
    }
    let verdict = if args.run_guards {
        let (v, took) = run_guards(&args, point, &payload)?;
        elapsed = took;
        v
    } else {
        verdict
    };
    match (&verdict.decision, &verdict.policy) {
        (Some(d), Some(p)) => out!(
            "decision: {d} by {p}: {}  ({} µs)",
            verdict.reason.as_deref().unwrap_or(""),
            elapsed.as_micros()
        ),
        _ => out!(
            "decision: none (no policy decides; the agent's own flow)  ({} µs)",
            elapsed.as_micros()
        ),
    }
    Ok(ExitCode::SUCCESS)
}
