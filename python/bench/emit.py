"""What an emit costs from Python, against what Python programs use instead.

    python python/bench/emit.py [--rounds 7] [--calls 20000] [--json]

One run, several rounds; within a round every case runs in turn (so a busy moment of the
machine hits them alike). Each case is timed two ways:

* batch: CPU time of the calling thread (time.thread_time_ns) over `calls` calls, per call —
  the round's figure; the report gives the median over rounds (and their spread);
* single: wall time of each call on its own (perf_counter_ns around it, minus the timer's own
  cost measured the same way), p50 and p99 over every call of every round.

Cases: em.tool_call_start("shell", <dict>) and with the same arguments as JSON text (str),
both with a listener (a bus subscription, so the event is queued, not skipped); the baselines
queue.SimpleQueue.put(<dict>), em.is_listened (a call into the extension that only reads a flag:
the floor of any PyO3 method call), logging.info to a logger with a NullHandler, and json.dumps +
os.write to /dev/null. Then the LangChain handler's cost: a LangGraph prebuilt agent on
LangChain's fake chat model making 3 tool calls, run with no callbacks, with a do-nothing
BaseCallbackHandler, and with PrxCallbackHandler, alternating.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import statistics
import sys
import time
import warnings

import prx_hooks

ARGS = {"cmd": "cargo test --release", "cwd": "/src/app", "timeout_ms": 30000}
TEXT = json.dumps(ARGS, separators=(",", ":"))


def cases(em, devnull):
    q = queue.SimpleQueue()
    log = logging.getLogger("prx-bench")
    log.handlers[:] = [logging.NullHandler()]
    log.setLevel(logging.INFO)
    log.propagate = False
    dumps, write = json.dumps, os.write

    def json_write(d):
        write(devnull, dumps(d).encode())

    return {
        "emit dict": (em.tool_call_start, ("shell", ARGS)),
        "emit str": (em.tool_call_start, ("shell", TEXT)),
        "SimpleQueue.put": (q.put, (ARGS,)),
        # The floor of any call into the extension: a method that reads one flag.
        "em.is_listened (PyO3 call)": (em.is_listened, ("tool_call_start",)),
        "logging.info (NullHandler)": (log.info, ("tool_call_start %s", ARGS)),
        "json.dumps + os.write": (json_write, (ARGS,)),
    }, q


def batch(f, a, calls):
    t = time.thread_time_ns()
    for _ in range(calls):
        f(*a)
    return (time.thread_time_ns() - t) / calls


def singles(f, a, calls, out):
    clock = time.perf_counter_ns
    for _ in range(calls):
        t = clock()
        f(*a)
        out.append(clock() - t)


def timer_cost(calls):
    clock = time.perf_counter_ns
    got = []
    for _ in range(calls):
        t = clock()
        got.append(clock() - t)
    return statistics.median(got)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def emit_costs(rounds, calls):
    hooks = prx_hooks.Hooks(workspace=None)
    sub = hooks.bus.subscribe("prx.lifecycle.tool_call_start", capacity=2 * calls + 16)
    em = hooks.emitter("bench", "s")
    devnull = os.open(os.devnull, os.O_WRONLY)
    table, q = cases(em, devnull)
    assert em.tool_call_start("shell", ARGS) == "queued"
    batches = {k: [] for k in table}
    single = {k: [] for k in table}
    overhead = timer_cost(calls)
    for _ in range(rounds):
        for name, (f, a) in table.items():
            batches[name].append(batch(f, a, calls))
            singles(f, a, calls, single[name])
            # Drain between cases: a full queue would change what the next case measures.
            while sub.try_recv() is not None:
                pass
            while not q.empty():
                q.get_nowait()
    stats = hooks.stats()
    hooks.shutdown()
    os.close(devnull)
    assert stats["dropped"] == 0, "the ring overflowed: the figures would include drops"
    out = {}
    for name in table:
        s = [max(0.0, x - overhead) for x in single[name]]
        out[name] = {
            "batch_median_ns": statistics.median(batches[name]),
            "batch_min_ns": min(batches[name]),
            "batch_max_ns": max(batches[name]),
            "p50_ns": pct(s, 0.50),
            "p99_ns": pct(s, 0.99),
        }
    out["_timer_overhead_ns"] = overhead
    return out


def langchain_overhead(rounds):
    try:
        from langchain_core.callbacks import BaseCallbackHandler
        from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
        from langchain_core.messages import AIMessage
        from langchain_core.tools import tool
        from langchain_core.utils.function_calling import convert_to_openai_tool

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from langgraph.prebuilt import create_react_agent
    except ImportError as e:
        return {"skipped": f"needs langchain-core and langgraph: {e}"}
    from prx_hooks.langchain import PrxCallbackHandler

    @tool
    def read_file(path: str) -> str:
        """Reads a file."""
        return "x" * 200

    def graph():
        responses = [
            AIMessage(content="", tool_calls=[{"name": "read_file", "args": {"path": f"f{n}.rs"}, "id": f"c{n}"}])
            for n in range(3)
        ] + [AIMessage(content="done")]
        model = FakeMessagesListChatModel(responses=responses)
        return create_react_agent(model.bind(tools=[convert_to_openai_tool(read_file)]), [read_file])

    class Nothing(BaseCallbackHandler):
        run_inline = True

    hooks = prx_hooks.Hooks(workspace=None)
    sub = hooks.bus.subscribe("*", capacity=1 << 16)
    em = hooks.emitter("bench", "lc")
    variants = {"no callbacks": None, "empty handler": Nothing(), "PrxCallbackHandler": PrxCallbackHandler(em)}
    times = {k: [] for k in variants}
    graphs = {k: graph() for k in variants}
    for _ in range(3):  # warm
        for k, h in variants.items():
            graphs[k] = graph()
            graphs[k].invoke({"messages": [("user", "go")]}, config={"callbacks": [h]} if h else {})
    for _ in range(rounds):
        for k, h in variants.items():
            g = graph()
            t = time.thread_time_ns()
            g.invoke({"messages": [("user", "go")]}, config={"callbacks": [h]} if h else {})
            times[k].append((time.thread_time_ns() - t) / 1e6)
        while sub.try_recv() is not None:
            pass
    events = hooks.stats()["queued"]
    hooks.shutdown()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "run_ms_median": med,
        "events_per_run": events / (rounds + 3),
        "overhead_vs_no_callbacks_pct": 100 * (med["PrxCallbackHandler"] - med["no callbacks"]) / med["no callbacks"],
        "overhead_vs_empty_handler_pct": 100 * (med["PrxCallbackHandler"] - med["empty handler"]) / med["no callbacks"],
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--agent-rounds", type=int, default=30)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    result = {
        "python": sys.version.split()[0],
        "load_average": os.getloadavg(),
        "emit": emit_costs(a.rounds, a.calls),
        "langchain": langchain_overhead(a.agent_rounds),
    }
    result["load_average_after"] = os.getloadavg()
    if a.json:
        print(json.dumps(result, indent=2))
        return
    e = result["emit"]
    put = e["SimpleQueue.put"]["batch_median_ns"]
    print(f"Python {result['python']}, load average {result['load_average'][0]:.1f} → "
          f"{result['load_average_after'][0]:.1f}; timer overhead {e['_timer_overhead_ns']:.0f} ns (subtracted)")
    print(f"{'case':30s} {'CPU/call median':>16s} {'(min–max)':>16s} {'single p50':>11s} {'p99':>8s} {'× put':>6s}")
    for name, r in e.items():
        if name.startswith("_"):
            continue
        print(f"{name:30s} {r['batch_median_ns']:13.0f} ns {r['batch_min_ns']:7.0f}–{r['batch_max_ns']:<7.0f}"
              f" {r['p50_ns']:8.0f} ns {r['p99_ns']:5.0f} ns {r['batch_median_ns'] / put:5.2f}×")
    s, d = e["emit str"], e["emit dict"]
    print(f"targets: str p50 ≤ 1 µs: {'met' if s['p50_ns'] <= 1000 else 'NOT met'}; "
          f"str ≤ 1.5× SimpleQueue.put: {'met' if s['batch_median_ns'] <= 1.5 * put else 'NOT met'} "
          f"({s['batch_median_ns'] / put:.2f}×); dict ≤ 2 µs: {'met' if d['p50_ns'] <= 2000 else 'NOT met'}")
    lc = result["langchain"]
    if "skipped" in lc:
        print("LangChain:", lc["skipped"])
    else:
        m = lc["run_ms_median"]
        print(f"LangGraph agent run (fake model, 3 tool calls, {lc['events_per_run']:.0f} events), CPU ms median: "
              + ", ".join(f"{k} {v:.2f}" for k, v in m.items()))
        print(f"PrxCallbackHandler adds {lc['overhead_vs_no_callbacks_pct']:.1f} % to the run "
              f"({lc['overhead_vs_empty_handler_pct']:.1f} % more than a do-nothing handler)")


if __name__ == "__main__":
    main()
