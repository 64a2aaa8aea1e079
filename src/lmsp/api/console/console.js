// The lmsp console: plain JS, no build step. It calls the ordinary API with its
// session's secret in the X-Lmsp-Session header. The secret comes from spending the
// one-time code of a login link (/console/login#code=…: a fragment, never sent to a
// server) and lives in this tab's sessionStorage: it survives a reload, stays in this
// tab and this origin (a page on another port cannot read it), and is gone when the tab
// closes. No cookie: the browser would send one to every port of the host.
// Everything shown is set as text (textContent), never as HTML: client names and
// outputs are written by agents.
"use strict";

const TERMINAL = ["response.completed", "response.incomplete", "response.failed", "response.cancelled"];
const UNFINISHED = new Set(["queued", "loading", "running", "cancelling"]);
const SCOPES = ["models:read", "models:write", "responses:read", "responses:write", "admin"];
const SESSION_KEY = "lmsp.console.session";
// a pairing code this browser was sent to approve before it was signed in: kept (it is
// no secret) so that the login link, opened in this tab or another, lands on it
const PAIR_KEY = "lmsp.console.pair";
const PAIR_FOR = 10 * 60 * 1000;
let secret = sessionStorage.getItem(SESSION_KEY) || "";
let clientNames = {};
let following = null; // {id, stop}
const wantedCode = new URLSearchParams(location.search).get("user_code");

const $ = (id) => document.getElementById(id);

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function when(stamp) {
  return stamp ? new Date(stamp * 1000).toLocaleString() : "-";
}

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

function headers(extra = {}) {
  return { Accept: "application/json", "X-Lmsp-Session": secret, ...extra };
}

async function api(method, path, body) {
  const init = { method, headers: headers(), credentials: "omit", cache: "no-store" };
  if (method !== "GET" && method !== "DELETE") {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body || {});
  }
  const answer = await fetch(path, init);
  const data = await answer.json().catch(() => ({}));
  if (answer.status === 401) {
    forget();
    showSignin();
    throw new Error("signed out");
  }
  if (!answer.ok) {
    const error = data.error || {};
    throw new Error(`${error.message || answer.statusText} (${error.code || answer.status})`);
  }
  return data;
}

function forget() {
  secret = "";
  sessionStorage.removeItem(SESSION_KEY);
  if (following) following.stop();
  following = null;
}

function showSignin(spent = false) {
  $("app").hidden = true;
  $("signin").hidden = false;
  $("signin-spent").hidden = !spent;
  if (wantedCode) {
    localStorage.setItem(PAIR_KEY, JSON.stringify({ code: wantedCode, at: Date.now() }));
    $("signin-pair").hidden = false;
    $("signin-code").textContent = wantedCode;
  }
}

// the pairing code a login should land on (once), if it was asked for lately
function pendingPairCode() {
  const kept = localStorage.getItem(PAIR_KEY);
  localStorage.removeItem(PAIR_KEY);
  try {
    const { code, at } = JSON.parse(kept || "null") || {};
    return code && Date.now() - at < PAIR_FOR ? code : null;
  } catch {
    return null;
  }
}

// -- rows kept by id, updated in place (so a click never lands on a replaced row) ----------
function syncRows(tbody, items, key, build, update) {
  const seen = new Set();
  let previous = null;
  for (const item of items) {
    const id = key(item);
    seen.add(id);
    let row = tbody.querySelector(`tr[data-id="${CSS.escape(id)}"]`);
    if (!row) {
      row = build(item);
      row.dataset.id = id;
    }
    update(row, item);
    const wantedPlace = previous ? previous.nextSibling : tbody.firstChild;
    if (row !== wantedPlace) tbody.insertBefore(row, wantedPlace);
    previous = row;
  }
  for (const row of [...tbody.children]) if (!seen.has(row.dataset.id)) row.remove();
}

