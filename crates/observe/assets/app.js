// The gpufuse dashboard: polls the JSON API once a second and redraws. No libraries, no
// network but this server (the files are built into the gpufuse binary).
"use strict";

const GiB = 1024 ** 3;
const fmtBytes = (b) => b >= GiB ? (b / GiB).toFixed(1) + " GiB" : (b / 1024 ** 2).toFixed(0) + " MiB";
const pct = (r) => (100 * r).toFixed(0) + "%";
const secs = (s) => s < 1e-3 ? (s * 1e6).toFixed(0) + " µs" : s < 1 ? (s * 1e3).toFixed(1) + " ms" : s.toFixed(2) + " s";
const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));

function bar(ratio) {
  const r = Math.max(0, Math.min(1, ratio || 0));
  const cls = r >= 0.95 ? "full" : r >= 0.8 ? "hi" : "";
  return `<span class="bar"><i class="${cls}" style="width:${(100 * r).toFixed(1)}%"></i></span>`;
}

function rows(id, items, render, emptyText) {
  const body = document.querySelector(`#${id} tbody`);
  body.innerHTML = items.length ? items.map(render).join("")
    : `<tr><td class="empty" colspan="12">${esc(emptyText)}</td></tr>`;
}

function chart(id, points, value, max) {
  const svg = document.getElementById(id);
  if (!points.length) { svg.innerHTML = ""; return; }
  const t0 = points[0].t, t1 = Math.max(points[points.length - 1].t, t0 + 1);
  const top = max || Math.max(1, ...points.map(value));
  const xy = points.map((p) => [600 * (p.t - t0) / (t1 - t0), 118 - 116 * Math.min(1, value(p) / top)]);
  const line = xy.map(([x, y], i) => `${i ? "L" : "M"}${x.toFixed(1)},${y.toFixed(1)}`).join("");
  svg.innerHTML = `<path class="area" d="${line}L${xy[xy.length - 1][0].toFixed(1)},120L${xy[0][0].toFixed(1)},120Z"></path><path d="${line}"></path>`;
}

function render(snap, history, report) {
  document.getElementById("where").textContent =
    `${snap.role} ${snap.host} · compute policy ${snap.compute_policy}`;
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  const total = snap.devices.reduce((a, d) => a + d.memory_total_bytes, 0);
  const used = snap.devices.reduce((a, d) => a + d.memory_used_bytes, 0);
  const busy = snap.devices.length ? snap.devices.reduce((a, d) => a + d.busy_ratio, 0) / snap.devices.length : 0;
  const nodes = snap.controller ? snap.controller.nodes : [{ name: snap.host, state: "ready", address: "" }];
  const pending = snap.pending.filter((p) => p.state === "pending").length;
  document.getElementById("summary").innerHTML = [
    ["nodes", nodes.length], ["devices", snap.devices.length], ["sessions", snap.sessions.length],
    ["pending", pending], ["busy", pct(busy)], ["memory", `${fmtBytes(used)} / ${fmtBytes(total)}`],
    ["cost, last hour", `${report.cost.toFixed(report.cost < 1 ? 4 : 2)} ${esc(report.currency)}`],
  ].map(([k, v]) => `<div class="card"><span class="muted">${k}</span><b id="card-${k.split(",")[0]}">${v}</b></div>`).join("");

  rows("nodes", nodes, (n) => `<tr><td>${esc(n.name)}</td><td>${esc(n.state)}</td><td>${esc(n.address)}</td></tr>`, "no nodes");
  rows("devices", snap.devices, (d) => `<tr>
    <td>${esc(d.node)}</td><td>${d.index}</td><td>${esc(d.model)}</td>
    <td>${bar(d.memory_used_bytes / d.memory_total_bytes)}${fmtBytes(d.memory_used_bytes)} / ${fmtBytes(d.memory_total_bytes)}</td>
    <td class="num">${fmtBytes(d.memory_promised_bytes)}</td>
    <td>${bar(d.busy_ratio)}${pct(d.busy_ratio)}</td>
    <td class="num">${d.compute_promised_percent}%</td><td class="num">${d.sessions}</td></tr>`, "no devices");
  rows("sessions", snap.sessions, (s) => {
    const limit = s.memory_limit_bytes;
    return `<tr data-session="${s.id}">
    <td>#${s.id}</td><td>${esc(s.tenant)}</td><td class="prog">${esc(s.program)} <span class="muted">pid ${s.pid}</span></td>
    <td>${esc(s.node)}/${s.device}</td><td>${esc(s.qos)}</td>
    <td class="num">${s.compute_share == null ? "-" : pct(s.compute_share)}</td>
    <td>${limit ? bar(s.memory_used_bytes / limit) : ""}${fmtBytes(s.memory_used_bytes)}${limit ? " / " + fmtBytes(limit) : ""}</td>
    <td>${bar(s.busy_ratio)}${pct(s.busy_ratio)}</td>
    <td class="num">${secs(s.device_seconds)}</td>
    <td class="num">${secs(s.queue_p50_seconds)} / ${secs(s.queue_p99_seconds)}</td>
    <td class="num">${secs(s.throttled_seconds)}</td>
    <td class="state-${esc(s.state)}">${esc(s.state)}</td></tr>`;
  }, "no sessions");
  rows("pending", snap.pending, (p) => `<tr><td>${esc(p.what)}</td><td>${esc(p.tenant)}</td>
    <td class="state-${esc(p.state)}">${esc(p.state)}</td><td>${esc(p.reason)}</td><td>${secs(p.age_seconds)} ago</td></tr>`,
    "none waiting, none refused in the last hour");
  rows("tenants", report.tenants, (t) => `<tr><td>${esc(t.tenant)}</td><td class="num">${t.sessions}</td>
    <td class="num">${t.device_hours_promised.toFixed(4)}</td><td class="num">${t.device_hours_used.toFixed(4)}</td>
    <td class="num">${t.vram_gib_hours.toFixed(3)}</td><td class="num">${t.cost.toFixed(4)}</td>
    <td class="num">${t.whole_gpu_cost.toFixed(4)}</td></tr>`, "no usage yet");
  document.querySelector("#tenants tfoot").innerHTML = report.tenants.length
    ? `<tr><td>pool</td><td colspan="4" class="muted">utilization ${pct(report.pool_utilization)} of ${report.pool_device_hours.toFixed(3)} device-hours</td>
       <td class="num">${report.cost.toFixed(4)}</td><td class="num">${report.whole_gpu_cost.toFixed(4)}</td></tr>` : "";

  chart("chart-busy", history, (p) => p.busy, 1);
  chart("chart-mem", history, (p) => p.memory_total_bytes ? p.memory_used_bytes / p.memory_total_bytes : 0, 1);
  chart("chart-sessions", history, (p) => p.sessions, 0);
  document.body.dataset.ready = "1";
  document.body.dataset.renders = String(Number(document.body.dataset.renders || 0) + 1);
}

async function tick() {
  try {
    const get = (u) => fetch(u, { cache: "no-store" }).then((r) => r.json());
    const [snap, history, report] = await Promise.all([
      get("api/v1/snapshot"), get("api/v1/history?since=3600"), get("api/v1/report?since=3600")]);
    render(snap, history, report);
  } catch (e) {
    document.getElementById("updated").textContent = "cannot reach the server: " + e;
  }
  setTimeout(tick, 1000);
}
tick();
