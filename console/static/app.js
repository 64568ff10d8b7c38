// The RaftMQ console page: hash routes (#/cluster, #/topics, #/groups, #/messages, #/dlq,
// #/login), each page a render function over the console's JSON API (console/web.py).
// A 401 from the API (a cluster with ACLs on, no user signed in) leads to the login page.
// Pages that show live state re-render their data on a timer; forms are left alone.
"use strict";

const page = document.getElementById("page");
let timer = null;

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined && v !== false) el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : String(c));
  return el;
}

// The session's CSRF token: /api/whoami gives it (another site's page cannot read that
// answer); every POST sends it as X-CSRF-Token. Sign-in and sign-out give a new one.
let csrf = null;

async function api(path, body) {
  if (body !== undefined && csrf === null) await api("/api/whoami");
  const init = body === undefined ? {} : { method: "POST",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf || "" }, body: JSON.stringify(body) };
  const resp = await fetch(path, init);
  const doc = await resp.json().catch(() => ({}));
  if (typeof doc.csrf === "string") csrf = doc.csrf;
  if (resp.status === 403 && /CSRF/.test(doc.error || "")) csrf = null;  // the session ended: a new one next
  if (resp.status === 401 && doc.login && location.hash !== "#/login") {
    sessionStorage.setItem("after-login", location.hash || "#/cluster");
    location.hash = "#/login";
  }
  if (!resp.ok) throw new Error(doc.error || `${resp.status} ${resp.statusText}`);
  return doc;
}

// -- sign in ----------------------------------------------------------------------------
async function showUser() {
  const who = await api("/api/whoami").catch(() => ({ user: null }));
  const box = document.getElementById("who");
  box.replaceChildren(who.user ? h("span", {}, `signed in as ${who.user} `,
    h("button", { id: "logout", onclick: async () => { await api("/api/logout", {}); location.hash = "#/login"; } },
      "Sign out")) : h("a", { href: "#/login", id: "login-link" }, "Sign in"));
}

function renderLogin() {
  const user = h("input", { id: "login-user", autocomplete: "username" });
  const password = h("input", { id: "login-password", type: "password", autocomplete: "current-password" });
  page.append(h("h2", {}, "Sign in"), h("section", { class: "card" },
    h("p", { class: "muted" }, "This cluster checks users and ACLs: the console acts with your rights."),
    h("form", { class: "inline", id: "login-form", onsubmit: async (e) => {
      e.preventDefault();
      const ok = await act((r) => `signed in as ${r.user}`, () =>
        api("/api/login", { user: user.value, password: password.value }));
      if (ok) {
        await showUser();
        location.hash = sessionStorage.getItem("after-login") || "#/cluster";
      }
    } }, h("label", {}, "user", user), h("label", {}, "password", password),
      h("button", { class: "primary", id: "login-submit" }, "Sign in"))));
}

function notice(text, error) {
  const el = document.getElementById("notice");
  el.textContent = text;
  el.className = error ? "error" : "";
  el.hidden = false;
}

function confirmAction(text) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  return new Promise((resolve) => {
    const done = (answer) => { dialog.close(); ok.onclick = cancel.onclick = null; resolve(answer); };
    const ok = document.getElementById("confirm-ok");
    const cancel = document.getElementById("confirm-cancel");
    ok.onclick = () => done(true);
    cancel.onclick = () => done(false);
    dialog.showModal();
  });
}

async function act(what, fn) {
  try {
    const result = await fn();
    notice(what(result));
    return result;
  } catch (e) {
    notice(e.message, true);
    return null;
  }
}

const time = (ms) => new Date(ms).toLocaleString();
const bytes = (n) => (n === null || n === undefined) ? "–" : `${(n / 2 ** 30).toFixed(1)} GiB`;
const rate = (v) => `${formatNumber(v)}/s`;
const duration = (s) => s === null || s === undefined ? "–" :
  s < 120 ? `${Math.round(s)} s` : s < 7200 ? `${Math.round(s / 60)} min` : `${(s / 3600).toFixed(1)} h`;
const sum = (xs) => xs.reduce((a, b) => a + b, 0);
// a queue and offset; a message found by key or id has no known offset (-1)
const where = (m) => `${m.group}#${m.queue_id}` + (m.queue_offset >= 0 ? `@${m.queue_offset}` : "");

