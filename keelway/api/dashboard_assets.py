"""The dashboard's page, script and style, served by the admin listener as files.

Kept as strings in a module so an install carries them as it carries any module. The
page has no inline script or style and the script builds every node with
`textContent`, never markup from data: the Content-Security-Policy the listener sends
(`script-src 'self'`) then holds even against a hostile app name or log line.
"""

from __future__ import annotations

from typing import Final

INDEX_HTML: Final = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>keelway</title>
<link rel="stylesheet" href="/dashboard.css">
<script src="/dashboard.js" defer></script>
</head>
<body>
<header>
  <h1>keelway</h1>
  <span id="router" class="muted">router: …</span>
  <span id="updated" class="muted"></span>
</header>
<main>
  <section>
    <h2>Apps</h2>
    <table id="apps"><thead><tr><th>app</th><th>release</th><th>instances</th>
      <th>by state</th><th>need attention</th><th>rollout</th></tr></thead>
      <tbody></tbody></table>
  </section>
  <section>
    <h2>Instances <span id="page" class="muted"></span></h2>
    <table id="instances"><thead><tr><th>host</th><th>app</th><th>state</th>
      <th>release</th><th>processes</th><th>last operation</th><th>drill</th></tr></thead>
      <tbody></tbody></table>
    <p><button id="prev" type="button">previous page</button>
       <button id="next" type="button">next page</button></p>
  </section>
  <section id="app-detail" hidden>
    <h2>App <span id="app-name"></span></h2>
    <h3>Releases</h3>
    <table id="releases"><thead><tr><th>release</th><th>build</th><th>description</th>
      <th>created</th><th>current on</th><th>failed on</th></tr></thead>
      <tbody></tbody></table>
    <h3>Operations</h3>
    <div id="operations"></div>
    <h3>Events</h3>
    <table id="events"><thead><tr><th>at</th><th>instance</th><th>kind</th>
      <th>message</th></tr></thead><tbody></tbody></table>
    <h3>Log tail</h3>
    <pre id="logs"></pre>
  </section>
  <section id="instance-detail" hidden>
    <h2>Instance <span id="instance-name"></span></h2>
    <h3>Snapshots</h3>
    <table id="snapshots"><thead><tr><th>id</th><th>taken</th><th>size</th></tr></thead>
      <tbody></tbody></table>
    <h3>Replica</h3>
    <pre id="replica"></pre>
  </section>
</main>
</body>
</html>
"""

LOGIN_HTML: Final = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>keelway: sign in</title>
<link rel="stylesheet" href="/dashboard.css">
</head>
<body>
<main>
  <h1>keelway</h1>
  <form method="post" action="/login">
    <label>Admin token (KEELWAY_ADMIN_TOKEN)
      <input type="password" name="token" autocomplete="current-password" required>
    </label>
    <button type="submit">Sign in</button>
  </form>
</main>
</body>
</html>
"""

