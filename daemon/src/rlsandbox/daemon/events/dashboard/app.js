// rlsandbox dashboard: plain JavaScript, no build step. Everything a sandbox wrote (commands,
// outputs, task ids, labels) is hostile: it only ever reaches the page as text (textContent),
// never as HTML.
"use strict";

const state = { run: null, task: null, session: null, oldest: null, charts: {}, pending: false, last: 0 };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  return node;
}

async function get(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) throw new Error(`${path}: ${r.status}`);
  return r.json();
}

const num = (v, d = 2) => (v == null ? "-" : Number(v).toFixed(d));
const pct = (a, b) => (b ? `${((100 * a) / b).toFixed(1)}%` : "-");
const when = (ts) => (ts ? new Date(ts * 1000).toLocaleTimeString() : "-");

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function chart(id, title, series, data) {
  const box = document.getElementById(id);
  const width = Math.max(box.clientWidth, 300);
  if (state.charts[id] && state.charts[id].series.length === series.length + 1) {
    state.charts[id].setData(data);
    return;
  }
  if (state.charts[id]) state.charts[id].destroy();
  box.replaceChildren();
  state.charts[id] = new uPlot({ title, width, height: 220, series: [{}, ...series], scales: { x: { time: true } } }, data, box);
}

// -- overview ------------------------------------------------------------------------------------
async function refreshOverview() {
  const o = await get("/v1/overview");
  document.getElementById("rate-steps").textContent = num(o.rates.steps, o.rates.steps < 10 ? 2 : 1);
  document.getElementById("rate-created").textContent = num(o.rates.created, 2);
  document.getElementById("rate-ended").textContent = num(o.rates.ended, 2);
  document.getElementById("rate-graded").textContent = num(o.rates.graded, 2);
  const l = o.latency;
  document.getElementById("lat").textContent = l.steps ? `${num(l.p50_ms, 1)} / ${num(l.p90_ms, 1)} / ${num(l.p99_ms, 1)}` : "-";
  document.getElementById("integrity").textContent = `${o.integrity.events} / ${o.integrity.missing_events}`;

  fill(document.querySelector("#nodes tbody"), o.nodes.map((n) => {
    const d = n.data || {};
    const pools = Object.entries(d.pools || {}).map(([name, p]) => `${name} ${p.ready}/${p.in_use}/${p.creating}`).join(", ");
    const ev = d.events || {};
    return el("tr", { "data-node": n.node }, el("td", {}, n.node),
      el("td", { class: n.live ? "ok" : "bad" }, n.live ? "live" : `stale since ${when(n.last_heartbeat)}`),
      el("td", {}, `${d.sessions ?? "-"} / ${d.max_sessions ?? "-"}`), el("td", {}, pools),
      el("td", {}, num(d.load1, 2)), el("td", {}, `${ev.outbox_events ?? 0} queued, ${ev.dropped_total ?? 0} dropped`));
  }));

  fill(document.getElementById("alerts"), o.alerts.map((a) => {
    const d = a.data || {};
    const what = d.run ? `run ${d.run}` : a.session ? `session ${a.session}` : `node ${a.node}`;
    return el("li", { class: "alert", "data-kind": a.kind }, el("b", { class: "warn" }, a.kind), ` ${what} at ${when(a.ts)}`);
  }));
  if (!o.alerts.length) fill(document.getElementById("alerts"), [el("li", { class: "muted" }, "no alerts")]);

  fill(document.querySelector("#runs tbody"), o.runs.map((r) => {
    const row = el("tr", { class: "clickable" + (r.name === state.run ? " selected" : ""), "data-run": r.name ?? "" },
      el("td", {}, r.name ?? "(no run label)"), el("td", {}, r.sessions_seen), el("td", {}, r.open), el("td", {}, r.steps),
      el("td", { class: "gradings" }, r.gradings ?? 0), el("td", { class: "mean-reward" }, num(r.mean_reward, 3)),
      el("td", {}, r.pass_rate == null ? "-" : `${(100 * r.pass_rate).toFixed(1)}%`),
      el("td", { class: r.infra_errors ? "bad" : "" }, `${r.infra_errors ?? 0} (${pct(r.infra_errors, r.gradings)})`),
      el("td", { class: r.tampered ? "warn" : "" }, r.tampered ?? 0), el("td", {}, r.missing_events));
    row.addEventListener("click", () => selectRun(r.name));
    return row;
  }));
  if (state.run != null) renderDistribution(o.runs.find((r) => r.name === state.run));

  const a = await get("/v1/activity?minutes=30");
  const byT = new Map(a.points.map((p) => [p.t, p]));
  const xs = [];
  for (let t = a.since; t <= a.until; t += a.step) xs.push(t);  // quiet buckets are zeros, not gaps
  const at = (t, k) => ((byT.get(t) || {})[k] || 0) / a.step;
  chart("activity-chart", "per second", [
    { label: "commands", stroke: "#4a90d9" }, { label: "sessions started", stroke: "#1f8a4c" }, { label: "gradings", stroke: "#b7791f" },
  ], [xs, xs.map((t) => at(t, "steps")), xs.map((t) => at(t, "created")), xs.map((t) => at(t, "graded"))]);
}