// -- tasks ---------------------------------------------------------------------------
// what a task is doing now, from the service's activity: a prompt being read (how far,
// how fast), the speed it generates at, and what slows it or keeps it waiting
function taskNow(activity) {
  const now = {};
  const number = (n) => n.toLocaleString("en");
  for (const s of activity.sequences) {
    let doing = "";
    if (s.phase === "reading") {
      doing = s.prompt_total
        ? `reading its prompt: ${number(s.prompt_read)} of ${number(s.prompt_total)}` +
          (s.prompt_tokens_per_second ? ` (${number(Math.round(s.prompt_tokens_per_second))} tok/s)` : "")
        : `reading its prompt (${number(s.prompt_tokens)} tokens)`;
    } else if (s.tokens_per_second) {
      doing = `generating, ${s.tokens_per_second.toFixed(1)} tok/s`;
    } else doing = "generating";
    now[s.task_id] = s.reason ? `${doing}; ${s.reason}` : doing;
  }
  for (const w of activity.waiting || []) now[w.task_id] = w.reason;
  return now;
}

function renderTasks(tasks, now = {}) {
  syncRows(
    $("task-rows"),
    tasks,
    (t) => t.id,
    (t) =>
      el(
        "tr",
        {},
        el("td", {}, el("code", { text: t.id })),
        el("td", { class: "status" }),
        el("td"),
        el("td", {}, el("code", { text: t.response_id })),
        el("td", { text: when(t.created_at) }),
        el("td", { class: "now" }),
        el(
          "td",
          {},
          el("button", { type: "button", class: "follow", text: "Follow", onclick: () => follow(t.id) }),
          " ",
          el("button", { type: "button", class: "cancel danger", text: "Cancel", onclick: () => cancel(t.id) }),
        ),
      ),
    (row, t) => {
      const cells = row.children;
      cells[1].textContent = t.status;
      cells[1].className = `status ${t.status}`;
      cells[2].textContent = clientNames[t.client_id] || t.client_id || "";
      cells[5].textContent = UNFINISHED.has(t.status) ? now[t.id] || "" : "";
      row.querySelector("button.cancel").hidden = !UNFINISHED.has(t.status);
    },
  );
}

async function cancel(taskId) {
  try {
    const task = await api("POST", `/v1/tasks/${encodeURIComponent(taskId)}/cancel`);
    if (following && following.id === taskId) $("follow-status").textContent = task.status;
    await refresh();
  } catch (err) {
    showError(`Cancel failed: ${err.message}`);
  }
}

// an event stream read with fetch (EventSource cannot send the session's header); it
// reconnects after a drop with Last-Event-ID, as EventSource would, until a terminal event
function stream(path, onEvent) {
  const control = new AbortController();
  let lastId = null;
  let ended = false;
  const run = async () => {
    while (!ended) {
      const extra = { Accept: "text/event-stream" };
      if (lastId !== null) extra["Last-Event-ID"] = lastId;
      try {
        const answer = await fetch(path, { headers: headers(extra), signal: control.signal, cache: "no-store" });
        if (answer.status === 401) {
          forget();
          showSignin();
          return;
        }
        if (!answer.ok || !answer.body) throw new Error(`status ${answer.status}`);
        const reader = answer.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value.replace(/\r\n?/g, "\n");
          let cut;
          while ((cut = buffer.indexOf("\n\n")) >= 0) {
            const frame = buffer.slice(0, cut);
            buffer = buffer.slice(cut + 2);
            const event = { type: "message", data: [] };
            for (const line of frame.split("\n")) {
              if (!line || line.startsWith(":")) continue;
              const colon = line.indexOf(":");
              const field = colon < 0 ? line : line.slice(0, colon);
              const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
              if (field === "event") event.type = text;
              else if (field === "data") event.data.push(text);
              else if (field === "id") lastId = text;
            }
            if (event.data.length && onEvent(event.type, event.data.join("\n")) === false) {
              ended = true;
              control.abort();
              return;
            }
          }
        }
      } catch (err) {
        if (ended || control.signal.aborted) return;
      }
      await new Promise((done) => setTimeout(done, 1000));
    }
  };
  run();
  return () => {
    ended = true;
    control.abort();
  };
}

// one line per step of a task's MCP tool loop (docs/tools.md)
function mcpStep(item) {
  if (!item) return "";
  const error = (e) => (e && (e.message || (e.content || []).map((c) => c.text).join(" "))) || "";
  if (item.type === "mcp_list_tools") {
    const names = (item.tools || []).map((t) => t.name).join(", ");
    return `[mcp ${item.server_label}] tools: ${item.error || names || "none"}`;
  }
  if (item.type === "mcp_call") {
    const result = item.error ? `error: ${error(item.error)}` : item.output || "";
    return `[mcp ${item.server_label}] ${item.name}(${item.arguments}) → ${result}`;
  }
  if (item.type === "mcp_approval_request") {
    return `[mcp ${item.server_label}] waiting for approval: ${item.name}(${item.arguments})`;
  }
  return "";
}