DASHBOARD_CSS: Final = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d232a; background: #f7f8fa; }
header { display: flex; gap: 1.5em; align-items: baseline; padding: .6em 1.2em;
         background: #1d232a; color: #f7f8fa; }
header h1 { font-size: 1.2em; margin: 0; }
main { padding: .5em 1.2em 2em; }
h2 { font-size: 1.1em; margin: 1.2em 0 .4em; }
h3 { font-size: 1em; margin: 1em 0 .3em; }
table { border-collapse: collapse; width: 100%; background: #fff; }
th, td { text-align: left; padding: .25em .6em; border-bottom: 1px solid #e3e6ea;
         vertical-align: top; }
th { background: #eef0f3; font-weight: 600; }
tr.pick { cursor: pointer; }
tr.pick:hover { background: #f0f4ff; }
.muted { color: #8a939d; }
.state { font-weight: 600; }
.state-running { color: #1a7f37; }
.state-frozen { color: #3b6fd8; }
.state-parked, .state-stopped, .state-no-release { color: #6e7781; }
.state-crashed, .state-failed { color: #cf222e; }
.op { background: #fff; border: 1px solid #e3e6ea; margin: .4em 0; padding: .4em .6em; }
.op ol { margin: .3em 0 0; padding-left: 1.6em; }
.failed { color: #cf222e; }
pre { background: #fff; border: 1px solid #e3e6ea; padding: .6em; overflow-x: auto;
      max-height: 24em; }
form label { display: block; margin: 1em 0; }
"""

DASHBOARD_JS: Final = r"""
"use strict";
// keelway's dashboard: polls the admin listener's JSON every 2 s (read-only).
// Every node is built with textContent: nothing from the data is parsed as markup.
(function () {
  const POLL_MS = 2000;
  let page = 1;
  let pages = 1;
  let app = null;
  let instance = null;

  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }
  function row(cells) {
    const tr = document.createElement("tr");
    for (const cell of cells) {
      tr.appendChild(cell instanceof Node ? wrap(cell) : el("td", cell));
    }
    return tr;
  }
  function wrap(node) { const td = el("td"); td.appendChild(node); return td; }
  function fill(id, rows) {
    const body = document.querySelector("#" + id + " tbody");
    body.replaceChildren(...rows);
  }
  function when(at) { return at ? new Date(at * 1000).toLocaleString() : ""; }
  function stateNode(state) {
    return el("span", state, "state state-" + String(state).replace(/ /g, "-"));
  }
  async function get(path) {
    const answer = await fetch(path, {credentials: "same-origin", cache: "no-store"});
    if (answer.status === 401) { window.location.assign("/login"); throw new Error("401"); }
    if (!answer.ok) throw new Error(path + ": " + answer.status);
    return answer.json();
  }

  function showOverview(data) {
    const router = data.router;
    document.getElementById("router").textContent = router
      ? "router: " + router.state + (router.pid ? " (pid " + router.pid + ")" : "")
      : "router: unknown";
    document.getElementById("updated").textContent =
      "updated " + new Date(data.generated_at * 1000).toLocaleTimeString();
    const appRows = [];
    const instanceRows = [];
    pages = 1;
    for (const a of data.apps) {
      const s = a.summary || {};
      const states = Object.entries(s.states || {}).map(([k, n]) => k + " " + n).join(", ");
      const r = row([a.name, a.release || "", s.instances, states, s.attention,
                     a.rollout ? a.rollout.release + " " + a.rollout.state : ""]);
      r.className = "pick";
      r.dataset.app = a.name;
      r.addEventListener("click", () => { app = a.name; instance = null; refreshApp(); });
      appRows.push(r);
      if (a.page) pages = Math.max(pages, a.page.pages);
      for (const i of a.instances) {
        const procs = (i.processes || []).filter(p => p.active)
          .map(p => p.service + " " + p.state + (p.pid ? " pid " + p.pid : "")).join(", ");
        const last = i.last_operation
          ? i.last_operation.kind + " " + i.last_operation.state : "";
        const drill = i.drill ? (i.drill.ok ? "ok " : "failed ") + when(i.drill.at) : "";
        const tr = row([i.host, a.name, stateNode(i.state), i.release || "", procs, last,
                        drill]);
        tr.className = "pick";
        tr.dataset.host = i.host;
        tr.dataset.state = i.state;
        tr.dataset.app = a.name;
        tr.title = i.label;
        tr.addEventListener("click", () => {
          app = a.name; instance = i.host; refreshApp(); refreshInstance();
        });
        instanceRows.push(tr);
      }
    }
    // The first app's journal, events and logs until another is picked.
    if (app === null && data.apps.length > 0) { app = data.apps[0].name; refreshApp(); }
    fill("apps", appRows);
    fill("instances", instanceRows);
    document.getElementById("page").textContent = "page " + page + " of " + pages;
  }

  function showApp(data) {
    document.getElementById("app-detail").hidden = false;
    document.getElementById("app-name").textContent = data.app;
    fill("releases", data.releases.map(r => row([
      r.version, r.build, r.description || "", when(r.created_at),
      r.current.join(", "), r.failed_on.join(", ")])));
    const ops = document.getElementById("operations");
    ops.replaceChildren(...data.operations.map(op => {
      const box = el("div", null, "op");
      box.dataset.op = op.id;
      box.appendChild(el("strong", "#" + op.id + " " + op.kind + " " + op.instance + ": "));
      box.appendChild(el("span", op.state, op.state === "failed" ? "failed" : ""));
      box.appendChild(el("span", " " + when(op.created_at) +
        (op.duration_s !== null ? " (" + op.duration_s + " s)" : ""), "muted"));
      if (op.error) box.appendChild(el("div", op.error, "failed"));
      const steps = el("ol");
      for (const s of op.steps || []) {
        steps.appendChild(el("li", s.name + (s.service ? " " + s.service : "") + ": " +
          s.state + (s.detail ? " (" + s.detail + ")" : "") +
          (s.error ? " error: " + s.error : "") +
          (s.duration_s !== null ? " " + s.duration_s + " s" : ""),
          s.state === "failed" ? "failed" : ""));
      }
      box.appendChild(steps);
      return box;
    }));
    fill("events", data.events.slice().reverse().map(e => row([
      when(e.at), e.instance || "", e.kind, e.message])));
    document.getElementById("logs").textContent = data.logs.map(
      l => l.instance + " " + l.service + "." + l.generation + " | " + l.line).join("\n");
  }

  function showInstance(data) {
    document.getElementById("instance-detail").hidden = false;
    document.getElementById("instance-name").textContent = data.host;
    fill("snapshots", (data.snapshots || []).map(s => row([
      s.id, when(s.taken_at), s.size + " bytes"])));
    document.getElementById("replica").textContent =
      data.replica ? JSON.stringify(data.replica, null, 2) : "no replica here";
  }

  async function refresh() {
    try { showOverview(await get("/api/overview?page=" + page)); }
    catch (err) { document.getElementById("updated").textContent = String(err); }
  }
  async function refreshApp() {
    if (!app) return;
    try { showApp(await get("/api/apps/" + encodeURIComponent(app))); }
    catch (err) { document.getElementById("logs").textContent = String(err); }
  }
  async function refreshInstance() {
    if (!instance) return;
    try { showInstance(await get("/api/instances/" + encodeURIComponent(instance))); }
    catch (err) { document.getElementById("replica").textContent = String(err); }
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.getElementById("prev").addEventListener("click", () => {
      if (page > 1) { page -= 1; refresh(); }
    });
    document.getElementById("next").addEventListener("click", () => {
      if (page < pages) { page += 1; refresh(); }
    });
    refresh();
    setInterval(() => { refresh(); refreshApp(); }, POLL_MS);
  });
})();
"""
