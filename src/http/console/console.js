// The prx-hooks console (docs/http.md § Console page; ARCHITECTURE.md § Console page).
//
// Everything shown here may come from agents, LLMs or hook processes (tool names, outputs,
// stderr, topics, agent names), so text only ever enters the page as text: through `el()`
// below (text nodes), `textContent` and attribute values. Nothing here parses a string as
// markup; the page's Content-Security-Policy enforces Trusted Types, under which doing so
// would throw, and it forbids inline script and style, so even markup that got in could not
// run.
//
// The token lives in sessionStorage (this tab only) and travels only in the Authorization
// header of same-origin fetches. The live stream is read with fetch and the SSE parser
// below, because EventSource cannot send that header; it resumes with Last-Event-ID.
"use strict";

(() => {
  const TOKEN_KEY = "prx-hooks.token";
  const EVENTS = [
    "agent_start", "agent_end", "llm_request", "llm_response",
    "tool_call_start", "tool_call", "turn_complete", "error",
  ];
  const MAX_ROWS = 500;
  const RATE_POINTS = 60;
  const SVG = "http://www.w3.org/2000/svg";
  // The API is beside the page: this script is <base>/console/console.js, whether the page
  // was loaded as /, /prx or /prx/ (a host may nest the router under a prefix).
  const BASE = new URL("..", document.currentScript.src);
  const url = (path) => new URL(path, BASE).href;

  const $ = (id) => document.getElementById(id);

  // ---- DOM helpers: text only ------------------------------------------------------------

  // el("li", {class: "x", "aria-label": "y"}, "text", childNode, ...). Attribute names are
  // always literals of this file; values and children may be data.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG, tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  // A `value` or `data-*` attribute is what the page works with (a filter's real agent name,
  // a hook's id), never shown as it is; every other attribute (titles, labels) is shown, so
  // it is escaped like text.
  function setAttrs(node, attrs) {
    if (!attrs) return;
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith("on")) throw new Error("event handlers go through addEventListener");
      node.setAttribute(k, v === true ? "" : k === "value" || k.startsWith("data-") ? String(v) : shown(String(v)));
    }
  }

  function append(node, children) {
    for (const c of children.flat()) {
      if (c === undefined || c === null || c === false) continue;
      node.appendChild(c instanceof Node ? c : document.createTextNode(shown(String(c))));
    }
  }

  // Characters shown escaped, by the rule `prx-hooks tail` prints with (src/bin/prx-hooks/
  // tail.rs, `hazardous` and `escape`): C0 and C1 controls and DEL (Rust's char::is_control),
  // and the bidirectional controls that reorder what follows them (embeddings and overrides
  // U+202A–U+202E, isolates U+2066–U+2069, the marks U+200E, U+200F, U+061C). Each becomes
  // what Rust's char::escape_default writes: \t, \r, \n, else \u{hex}. An agent named
  // "coder\u{202e}" would otherwise show the rest of its row reversed.
  const HAZARD = /[\u0000-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]/g;
  const ESCAPES = { "\t": "\\t", "\r": "\\r", "\n": "\\n" };

  function shown(s) {
    return s.replace(HAZARD, (c) => ESCAPES[c] || "\\u{" + c.charCodeAt(0).toString(16) + "}");
  }

  // A multi-line block (stderr, a row's JSON): the same, but its line breaks stay breaks.
  function block(s) {
    return document.createTextNode(String(s).split("\n").map(shown).join("\n"));
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }

  function button(label, attrs, onClick) {
    const b = el("button", Object.assign({ type: "button" }, attrs), label);
    b.addEventListener("click", onClick);
    return b;
  }

  function show(node, on) {
    node.hidden = !on;
  }

  function fmt(n) {
    if (n === undefined || n === null) return "–";
    if (n >= 1e9) return (n / 1e9).toFixed(1) + "G";
    if (n >= 1e6) return (n / 1e6).toFixed(1) + "M";
    if (n >= 1e4) return (n / 1e3).toFixed(1) + "k";
    return String(Math.round(n * 10) / 10);
  }

  function ms(d) {
    if (typeof d !== "number") return "";
    if (d >= 1000) return (d / 1000).toFixed(2) + " s";
    return (d >= 10 ? d.toFixed(0) : d.toFixed(2)) + " ms";
  }

  // "2026-12-01T20:52:05.701617Z" → "20:52:05.701" (UTC, as the server writes it).
  function clock(ts) {
    if (typeof ts !== "string" || ts.length < 19) return "";
    return ts.slice(11, 23).replace(/Z$/, "");
  }

  function truncate(s, n) {
    s = String(s);
    return s.length > n ? s.slice(0, n - 1) + "…" : s;
  }

  // ---- state -----------------------------------------------------------------------------

  const state = {
    token: null,
    hooks: [],
    listEtag: null,
    readOnly: false,
    fileError: null,
    stats: null,
    prevStats: null,
    rate: { emitted: [], processed: [], dropped: [] },
    rows: [],
    paused: false,
    unseen: 0,
    lastEventId: null,
    stream: null,
    timers: [],
    pluginRates: new Map(),
    // Per hook: runs that never started (skipped, dropped, cancelled) seen on the stream;
    // the server's history keeps the runs that started.
    liveRuns: new Map(),
    runsOf: null,
    // The session the live list shows alone ({agent, session}), or null.
    session: null,
    editing: null,
    busy: false,
  };

  // ---- the API ---------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, body, headers) {
      super((body && body.error) || "HTTP " + status);
      this.status = status;
      this.body = body || {};
      this.headers = headers;
    }
    get retryAfter() {
      const v = this.headers && parseInt(this.headers.get("Retry-After"), 10);
      return Number.isFinite(v) ? v : 1;
    }
  }

  // Every call carries the token; 401 signs out, 503 says why in the banner.
  async function api(method, path, opts = {}) {
    const headers = { Authorization: "Bearer " + (opts.token || state.token) };
    let body;
    if (opts.json !== undefined) {
      headers["Content-Type"] = opts.patch ? "application/merge-patch+json" : "application/json";
      body = JSON.stringify(opts.json);
    }
    if (opts.ifMatch) headers["If-Match"] = opts.ifMatch;
    if (opts.ifNoneMatch) headers["If-None-Match"] = opts.ifNoneMatch;
    let resp;
    try {
      resp = await fetch(url(path), { method, headers, body, cache: "no-store", credentials: "omit", redirect: "error" });
    } catch (e) {
      banner("Cannot reach the server (" + e.message + "); retrying.");
      throw new ApiError(0, { error: "network error: " + e.message }, null);
    }
    if (resp.status === 304) return { status: 304, headers: resp.headers, body: null };
    let parsed = null;
    const text = await resp.text();
    if (text) {
      try { parsed = JSON.parse(text); } catch (_) { parsed = { error: text }; }
    }
    if (resp.ok) {
      if (!opts.quiet) banner(null);
      return { status: resp.status, headers: resp.headers, body: parsed };
    }
    const err = new ApiError(resp.status, parsed, resp.headers);
    if (resp.status === 401 && !opts.token) {
      signOut("The server refused the token (" + err.message + "). Sign in again.");
    } else if (resp.status === 503) {
      banner("The server is unavailable: " + err.message);
    }
    throw err;
  }

  // ---- banner, notes ---------------------------------------------------------------------

  function banner(text) {
    const b = $("banner");
    if (!text) { show(b, false); return; }
    b.textContent = shown(text);
    show(b, true);
  }

  function note(id, text, kind) {
    const n = $(id);
    if (!text) { show(n, false); return; }
    n.textContent = shown(text);
    n.dataset.kind = kind || "info";
    show(n, true);
  }

  function conn(text, stateName) {
    const c = $("conn");
    c.textContent = shown(text);
    c.dataset.state = stateName;
  }

  // ---- sign in / out ---------------------------------------------------------------------

  async function signIn(token) {
    const err = $("token-error");
    show(err, false);
    $("token").removeAttribute("aria-invalid");
    try {
      await api("GET", "api/stats", { token });
    } catch (e) {
      if (e.status === 401) {
        sessionStorage.removeItem(TOKEN_KEY);
        err.textContent = shown("Wrong token: " + e.message);
      } else {
        err.textContent = shown("Could not sign in: " + e.message);
      }
      show(err, true);
      $("token").setAttribute("aria-invalid", "true");
      $("token").focus();
      return false;
    }
    state.token = token;
    sessionStorage.setItem(TOKEN_KEY, token);
    $("token").value = "";
    show($("login"), false);
    show($("app"), true);
    show($("logout"), true);
    start();
    return true;
  }

  function signOut(message) {
    stop();
    state.token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    for (const d of document.querySelectorAll("dialog[open]")) d.close();
    show($("app"), false);
    show($("logout"), false);
    show($("login"), true);
    conn("Signed out", "out");
    const err = $("token-error");
    if (message) {
      err.textContent = shown(message);
      show(err, true);
    } else {
      show(err, false);
    }
    $("token").focus();
  }

  function start() {
    state.rows = [];
    state.lastEventId = null;
    renderRows();
    loadHooks();
    pollStats();
    pollPlugins();
    pollSessions();
    state.timers.push(setInterval(pollStats, 1000));
    state.timers.push(setInterval(pollPlugins, 2000));
    state.timers.push(setInterval(pollSessions, 2000));
    state.timers.push(setInterval(() => loadHooks({ revalidate: true }), 5000));
    openStream();
  }

  function stop() {
    for (const t of state.timers) clearInterval(t);
    state.timers = [];
    if (state.stream) { state.stream.abort(); state.stream = null; }
  }

  // ---- hooks -----------------------------------------------------------------------------

  async function loadHooks(opts = {}) {
    if (!state.token) return;
    let r;
    try {
      r = await api("GET", "api/hooks", {
        ifNoneMatch: opts.revalidate ? state.listEtag : undefined,
        quiet: opts.revalidate,
      });
    } catch (e) {
      if (e.status !== 401) note("hooks-note", "Could not load the hooks: " + e.message, "error");
      return;
    }
    if (r.status === 304) return;
    state.listEtag = r.headers.get("ETag");
    state.hooks = (r.body && r.body.hooks) || [];
    state.readOnly = !!(r.body && r.body.read_only);
    state.fileError = r.body && r.body.file_error;
    if (opts.note) note("hooks-note", opts.note, opts.noteKind);
    else if (state.readOnly) {
      note("hooks-note", "hooks.json does not load, so the hooks below (the ones in force) are read-only until it is fixed: " +
        ((state.fileError && state.fileError.error) || "unknown error"), "error");
    } else if (!opts.keepNote) note("hooks-note", null);
    renderHooks();
  }

  function hookStats(id) {
    const s = state.stats && state.stats.shell && state.stats.shell.hooks;
    return (s && s[id]) || null;
  }

  function renderHooks() {
    const list = $("hooks-list");
    const focused = document.activeElement && document.activeElement.dataset && document.activeElement.dataset.focusKey;
    clear(list);
    $("new-hook").disabled = state.readOnly;
    if (!state.hooks.length) {
      list.appendChild(el("p", { class: "empty" }, "No hooks yet. Create one with New hook."));
      return;
    }
    const groups = new Map();
    for (const h of state.hooks) {
      if (!groups.has(h.event)) groups.set(h.event, []);
      groups.get(h.event).push(h);
    }
    const order = [...EVENTS.filter((e) => groups.has(e)), ...[...groups.keys()].filter((e) => !EVENTS.includes(e))];
    for (const event of order) {
      const hooks = groups.get(event);
      const items = hooks.map(hookItem);
      list.appendChild(el("section", { class: "group", "data-event": event },
        el("h3", null, event, el("span", { class: "count" }, String(hooks.length))),
        el("ul", { class: "hook-list" }, items)));
    }
    if (focused) {
      const again = list.querySelector('[data-focus-key="' + CSS.escape(focused) + '"]');
      if (again) again.focus();
    }
  }

  function hookItem(h) {
    const enabled = h.enabled !== false;
    const sw = el("button", {
      type: "button", role: "switch", class: "switch", "aria-checked": String(enabled),
      "aria-label": "Enabled: " + h.id, "data-focus-key": "switch:" + h.id,
      title: enabled ? "Enabled: click to disable" : "Disabled: click to enable",
      disabled: state.readOnly,
    }, el("span", { class: "knob", "aria-hidden": "true" }));
    sw.addEventListener("click", () => toggleHook(h, sw));
    const cmd = [h.command, ...(Array.isArray(h.args) ? h.args : [])].join(" ");
    const tags = [];
    if (h.matcher) tags.push(el("span", { class: "tag" }, "matcher ", el("code", null, h.matcher)));
    if (h.stdin_json) tags.push(el("span", { class: "tag" }, "stdin"));
    if (h.timeout_ms) tags.push(el("span", { class: "tag" }, "timeout " + ms(h.timeout_ms)));
    if (h.cwd) tags.push(el("span", { class: "tag" }, "cwd ", el("code", null, h.cwd)));
    const s = hookStats(h.id);
    const counts = s ? hookCounts(s) : null;
    const result = el("div", { class: "hook-result", "aria-live": "polite", hidden: true });
    const item = el("li", { class: "hook" + (enabled ? "" : " off"), "data-id": h.id },
      el("div", { class: "hook-row" },
        sw,
        el("div", { class: "hook-text" },
          el("p", { class: "hook-id" }, h.id, enabled ? null : el("span", { class: "badge muted-badge" }, "disabled")),
          el("p", { class: "cmd" }, el("code", null, cmd)),
          tags.length ? el("p", { class: "tags" }, tags) : null,
          el("p", { class: "hook-counts small muted" }, counts ? countsText(counts) : "")),
        el("div", { class: "hook-actions" },
          button("Test", { "data-focus-key": "test:" + h.id, "aria-label": "Test " + h.id, disabled: state.readOnly }, () => testHook(h, result)),
          button("Runs", { "data-focus-key": "runs:" + h.id, "aria-label": "Runs of " + h.id }, () => openRuns(h.id)),
          button("Edit", { "data-focus-key": "edit:" + h.id, "aria-label": "Edit " + h.id, disabled: state.readOnly }, () => openEditor(h)),
          button("Delete", { class: "danger-ghost", "data-focus-key": "delete:" + h.id, "aria-label": "Delete " + h.id, disabled: state.readOnly }, () => confirmDelete(h)))),
      result);
    return item;
  }

  function countsText(c) {
    return c.ok + " ok · " + c.failed + " failed · " + c.skipped + " skipped" + (c.dropped ? " · " + c.dropped + " dropped" : "");
  }

  function hookCounts(s) {
    return {
      ok: s.ok || 0,
      failed: (s.exit || 0) + (s.signal || 0) + (s.timed_out || 0) + (s.spawn_failed || 0) + (s.killed || 0),
      skipped: s.skipped || 0,
      dropped: (s.dropped || 0) + (s.cancelled || 0),
    };
  }

  // A stale list (hooks.json changed since this page read it) gets 412 (If-Match) or 409:
  // reload and say so, never retry blindly.
  function writeFailed(e, what) {
    if (e.status === 412 || e.status === 409) {
      const why = e.status === 412
        ? "hooks.json changed since this page loaded it, so nothing was " + what + ". The list is reloaded: check it and try again."
        : "Nothing was " + what + ": " + e.message + " The list is reloaded.";
      loadHooks({ note: why, noteKind: "warn" });
      return why;
    }
    if (e.status === 429) return "Busy: " + e.message + " Retry in " + e.retryAfter + " s.";
    if (e.status === 401) return null;
    return "Nothing was " + what + ": " + e.message;
  }

  async function toggleHook(h, sw) {
    if (state.busy) return;
    state.busy = true;
    sw.setAttribute("aria-busy", "true");
    try {
      const r = await api("PATCH", "api/hooks/" + encodeURIComponent(h.id) + "/toggle", { ifMatch: state.listEtag });
      const on = r.body && r.body.enabled !== false;
      await loadHooks({ note: h.id + (on ? " enabled." : " disabled."), noteKind: "ok" });
    } catch (e) {
      const why = writeFailed(e, "switched");
      if (why && e.status !== 412 && e.status !== 409) note("hooks-note", why, "error");
    } finally {
      state.busy = false;
      sw.removeAttribute("aria-busy");
    }
  }

  async function testHook(h, box) {
    clear(box);
    box.appendChild(el("p", { class: "small muted" }, "Running " + h.id + " once with the " + h.event + " sample payload…"));
    show(box, true);
    let run;
    try {
      run = (await api("POST", "api/hooks/" + encodeURIComponent(h.id) + "/test")).body;
    } catch (e) {
      clear(box);
      const why = e.status === 429
        ? "Busy: " + e.message + " Retry in " + e.retryAfter + " s."
        : "The test run failed to start: " + e.message;
      box.appendChild(el("p", { class: "field-error" }, why));
      return;
    }
    clear(box);
    box.appendChild(el("p", { class: "run-line" },
      outcomeBadge(run), " ", el("span", { class: "small muted" }, "test run · " + ms(run.duration_ms) + (run.pid ? " · pid " + run.pid : ""))));
    if (run.stderr_tail) {
      box.appendChild(el("p", { class: "small muted" }, "stderr"));
      box.appendChild(el("pre", { class: "stderr" }, block(run.stderr_tail)));
    }
    box.appendChild(button("Dismiss", { class: "ghost small-btn" }, () => { show(box, false); clear(box); }));
  }

  function outcomeClass(run) {
    if (run.ok) return "ok";
    if (run.kind === "skipped" || run.kind === "dropped" || run.kind === "cancelled") return "skip";
    return "fail";
  }

  function outcomeBadge(run) {
    return el("span", { class: "badge " + outcomeClass(run) }, run.outcome || run.kind || "?");
  }

  // ---- the editor ------------------------------------------------------------------------

  const FIELDS = ["event", "id", "command", "args", "matcher", "timeout_ms", "max_concurrent", "cwd", "env", "limits", "stdin_json", "enabled"];

  function setupEditor() {
    const sel = $("f-event");
    for (const e of EVENTS) sel.appendChild(el("option", { value: e }, e));
    $("editor-form").addEventListener("submit", (ev) => { ev.preventDefault(); saveHook(); });
    $("editor-cancel").addEventListener("click", () => $("editor").close());
    $("editor-close").addEventListener("click", () => $("editor").close());
  }

  function openEditor(h) {
    state.editing = h || null;
    clearFieldErrors();
    $("editor-title").textContent = shown(h ? "Edit " + h.id : "New hook");
    $("editor-save").textContent = h ? "Save" : "Create";
    const v = h || {};
    $("f-event").value = v.event || "tool_call";
    $("f-id").value = v.id || "";
    $("f-id").readOnly = !!h;
    $("f-command").value = v.command || "";
    $("f-args").value = Array.isArray(v.args) ? v.args.join("\n") : "";
    $("f-matcher").value = v.matcher || "";
    $("f-timeout_ms").value = v.timeout_ms !== undefined && v.timeout_ms !== null ? String(v.timeout_ms) : "";
    $("f-max_concurrent").value = v.max_concurrent !== undefined && v.max_concurrent !== null ? String(v.max_concurrent) : "";
    $("f-cwd").value = v.cwd || "";
    $("f-env").value = v.env && typeof v.env === "object" ? Object.entries(v.env).map(([k, x]) => k + "=" + x).join("\n") : "";
    $("f-limits").value = v.limits ? JSON.stringify(v.limits) : "";
    $("f-stdin_json").checked = !!v.stdin_json;
    $("f-enabled").checked = v.enabled !== false;
    $("editor").showModal();
    (h ? $("f-command") : $("f-event")).focus();
  }

  function clearFieldErrors() {
    show($("editor-error"), false);
    for (const f of FIELDS) {
      const e = $("f-" + f + "-error");
      if (e) { e.textContent = ""; show(e, false); }
      const input = $("f-" + f);
      if (input) input.removeAttribute("aria-invalid");
    }
  }

  function fieldError(field, message) {
    const box = $("f-" + field + "-error");
    const input = $("f-" + field);
    if (!box || !input) return false;
    box.textContent = shown(message);
    show(box, true);
    input.setAttribute("aria-invalid", "true");
    return true;
  }

  // Numbers stay numbers, other text stays text: the loader says what is wrong with it.
  function numberOrText(s) {
    return /^-?\d+$/.test(s) ? Number(s) : s;
  }

  // The body the form describes, or field errors for what cannot even be sent.
  function formBody() {
    const errors = [];
    const body = { event: $("f-event").value };
    const text = (id) => $("f-" + id).value.trim();
    if (text("id")) body.id = text("id");
    body.command = $("f-command").value.trim();
    const args = $("f-args").value.split("\n").map((a) => a.replace(/\r$/, ""));
    while (args.length && args[args.length - 1] === "") args.pop();
    if (args.length) body.args = args;
    if (text("matcher")) body.matcher = text("matcher");
    if (text("timeout_ms")) body.timeout_ms = numberOrText(text("timeout_ms"));
    if (text("max_concurrent")) body.max_concurrent = numberOrText(text("max_concurrent"));
    if (text("cwd")) body.cwd = text("cwd");
    const envText = $("f-env").value.split("\n").map((l) => l.trim()).filter((l) => l);
    if (envText.length) {
      body.env = {};
      envText.forEach((line, i) => {
        const at = line.indexOf("=");
        if (at <= 0) errors.push(["env", "line " + (i + 1) + ": expected NAME=value, found " + JSON.stringify(line)]);
        else body.env[line.slice(0, at)] = line.slice(at + 1);
      });
    }
    if (text("limits")) {
      try {
        const v = JSON.parse(text("limits"));
        if (!v || typeof v !== "object" || Array.isArray(v)) throw new Error("expected a JSON object");
        body.limits = v;
      } catch (e) {
        errors.push(["limits", "not a JSON object: " + e.message]);
      }
    }
    body.stdin_json = $("f-stdin_json").checked;
    body.enabled = $("f-enabled").checked;
    return { body, errors };
  }

  // For an edit: a merge patch of what changed (null removes a field).
  function mergePatch(old, body) {
    const patch = {};
    for (const k of FIELDS) {
      if (k === "id") continue;
      const before = old[k] === undefined ? null : old[k];
      let after = body[k] === undefined ? null : body[k];
      if (k === "stdin_json" && after === false && before === null) after = null;
      if (k === "enabled" && after === true && before === null) after = null;
      if (JSON.stringify(before) !== JSON.stringify(after)) patch[k] = after;
    }
    return patch;
  }

  // "body:1:53: timeout_ms: expected an integer" at path "timeout_ms" → the field timeout_ms,
  // "expected an integer". A path this form has no field for goes above the fields.
  function placeError(e) {
    const path = (e.body && e.body.path) || "";
    let msg = e.message.replace(/^body:\d+:\d+:\s*/, "");
    if (path && msg.startsWith(path + ": ")) msg = msg.slice(path.length + 2);
    const m = /^([A-Za-z_]+)(.*)$/.exec(path);
    let field = m ? m[1] : "";
    let rest = m ? m[2] : "";
    if (field && FIELDS.includes(field) && $("f-" + field)) {
      const where = rest.match(/^\[(\d+)\]/);
      if (field === "args" && where) msg = "line " + (Number(where[1]) + 1) + ": " + msg;
      else if (rest.startsWith(".")) msg = rest.slice(1) + ": " + msg;
      fieldError(field, msg);
      $("f-" + field).focus();
      return;
    }
    const box = $("editor-error");
    box.textContent = shown((path && path !== "$" ? path + ": " : "") + msg);
    show(box, true);
    box.focus();
  }

  async function saveHook() {
    clearFieldErrors();
    const { body, errors } = formBody();
    if (errors.length) {
      for (const [f, m] of errors) fieldError(f, m);
      $("f-" + errors[0][0]).focus();
      return;
    }
    const h = state.editing;
    const save = $("editor-save");
    save.disabled = true;
    try {
      let r;
      if (h) {
        const patch = mergePatch(h, body);
        r = await api("PATCH", "api/hooks/" + encodeURIComponent(h.id), { json: patch, patch: true, ifMatch: state.listEtag });
      } else {
        r = await api("POST", "api/hooks", { json: body, ifMatch: state.listEtag });
      }
      const saved = r.body || {};
      $("editor").close();
      const warnings = Array.isArray(saved.warnings) && saved.warnings.length ? " Warnings: " + saved.warnings.join("; ") : "";
      await loadHooks({ note: (h ? "Saved " : "Created ") + saved.id + "." + warnings, noteKind: warnings ? "warn" : "ok" });
    } catch (e) {
      if (e.status === 422 || e.status === 400) placeError(e);
      else {
        const why = writeFailed(e, h ? "saved" : "created");
        if (why) {
          const box = $("editor-error");
          box.textContent = shown(why);
          show(box, true);
        }
      }
    } finally {
      save.disabled = false;
    }
  }

  function confirmDelete(h) {
    $("confirm-text").textContent = shown("The hook " + h.id + " (" + h.event + ") is removed from hooks.json.");
    const dlg = $("confirm");
    const ok = $("confirm-ok");
    const fresh = ok.cloneNode(true);
    ok.replaceWith(fresh);
    fresh.addEventListener("click", async () => {
      dlg.close();
      try {
        await api("DELETE", "api/hooks/" + encodeURIComponent(h.id), { ifMatch: state.listEtag });
        await loadHooks({ note: "Deleted " + h.id + ".", noteKind: "ok" });
      } catch (e) {
        const why = writeFailed(e, "deleted");
        if (why && e.status !== 412 && e.status !== 409) note("hooks-note", why, "error");
      }
    });
    dlg.showModal();
    $("confirm-cancel").focus();
  }

  // ---- run history -----------------------------------------------------------------------

  async function openRuns(id) {
    state.runsOf = id;
    $("runs-title").textContent = shown("Runs of " + id);
    $("runs-note").textContent = "Loading…";
    clear($("runs-table").tBodies[0]);
    const dlg = $("runs");
    if (!dlg.open) dlg.showModal();
    $("runs-close").focus();
    await refreshRuns();
  }

  async function refreshRuns() {
    const id = state.runsOf;
    if (!id) return;
    let r;
    try {
      r = await api("GET", "api/hooks/" + encodeURIComponent(id) + "/runs?limit=50", { quiet: true });
    } catch (e) {
      $("runs-note").textContent = shown("Could not load the runs: " + e.message);
      return;
    }
    if (state.runsOf !== id) return;
    const kept = (r.body && r.body.runs) || [];
    const key = (x) => [x.time, x.kind, x.seq, x.direct].join("|");
    const known = new Set(kept.map(key));
    const live = (state.liveRuns.get(id) || []).filter((x) => !known.has(key(x))).map((x) => Object.assign({ live: true }, x));
    const runs = kept.concat(live).sort((a, b) => (a.time < b.time ? 1 : a.time > b.time ? -1 : 0)).slice(0, 50);
    $("runs-note").textContent = runs.length
      ? "Newest first: the server's last " + kept.length + " runs (pipeline and test runs; it keeps 50)" +
        (live.length ? ", and " + live.length + " skipped or dropped seen live since this page opened" : "") + ". Updates live."
      : "No runs yet.";
    const tbody = $("runs-table").tBodies[0];
    clear(tbody);
    for (const run of runs) tbody.appendChild(runRow(run));
  }

  function runRow(run) {
    return el("tr", { class: "run " + outcomeClass(run) },
      el("td", { "data-label": "Time" }, clock(run.time)),
      el("td", { "data-label": "Outcome" }, outcomeBadge(run)),
      el("td", { "data-label": "Duration" }, ms(run.duration_ms)),
      el("td", { "data-label": "Source" }, (run.direct ? "test" : (run.agent ? run.agent + " / " + run.session : "pipeline")) + (run.live ? " (seen live)" : "")),
      el("td", { "data-label": "Stderr" }, run.stderr_tail ? el("pre", { class: "stderr" }, block(run.stderr_tail)) : el("span", { class: "muted" }, "—")));
  }

  // ---- the live stream -------------------------------------------------------------------

  // A fetch-based EventSource: the token in a header, Last-Event-ID on every reconnect.
  function openStream() {
    const ctl = new AbortController();
    state.stream = ctl;
    let delay = 500;
    const run = async () => {
      while (!ctl.signal.aborted) {
        conn(state.lastEventId ? "Reconnecting…" : "Connecting…", "wait");
        let wait = delay;
        try {
          const headers = { Authorization: "Bearer " + state.token, Accept: "text/event-stream" };
          let path = "api/events?kinds=bus,runs,plugins";
          if (state.lastEventId) headers["Last-Event-ID"] = state.lastEventId;
          else path += "&backlog=100";
          const resp = await fetch(url(path), { headers, cache: "no-store", credentials: "omit", signal: ctl.signal });
          if (resp.status === 401) {
            signOut("The server refused the token. Sign in again.");
            return;
          }
          if (!resp.ok) {
            let msg = "HTTP " + resp.status;
            try { msg = (await resp.json()).error || msg; } catch (_) { /* not JSON */ }
            if (resp.status === 429) {
              const ra = parseInt(resp.headers.get("Retry-After"), 10);
              wait = (Number.isFinite(ra) ? ra : 5) * 1000;
              streamNote("The server has too many live streams open: " + msg, "warn");
            } else if (resp.status === 503) {
              streamNote("The stream is unavailable: " + msg, "warn");
              wait = Math.max(wait, 2000);
            } else {
              streamNote("The stream was refused: " + msg, "error");
            }
          } else {
            await readStream(resp.body, ctl.signal, () => { delay = 500; });
          }
        } catch (e) {
          if (ctl.signal.aborted) return;
        }
        if (ctl.signal.aborted) return;
        conn("Reconnecting in " + Math.round(wait / 100) / 10 + " s", "wait");
        await new Promise((res) => setTimeout(res, wait));
        delay = Math.min(delay * 2, 8000);
      }
    };
    run();
  }

  // Server-Sent Events (HTML § 9.2.6): lines end in CRLF, LF or CR; "field: value"; a blank
  // line dispatches; lines starting with ":" are comments (keep-alives).
  async function readStream(body, signal, onOpen) {
    const reader = body.getReader();
    const decoder = new TextDecoder("utf-8");
    let buf = "";
    let ev = { event: "", data: [], id: null };
    const onLine = (line) => {
      if (line === "") {
        if (ev.data.length) dispatch(ev.event || "message", ev.data.join("\n"), ev.id, onOpen);
        ev = { event: "", data: [], id: null };
        return;
      }
      if (line[0] === ":") return;
      const at = line.indexOf(":");
      const field = at < 0 ? line : line.slice(0, at);
      let value = at < 0 ? "" : line.slice(at + 1);
      if (value[0] === " ") value = value.slice(1);
      if (field === "event") ev.event = value;
      else if (field === "data") ev.data.push(value);
      else if (field === "id" && !value.includes("\0")) { ev.id = value; state.lastEventId = value; }
    };
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        for (;;) {
          const m = /\r\n|\r|\n/.exec(buf);
          if (!m) break;
          // A CR at the end of what came may be the first half of a CRLF.
          if (m[0] === "\r" && m.index === buf.length - 1) break;
          onLine(buf.slice(0, m.index));
          buf = buf.slice(m.index + m[0].length);
        }
      }
    } finally {
      if (!signal.aborted) reader.cancel().catch(() => {});
    }
  }

  function streamNote(text, kind) {
    note("stream-note", text, kind);
  }

  function dispatch(type, data, id, onOpen) {
    let d;
    try { d = JSON.parse(data); } catch (_) { d = { raw: data }; }
    switch (type) {
      case "ready":
        onOpen();
        conn(state.paused ? "Live (paused)" : "Live", "live");
        if (d.replayed) streamNote("Resumed: " + d.replayed + " events replayed from the server's backlog.", "info");
        return;
      case "gap": {
        const why = {
          evicted: "the server's backlog no longer holds " + (d.missed === null ? "some" : d.missed) + " of them",
          not_recorded: "the stream was not recording meanwhile",
          other_instance: "the server restarted",
          unknown_id: "the server did not know where this page stopped",
        }[d.reason] || d.reason;
        pushNotice("Missed events while disconnected: " + why + ".", "warn");
        return;
      }
      case "dropped":
        pushNotice(d.count + " events lost: " + (d.reason === "client_queue_full"
          ? "this page read too slowly"
          : "the stream's own queue was full (" + d.source + ")") + ".", "warn");
        return;
      case "shutdown":
        conn("Server stopped", "wait");
        pushNotice("The server is shutting down: " + (d.reason || "") + ".", "warn");
        return;
      case "plugin":
        state.pluginRates.set(d.plugin, { calls: d.calls || 0, interval: d.interval_ms || 1000, results: d.results || {}, at: Date.now() });
        return;
      case "run":
        if (d.kind === "skipped" || d.kind === "dropped" || d.kind === "cancelled") {
          const seen = state.liveRuns.get(d.id) || [];
          seen.push(d);
          if (seen.length > 50) seen.shift();
          state.liveRuns.set(d.id, seen);
        }
        pushRow({ kind: "run", id, data: d, event: "run", agent: d.agent || "" });
        if (state.runsOf && state.runsOf === d.id && $("runs").open) refreshRuns();
        return;
      default:
        pushRow({ kind: "bus", id, data: d, event: d.event || d.topic || type, agent: d.agent || "" });
    }
  }

  function pushNotice(text, kind) {
    pushRow({ kind: "notice", data: { text, kind }, event: "", agent: "" });
  }

  function pushRow(row) {
    state.rows.push(row);
    if (state.rows.length > MAX_ROWS) state.rows.splice(0, state.rows.length - MAX_ROWS);
    if (row.event) menus.event.see(row.event, row.event === "run" ? "hook runs" : row.event);
    if (row.agent) menus.agent.see(row.agent, row.agent);
    if (state.paused) {
      state.unseen += 1;
      $("pause").textContent = "Resume (" + state.unseen + " new)";
      return;
    }
    if (!matches(row)) return;
    const list = $("stream-list");
    list.insertBefore(rowNode(row), list.firstChild);
    while (list.childNodes.length > MAX_ROWS) list.removeChild(list.lastChild);
    show($("stream-empty"), false);
  }

  // A filter menu holds the MAX_OPTIONS values first seen most recently (the filter in use
  // always stays), like the list holds the last MAX_ROWS rows; a last, disabled option says
  // how many more were seen. A value seen again after it left comes back as the newest.
  const MAX_OPTIONS = 200;
  // Values no longer listed, remembered (up to this many) only to count them.
  const MAX_UNLISTED = 10000;

  function menu(selectId) {
    const listed = new Map(); // value → its <option>, oldest first
    const unlisted = new Set();
    let note = null;
    function sayMore() {
      const sel = $(selectId);
      if (note) { note.remove(); note = null; }
      if (!unlisted.size) return;
      const n = unlisted.size >= MAX_UNLISTED ? "over " + MAX_UNLISTED.toLocaleString("en") : unlisted.size.toLocaleString("en");
      note = el("option", { disabled: true, value: "" }, n + " more not shown (the " + MAX_OPTIONS + " newest are)");
      sel.appendChild(note);
    }
    return {
      see(value, label) {
        if (listed.has(value)) return;
        const sel = $(selectId);
        unlisted.delete(value);
        const option = el("option", { value }, truncate(label, 60));
        sel.insertBefore(option, note);
        listed.set(value, option);
        for (const [old, node] of listed) {
          if (listed.size <= MAX_OPTIONS) break;
          if (old === sel.value) continue;
          node.remove();
          listed.delete(old);
          if (unlisted.size < MAX_UNLISTED) unlisted.add(old);
        }
        sayMore();
      },
    };
  }

  const menus = { event: menu("filter-event"), agent: menu("filter-agent") };
  const sessionMenu = menu("sessions-agent");

  function matches(row) {
    const ev = $("filter-event").value;
    const agent = $("filter-agent").value;
    if (row.kind === "notice") return true;
    const s = state.session;
    if (s && (row.agent !== s.agent || (row.data && row.data.session) !== s.session)) return false;
    return (!ev || row.event === ev) && (!agent || row.agent === agent);
  }

  // ---- sessions (GET /api/sessions) ------------------------------------------------------

  let sessionsInFlight = false;
  async function pollSessions() {
    if (!state.token || sessionsInFlight) return;
    sessionsInFlight = true;
    try {
      const r = await api("GET", "api/sessions", { quiet: true });
      renderSessions((r.body && r.body.sessions) || []);
    } catch (_) {
      /* the banner says it */
    } finally {
      sessionsInFlight = false;
    }
  }

  // One session's events and runs only, in the live list (`null`: every session).
  function pickSession(s) {
    state.session = s;
    const chip = $("session-chip");
    chip.textContent = s ? "Session " + truncate(s.session, 40) + " ×" : "";
    show(chip, !!s);
    renderRows();
    if (s) $("stream").scrollIntoView({ block: "start" });
  }

  function renderSessions(list) {
    const agents = new Set(list.map((x) => x.agent));
    for (const a of agents) sessionMenu.see(a, a);
    const agent = $("sessions-agent").value;
    const shown = list.filter((x) => !agent || x.agent === agent);
    const body = $("sessions-list");
    clear(body);
    for (const x of shown) {
      const picked = state.session && state.session.agent === x.agent && state.session.session === x.session;
      const pick = el("button", { type: "button", class: "link", "aria-pressed": String(!!picked) }, truncate(x.session, 60));
      pick.addEventListener("click", () => pickSession(picked ? null : { agent: x.agent, session: x.session }));
      body.appendChild(el("tr", { "data-agent": x.agent, "data-session": x.session },
        el("td", null, x.agent),
        el("td", null, pick),
        el("td", { class: "num tokens-in" }, fmt(x.input_tokens || 0)),
        el("td", { class: "num tokens-out" }, fmt(x.output_tokens || 0)),
        el("td", { class: "num" }, fmt(x.cache_read_input_tokens || 0)),
        el("td", { class: "muted small" }, ms(x.idle_ms) + " ago")));
    }
    show($("sessions-empty"), shown.length === 0);
    show($("sessions-table"), shown.length > 0);
  }

  function renderRows() {
    const list = $("stream-list");
    clear(list);
    const shown = state.rows.filter(matches);
    for (let i = shown.length - 1; i >= 0; i--) list.appendChild(rowNode(shown[i]));
    show($("stream-empty"), shown.length === 0);
  }

  // What a row says first, per event: its documented fields, in order.
  const FIRST = {
    tool_call_start: ["tool", "arguments"],
    tool_call: ["tool", "success", "output"],
    agent_end: ["success", "messages_count"],
    llm_request: ["provider", "model", "messages_count"],
    llm_response: ["provider", "model", "duration_ms", "success"],
    error: ["component", "message"],
  };
  // Fields that only locate the agent's own files or repeat the row's other columns: in the
  // detail (a click), never crowding out what the event says.
  const QUIET = new Set(["session_id", "transcript_path", "agent_transcript_path", "cwd",
    "hook_event_name", "permission_mode", "parent_session", "event_id"]);

  function scalar(v, max) {
    return typeof v === "string" ? truncate(v.replace(/\s+/g, " "), max) : String(v);
  }

  function summary(payload, event) {
    if (!payload || typeof payload !== "object") return payload === undefined ? "" : JSON.stringify(payload);
    const first = FIRST[event] || [];
    const keys = first.filter((k) => k in payload)
      .concat(Object.keys(payload).filter((k) => !first.includes(k) && !QUIET.has(k)));
    const parts = [];
    for (const k of keys) {
      const v = payload[k];
      if (v === null || v === undefined) continue;
      if (typeof v !== "object") { parts.push(k + ": " + scalar(v, 80)); continue; }
      // A tool's arguments say what it does: their plain members, shown as the others are.
      if (k === "arguments" && !Array.isArray(v)) {
        for (const [ak, av] of Object.entries(v)) {
          if (av !== null && typeof av !== "object") parts.push(ak + ": " + scalar(av, 120));
        }
      }
    }
    return truncate(parts.join(" · "), 240);
  }

  // A decision (docs/policies.md § Audit): the decided event's own fields, or the
  // `prx.policy.decision` message the decision was published as. `null` if neither.
  const DECISION_TOPIC = "prx.policy.decision";
  const DECISION_FIELDS = new Set(["policy_decision", "policy_id", "policy_reason"]);
  function decisionOf(d) {
    const p = d.payload;
    if (!p || typeof p !== "object") return null;
    if (d.topic === DECISION_TOPIC) {
      return { decision: p.decision || "none", policy: p.policy, reason: p.reason, point: p.point, us: p.elapsed_us };
    }
    if (typeof p.policy_decision === "string") {
      return { decision: p.policy_decision, policy: p.policy_id, reason: p.policy_reason };
    }
    return null;
  }

  function decisionText(x) {
    if (x.decision === "none") return (x.point ? x.point + " " : "") + "no decision";
    return (x.point ? x.point + " " : "") + x.decision + (x.policy ? " by " + x.policy : "") +
      (x.reason ? ": " + truncate(String(x.reason).replace(/\s+/g, " "), 160) : "") +
      (typeof x.us === "number" ? " (" + fmt(x.us) + " µs)" : "");
  }

  function rowNode(row) {
    if (row.kind === "notice") {
      return el("li", { class: "row notice", "data-kind": row.data.kind }, row.data.text);
    }
    const d = row.data;
    let badge, who, text, mark = null, cls = "";
    if (row.kind === "run") {
      // A run that never started says why in the text; its badge is the kind.
      const notRun = d.kind === "skipped" || d.kind === "dropped" || d.kind === "cancelled";
      badge = el("span", { class: "badge " + outcomeClass(d), title: d.outcome || d.kind }, notRun ? d.kind : (d.outcome || d.kind));
      who = "hook " + d.id + (d.direct ? " (test)" : "");
      text = (d.event ? d.event + " · " : "") + (notRun ? d.outcome || "" : ms(d.duration_ms)) +
        (d.stderr_tail ? " · stderr: " + truncate(d.stderr_tail.trim().replace(/\s+/g, " "), 120) : "");
      cls = "run";
    } else {
      badge = el("span", { class: "badge event", title: d.topic || null }, d.event || d.topic || "message");
      who = [d.agent, d.session].filter((x) => x).join(" / ");
      const decided = decisionOf(d);
      if (decided && d.topic === DECISION_TOPIC) {
        text = decisionText(decided);
      } else if (decided) {
        const rest = Object.fromEntries(Object.entries(d.payload).filter(([k]) => !DECISION_FIELDS.has(k)));
        text = decisionText(decided) + " · " + summary(rest, d.event);
      } else {
        text = summary(d.payload, d.event);
      }
      if (decided) {
        mark = el("span", { class: "badge decision decision-" + decided.decision, title: decided.reason || null }, decided.decision);
      }
      cls = "bus";
    }
    const detail = el("pre", { class: "detail", hidden: true }, block(JSON.stringify(d, null, 2)));
    const head = el("button", { type: "button", class: "row-head", "aria-expanded": "false" },
      el("span", { class: "time" }, clock(d.timestamp || d.time)),
      badge,
      el("span", { class: "who" }, who),
      el("span", { class: "text" }, mark, mark ? " " : null, text));
    head.addEventListener("click", () => {
      const open = head.getAttribute("aria-expanded") === "true";
      head.setAttribute("aria-expanded", String(!open));
      show(detail, !open);
    });
    return el("li", { class: "row " + cls, "data-event": row.event }, head, detail);
  }

  function setupStreamControls() {
    $("pause").addEventListener("click", () => {
      state.paused = !state.paused;
      $("pause").setAttribute("aria-pressed", String(state.paused));
      $("pause").textContent = state.paused ? "Resume" : "Pause";
      if (!state.paused) { state.unseen = 0; renderRows(); }
      if ($("conn").dataset.state === "live") conn(state.paused ? "Live (paused)" : "Live", "live");
    });
    $("filter-event").addEventListener("change", renderRows);
    $("filter-agent").addEventListener("change", renderRows);
    $("clear").addEventListener("click", () => { state.rows = []; state.unseen = 0; renderRows(); });
    $("session-chip").addEventListener("click", () => pickSession(null));
    $("sessions-agent").addEventListener("change", pollSessions);
  }

  // ---- counters and charts ---------------------------------------------------------------

  let statsInFlight = false;
  async function pollStats() {
    if (!state.token || statsInFlight) return;
    statsInFlight = true;
    try {
      const r = await api("GET", "api/stats", { quiet: true });
      const now = performance.now();
      state.prevStats = state.stats ? { s: state.stats, at: state.statsAt } : null;
      state.stats = r.body;
      state.statsAt = now;
      banner(null);
      renderStats();
    } catch (_) {
      /* the banner says it */
    } finally {
      statsInFlight = false;
    }
  }

  function pushRate(series, v) {
    series.push(v);
    if (series.length > RATE_POINTS) series.shift();
  }

  function renderStats() {
    const s = state.stats;
    if (!s) return;
    if (state.prevStats) {
      const p = state.prevStats.s;
      const dt = Math.max((state.statsAt - state.prevStats.at) / 1000, 0.001);
      const per = (k) => Math.max(0, ((s[k] || 0) - (p[k] || 0)) / dt);
      const drops = (x) => (x.dropped || 0) + (x.dropped_budget || 0) + (x.oversize || 0) + (x.dropped_shutdown || 0);
      pushRate(state.rate.emitted, per("emitted"));
      pushRate(state.rate.processed, per("processed"));
      pushRate(state.rate.dropped, Math.max(0, (drops(s) - drops(p)) / dt));
    }
    const r = state.rate;
    $("rate-now").textContent = fmt(r.emitted.length ? r.emitted[r.emitted.length - 1] : 0);
    sparkline($("rate-chart"), [
      { values: r.emitted, cls: "s-emitted" },
      { values: r.processed, cls: "s-processed" },
      { values: r.dropped, cls: "s-dropped" },
    ]);
    const legend = $("rate-legend");
    clear(legend);
    legend.append(
      el("span", { class: "key s-emitted" }, "emitted " + fmt(s.emitted)),
      el("span", { class: "key s-processed" }, "processed " + fmt(s.processed)),
      el("span", { class: "key s-dropped" }, "dropped " + fmt((s.dropped || 0) + (s.dropped_budget || 0) + (s.oversize || 0) + (s.dropped_shutdown || 0))));

    const shell = s.shell || {};
    const totals = shell.totals || {};
    const ev = s.events || {};
    const pluginDrops = ((s.plugins && s.plugins.plugins) || []).reduce((a, p) => a + (p.dropped || 0), 0);
    bars($("drops-chart"), [
      { label: "ring full", parts: [{ v: s.dropped || 0, cls: "b-drop" }] },
      { label: "byte budget", parts: [{ v: s.dropped_budget || 0, cls: "b-drop" }] },
      { label: "oversize", parts: [{ v: s.oversize || 0, cls: "b-drop" }] },
      { label: "shutdown", parts: [{ v: s.dropped_shutdown || 0, cls: "b-drop" }] },
      { label: "hook queue full", parts: [{ v: totals.dropped_queue_full || 0, cls: "b-warn" }] },
      { label: "plugin queues", parts: [{ v: pluginDrops, cls: "b-warn" }] },
      { label: "stream: slow page", parts: [{ v: ev.dropped_client || 0, cls: "b-warn" }] },
      { label: "stream: own queue", parts: [{ v: ev.dropped_server || 0, cls: "b-warn" }] },
    ], { empty: "No drops." });

    bars($("sinks-chart"), (s.sinks || []).map((k) => ({
      label: k.name,
      parts: [
        { v: k.delivered || 0, cls: "b-ok", name: "delivered" },
        { v: k.in_flight || 0, cls: "b-info", name: "in flight" },
        { v: k.dropped || 0, cls: "b-warn", name: "dropped" },
        { v: k.failed || 0, cls: "b-drop", name: "failed" },
      ],
    })), { legend: [["b-ok", "delivered"], ["b-info", "in flight"], ["b-warn", "dropped"], ["b-drop", "failed"]], stacked: true });

    const hooks = shell.hooks || {};
    bars($("outcomes-chart"), Object.keys(hooks).sort().map((id) => {
      const c = hookCounts(hooks[id]);
      return {
        label: id,
        parts: [
          { v: c.ok, cls: "b-ok", name: "ok" },
          { v: c.failed, cls: "b-drop", name: "failed" },
          { v: c.skipped, cls: "b-skip", name: "skipped" },
          { v: c.dropped, cls: "b-warn", name: "dropped" },
        ],
      };
    }), { legend: [["b-ok", "ok"], ["b-drop", "failed"], ["b-skip", "skipped"], ["b-warn", "dropped"]], stacked: true, empty: "No hooks." });

    if (s.config && s.config.enabled === false) {
      note("hooks-note", "hooks.json switches every hook off (top-level \"enabled\": false).", "warn");
    }
    $("stats-age").textContent = "updated " + new Date().toLocaleTimeString();
    // Per-hook counts in the list follow the stats.
    for (const li of document.querySelectorAll("#hooks-list li.hook")) {
      const st = hookStats(li.dataset.id);
      const p = li.querySelector(".hook-counts");
      if (st && p) p.textContent = shown(countsText(hookCounts(st)));
    }
  }

  function sparkline(box, series) {
    // Drawn at the box's own width, so lines and text are not stretched.
    const W = Math.max(120, Math.round(box.clientWidth || 240)), H = 56;
    const max = Math.max(1, ...series.flatMap((s) => s.values));
    const chart = svg("svg", { viewBox: "0 0 " + W + " " + H, class: "spark", role: "img", "aria-label": "events per second over the last minute, at most " + fmt(max) + "/s" });
    for (const y of [0.5, H / 2, H - 0.5]) chart.appendChild(svg("line", { x1: 0, x2: W, y1: y, y2: y, class: "grid" }));
    // The samples so far fill the width (at least 10 s of it), up to the last minute.
    const n = Math.max(0, ...series.map((s) => s.values.length));
    const span = Math.min(RATE_POINTS, Math.max(n, 10));
    const step = W / (span - 1);
    for (const s of series) {
      if (s.values.length < 2) continue;
      const x0 = W - step * (s.values.length - 1);
      const pts = s.values.map((v, i) => (x0 + i * step).toFixed(1) + "," + (H - 2 - (v / max) * (H - 6)).toFixed(1));
      chart.appendChild(svg("polyline", { points: pts.join(" "), class: "line " + s.cls }));
    }
    chart.appendChild(svg("text", { x: 2, y: 10, class: "axis" }, fmt(max) + "/s"));
    chart.appendChild(svg("text", { x: W - 2, y: 10, class: "axis end" }, "last " + span + " s"));
    clear(box);
    box.appendChild(chart);
  }

  // Horizontal bars: one row per label, stacked parts, scaled to the largest row.
  function bars(box, rows, opts = {}) {
    clear(box);
    const total = (r) => r.parts.reduce((a, p) => a + p.v, 0);
    const max = Math.max(1, ...rows.map(total));
    if (opts.empty && (!rows.length || (!opts.stacked && rows.every((r) => total(r) === 0)))) {
      box.appendChild(el("p", { class: "empty small" }, opts.empty));
      return;
    }
    const list = el("ul", { class: "bar-list" });
    for (const r of rows) {
      const t = total(r);
      // A list of reasons shows only those that happened.
      if (opts.empty && !opts.stacked && t === 0) continue;
      const chart = svg("svg", { viewBox: "0 0 100 8", preserveAspectRatio: "none", class: "bar", "aria-hidden": "true" });
      chart.appendChild(svg("rect", { x: 0, y: 0, width: 100, height: 8, class: "track", rx: 1.5 }));
      let x = 0;
      for (const p of r.parts) {
        if (!p.v) continue;
        const w = Math.max(0.8, (p.v / max) * 100);
        chart.appendChild(svg("rect", { x: x.toFixed(2), y: 0, width: w.toFixed(2), height: 8, class: p.cls }));
        x += w;
      }
      const detail = r.parts.filter((p) => p.v && p.name).map((p) => p.name + " " + fmt(p.v)).join(", ");
      list.appendChild(el("li", { class: "bar-row", title: detail || null },
        el("span", { class: "bar-label" }, r.label),
        chart,
        el("span", { class: "bar-value", "aria-label": detail || String(t) }, fmt(t))));
    }
    box.appendChild(list);
    if (opts.legend) {
      box.appendChild(el("p", { class: "legend" }, opts.legend.map(([cls, name]) => el("span", { class: "key " + cls }, name))));
    }
  }

  // ---- plugins ---------------------------------------------------------------------------

  let pluginsInFlight = false;
  async function pollPlugins() {
    if (!state.token || pluginsInFlight) return;
    pluginsInFlight = true;
    try {
      const r = await api("GET", "api/plugins", { quiet: true });
      renderPlugins(r.body || {});
    } catch (_) {
      /* the banner says it */
    } finally {
      pluginsInFlight = false;
    }
  }

  function renderPlugins(p) {
    const box = $("plugins-list");
    clear(box);
    if (!p.enabled) {
      box.appendChild(el("p", { class: "empty" }, "WASM plugins are not enabled on this server (no workspace, or built without the wasm feature)."));
      return;
    }
    const plugins = p.plugins || [];
    if (!plugins.length) box.appendChild(el("p", { class: "empty" }, "No plugins loaded."));
    const grid = el("ul", { class: "plugin-grid" });
    for (const x of plugins) {
      const stateCls = x.state === "running" ? "ok" : x.state === "suspended" ? "fail" : "skip";
      const rate = state.pluginRates.get(x.name);
      const recent = rate && Date.now() - rate.at < 3000 ? fmt(rate.calls * 1000 / rate.interval) + " calls/s" : "idle";
      const results = [
        { v: x.ok || 0, cls: "b-ok", name: "ok" },
        { v: x.errors || 0, cls: "b-warn", name: "error" },
        { v: x.traps || 0, cls: "b-drop", name: "trap" },
        { v: x.timeouts || 0, cls: "b-drop2", name: "timeout" },
        { v: x.out_of_fuel || 0, cls: "b-drop2", name: "out of fuel" },
        { v: x.busy || 0, cls: "b-info", name: "busy" },
      ];
      const chart = el("div", { class: "bars" });
      const card = el("li", { class: "plugin", "data-name": x.name, "data-state": x.state },
        el("div", { class: "plugin-head" },
          el("p", { class: "plugin-name" }, x.name, el("span", { class: "muted small" }, " v" + x.version)),
          el("span", { class: "badge " + stateCls }, x.state)),
        x.state === "suspended" ? el("p", { class: "why" },
          "Suspended after repeated faults" + (x.suspended_for_ms ? ", runs again in " + ms(x.suspended_for_ms) : "") +
          (x.last_error ? ": " + x.last_error : ".")) : (x.last_error ? el("p", { class: "small muted last-error" }, "Last error: " + x.last_error) : null),
        el("p", { class: "small muted" }, "events " + (x.events || []).join(", ") + " · " + recent + " · queued " + fmt(x.queued) + " · kv " + fmt(x.kv_bytes) + " B"),
        chart);
      bars(chart, results.map((r) => ({ label: r.name, parts: [r] })));
      grid.appendChild(card);
    }
    box.appendChild(grid);
    const problems = [...(p.errors || []).map((e) => ["error", e]), ...(p.warnings || []).map((w) => ["warning", w])];
    if (problems.length) {
      box.appendChild(el("ul", { class: "plugin-errors" }, problems.map(([k, m]) => el("li", { class: k }, el("strong", null, k + ": "), m))));
    }
  }

  // ---- boot ------------------------------------------------------------------------------

  function boot() {
    setupEditor();
    setupStreamControls();
    $("login-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const t = $("token").value.trim();
      if (!t) {
        $("token-error").textContent = "Enter the token.";
        show($("token-error"), true);
        $("token").setAttribute("aria-invalid", "true");
        $("token").focus();
        return;
      }
      signIn(t);
    });
    $("logout").addEventListener("click", () => signOut(null));
    $("new-hook").addEventListener("click", () => openEditor(null));
    $("runs-close").addEventListener("click", () => $("runs").close());
    $("runs").addEventListener("close", () => { state.runsOf = null; });
    $("confirm-cancel").addEventListener("click", () => $("confirm").close());
    const saved = sessionStorage.getItem(TOKEN_KEY);
    if (saved) signIn(saved);
    else $("token").focus();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
  else boot();
})();
