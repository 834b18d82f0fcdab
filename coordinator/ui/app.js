// The runlease dashboard: a hash router over four views (queues, one
// queue's jobs, one job, schedules), redrawn every few seconds by patching
// the DOM in place, so filters, focus and scroll survive a refresh. All
// state the user chose lives in the URL's hash; the key lives in the tab's
// session storage (api.js). Clicks are handled once, on the document, by
// `data-action`.

import { api, ApiError, serverNow, storeKey, storedKey } from "./api.js";
import { h, patch, placeBars } from "./dom.js";
import * as fmt from "./format.js";
import {
  PAGE_SIZE,
  REFRESH_MS,
  STATES,
  UUID,
  caller,
  errorView,
  jobHref,
  jobView,
  queueView,
  queuesView,
  schedulesView,
} from "./views.js";

const app = {
  who: null, // the answer of /v1/whoami
  route: null,
  data: null,
  error: null,
  loadedAt: 0,
  timer: 0,
  generation: 0,
};

// ---- routing, loading, drawing ----

function parseRoute() {
  const raw = location.hash.replace(/^#/, "");
  const [path, query] = raw.split("?");
  const parts = path.split("/").filter(Boolean).map((p) => {
    try {
      return decodeURIComponent(p);
    } catch {
      return p;
    }
  });
  const params = new URLSearchParams(query || "");
  if (parts[0] === "queues" && parts[1]) {
    const states = (params.get("state") || "").split(",").filter((s) => STATES.includes(s));
    return { view: "queue", queue: parts[1], states, cursor: params.get("cursor") || null };
  }
  if (parts[0] === "jobs" && parts[1]) return { view: "job", id: parts[1] };
  if (parts[0] === "schedules") return { view: "schedules" };
  return { view: "queues" };
}

const routeKey = (r) => JSON.stringify(r);

async function load(route) {
  switch (route.view) {
    case "queues":
      return api.queues();
    case "queue": {
      const [q, list] = await Promise.all([api.queue(route.queue), api.jobs(route.queue, route.states, route.cursor, PAGE_SIZE)]);
      return { q, list };
    }
    case "job":
      if (!UUID.test(route.id)) throw new ApiError(400, "bad_request", `${route.id} is not a job id (a UUID)`);
      return { job: await api.job(route.id) };
    case "schedules":
      return api.schedules();
  }
  return null;
}

async function refresh() {
  clearTimeout(app.timer);
  const route = app.route;
  const generation = ++app.generation;
  try {
    const data = await load(route);
    if (generation !== app.generation) return;
    app.data = data;
    app.error = null;
    app.loadedAt = serverNow();
  } catch (e) {
    if (generation !== app.generation) return;
    if (e.status === 401) {
      askForKey(`The coordinator refused the key: ${e.message}.`);
      return;
    }
    app.error = e;
    app.data = null;
  }
  draw();
  schedule();
}

function schedule() {
  clearTimeout(app.timer);
  if (!document.hidden) app.timer = setTimeout(refresh, REFRESH_MS);
}

function draw() {
  const main = document.getElementById("main");
  const now = serverNow();
  let nodes;
  if (app.error) nodes = errorView(app.error);
  else if (!app.data) nodes = [h("p", { class: "muted loading" }, "Loading…")];
  else if (app.route.view === "queues") nodes = queuesView(app.data, now);
  else if (app.route.view === "queue") nodes = queueView(app.data, app.route, now);
  else if (app.route.view === "job") nodes = jobView(app.data, now);
  else nodes = schedulesView(app.data, now);
  patch(main, nodes);
  placeBars(main);
  main.setAttribute("data-view", app.route.view);
  main.setAttribute("aria-busy", app.data || app.error ? "false" : "true");
  for (const a of document.querySelectorAll("[data-nav]")) {
    const current = a.getAttribute("data-nav") === (app.route.view === "schedules" ? "schedules" : "queues");
    if (current) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  const updated = document.getElementById("updated");
  if (updated && app.loadedAt) updated.textContent = `Updated ${new Date(app.loadedAt).toLocaleTimeString(undefined, { hour12: false })} · every ${REFRESH_MS / 1000} s`;
}

function navigate() {
  const route = parseRoute();
  const moved = !app.route || routeKey(route) !== routeKey(app.route);
  const viewChanged = !app.route || route.view !== app.route.view || route.queue !== app.route.queue || route.id !== app.route.id;
  app.route = route;
  if (moved && viewChanged) {
    app.data = null;
    app.error = null;
    draw();
    window.scrollTo(0, 0);
  }
  refresh().then(() => {
    if (moved && viewChanged) {
      const heading = document.querySelector("#main h1");
      if (heading) heading.focus({ preventScroll: true });
    }
  });
}

// ---- who is calling ----

function showWho() {
  caller.who = app.who;
  const who = document.getElementById("who");
  const forget = document.getElementById("forget");
  const w = app.who;
  let text = "";
  let cls = "who";
  if (w && !w.keys_configured) text = "Open: no keys (loopback)";
  else if (w && w.role === "admin") text = "Admin key";
  else if (w && w.role) {
    text = `${w.role[0].toUpperCase()}${w.role.slice(1)} key · read-only`;
    cls += " readonly";
  }
  if (w && w.queues) text += ` · ${w.queues.join(", ")}`;
  who.textContent = text;
  who.className = cls;
  forget.hidden = !storedKey();
  const banner = document.getElementById("banner");
  if (w && w.role && w.role !== "admin") {
    banner.hidden = false;
    banner.textContent = `This ${w.role} key sees every figure but cannot retry, delete or pause${w.role === "producer" ? " (it may cancel)" : ""}: those buttons are disabled. Use an admin key to act.`;
  } else {
    banner.hidden = true;
  }
}

function askForKey(message) {
  clearTimeout(app.timer);
  app.generation++;
  const dialog = document.getElementById("key-dialog");
  document.getElementById("key-message").textContent = message;
  document.getElementById("key-message").hidden = !message;
  const input = document.getElementById("key-input");
  input.value = "";
  if (!dialog.open) dialog.showModal();
  input.focus();
}

async function start() {
  try {
    app.who = await api.whoami();
  } catch (e) {
    if (e.status === 401) {
      storeKey(null);
      app.who = null;
      showWho();
      askForKey(`The coordinator refused this key: ${e.message}. Check the key (RUNLEASE_API_KEYS on the coordinator) and try again.`);
      return;
    }
    app.route = parseRoute();
    app.error = e;
    draw();
    setTimeout(start, REFRESH_MS);
    return;
  }
  showWho();
  if (!app.who.role) {
    askForKey("");
    return;
  }
  navigate();
}

// ---- actions ----

function toast(text, bad) {
  const el = document.getElementById("toast");
  el.textContent = text;
  el.className = bad ? "toast bad" : "toast";
  el.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => (el.hidden = true), 6000);
}

/** Asks before an action; resolves true when the user confirms. */
function confirmAction(title, message, label, danger) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-message").textContent = message;
  const ok = document.getElementById("confirm-ok");
  ok.textContent = label;
  ok.className = danger ? "danger" : "";
  dialog.returnValue = "";
  dialog.showModal();
  document.getElementById("confirm-cancel").focus();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
  });
}

