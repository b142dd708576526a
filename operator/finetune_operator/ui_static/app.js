// finetune ui: the jobs page (/) and a job's page (/jobs/<namespace>/<name>), drawn from the server's JSON
// (/api/jobs, /api/jobs/<namespace>/<name>) and refreshed every few seconds. Every value is inserted as text.
"use strict";
(function () {
  const REFRESH_MS = 5000;
  const app = document.getElementById("app");

  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined) continue;
      if (k === "class") node.className = v;
      else if (k.startsWith("data-")) node.setAttribute(k, v);
      else node[k] = v;
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined) continue;
      node.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
    }
    return node;
  }

  function table(columns, rows, attrs) {
    return h("table", attrs || {},
      h("thead", {}, h("tr", {}, columns.map((c) => h("th", {}, c)))),
      h("tbody", {}, rows));
  }

  const dash = (v) => (v === null || v === undefined || v === "" ? "-" : v);
  const num = (v) => (v === null || v === undefined ? "-" : String(parseFloat(Number(v).toPrecision(4))));
  const pct = (v) => (v === null || v === undefined ? "-" : `${(100 * v).toFixed(1)}%`);

  function state(s) {
    return h("span", { class: `state state-${s}` }, s);
  }

  function progress(job) {
    if (job.step === null || job.step === undefined) return "-";
    if (!job.totalSteps) return `step ${job.step}`;
    const fill = h("span", {});
    fill.style.width = `${job.percent}%`;  // CSSOM, which the page's Content-Security-Policy allows
    return h("span", {}, h("span", { class: "bar" }, fill), `${job.step}/${job.totalSteps}`);
  }

  async function get(url) {
    const resp = await fetch(url, { headers: { Accept: "application/json" } });
    const body = await resp.json();
    if (!resp.ok) throw new Error(body.error || resp.statusText);
    return body;
  }

  function stamp() {
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  }

  function failed(err) {
    app.replaceChildren(h("div", { class: "error" }, String(err.message || err)));
    document.body.dataset.ready = "error";
  }

  async function jobsPage() {
    const data = await get("/api/jobs");
    document.getElementById("scope").textContent = data.scope;
    const rows = data.jobs.map((j) => h("tr", { "data-job": `${j.namespace}/${j.name}` },
      h("td", {}, j.namespace),
      h("td", {}, h("a", { href: `/jobs/${encodeURIComponent(j.namespace)}/${encodeURIComponent(j.name)}` }, j.name)),
      h("td", {}, state(j.state)),
      h("td", { title: j.message || "" }, dash(j.reason)),
      h("td", { class: "num" }, j.nodes),
      h("td", { class: "num" }, progress(j)),
      h("td", { class: "num" }, dash(j.eta)),
      h("td", { class: "num" }, pct(j.mfu)),
      h("td", { class: "num" }, num(j.loss)),
      h("td", { class: "num" }, j.restarts),
      h("td", { class: "num" }, j.age)));
    app.replaceChildren(
      ...data.notes.map((n) => h("div", { class: "note" }, n)),
      data.jobs.length
        ? table(["Namespace", "Name", "State", "Reason", "Nodes", "Progress", "ETA", "MFU", "Loss", "Restarts", "Age"], rows, { id: "jobs" })
        : h("p", { class: "muted", id: "jobs" }, "No FineTuneJobs."));
    stamp();
    document.body.dataset.ready = "jobs";
  }

  async function jobPage(ns, name) {
    const j = await get(`/api/jobs/${encodeURIComponent(ns)}/${encodeURIComponent(name)}`);
    document.title = `${name} · FineTuneJobs`;
    document.getElementById("scope").textContent = `namespace ${ns}`;
    const summary = h("dl", { class: "summary" },
      h("dt", {}, "State"), h("dd", {}, state(j.state), j.reason ? ` ${j.reason}` : ""),
      h("dt", {}, "Why"), h("dd", {}, dash(j.message)),
      h("dt", {}, "Attempt"), h("dd", {}, `${j.attempt} (restarts ${j.restarts})`),
      h("dt", {}, "Nodes"), h("dd", {}, `${j.nodes} running`),
      h("dt", {}, "Progress"), h("dd", {}, progress(j), j.progressLine ? ` ${j.progressLine.replace(/^step [^,]*(, )?/, "")}` : ""),
      h("dt", {}, "MFU"), h("dd", {}, pct(j.mfu)),
      h("dt", {}, "Age"), h("dd", {}, j.age),
      j.failure ? [h("dt", {}, j.state === "Failed" ? "Failure" : "Last failure"), h("dd", { class: "state-Failed" },
        `${j.failure.reason}${j.failure.rank !== undefined ? ` on node ${j.failure.rank}` : ""}: ${j.failure.message || ""}`)] : null);
    const charts = h("div", { class: "charts", id: "charts" });
    const c = j.curves, marks = j.attempts;
    const sections = [
      h("h1", {}, name), summary,
      h("h2", {}, "Curves"), charts,
      h("h2", {}, "Conditions"),
      table(["Type", "Status", "Reason", "Age", "Message"], j.conditions.map((x) =>
        h("tr", {}, h("td", {}, x.type), h("td", {}, x.status), h("td", {}, dash(x.reason)), h("td", {}, x.age), h("td", {}, dash(x.message)))),
      { id: "conditions" }),
      h("h2", {}, "Events"),
      table(["Age", "Type", "Reason", "Message"], j.events.map((x) =>
        h("tr", {}, h("td", {}, x.age), h("td", {}, dash(x.type)), h("td", {}, dash(x.reason)), h("td", {}, dash(x.message)))),
      { id: "events" }),
      h("h2", {}, "Rank 0's log"),
      h("p", { class: "muted" }, j.log.note),
      j.log.lines.length ? h("pre", { class: "log", id: "log" }, j.log.lines.join("\n")) : h("p", { id: "log", class: "muted" }, "(no lines)"),
    ];
    app.replaceChildren(...sections);
    window.FinetuneChart.draw(charts, { title: "Loss", marks, series: [
      { name: "train loss", color: "#1f6feb", points: c.loss },
      { name: "eval loss", color: "#c62828", points: c.eval_loss, dots: true }] });
    window.FinetuneChart.draw(charts, { title: "Samples/s", marks, series: [
      { name: "samples/s", color: "#1a7f37", points: c.samples_per_second }] });
    window.FinetuneChart.draw(charts, { title: "Learning rate", marks, series: [
      { name: "learning rate", color: "#8250df", points: c.learning_rate }] });
    if (c.reward && c.reward.length) {  // grpo: the mean of the weighted rewards
      window.FinetuneChart.draw(charts, { title: "Reward", marks, series: [
        { name: "mean reward", color: "#bf8700", points: c.reward }] });
    }
    stamp();
    document.body.dataset.ready = "job";
  }

  function route() {
    const m = location.pathname.match(/^\/jobs\/([^/]+)\/([^/]+)$/);
    const page = m ? () => jobPage(decodeURIComponent(m[1]), decodeURIComponent(m[2])) : jobsPage;
    // the next refresh is due REFRESH_MS after this one answered: slow answers never pile up
    const tick = () => page().catch(failed).finally(() => setTimeout(tick, REFRESH_MS));
    tick();
  }

  route();
})();