function follow(taskId) {
  if (following) following.stop();
  document.body.classList.add("following");
  $("follow").hidden = false;
  $("follow-id").textContent = taskId;
  $("follow-status").textContent = "";
  $("follow-status").className = "status";
  const text = $("follow-text");
  text.textContent = "";
  const status = (kind, data) => {
    const shown = (data.response && data.response.status) || kind;
    $("follow-status").textContent = shown;
    $("follow-status").className = `status ${shown}`;
  };
  const stop = stream(`/v1/tasks/${encodeURIComponent(taskId)}/events`, (kind, raw) => {
    if (raw === "[DONE]") return false;
    const data = JSON.parse(raw);
    if (kind === "response.output_text.delta") {
      text.append(data.delta || "");
      text.scrollTop = text.scrollHeight;
    } else if (kind === "response.output_item.done" && mcpStep(data.item)) {
      text.append(`\n${mcpStep(data.item)}\n`); // the MCP loop: its lists, calls, approvals
      text.scrollTop = text.scrollHeight;
    } else if (kind === "response.queued" || kind === "response.in_progress") {
      status(kind, data);
    } else if (TERMINAL.includes(kind)) {
      status(kind, data);
      return false; // the log is complete: no reconnect
    } else if (kind === "error") {
      $("follow-status").textContent = data.code || "error";
      return false;
    }
    return true;
  });
  following = { id: taskId, stop };
  $("follow-cancel").onclick = () => cancel(taskId);
  // where the user sees it: beside the lists on a wide window, above them on a narrow one
  $("follow").scrollIntoView({ block: "nearest" });
}

// -- pairing ---------------------------------------------------------------------------
function renderPairing(pending) {
  const list = $("pairing-list");
  $("pairing-empty").hidden = pending.length > 0;
  $("pairing-hint").hidden = !wantedCode;
  $("wanted-code").textContent = wantedCode || "";
  const seen = new Set();
  for (const request of pending) {
    seen.add(request.id);
    if (list.querySelector(`li[data-id="${CSS.escape(request.id)}"]`)) continue;
    const boxes = SCOPES.filter((s) => request.scopes.includes(s)).map((scope) =>
      el(
        "label",
        {},
        el("input", { type: "checkbox", name: "scope", value: scope, checked: "" }),
        " ",
        scope,
        scope === "admin" ? el("span", { class: "admin-flag", text: " (full control!)" }) : "",
      ),
    );
    const item = el(
      "li",
      { class: request.user_code === wantedCode ? "wanted" : "" },
      el("span", { class: "code", text: request.user_code }),
      " ",
      el("strong", { text: request.client_name }),
      el("span", { class: "hint", text: ` from ${request.source || "?"}, expires ${when(request.expires_at)}` }),
      el("div", {}, ...boxes),
      el("button", {
        type: "button",
        class: "approve primary",
        text: "Approve",
        onclick: () => decide(request.id, true, item),
      }),
      " ",
      el("button", {
        type: "button",
        class: "deny danger",
        text: "Deny",
        onclick: () => decide(request.id, false, item),
      }),
    );
    item.dataset.id = request.id;
    item.dataset.code = request.user_code;
    list.append(item);
  }
  for (const item of [...list.children]) if (!seen.has(item.dataset.id)) item.remove();
}

async function decide(id, approve, item) {
  try {
    if (approve) {
      const scopes = [...item.querySelectorAll("input[name=scope]:checked")].map((b) => b.value);
      if (!scopes.length) {
        showError("Pick at least one scope, or deny the request.");
        return;
      }
      await api("POST", `/v1/pairing/${encodeURIComponent(id)}/approve`, { scopes });
    } else {
      await api("POST", `/v1/pairing/${encodeURIComponent(id)}/deny`);
    }
    item.remove();
    showError("");
    await refresh();
  } catch (err) {
    showError(`${approve ? "Approve" : "Deny"} failed: ${err.message}`);
  }
}