function table(headers, rows, rowAttrs) {
  return h("table", {},
    h("thead", {}, h("tr", {}, headers.map(([label, cls]) => h("th", { class: cls }, label)))),
    h("tbody", {}, rows.map((cells, i) => h("tr", rowAttrs ? rowAttrs(i) : {},
      cells.map((c, j) => h("td", { class: headers[j][1] }, c))))));
}

// live: call refresh now and every `ms` while this page is shown
function live(refresh, ms) {
  refresh();
  timer = setInterval(refresh, ms);
}

// -- Cluster --------------------------------------------------------------------------
function renderCluster() {
  const charts = h("div", { class: "charts", id: "charts" });
  const groups = h("div", { id: "groups" });
  page.append(h("h2", {}, "Cluster"), charts, groups);
  live(async () => {
    const [overview, cluster] = await Promise.all([api("/api/overview"), api("/api/cluster")]);
    drawCharts(charts, overview.series);
    groups.replaceChildren(...cluster.groups.map(groupCard));
  }, 1000);
}

function drawCharts(box, series) {
  const last = (xs) => { for (let i = xs.length - 1; i >= 0; i--) if (xs[i] !== null) return xs[i]; return null; };
  box.replaceChildren(...[["produce", "Produce", "msg/s"], ["consume", "Consume", "msg/s"],
                          ["p99_ms", "Send p99", "ms"]].map(([key, title, unit]) =>
    h("div", { class: "chart", id: `chart-${key}` },
      h("div", { class: "title" }, h("span", {}, `${title} (${unit})`),
        h("span", { class: "value" }, formatNumber(last(series[key])))),
      lineChart(series[key], series.t))));
}

function groupCard(g) {
  const headers = [["node"], ["address"], ["role"], ["term", "num"], ["commit", "num"], ["applied", "num"],
                   ["replication lag", "num"], ["disk free", "num"], ["version"], ["uptime", "num"], ["health"]];
  const rows = g.replicas.map((r) => [r.node, r.address, h("span", { class: `role-${r.role}` }, r.role),
    r.term ?? "–", r.commit_index ?? "–", r.applied_index ?? "–", r.lag ?? "–",
    r.disk_full ? h("span", { class: "bad", title: "disk full: stores nothing, does not lead" },
                    `${bytes(r.free_bytes)} full`) : bytes(r.free_bytes),
    r.version ?? "–", duration(r.uptime_s),
    r.role === "down" ? h("span", { class: "bad" }, "down") :
      r.healthy ? h("span", { class: "ok" }, "ok") : h("span", { class: "bad" }, "unhealthy")]);
  const leader = g.replicas.find((r) => r.role === "leader");
  const history = g.leader_history.slice().reverse().map((c) => [time(c.t * 1000), c.term, c.leader]);
  return h("section", { class: "card", id: `group-${g.group}` },
    h("h3", {}, `Broker group ${g.group} · leader `,
      h("span", { id: `leader-${g.group}`, "data-leader": g.leader || "" },
        leader ? `${leader.node} (term ${leader.term})` : "none")),
    table(headers, rows, (i) => ({ class: g.replicas[i].role === "leader" ? "leader" : "" })),
    verifyLine(g),
    h("h3", {}, "Leader changes"),
    history.length ? table([["since"], ["term", "num"], ["leader"]], history)
                   : h("p", { class: "muted" }, "none seen since the console started"));
}

// The group's last comparison of its replicas at a verify marker (`raftmq cluster verify`).
function verifyLine(g) {
  const v = g.last_verify;
  if (!v) {
    return h("p", { class: "muted", id: `verify-${g.group}` }, "Replicas never compared (raftmq cluster verify)");
  }
  const cls = v.outcome === "equal" ? "ok" : "bad";
  const missing = v.not_compared.length ? `; not compared: ${v.not_compared.join(", ")}` : "";
  return h("p", { id: `verify-${g.group}`, "data-index": v.index },
    `Last compared at index ${v.index}, ${time(v.at_ms)}: `,
    h("span", { class: cls }, v.outcome), ` (${v.compared.join(", ")}${missing})`);
}

