// records-gateway console. Every view is read from the admin API the command line uses
// (GET /admin/config, /admin/ttl, /admin/shadow, DELETE /admin/cache) and GET /readyz.
// The admin token lives in this closure only: never in a URL, a cookie or storage.
// Every value that comes from the gateway is written as text (textContent, SVG text
// nodes), never as markup.
"use strict";
(function () {
  let token = null;
  let current = "fleet";
  const views = { fleet: fleetView, ttls: ttlView, shadow: shadowView, purge: purgeView };

  // --- small DOM helpers: children are nodes or strings (as text) -------------------
  function el(tag, attributes, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes || {})) {
      if (value === false || value === null || value === undefined) continue;
      if (name === "text") node.textContent = String(value);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  const svgNS = "http://www.w3.org/2000/svg";
  function svg(tag, attributes, text) {
    const node = document.createElementNS(svgNS, tag);
    for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, String(value));
    if (text !== undefined) node.textContent = String(text);
    return node;
  }
  function table(headings, rows, numeric) {
    const head = el("tr", {}, ...headings.map((h, i) => el("th", { class: numeric && numeric[i] ? "num" : null, scope: "col" }, h)));
    const body = rows.map((cells) => el("tr", {}, ...cells.map((c, i) => el("td", { class: numeric && numeric[i] ? "num" : null }, c))));
    return el("table", {}, el("thead", {}, head), el("tbody", {}, ...body));
  }
  function percent(share) {
    return share === null || share === undefined ? "-" : (share * 100).toFixed(1) + "%";
  }
  function number(value) {
    return value === null || value === undefined ? "-" : String(value);
  }
  function status(word) {
    return el("span", { class: "status-" + String(word) }, String(word));
  }
  function rank(word) {
    return { down: 3, degraded: 2, unknown: 1 }[word] || 0;
  }
  function problemBox(answer) {
    const body = answer.body || {};
    const title = typeof body.title === "string" ? body.title : "HTTP " + answer.status;
    const detail = typeof body.detail === "string" ? body.detail : "";
    return el("div", { class: "problem", role: "alert" }, el("strong", {}, title), detail ? el("div", {}, detail) : null);
  }

  // --- the admin API -------------------------------------------------------------
  async function call(method, path, withToken, body) {
    const headers = { Accept: "application/json" };
    if (withToken !== false) headers.Authorization = "Bearer " + token;
    const init = { method, headers, cache: "no-store", credentials: "omit" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (error) {
      return { status: 0, ok: false, body: { title: "The gateway cannot be reached", detail: String(error) } };
    }
    let answered = null;
    try {
      answered = await response.json();
    } catch (error) {
      answered = null;
    }
    return { status: response.status, ok: response.ok, body: answered };
  }

  // --- signing in and out ----------------------------------------------------------
  const loginForm = document.getElementById("login-form");
  const tokenInput = document.getElementById("token");
  loginForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    const given = tokenInput.value;
    tokenInput.value = "";
    token = given;
    const answer = await call("GET", "/admin/config");
    const problem = document.getElementById("login-problem");
    problem.replaceChildren();
    if (!answer.ok) {
      token = null;
      problem.append(problemBox(answer));
      tokenInput.focus();
      return;
    }
    document.getElementById("login").hidden = true;
    document.getElementById("app").hidden = false;
    document.getElementById("sign-out").hidden = false;
    show("fleet");
  });
  document.getElementById("sign-out").addEventListener("click", () => {
    token = null;
    document.getElementById("view").replaceChildren();
    document.getElementById("app").hidden = true;
    document.getElementById("sign-out").hidden = true;
    document.getElementById("login").hidden = false;
    tokenInput.focus();
  });

  // --- tabs: arrows move between them, Enter or Space (a click) opens one ------------
  const tabs = Object.keys(views).map((name) => document.getElementById("tab-" + name));
  tabs.forEach((tab, index) => {
    const name = Object.keys(views)[index];
    tab.addEventListener("click", () => show(name));
    tab.addEventListener("keydown", (event) => {
      const step = event.key === "ArrowRight" ? 1 : event.key === "ArrowLeft" ? -1 : 0;
      if (!step) return;
      event.preventDefault();
      const next = tabs[(index + step + tabs.length) % tabs.length];
      next.focus();
      next.click();
    });
  });
  async function show(name) {
    current = name;
    tabs.forEach((tab) => {
      const selected = tab.id === "tab-" + name;
      tab.setAttribute("aria-selected", selected ? "true" : "false");
      tab.tabIndex = selected ? 0 : -1;
    });
    const view = document.getElementById("view");
    view.replaceChildren(el("p", { class: "note" }, "Loading…"));
    let content;
    try {
      content = await views[name]();
    } catch (error) {
      content = [problemBox({ status: 0, body: { title: "This view could not be shown", detail: String(error) } })];
    }
    if (current === name && token !== null) view.replaceChildren(...content);
  }

  // --- Fleet: readiness, traffic per route, the configuration in force ---------------
  async function fleetView() {
    const [ready, ttl, config, fleet] = await Promise.all([
      call("GET", "/readyz", false),
      call("GET", "/admin/ttl"),
      call("GET", "/admin/config"),
      call("GET", "/admin/fleet"),
    ]);
    const out = [el("h2", {}, "Fleet")];
    if (fleet.ok) {
      const worst = fleet.body.instances.slice().sort((a, b) => rank(b.status) - rank(a.status));
      const rows = worst.map((item) => [
        item.instance + (item.mine ? " (this one)" : ""),
        status(item.status),
        Object.entries(item.components).map(([name, word]) => name + " " + word).join(", "),
        item.circuit ? String(item.circuit) : "-",
        item.fingerprint ? String(item.fingerprint) : "-",
        item.secondsAgo === undefined || item.mine ? "now" : item.secondsAgo + " s ago",
      ]);
      out.push(el("h3", {}, fleet.body.shared ? "Instances sharing the cache" : "This instance (no shared cache)"));
      out.push(table(["instance", "status", "components", "upstream circuit", "cache configuration", "announced"], rows));
    } else {
      out.push(problemBox(fleet));
    }
    if (ready.body && ready.body.components) {
      out.push(el("h3", {}, "Readiness of the instance answering"));
      out.push(el("p", {}, "Readiness: ", status(ready.body.status), " (HTTP " + ready.status + ")"));
      const rows = Object.entries(ready.body.components).map(([name, part]) => [
        name,
        status(part.status),
        part.circuit ? String(part.circuit) : part.instances !== undefined ? String(part.instances) + " instance(s)" : "-",
        part.lastError ? String(part.lastError) : "-",
      ]);
      out.push(table(["component", "status", "circuit / instances", "last error"], rows));
    } else {
      out.push(problemBox(ready));
    }
    out.push(el("h3", {}, "Traffic per route"));
    if (ttl.ok) {
      const rows = ttl.body.routes.map((route) => {
        const t = route.traffic;
        return [route.route, number(t.requests), percent(t.hitRatio), number(t.stale), number(t.upstreamCalls)];
      });
      out.push(table(["route", "requests", "hit rate", "stale answers", "upstream calls"], rows, [false, true, true, true, true]));
    } else {
      out.push(problemBox(ttl));
    }
    out.push(el("h3", {}, "Configuration in force (secrets redacted)"));
    out.push(config.ok ? el("pre", { id: "config" }, JSON.stringify(config.body, null, 2)) : problemBox(config));
    return out;
  }

  // --- TTLs: the advice, and the stale share against the TTL -------------------------
  async function ttlView() {
    const answer = await call("GET", "/admin/ttl");
    if (!answer.ok) return [el("h2", {}, "TTLs"), problemBox(answer)];
    const advice = answer.body;
    const out = [
      el("h2", {}, "TTLs"),
      el("p", { class: "note" }, "Aim: at most " + percent(advice.maxStaleShare) + " of answers served after the upstream changed (cache.max_stale_share); advice within " + advice.minTtl + "…" + advice.maxTtl + " s. The gateway never changes a TTL by itself."),
    ];
    // the worst first: the furthest over the aim
    const over = (r) => (r.current.staleShare === null ? -1 : r.current.staleShare - advice.maxStaleShare);
    advice.routes.sort((a, b) => over(b) - over(a));
    const rows = advice.routes.map((r) => [
      r.route, number(r.ttl), number(r.advisedTtl), number(r.changesPerHour),
      percent(r.current.staleShare), percent(r.advised.staleShare), percent(r.traffic.hitRatio), percent(r.advised.hitRatio),
      percent(r.traffic.bestHitRatio),
    ]);
    out.push(table(["route", "TTL now (s)", "advised (s)", "changes / hour", "stale now", "stale advised", "hit rate now", "hit rate advised", "best hit rate (distinct keys)"], rows, [false, true, true, true, true, true, true, true, true]));
    const cards = el("div", { class: "cards" });
    for (const route of advice.routes) {
      cards.append(el("div", { class: "card", id: "ttl-" + route.route },
        el("h3", {}, route.route),
        el("p", { class: "note" }, route.reason),
        route.curve.length ? chart(route, advice) : el("p", { class: "note" }, "No curve until the change rate is known.")));
    }
    out.push(cards);
    return out;
  }
  function chart(route, advice) {
    const width = 360, height = 200, left = 44, right = 10, top = 10, bottom = 30;
    const ttls = route.curve.map((p) => p.ttl);
    const lo = Math.log(Math.min(...ttls)), hi = Math.log(Math.max(...ttls));
    const top_share = Math.max(advice.maxStaleShare * 2, ...route.curve.map((p) => p.staleShare)) || 1;
    const x = (ttl) => left + ((Math.log(ttl) - lo) / (hi - lo || 1)) * (width - left - right);
    const y = (share) => top + (1 - share / top_share) * (height - top - bottom);
    const figure = svg("svg", { class: "chart", viewBox: "0 0 " + width + " " + height, role: "img", "aria-label": "Stale answers against the TTL for " + route.route });
    figure.append(svg("title", {}, "Share of stale answers against the TTL, " + route.route));
    figure.append(svg("line", { class: "axis", x1: left, y1: height - bottom, x2: width - right, y2: height - bottom }));
    figure.append(svg("line", { class: "axis", x1: left, y1: top, x2: left, y2: height - bottom }));
    figure.append(svg("polyline", { class: "curve", points: route.curve.map((p) => x(p.ttl).toFixed(1) + "," + y(p.staleShare).toFixed(1)).join(" ") }));
    figure.append(svg("line", { class: "limit", x1: left, y1: y(advice.maxStaleShare), x2: width - right, y2: y(advice.maxStaleShare) }));
    figure.append(svg("text", { x: width - right, y: y(advice.maxStaleShare) - 4, "text-anchor": "end" }, "max " + percent(advice.maxStaleShare)));
    const marks = [["now", route.ttl], ["advised", route.advisedTtl]];
    for (const [name, ttl] of marks) {
      if (!ttl) continue;
      figure.append(svg("line", { class: name, x1: x(ttl), y1: top, x2: x(ttl), y2: height - bottom }));
      figure.append(svg("text", { x: x(ttl) + 3, y: top + (name === "now" ? 10 : 22) }, name + " " + ttl + " s"));
    }
    figure.append(svg("text", { x: left, y: height - 8 }, Math.min(...ttls) + " s"));
    figure.append(svg("text", { x: width - right, y: height - 8, "text-anchor": "end" }, Math.max(...ttls) + " s (log scale)"));
    figure.append(svg("text", { x: 2, y: top + 8 }, percent(top_share)));
    figure.append(svg("text", { x: 2, y: height - bottom }, "0%"));
    return figure;
  }

  // --- Switching upstreams: the shadow report, regressions apart from noise ----------
  async function shadowView() {
    const answer = await call("GET", "/admin/shadow");
    if (!answer.ok) return [el("h2", {}, "Switching upstreams"), problemBox(answer)];
    const report = answer.body;
    const out = [el("h2", {}, "Switching upstreams")];
    out.push(el("p", {}, "Shadow traffic: ", status(report.enabled ? "ok" : "degraded"), report.enabled ? " on, " + percent(report.sampleRatio) + " of upstream calls mirrored" : " off"));
    out.push(table(["primary", "candidate", "since", "compared", "identical", "different", "noise only", "candidate errors"], [[
      number(report.primary), number(report.candidate), number(report.since),
      number(report.totals.compared), percent(report.totals.identicalShare), number(report.totals.different),
      number(report.totals.noiseOnly), number(report.totals.candidateErrors),
    ]]));
    out.push(shadowControl(report));
    const examples = el("div", { id: "examples" });
    // the worst first: the most regressions (differences beyond noise), then errors
    const worst = Object.entries(report.routes).sort(([, a], [, b]) =>
      (b.different - a.different) || (errors(b) - errors(a)));
    for (const [name, route] of worst) {
      const section = el("section", { id: "shadow-" + name, "aria-label": "route " + name });
      section.append(el("h3", {}, name + ": " + route.compared + " compared, " + percent(route.identicalShare) + " identical"));
      section.append(el("h4", {}, "Regressions"));
      section.append(fieldTable(route.fields, "regression", examples, name));
      section.append(el("h4", {}, "Noise (differs between two answers of the primary too)"));
      section.append(fieldTable(route.noise, "noise", examples, name));
      out.push(section);
    }
    if (!Object.keys(report.routes).length) out.push(el("p", { class: "note" }, "Nothing compared yet."));
    out.push(examples);
    return out;
  }
  // turning the shadow on, off or to another candidate: PUT /admin/shadow, after a
  // confirmation that shows the change
  function shadowControl(report) {
    const url = el("input", { id: "shadow-url", type: "url", size: "40", autocomplete: "off", value: report.candidate || "" });
    const ratio = el("input", { id: "shadow-ratio", type: "number", min: "0", max: "1", step: "0.05", value: String(report.sampleRatio) });
    const box = el("div", { id: "shadow-change", "aria-live": "polite" });
    const apply = el("button", { type: "button", id: "shadow-apply" }, "Apply…");
    const off = el("button", { type: "button", class: "danger", id: "shadow-off" }, "Turn off…");
    const ask = (change) => {
      const lines = [];
      if ("baseUrl" in change) lines.push("upstream.shadow.base_url: " + (report.candidate || "(none)") + " → " + change.baseUrl);
      lines.push("upstream.shadow.sample_ratio: " + report.sampleRatio + " → " + change.sampleRatio);
      const confirm = el("button", { type: "button", class: "danger", id: "shadow-confirm" }, "Reload with this change");
      const cancel = el("button", { type: "button", id: "shadow-cancel" }, "Cancel");
      box.replaceChildren(el("div", { class: "confirm", role: "alertdialog", "aria-labelledby": "shadow-said" },
        el("p", { id: "shadow-said" }, "This changes, on every worker:"),
        el("ul", {}, ...lines.map((line) => el("li", {}, line))),
        change.sampleRatio > 0 ? el("p", {}, "The candidate gets the callers' own tokens. A reload from the file later sets these keys as the file says.") : null,
        confirm, " ", cancel));
      confirm.focus();
      cancel.addEventListener("click", () => { box.replaceChildren(); apply.focus(); });
      box.addEventListener("keydown", (event) => { if (event.key === "Escape") cancel.click(); });
      confirm.addEventListener("click", async () => {
        confirm.disabled = true;
        const answer = await call("PUT", "/admin/shadow", true, change);
        if (!answer.ok) { box.replaceChildren(problemBox(answer)); return; }
        const applied = answer.body.applied.length ? answer.body.applied.join(", ") : "nothing changed";
        box.replaceChildren(el("div", { class: "answer", role: "status", id: "shadow-result", tabindex: "-1" }, "Applied: " + applied));
        document.getElementById("shadow-result").focus();
      });
    };
    apply.addEventListener("click", () => {
      if (ratio.value.trim() === "" || Number.isNaN(Number(ratio.value)) || url.value.trim() === "") {
        box.replaceChildren(el("div", { class: "problem", role: "alert" }, "Give the candidate's URL and a share from 0 to 1."));
        return;
      }
      ask({ baseUrl: url.value.trim(), sampleRatio: Number(ratio.value) });
    });
    off.addEventListener("click", () => ask({ sampleRatio: 0 }));
    return el("div", {},
      el("label", { for: "shadow-url" }, "Candidate"), url,
      el("label", { for: "shadow-ratio" }, "Share of upstream calls mirrored (0 to 1)"), ratio,
      el("p", {}, apply, " ", off), box);
  }
  function errors(route) {
    return Object.values(route.candidateErrors || {}).reduce((sum, n) => sum + n, 0);
  }
  function fieldTable(fields, kind, examples, routeName) {
    if (!fields.length) return el("p", { class: "note" }, "None.");
    const rows = fields.map((entry) => {
      const kinds = Object.entries(entry.kinds).map(([k, n]) => k + " " + n).join(", ");
      const list = entry.examples.length ? entry.examples : entry.evidence || [];
      const open = el("button", { type: "button", "data-field": entry.field }, "Side by side");
      open.addEventListener("click", () => sideBySide(examples, routeName, entry.field, list, kind));
      return [el("span", { class: kind === "regression" ? "regression" : null }, entry.field), number(entry.total), kinds || "-", list.length ? open : "-"];
    });
    return table(["field", "differences", "kinds", "example"], rows, [false, true, false, false]);
  }
  function sideBySide(examples, routeName, field, list, kind) {
    // noise's evidence is the primary against itself, asked twice
    const [left, right] = kind === "noise" ? ["primary", "primary, asked again"] : ["primary", "candidate"];
    const blocks = list.map((example) => {
      const primary = JSON.stringify(example.primary, null, 2);
      const candidate = JSON.stringify(example.candidate, null, 2);
      const same = primary === candidate;
      const value = (text) => el("pre", {}, same ? text : el("mark", { class: "differs" }, text === undefined ? "(missing)" : text));
      const whole = el("div", {});
      const open = el("button", { type: "button", class: "whole" }, "Whole answers");
      open.addEventListener("click", () => wholeAnswers(whole, example.requestId));
      return el("div", { class: "card" },
        el("p", { class: "note" }, "request " + example.requestId + " · " + example.kind + " "),
        el("div", { class: "side-by-side" },
          el("div", {}, el("h4", {}, left), value(primary)),
          el("div", {}, el("h4", {}, right), value(candidate))),
        kind === "noise" ? null : el("p", {}, open), whole);
    });
    examples.replaceChildren(el("h3", { tabindex: "-1", id: "examples-title" }, routeName + " · " + field), ...blocks);
    document.getElementById("examples-title").focus();
  }

  // the two whole answers of a request, their differing lines marked
  async function wholeAnswers(box, requestId) {
    const answer = await call("GET", "/admin/shadow/answers/" + encodeURIComponent(requestId));
    if (!answer.ok) { box.replaceChildren(problemBox(answer)); return; }
    const kept = answer.body;
    const lines = (text) => {
      try { return JSON.stringify(JSON.parse(text), null, 2).split("\n"); } catch (error) { return text.split("\n"); }
    };
    const primary = lines(kept.primary), candidate = lines(kept.candidate);
    const [inPrimary, inCandidate] = common(primary, candidate);
    const shown = (mine, kept_) => el("pre", { class: "whole-answer" }, ...mine.map((line, i) =>
      kept_[i] ? line + "\n" : el("mark", { class: "differs" }, line + "\n")));
    box.replaceChildren(
      el("p", { class: "note" }, kept.route + ": " + kept.target),
      el("div", { class: "side-by-side" },
        el("div", {}, el("h4", {}, "primary"), shown(primary, inPrimary)),
        el("div", {}, el("h4", {}, "candidate"), shown(candidate, inCandidate))));
  }
  // which lines of a and of b are in their longest common subsequence (the lines a
  // diff leaves unmarked); answers of at most 32 KiB keep the table small
  function common(a, b) {
    const n = a.length, m = b.length;
    const length = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
    for (let i = n - 1; i >= 0; i--) {
      for (let j = m - 1; j >= 0; j--) {
        length[i][j] = a[i] === b[j] ? length[i + 1][j + 1] + 1 : Math.max(length[i + 1][j], length[i][j + 1]);
      }
    }
    const inA = new Array(n).fill(false), inB = new Array(m).fill(false);
    let i = 0, j = 0;
    while (i < n && j < m) {
      if (a[i] === b[j]) { inA[i] = true; inB[j] = true; i++; j++; }
      else if (length[i + 1][j] >= length[i][j + 1]) i++;
      else j++;
    }
    return [inA, inB];
  }

  // --- Purging: by route, everything, or record, after a confirmation ----------------
  async function purgeView() {
    const out = [el("h2", {}, "Purging")];
    const advice = await call("GET", "/admin/ttl");
    const routeNames = advice.ok ? advice.body.routes.map((r) => r.route) : [];
    const what = el("select", { id: "purge-what" },
      el("option", { value: "route" }, "one route, every caller"),
      el("option", { value: "record" }, "one record, every view of it"),
      el("option", { value: "all" }, "everything"));
    const route = el("select", { id: "purge-route" }, ...routeNames.map((name) => el("option", { value: name }, name)));
    const record = el("input", { id: "purge-record", placeholder: "expense:ID", autocomplete: "off" });
    const soft = el("input", { id: "purge-soft", type: "checkbox" });
    const answerBox = el("div", { id: "purge-answer", "aria-live": "polite" });
    const start = el("button", { type: "button", class: "danger", id: "purge-start" }, "Purge…");
    const form = el("div", {},
      el("label", { for: "purge-what" }, "What"), what,
      el("label", { for: "purge-route" }, "Route"), route,
      el("label", { for: "purge-record" }, "Record (kind:id)"), record,
      el("label", { for: "purge-soft" }, soft, " soft: mark stale, served while refreshed (records only)"),
      el("p", {}, start));
    start.addEventListener("click", () => {
      const kind = what.value;
      let query = "", said = "";
      if (kind === "route") {
        query = "?route=" + encodeURIComponent(route.value);
        said = "every cached answer of route " + route.value + ", for every caller, on every instance";
      } else if (kind === "record") {
        const ref = record.value.trim();
        if (!ref) { answerBox.replaceChildren(el("div", { class: "problem", role: "alert" }, "Name the record as kind:id.")); record.focus(); return; }
        query = "?record=" + encodeURIComponent(ref) + (soft.checked ? "&mode=soft" : "");
        said = "every cached answer that holds record " + ref + ", for every caller, on every instance" + (soft.checked ? " (marked stale)" : "");
      } else {
        said = "every cached answer of every route, for every caller, on every instance";
      }
      const confirm = el("button", { type: "button", class: "danger", id: "purge-confirm" }, "Purge");
      const cancel = el("button", { type: "button", id: "purge-cancel" }, "Cancel");
      const box = el("div", { class: "confirm", role: "alertdialog", "aria-labelledby": "purge-said" },
        el("p", { id: "purge-said" }, "This purges " + said + "."), confirm, " ", cancel);
      answerBox.replaceChildren(box);
      confirm.focus();
      cancel.addEventListener("click", () => { answerBox.replaceChildren(); start.focus(); });
      box.addEventListener("keydown", (event) => { if (event.key === "Escape") cancel.click(); });
      confirm.addEventListener("click", async () => {
        confirm.disabled = true;
        const answer = await call("DELETE", "/admin/cache" + query);
        if (!answer.ok) { answerBox.replaceChildren(problemBox(answer)); return; }
        const body = answer.body;
        const reached = body.instances || body.workers;
        const counts = [
          "Purged: " + (body.purged === "records" ? (body.records || []).join(", ") : String(body.purged)),
          body.entries !== undefined ? body.entries + " entries" : null,
          reached ? reached.confirmed + " of " + reached.told + " processes confirmed" : null,
        ].filter(Boolean).join(" · ");
        answerBox.replaceChildren(el("div", { class: "answer", role: "status", id: "purge-result", tabindex: "-1" }, counts));
        document.getElementById("purge-result").focus();
      });
    });
    out.push(form, answerBox);
    return out;
  }
})();