function renderDistribution(run) {
  const box = document.getElementById("dist");
  if (!run || !run.distribution) { box.replaceChildren(el("div", { class: "muted" }, "no gradings yet")); return; }
  const total = Object.values(run.distribution).reduce((s, v) => s + v, 0) || 1;
  box.replaceChildren(...Object.entries(run.distribution).map(([bucket, n]) =>
    el("div", { class: "bar", "data-bucket": bucket }, el("span", {}, bucket),
      el("span", { class: "fill", style: `width:${(300 * n) / total}px` }), el("span", { class: "n" }, n))));
}

// -- one run ---------------------------------------------------------------------------------------
function selectRun(run) {
  state.run = run;
  state.task = null;
  state.oldest = null;
  location.hash = `run=${encodeURIComponent(run ?? "")}`;
  document.getElementById("run").hidden = false;
  document.getElementById("run-name").textContent = run ?? "(no run label)";
  for (const tr of document.querySelectorAll("#runs tbody tr")) tr.classList.toggle("selected", tr.dataset.run === (run ?? ""));
  refreshRun(true).catch(report);
  refreshOverview().catch(report);
}

async function refreshRun(firstPage) {
  if (state.run == null) return;
  const r = encodeURIComponent(state.run);
  const [curve, tasks, sessions] = await Promise.all([
    get(`/v1/runs/${r}/curve` + (state.task != null ? `?task=${encodeURIComponent(state.task)}` : "")),
    get(`/v1/tasks?run=${r}`), firstPage ? get(`/v1/runs/${r}/sessions?limit=50`) : null,
  ]);
  document.getElementById("curve-what").textContent = state.task != null ? `task ${state.task} (click it again for the run)` : "the run";
  chart("curve-chart", "per time bucket", [
    { label: "mean reward", stroke: "#1f8a4c", scale: "r" }, { label: "pass rate", stroke: "#4a90d9", scale: "r" },
    { label: "infra error rate", stroke: "#c0392b", scale: "r" }, { label: "tampered rate", stroke: "#b7791f", scale: "r" },
  ], [curve.map((p) => p.t), curve.map((p) => p.mean_reward), curve.map((p) => p.pass_rate),
      curve.map((p) => p.infra_errors / p.gradings), curve.map((p) => p.tampered / p.gradings)]);
  fill(document.querySelector("#tasks tbody"), tasks.map((t) => {
    const row = el("tr", { class: "clickable" + (t.name === state.task ? " selected" : ""), "data-task": t.name ?? "" },
      el("td", {}, t.name ?? "-"), el("td", {}, t.gradings), el("td", {}, num(t.mean_reward, 3)),
      el("td", {}, t.pass_rate == null ? "-" : `${(100 * t.pass_rate).toFixed(1)}%`), el("td", {}, t.infra_errors), el("td", {}, t.tampered));
    row.addEventListener("click", () => { state.task = state.task === t.name ? null : t.name; refreshRun(false).catch(report); });
    return row;
  }));
  if (sessions) {
    fill(document.querySelector("#sessions tbody"), []);
    appendSessions(sessions);
  }
}

function appendSessions(page) {
  const body = document.querySelector("#sessions tbody");
  for (const s of page) {
    const row = el("tr", { class: "clickable", "data-session": s.session },
      el("td", {}, s.session), el("td", {}, s.task ?? "-"), el("td", {}, s.node), el("td", {}, when(s.created_ts)),
      el("td", {}, s.steps), el("td", {}, s.state === "open" ? "open" : `${s.state}: ${s.end_reason ?? ""}`),
      el("td", { class: s.status === "infra_error" ? "bad" : "" }, s.status ?? "-"), el("td", { class: "reward" }, num(s.reward, 3)));
    row.addEventListener("click", () => openEpisode(s.session));
    body.append(row);
    state.oldest = s.created_ts;
  }
  document.getElementById("older").hidden = page.length < 50;
}