// -- Topics ---------------------------------------------------------------------------
function renderTopics() {
  const name = h("input", { id: "topic-name", placeholder: "orders", required: true });
  const queues = h("input", { id: "topic-queues", type: "number", min: 1, value: 8 });
  const perm = h("select", { id: "topic-perm" }, h("option", { value: 6 }, "read + write"),
                 h("option", { value: 4 }, "read only"), h("option", { value: 2 }, "write only"));
  const list = h("div", { id: "topic-list" });
  const refresh = async () => list.replaceChildren(topicTable(await api("/api/topics"), name, queues, perm));
  const form = h("form", { class: "inline", id: "topic-form", onsubmit: async (e) => {
    e.preventDefault();
    await act((r) => `topic ${r.topic} saved on ${r.groups.join(", ")}`, () =>
      api("/api/topics", { topic: name.value, queues: Number(queues.value), perm: Number(perm.value) }));
    refresh();
  } }, h("label", {}, "topic", name), h("label", {}, "queues per group", queues), h("label", {}, "permission", perm),
     h("button", { class: "primary", id: "topic-save" }, "Create / update"));
  page.append(h("h2", {}, "Topics"), h("section", { class: "card" }, form), list);
  live(refresh, 2000);
}

function topicTable(rows, name, queues, perm) {
  const headers = [["topic"], ["groups"], ["queues", "num"], ["min offsets", "num"], ["max offsets", "num"],
                   ["messages", "num"], ["produce", "num"], [""]];
  return table(headers, rows.map((t) => {
    const infos = Object.values(t.groups);
    const maxes = infos.flatMap((i) => i.max_offsets), mins = infos.flatMap((i) => i.min_offsets);
    return [t.topic, Object.keys(t.groups).join(", "), sum(infos.map((i) => i.queues)),
      mins.join(" "), maxes.join(" "), sum(maxes) - sum(mins), rate(t.rate),
      h("span", {},
        h("button", { onclick: () => { name.value = t.topic; queues.value = infos[0].queues;
                                       perm.value = infos[0].perm; } }, "Edit"), " ",
        h("button", { class: "danger", "data-topic": t.topic, onclick: async () => {
          if (!await confirmAction(`Delete topic ${t.topic}? Its queues and consumer offsets go with it.`)) return;
          await act(() => `topic ${t.topic} deleted`, () => api("/api/topics/delete", { topic: t.topic }));
        } }, "Delete"))];
  }), (i) => ({ id: `topic-row-${rows[i].topic}` }));
}

// -- Consumer groups ----------------------------------------------------------------
function renderGroups() {
  const list = h("div", { id: "group-list" });
  const detail = h("div", { id: "group-detail" });
  let chosen = null;
  const refresh = async () => {
    const rows = await api("/api/groups");
    list.replaceChildren(table([["group"], ["members", "num"], ["topics"], ["lag", "num"], ["consume", "num"]],
      rows.map((g) => [g.group, g.members.length, g.topics.join(", "),
                       h("span", { id: `lag-${g.group}` }, g.lag), rate(g.rate)]),
      (i) => ({ class: "clickable", onclick: () => { chosen = rows[i].group; showGroup(detail, chosen); } })));
    if (chosen) showGroup(detail, chosen, true);
  };
  page.append(h("h2", {}, "Consumer groups"), list, detail);
  live(refresh, 2000);
}