// -- clients and models ----------------------------------------------------------------
function renderClients(clients, me) {
  syncRows(
    $("client-rows"),
    clients,
    (c) => c.id,
    (c) =>
      el(
        "tr",
        {},
        el("td", { text: c.name }),
        el("td", {}, el("code", { text: c.id })),
        el("td", { text: c.scopes.join(" ") }),
        el("td"),
        el("td"),
        el("td", {}, el("button", { type: "button", class: "revoke danger", text: "Revoke", onclick: () => revoke(c.id) })),
        el("td"),
        el("td", {}, el("button", { type: "button", class: "limits", text: "Limits…", onclick: () => setLimits(c) })),
      ),
    (row, c) => {
      row.children[3].textContent = when(c.last_used_at);
      row.children[4].textContent = c.revoked_at ? when(c.revoked_at) : "";
      row.querySelector("button.revoke").hidden = Boolean(c.revoked_at) || c.id === me;
      row.children[6].textContent = limitsText(c.limits || {});
      row.querySelector("button.limits").hidden = Boolean(c.revoked_at) || c.id === me;
    },
  );
}

// fair share: a client's limits (PROTOCOL.md 13), "name=value" pairs, "none" lifts one
const LIMITS = ["max_queued", "max_running", "tokens_per_minute", "tokens_per_day"];

function limitsText(limits) {
  return LIMITS.filter((k) => limits[k] !== null && limits[k] !== undefined)
    .map((k) => `${k}=${limits[k]}`)
    .join(" ");
}

async function setLimits(client) {
  const given = window.prompt(
    `Limits of ${client.name} (${LIMITS.join(", ")}; a number, or none to lift):`,
    LIMITS.map((k) => `${k}=${client.limits && client.limits[k] != null ? client.limits[k] : "none"}`).join(" "),
  );
  if (given === null) return;
  const limits = {};
  for (const pair of given.split(/[\s,]+/).filter(Boolean)) {
    const [name, value] = pair.split("=");
    if (!LIMITS.includes(name)) return showError(`Unknown limit ${name}`);
    limits[name] = value === "none" || value === "" ? null : Number(value);
  }
  try {
    await api("PATCH", `/v1/clients/${encodeURIComponent(client.id)}`, { limits });
    await refresh();
  } catch (err) {
    showError(`Changing the limits failed: ${err.message}`);
  }
}

function renderUsage(rows) {
  syncRows(
    $("usage-rows"),
    rows,
    (u) => `${u.client_id} ${u.model}`,
    () => el("tr", {}, el("td"), el("td"), el("td"), el("td"), el("td"), el("td")),
    (row, u) => {
      row.children[0].textContent = u.client_name || u.client_id;
      row.children[1].textContent = u.model;
      row.children[2].textContent = String(u.requests);
      row.children[3].textContent = String(u.input_tokens);
      row.children[4].textContent = String(u.cached_tokens);
      row.children[5].textContent = String(u.output_tokens);
    },
  );
}

async function revoke(clientId) {
  try {
    await api("DELETE", `/v1/clients/${encodeURIComponent(clientId)}`);
    await refresh();
  } catch (err) {
    showError(`Revoke failed: ${err.message}`);
  }
}

function renderModels(models) {
  syncRows(
    $("model-rows"),
    models,
    (m) => m.id,
    () => el("tr", {}, el("td"), el("td", {}, el("code")), el("td"), el("td"), el("td")),
    (row, m) => {
      row.children[0].textContent = m.id;
      row.children[1].firstChild.textContent = m.digest;
      row.children[2].textContent = `${(m.size_bytes / 1048576).toFixed(1)} MiB`;
      row.children[3].textContent = m.status || "ready";
      row.children[4].textContent = m.loaded ? "yes" : "";
    },
  );
}

// nodes sharing one PostgreSQL database (none on SQLite: the section stays hidden)
function renderNodes(nodes, self) {
  $("nodes").hidden = nodes.length === 0;
  syncRows(
    $("node-rows"),
    nodes,
    (n) => n.id,
    () => el("tr", {}, el("td"), el("td"), el("td"), el("td"), el("td"), el("td")),
    (row, n) => {
      row.children[0].textContent = n.id === self ? `${n.id} (this node)` : n.id;
      row.children[1].textContent = n.address;
      row.children[2].textContent = n.status;
      row.children[3].textContent = n.status === "up" ? `${n.lease_seconds_left.toFixed(1)}s left` : "";
      row.children[4].textContent =
        n.clock_skew_seconds === null ? "" : `${n.clock_skew_seconds >= 0 ? "+" : ""}${n.clock_skew_seconds.toFixed(3)}s`;
      const held = n.tasks.map((t) => `${t.id} (${t.status})`).join(", ");
      row.children[5].textContent = n.unfinished > n.tasks.length ? `${held}, … (${n.unfinished} in all)` : held;
    },
  );
}

