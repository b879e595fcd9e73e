"use strict";
// Redraws the status page from GET /admin/status every 2 s; lifts bans. Text only:
// every value goes in with textContent, never as markup.
(function () {
  const csrf = document.querySelector('meta[name="csrf-token"]');
  const summary = document.getElementById("summary");
  const SVG = "http://www.w3.org/2000/svg";

  function number(v) {
    return v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2);
  }
  function ms(v) {
    return v === null || v === undefined ? "\u2013" : number(v) + " ms";
  }
  function duration(s) {
    if (s >= 86400) return Math.floor(s / 86400) + "d " + Math.floor((s % 86400) / 3600) + "h";
    if (s >= 3600) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
    if (s >= 60) return Math.floor(s / 60) + "m " + (s % 60) + "s";
    return s + "s";
  }
  function bytes(n) {
    return n >= 1048576 ? (n / 1048576).toFixed(1) + " MiB" : (n / 1024).toFixed(0) + " KiB";
  }
  function spark(series, what) {
    if (!series || series.length < 2) return null;
    const top = Math.max(Number.MIN_VALUE, ...series);
    const step = 60 / (series.length - 1);
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "spark");
    svg.setAttribute("viewBox", "0 0 60 16");
    svg.setAttribute("width", "60");
    svg.setAttribute("height", "16");
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", what + ", last 5 minutes");
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", series.map((v, i) =>
      (i * step).toFixed(1) + "," + (15 - (14 * v) / top).toFixed(1)).join(" "));
    svg.appendChild(line);
    return svg;
  }
  function cell(tag, text, extra) {
    const c = document.createElement(tag);
    if (tag === "th") c.scope = "row";
    c.textContent = text;
    if (extra) c.appendChild(extra);
    return c;
  }
  function fill(id, rows) {
    const table = document.getElementById(id);
    const columns = table.tHead.rows[0].cells.length;
    const body = document.createElement("tbody");
    if (rows.length === 0) {
      const tr = body.insertRow();
      const td = cell("td", "none");
      td.colSpan = columns;
      tr.appendChild(td);
    }
    for (const cells of rows) {
      const tr = body.insertRow();
      for (const c of cells) tr.appendChild(c);
    }
    table.tBodies[0].replaceWith(body);
  }
  function set(id, text) {
    const node = document.getElementById(id);
    if (node && node.textContent !== text) node.textContent = text;
  }

  function render(s) {
    fill("routes", s.routes.map((r) => [
      cell("th", r.route),
      cell("td", number(r.admitted_per_s), spark(r.series.admitted, "admitted")),
      cell("td", number(r.limited_per_s), spark(r.series.limited, "limited")),
      cell("td", number(r.refused_per_s), spark(r.series.refused, "refused")),
      cell("td", number(r.upstream_errors_per_s), spark(r.series.upstream_errors, "upstream errors")),
      cell("td", ms(r.p50_ms)),
      cell("td", ms(r.p99_ms), spark(r.series.p99_ms, "p99 latency")),
    ]));
    fill("decisions", s.decisions.map((d) => [
      cell("th", d.via), cell("td", d.outcome), cell("td", String(d.total)), cell("td", number(d.per_s)),
    ]));
    fill("refused", s.refused.callers.map((c) => [
      cell("th", c.caller), cell("td", c.policy), cell("td", c.limit), cell("td", String(c.count)),
    ]));
    document.querySelector("#refused caption").textContent = "This replica, last " +
      s.refused.window_s + " s: " + s.refused.total + " refusals; counts within \u00b1" +
      s.refused.error_bound + " (Space-Saving summary).";
    fill("near", s.near_limit.callers.map((c) => [
      cell("th", c.caller), cell("td", c.policy), cell("td", c.window),
      cell("td", c.used + " of " + c.limit), cell("td", (c.ratio * 100).toFixed(0) + " %"),
      cell("td", String(c.count)),
    ]));
    fill("bans", s.bans.map((b) => {
      const button = document.createElement("button");
      button.type = "button";
      button.className = "lift";
      button.dataset.caller = b.caller;
      button.textContent = "Lift ban on " + b.caller;
      return [cell("th", b.caller), cell("td", b.reason), cell("td", duration(b.remaining)),
        cell("td", String(b.refusals)), cell("td", "", button)];
    }));
    fill("concurrency", s.concurrency.map((c) => [
      cell("th", c.policy), cell("td", c.in_use + " of " + c.max), cell("td", c.queued + " of " + c.queue),
    ]));
    const st = s.store;
    set("store-backend", st.backend);
    set("store-nodes", st.nodes.join(", "));
    set("store-ping", st.reachable === null ? "in this process"
      : st.reachable && st.ping_ms !== null ? "answers, " + st.ping_ms.toFixed(2) + " ms" : "does not answer");
    set("store-errors", String(st.errors));
    set("store-fallback", st.fallback ? "on" : "off");
    set("store-tracked", st.tracked_callers + " of " + st.max_keys);
    const id = s.identity;
    set("consumers", id.consumers_config + " in the config, " + id.consumers_file + " from the file");
    set("jwks", id.jwks ? id.jwks.keys + " keys from " + id.jwks.url + ", " +
      (id.jwks.age_s === null ? "never fetched" : "fetched " + id.jwks.age_s + " s ago") +
      ", " + id.jwks.errors + " errors" : "not used");
    set("generation", String(s.config.generation));
    const last = s.config.last_reload;
    set("reload", last ? [last.result + " (generation " + last.generation + ")"].concat(last.errors).join("; ")
      : "none since start");
    set("version", s.process.version);
    set("uptime", duration(s.process.uptime_s));
    set("rss", s.process.rss_bytes === null ? "unknown" : bytes(s.process.rss_bytes));
    const open = s.process.connections;
    set("connections", open.http1 + " HTTP/1, " + open.http2 + " HTTP/2, " + open.websocket + " WebSocket");
    set("summary-bytes", bytes(s.process.summary_bytes));
    const text = "Refusals in the last minute: " + s.refused.total + " \u00b7 refused callers: " +
      s.refused.callers.length + " \u00b7 near a limit: " + s.near_limit.callers.length +
      " \u00b7 bans: " + s.bans.length + " \u00b7 config generation: " + s.config.generation;
    if (summary.textContent !== text) summary.textContent = text;
  }

  async function refresh() {
    try {
      const response = await fetch("/admin/status", { credentials: "same-origin", cache: "no-store" });
      if (!response.ok) {
        summary.textContent = "Live updates stopped (" + response.status + "): reload the page.";
        return;
      }
      render(await response.json());
    } catch (err) {
      summary.textContent = "Live updates failed: " + err.message;
    }
  }

  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button.lift");
    if (!button) return;
    button.disabled = true;
    const headers = csrf ? { "x-csrf-token": csrf.content } : {};
    const url = "/admin/bans?caller=" + encodeURIComponent(button.dataset.caller);
    const response = await fetch(url, { method: "DELETE", headers, credentials: "same-origin" });
    summary.textContent = response.ok ? "Ban on " + button.dataset.caller + " lifted."
      : "Lifting the ban failed (" + response.status + ").";
    await refresh();
  });

  setInterval(refresh, 2000);
})();