async function showGroup(box, name, keepForm) {
  const doc = await api(`/api/group?name=${encodeURIComponent(name)}`);
  const rows = table([["topic"], ["broker group"], ["queue", "num"], ["committed", "num"], ["min", "num"],
                      ["max", "num"], ["lag", "num"]],
    doc.queues.map((q) => [q.topic, q.group, q.queue, q.committed, q.min_offset, q.max_offset, q.lag]));
  const held = doc.in_flight || { count: 0, rows: [], policies: {} };
  const inFlight = h("div", { id: "group-in-flight" },
    h("p", {}, `${held.count} message(s) held by SimpleConsumers` +
      Object.entries(held.policies).map(([g, p]) => ` · ${g}: retry ${p.retry_ms.map((ms) => ms / 1000 + "s").join(" ")}` +
        `, at most ${p.max_deliveries} deliveries${p.ordered ? ", ordered" : ""}`).join("")),
    table([["topic"], ["broker group"], ["queue", "num"], ["offset", "num"], ["delivery", "num"],
           ["invisible until"]],
      held.rows.map((m) => [m.topic, m.group, m.queue, m.offset, m.delivery, time(m.deadline_ms)])));
  const old = box.querySelector("#group-rows");
  if (keepForm && old && box.dataset.group === name) {
    old.replaceChildren(rows);
    box.querySelector("#group-in-flight").replaceWith(inFlight);
    return;
  }
  box.dataset.group = name;
  const topics = [...new Set(doc.queues.map((q) => q.topic))];
  const topic = h("select", { id: "reset-topic" }, topics.map((t) => h("option", { value: t }, t)));
  const when = h("input", { id: "reset-time", type: "datetime-local", step: 1 });
  const form = h("form", { class: "inline", onsubmit: async (e) => {
    e.preventDefault();
    const ms = when.value ? new Date(when.value).getTime() : Date.now();
    if (!await confirmAction(`Reset ${name}'s offsets on ${topic.value} to ${time(ms)}? ` +
                             "Consumers then start from the first message stored at or after it.")) return;
    await act(() => `${name} reset on ${topic.value}`, () =>
      api("/api/group/reset", { group: name, topic: topic.value, timestamp: ms }));
  } }, h("label", {}, "topic", topic), h("label", {}, "to time (empty: now)", when),
     h("button", { class: "danger", id: "reset-offsets" }, "Reset offsets"));
  box.replaceChildren(h("section", { class: "card" }, h("h3", {}, `Group ${name}`),
                        h("div", { id: "group-rows" }, rows), h("h3", {}, "In flight (SimpleConsumer)"), inFlight,
                        h("h3", {}, "Reset offsets to a time"), form));
}

// -- Messages -------------------------------------------------------------------------
function renderMessages() {
  const topic = h("input", { id: "msg-topic", placeholder: "topic" });
  const by = h("select", { id: "msg-by" }, h("option", { value: "key" }, "key"),
               h("option", { value: "id" }, "message id"), h("option", { value: "time" }, "time range"));
  const value = h("input", { id: "msg-value", placeholder: "key or id" });
  const begin = h("input", { id: "msg-begin", type: "datetime-local", step: 1 });
  const end = h("input", { id: "msg-end", type: "datetime-local", step: 1 });
  const results = h("div", { id: "msg-results" });
  const detail = h("div", { id: "msg-detail" });
  const form = h("form", { class: "inline", onsubmit: async (e) => {
    e.preventDefault();
    const q = new URLSearchParams({ topic: topic.value });
    if (by.value === "time") {
      q.set("begin", begin.value ? new Date(begin.value).getTime() : 0);
      q.set("end", end.value ? new Date(end.value).getTime() : Date.now());
    } else q.set(by.value, value.value);
    try {
      const found = await api(`/api/messages?${q}`);
      results.replaceChildren(found.length ? messageTable(found, (m) => showMessage(detail, m)) :
                              h("p", { class: "muted", id: "msg-none" }, "no message found"));
      detail.replaceChildren();
    } catch (err) { notice(err.message, true); }
  } }, h("label", {}, "topic", topic), h("label", {}, "search by", by), h("label", {}, "key / id", value),
     h("label", {}, "from", begin), h("label", {}, "to", end),
     h("button", { class: "primary", id: "msg-search" }, "Search"));
  page.append(h("h2", {}, "Messages"), h("section", { class: "card" }, form), results, detail);
}

function preview(m) {
  const text = decodeText(m.body_base64);
  return text === null ? `${m.size} bytes (binary)` : text.length > 60 ? `${text.slice(0, 60)}…` : text;
}

function messageTable(found, onpick) {
  return table([["message id"], ["topic"], ["queue"], ["tags"], ["keys"], ["stored"], ["body"]],
    found.map((m) => [m.msg_id, m.topic, where(m), m.tags ?? "",
                      m.keys.join(", "), time(m.store_timestamp), preview(m)]),
    (i) => ({ class: "clickable", "data-msg": found[i].msg_id, onclick: () => onpick(found[i]) }));
}

function bodyBytes(b64) { return Uint8Array.from(atob(b64), (c) => c.charCodeAt(0)); }

function decodeText(b64) {
  try { return new TextDecoder("utf-8", { fatal: true }).decode(bodyBytes(b64)); } catch { return null; }
}

function bodyAs(b64, view) {
  if (view === "hex") {
    const b = bodyBytes(b64), lines = [];
    for (let i = 0; i < b.length; i += 16) {
      const row = [...b.slice(i, i + 16)];
      lines.push(`${i.toString(16).padStart(6, "0")}  ${row.map((x) => x.toString(16).padStart(2, "0")).join(" ")}`);
    }
    return lines.join("\n");
  }
  const text = decodeText(b64);
  if (text === null) return "(not UTF-8 text: see hex)";
  if (view === "json") {
    try { return JSON.stringify(JSON.parse(text), null, 2); } catch { return "(not JSON)"; }
  }
  return text;
}