// -- one episode -----------------------------------------------------------------------------------
async function openEpisode(session) {
  state.session = session;
  location.hash = `run=${encodeURIComponent(state.run ?? "")}&session=${encodeURIComponent(session)}`;
  const events = await get(`/v1/sessions/${encodeURIComponent(session)}`);
  document.getElementById("episode").hidden = false;
  document.getElementById("ep-id").textContent = session;
  const first = events[0] || {};
  document.getElementById("ep-summary").textContent =
    `node ${first.node ?? "-"}, labels ${JSON.stringify(first.labels || {})}, ${events.length} events`;
  const t0 = first.ts || 0;
  document.getElementById("timeline").replaceChildren(...events.map((e) => timelineItem(e, t0)));
  document.getElementById("episode").scrollIntoView();
}

function timelineItem(e, t0) {
  const d = e.data || {};
  const head = el("div", {}, el("b", {}, e.type), ` +${(e.ts - t0).toFixed(2)} s  #${e.seq}`);
  const li = el("li", { class: `ev ev-${e.type}`, "data-seq": e.seq }, head);
  if (e.type === "created") {
    li.append(el("div", { class: "muted" }, `pool ${d.pool}, image ${d.image}, ${d.mode}, task ${d.task ?? "-"}` +
      (d.forked_from ? `, a fork of ${d.forked_from}` : "")));
  }
  if (e.type === "step") {
    const cmd = d.shell != null ? d.shell : (d.argv || []).join(" ");
    li.append(el("pre", { class: "cmd" }, `$ ${cmd}`),
      el("div", { class: d.exit_code === 0 ? "ok" : "bad" },
        `exit ${d.exit_code}${d.timed_out ? " (timed out)" : ""}, ${(1000 * (d.duration || 0)).toFixed(1)} ms, ` +
        `${d.stdout_bytes} + ${d.stderr_bytes} bytes out${d.truncated ? " (truncated)" : ""}`));
    if (d.stdout) li.append(el("pre", { class: "stdout" }, d.stdout));
    if (d.stderr) li.append(el("pre", { class: "stderr" }, d.stderr));
  }
  if (e.type === "files") li.append(el("div", { class: "muted" }, (d.files || []).map((f) => `${f.path} (${f.bytes} B)`).join(", ")));
  if (e.type === "reward") {
    li.append(el("div", { class: d.status === "ok" ? "ok" : "bad" },
      `${d.status}: reward ${num(d.reward, 3)}, ${d.resolved ? "resolved" : "not resolved"}, ${d.mode}, ${(d.duration || 0).toFixed(2)} s`));
    if (d.message) li.append(el("div", { class: "muted" }, d.message));
    if ((d.tampering || []).length) li.append(el("div", { class: "warn" }, `tampering: ${d.tampering.join("; ")}`));
    const tests = d.tests || [];
    if (tests.length) {
      li.append(el("table", { class: "tests" }, el("tbody", {}, ...tests.map((t) =>
        el("tr", { "data-test": t.id }, el("td", {}, t.group), el("td", { class: t.outcome === "passed" ? "ok" : "bad" }, t.outcome),
          el("td", {}, t.id))))));
    }
  }
  if (e.type === "closed" || e.type === "failed") li.append(el("div", { class: "muted" }, d.reason));
  if (e.type === "alert") li.append(el("div", { class: "warn" }, `${d.kind}: ${JSON.stringify(d.details || d.reason || "")}`));
  return li;
}

// -- live updates ----------------------------------------------------------------------------------
function report(err) {
  console.error(err);
}

async function refreshAll() {
  state.pending = false;
  state.last = Date.now();
  await refreshOverview();
  await refreshRun(true);
  if (state.session) {
    const open = document.getElementById("episode");
    if (!open.hidden) await openEpisode(state.session);
  }
  document.getElementById("updated").textContent = new Date().toLocaleTimeString();
}

function scheduleRefresh() {
  if (state.pending) return;
  state.pending = true;
  const wait = Math.max(0, 1000 - (Date.now() - state.last));
  setTimeout(() => refreshAll().catch(report), wait);
}

function connect() {
  const conn = document.getElementById("conn");
  const source = new EventSource("/v1/stream");
  source.onopen = () => { conn.textContent = "live"; conn.className = "conn live"; };
  source.onerror = () => { conn.textContent = "reconnecting"; conn.className = "conn off"; };
  source.addEventListener("change", scheduleRefresh);
}

document.getElementById("older").addEventListener("click", async () => {
  const r = encodeURIComponent(state.run);
  appendSessions(await get(`/v1/runs/${r}/sessions?limit=50&before=${state.oldest}`));
});
document.getElementById("ep-close").addEventListener("click", () => {
  state.session = null;
  document.getElementById("episode").hidden = true;
});

const params = new URLSearchParams(location.hash.slice(1));
if (params.has("run")) {
  state.run = params.get("run");
  document.getElementById("run").hidden = false;
  document.getElementById("run-name").textContent = state.run;
}
refreshAll().then(() => { if (params.get("session")) openEpisode(params.get("session")); }).catch(report);
connect();