// webhooks of every client (the console's client is the owner: it sees them all)
function renderWebhooks(hooks) {
  $("webhooks-empty").hidden = hooks.length > 0;
  syncRows(
    $("webhook-rows"),
    hooks,
    (h) => h.id,
    () => el("tr", {}, el("td", {}, el("code")), el("td"), el("td"), el("td"), el("td")),
    (row, h) => {
      row.children[0].firstChild.textContent = h.id;
      row.children[1].textContent = h.url;
      row.children[2].textContent = h.events.map((e) => e.replace("response.", "")).join(" ");
      row.children[3].textContent = h.all_clients
        ? "every client"
        : clientNames[h.client_id] || h.client_id || "";
      row.children[4].textContent = when(h.created_at);
    },
  );
}

// -- the loop ----------------------------------------------------------------------------
let me = "";

async function refresh() {
  const [tasks, pairing, clients, models, activity, usage, webhooks] = await Promise.all([
    api("GET", "/v1/tasks?limit=50"),
    api("GET", "/v1/pairing"),
    api("GET", "/v1/clients"),
    api("GET", "/v1/models"),
    api("GET", "/v1/service/activity"),
    api("GET", "/v1/usage?group_by=model"),
    api("GET", "/v1/webhooks"),
  ]);
  renderUsage(usage.data);
  clientNames = Object.fromEntries(clients.data.map((c) => [c.id, c.name]));
  renderPairing(pairing.data);
  renderTasks(tasks.data, taskNow(activity));
  renderClients(clients.data, me);
  renderModels(models.data);
  renderNodes(activity.nodes, activity.node);
  renderWebhooks(webhooks.data);
  const running = activity.sequences
    .map((s) => `${s.task_id} ${s.tokens_per_second ? s.tokens_per_second.toFixed(1) + " tok/s" : ""}`)
    .join(", ");
  $("summary").textContent =
    `${activity.sequences.length} running${running ? ` (${running})` : ""}, ${activity.queue.queued} queued` +
    (activity.pulls || [])
      .map((p) => `, pulling ${p.model} ${p.total ? Math.floor((100 * p.bytes) / p.total) : 0}%`)
      .join("");
}

// a login link: spend the code in its fragment for a session, then go where the
// operator was headed (a pairing request's page, or the console)
async function signIn() {
  const code = new URLSearchParams(location.hash.slice(1)).get("code") || "";
  history.replaceState(null, "", location.pathname); // the code leaves the address bar
  if (!code) return showSignin(true);
  const answer = await fetch("/console/session", {
    method: "POST",
    headers: { Accept: "application/json", "Content-Type": "application/json" },
    body: JSON.stringify({ code }),
    credentials: "omit",
    cache: "no-store",
  });
  if (!answer.ok) return showSignin(true);
  const session = await answer.json();
  sessionStorage.setItem(SESSION_KEY, session.secret);
  const pair = wantedCode || pendingPairCode();
  location.replace(pair ? `/console/pair?user_code=${encodeURIComponent(pair)}` : "/");
}

async function start() {
  if (location.pathname === "/console/login") return signIn();
  if (!secret) return showSignin();
  const answer = await fetch("/console/session", { headers: headers(), credentials: "omit", cache: "no-store" });
  if (!answer.ok) {
    forget();
    return showSignin();
  }
  const session = await answer.json();
  if (wantedCode) localStorage.removeItem(PAIR_KEY);
  me = session.client_id;
  $("who").textContent = `signed in as ${session.name}`;
  $("app").hidden = false;
  $("follow-close").onclick = () => {
    if (following) following.stop();
    following = null;
    $("follow").hidden = true;
    document.body.classList.remove("following");
  };
  $("logout").onclick = async () => {
    await api("DELETE", "/console/session").catch(() => {});
    forget();
    showSignin();
  };
  const tick = async () => {
    try {
      await refresh();
    } catch (err) {
      if (err.message !== "signed out") showError(err.message);
    }
    if (!$("app").hidden) setTimeout(tick, 1500);
  };
  await tick();
}

document.addEventListener("DOMContentLoaded", start);