async function showMessage(box, m) {
  let full = m;
  try { full = await api(`/api/message?topic=${encodeURIComponent(m.topic)}&id=${m.msg_id}`); } catch { /* shown below */ }
  const body = h("pre", { class: "body", id: "msg-body" }, bodyAs(m.body_base64, "text"));
  const tabs = h("div", { class: "tabs" }, ["text", "hex", "json"].map((view) =>
    h("button", { id: `view-${view}`, class: view === "text" ? "on" : "", onclick: (e) => {
      tabs.querySelectorAll("button").forEach((b) => b.classList.remove("on"));
      e.target.classList.add("on");
      body.textContent = bodyAs(m.body_base64, view);
    } }, view.toUpperCase())));
  const held = full.held_by ? Object.entries(full.held_by).map(([n, yes]) =>
    h("span", { class: `pill ${yes ? "ok" : "bad"}` }, `${n} ${yes ? "holds it" : "does not"}`)) : "–";
  const props = table([["property"], ["value"]], Object.entries(m.properties));
  const group = h("input", { id: "resend-group", placeholder: "consumer group" });
  const resend = h("form", { class: "inline", onsubmit: async (e) => {
    e.preventDefault();
    await act((r) => `resent to ${group.value} through ${r.stored_in}`, () =>
      api("/api/message/resend", { topic: m.topic, id: m.msg_id, group: group.value }));
  } }, h("label", {}, "consumer group", group), h("button", { id: "resend-to-group" }, "Resend to group"));
  box.replaceChildren(h("section", { class: "card", id: "msg-card" },
    h("h3", {}, `Message ${m.msg_id}`),
    h("p", {}, `topic ${m.topic} · queue ${where(m)} · stored ${time(m.store_timestamp)}` +
               ` · born ${time(m.born_timestamp)} on ${m.born_host} · tags ${m.tags ?? "–"} · keys ${m.keys.join(", ") || "–"}`),
    h("p", { id: "msg-holders" }, "replicas: ", held),
    h("h3", {}, "Properties"), props, h("h3", {}, "Body"), tabs, body,
    h("h3", {}, "Resend"), resend));
}

// -- Dead letters ---------------------------------------------------------------------
function renderDlq() {
  const group = h("input", { id: "dlq-group", placeholder: "consumer group" });
  const list = h("div", { id: "dlq-list" });
  const show = async () => {
    const found = await api(`/api/dlq?group=${encodeURIComponent(group.value)}`);
    list.replaceChildren(found.length ? table(
      [["message id"], ["original topic"], ["queue"], ["retries", "num"], ["stored"], ["body"], [""]],
      found.map((m) => [m.msg_id, m.topic, where(m), m.reconsume_times,
        time(m.store_timestamp), preview(m),
        h("button", { class: "primary", "data-resend": m.msg_id, onclick: () =>
          act((r) => `resent ${m.msg_id} to ${r.topic} as ${r.msg_id}`, () => api("/api/dlq/resend",
            { group: group.value, broker_group: m.group, queue_id: m.queue_id, offset: m.queue_offset })) },
          "Resend")])) : h("p", { class: "muted", id: "dlq-none" }, `no dead letters for ${group.value}`));
  };
  page.append(h("h2", {}, "Dead letters"), h("section", { class: "card" },
    h("form", { class: "inline", onsubmit: (e) => { e.preventDefault(); show().catch((err) => notice(err.message, true)); } },
      h("label", {}, "consumer group", group), h("button", { class: "primary", id: "dlq-show" }, "Show"))), list);
}

// -- routing --------------------------------------------------------------------------
const PAGES = { cluster: renderCluster, topics: renderTopics, groups: renderGroups, messages: renderMessages,
                dlq: renderDlq, login: renderLogin };

function route() {
  clearInterval(timer);
  const name = (location.hash.match(/^#\/(\w+)/) || [])[1] || "cluster";
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.id === `nav-${name}`));
  document.getElementById("notice").hidden = true;
  page.replaceChildren();
  (PAGES[name] || renderCluster)();
}

window.addEventListener("hashchange", route);
route();
showUser();