const plural = (n, one, many) => `${n.toLocaleString()} ${n === 1 ? one : many}`;

async function act(button) {
  const action = button.getAttribute("data-action");
  const queue = button.getAttribute("data-queue") || (app.data && app.data.q && app.data.q.queue);
  try {
    if (action === "pause") {
      const waiting = Number(button.getAttribute("data-waiting") || 0);
      if (!(await confirmAction(`Pause ${queue}?`, `Claims of ${queue} will get nothing on every coordinator until it is resumed; ${plural(waiting, "queued job waits", "queued jobs wait")}. Running jobs finish, enqueues are accepted.`, "Pause queue", true))) return;
      await api.updateQueue(queue, { paused: true });
      toast(`${queue} is paused.`);
    } else if (action === "resume") {
      await api.updateQueue(queue, { paused: false });
      toast(`${queue} is resumed.`);
    } else if (action === "retry" || action === "cancel") {
      const id = button.getAttribute("data-job");
      const verb = action === "retry" ? "Retry" : "Cancel";
      const what =
        action === "retry"
          ? "It goes back to queued with a fresh attempt budget and runs again."
          : "A queued job is cancelled now; a running one is asked to stop at its next heartbeat.";
      if (!(await confirmAction(`${verb} job ${fmt.shortId(id)}?`, `This touches 1 job (${id}). ${what}`, `${verb} 1 job`, action === "cancel"))) return;
      const job = action === "retry" ? await api.retry(id) : await api.cancel(id);
      toast(`Job ${fmt.shortId(id)} is ${job.state}${job.cancel_requested && job.state === "running" ? ", cancel requested" : ""}.`);
    } else if (action === "bulk-retry" || action === "bulk-delete") {
      const n = Number(button.getAttribute("data-count"));
      const states = button.getAttribute("data-states").split(",").filter(Boolean);
      const retry = action === "bulk-retry";
      const message = retry
        ? `This retries ${plural(n, "job", "jobs")} of ${queue} (${states.join(" and ")}): each goes back to queued with a fresh attempt budget.`
        : `This deletes ${plural(n, "job", "jobs")} of ${queue} (${states.join(", ")}) with their attempts. It cannot be undone.`;
      const label = `${retry ? "Retry" : "Delete"} ${plural(n, "job", "jobs")}`;
      if (!(await confirmAction(`${retry ? "Retry" : "Delete"} ${plural(n, "job", "jobs")}?`, message, label, !retry))) return;
      const result = await api.bulk({ action: retry ? "retry" : "delete", queue, states });
      toast(`${retry ? "Retried" : "Deleted"} ${plural(result.changed, "job", "jobs")} (${result.matched.toLocaleString()} matched).`);
    }
  } catch (e) {
    if (e.status === 401) return askForKey(`The coordinator refused the key: ${e.message}.`);
    toast(`${e.status ? e.status + " " + e.code + ": " : ""}${e.message}`, true);
  }
  refresh();
}

document.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-action]");
  if (button && !button.disabled) {
    event.preventDefault();
    act(button);
  }
});

document.addEventListener("submit", async (event) => {
  const form = event.target;
  event.preventDefault();
  if (form.id === "key-form") {
    const key = document.getElementById("key-input").value.trim();
    if (!key) return;
    storeKey(key);
    document.getElementById("key-dialog").close();
    start();
  } else if (form.getAttribute("data-form") === "search") {
    const id = new FormData(form).get("id").toString().trim();
    if (UUID.test(id)) location.hash = jobHref(id.toLowerCase());
    else toast(`${id || "An empty id"} is not a job id: paste the whole UUID.`, true);
  } else if (form.id === "confirm-form") {
    const dialog = document.getElementById("confirm");
    dialog.close(event.submitter && event.submitter.value === "ok" ? "ok" : "");
  }
});

document.getElementById("forget").addEventListener("click", () => {
  clearTimeout(app.timer);
  app.generation++;
  storeKey(null);
  app.who = null;
  showWho();
  start();
});

document.getElementById("key-dialog").addEventListener("cancel", (e) => e.preventDefault());
window.addEventListener("hashchange", navigate);
document.addEventListener("visibilitychange", () => {
  if (!document.hidden && app.route && app.who) refresh();
});

start();
