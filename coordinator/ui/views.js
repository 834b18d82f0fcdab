// The four views (queues, one queue's jobs, one job, schedules) and the
// error view: plain functions from the API's answers to DOM nodes, redrawn
// on every refresh and patched into the page by app.js. Every state is
// shown with a shape and a label beside its colour.

import { h } from "./dom.js";
import * as fmt from "./format.js";
import { dependencyPanel, retryPolicy } from "./links.js";

export const STATES = ["blocked", "queued", "running", "done", "failed", "cancelled", "enqueue_failed"];
export const TERMINAL = ["done", "failed", "cancelled"];
export const RETRYABLE = ["failed", "cancelled"];
export const STATE_LABEL = {
  blocked: "Blocked",
  queued: "Queued",
  running: "Running",
  done: "Done",
  failed: "Failed",
  cancelled: "Cancelled",
  enqueue_failed: "Enqueue failed",
};
// Shapes beside the colours, so a state reads without colour too.
export const STATE_ICON = {
  blocked: "⧖",
  queued: "◷",
  running: "▶",
  done: "✓",
  failed: "✕",
  cancelled: "⊘",
  enqueue_failed: "!",
};
export const OUTCOME_LABEL = {
  completed: "completed",
  failed: "failed",
  released: "released",
  lease_expired: "lease expired",
  cancelled: "cancelled",
};
export const REFRESH_MS = 3000;
// Most dependents a job answer lists.
const MAX_DEPENDENTS_SHOWN = 100;
export const PAGE_SIZE = 50;
export const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

// ---- small pieces ----

function stateBadge(state) {
  return h(
    "span",
    { class: `badge state-${state}`, "data-state": state },
    h("span", { class: "icon", "aria-hidden": "true" }, STATE_ICON[state] || "?"),
    " ",
    STATE_LABEL[state] || state,
  );
}

function pausedBadge(paused) {
  return paused
    ? h("span", { class: "badge paused", "data-status": "paused" }, h("span", { class: "icon", "aria-hidden": "true" }, "‖"), " Paused")
    : h("span", { class: "badge active", "data-status": "active" }, h("span", { class: "icon", "aria-hidden": "true" }, "●"), " Active");
}

function time(iso, now) {
  if (!iso) return h("span", { class: "muted" }, "–");
  return h("time", { datetime: iso, title: fmt.absolute(iso) }, fmt.relative(iso, now));
}

function num(n, extra) {
  return h("span", { class: "num", title: n.toLocaleString(), ...extra }, fmt.count(n));
}

/** Who the page calls as: the answer of /v1/whoami (app.js sets it). */
export const caller = { who: null };

const isAdmin = () => caller.who && caller.who.role === "admin";
const mayCancel = () => caller.who && (caller.who.role === "admin" || caller.who.role === "producer");

function actionButton(label, attrs, allowed, why) {
  return h(
    "button",
    {
      type: "button",
      ...attrs,
      disabled: !allowed,
      title: allowed ? attrs.title : why,
      "aria-disabled": !allowed ? "true" : null,
    },
    label,
  );
}

const NEEDS_ADMIN = "needs an admin key: this key may look, not act";

export function queueHref(queue, states, cursor) {
  const params = new URLSearchParams();
  if (states && states.length) params.set("state", states.join(","));
  if (cursor) params.set("cursor", cursor);
  const q = params.toString();
  return `#/queues/${encodeURIComponent(queue)}${q ? "?" + q : ""}`;
}

export const jobHref = (id) => `#/jobs/${encodeURIComponent(id)}`;

function limits(s) {
  const parts = [];
  if (s.max_running) parts.push(`${fmt.count(s.max_running)} running`);
  if (s.max_running_per_key) parts.push(`${fmt.count(s.max_running_per_key)} per key`);
  if (s.rate_limit) parts.push(`${s.rate_limit.per_s}/s, burst ${fmt.count(s.rate_limit.burst)}`);
  return parts.length ? parts.join(" · ") : "–";
}

/** A queue's endpoint health as a badge with a shape: ● healthy, ✕ unhealthy. */
function healthBadge(e) {
  return e.healthy
    ? h("span", { class: "badge active", "data-endpoint-health": "healthy" }, h("span", { class: "icon", "aria-hidden": "true" }, "●"), " Healthy")
    : h(
        "span",
        { class: "badge unhealthy", "data-endpoint-health": "unhealthy", title: `${e.consecutive_failures} connection failures in a row` },
        h("span", { class: "icon", "aria-hidden": "true" }, "✕"),
        " Unhealthy",
      );
}

/** The queues table's endpoint cell: health and requests in flight, or a dash for pull only. */
function endpointCell(q) {
  const e = q.endpoint;
  if (!e) return h("td", { class: "endpoint", "data-endpoint": "none" }, h("span", { class: "muted", title: "served by pull workers only" }, "–"));
  const title = `${e.url}${e.last_error ? `\nlast error: ${e.last_error}` : ""}`;
  return h(
    "td",
    { class: "endpoint", "data-endpoint": e.url, title },
    healthBadge(e),
    h("div", { class: "sub", "data-endpoint-in-flight": e.in_flight }, `${fmt.count(e.in_flight)}/${fmt.count(e.concurrency)} in flight`),
  );
}

/**
 * A queue's endpoint on its page: where, health, in flight, time-out, last
 * error. A list of top-level nodes (none for a pull-only queue): the view's
 * nodes are patched in one by one.
 */
function endpointFacts(q, now) {
  const e = q.endpoint;
  if (!e) return [];
  const section = h(
    "section",
    { class: "endpoint-facts", "aria-label": "Endpoint", "data-endpoint": e.url },
    h("h2", {}, "Endpoint"),
    h(
      "dl",
      { class: "facts" },
      fact("URL", h("span", { class: "mono selectable", "data-endpoint-url": "" }, e.url), true),
      fact("Health", healthBadge(e)),
      fact("In flight", h("span", { "data-endpoint-in-flight": e.in_flight }, `${fmt.count(e.in_flight)} of ${fmt.count(e.concurrency)}`)),
      fact("Time-out", fmt.duration(e.timeout_ms)),
      fact(
        "Last error",
        e.last_error
          ? h("span", { class: "bad", "data-endpoint-last-error": "" }, e.last_error, e.last_error_at ? h("span", { class: "sub" }, " · ", time(e.last_error_at, now)) : null)
          : h("span", { class: "muted", "data-endpoint-last-error": "" }, "–"),
        true,
      ),
    ),
  );
  return [section];
}

function throughputOf(q) {
  const t = q.throughput || { window_ms: 60000, done: 0, failed: 0, cancelled: 0 };
  return t;
}

// ---- views ----

export function queuesView(data, now) {
  const queues = data.queues;
  const sum = (f) => queues.reduce((a, q) => a + f(q), 0);
  const windowMs = queues.length ? throughputOf(queues[0]).window_ms : 60000;
  const tiles = [
    ["Queued", sum((q) => q.counts.queued + q.counts.enqueue_failed)],
    ["Running", sum((q) => q.counts.running)],
    ["Failed", sum((q) => q.counts.failed)],
  ];
  return [
    h("div", { class: "title" }, h("h1", { tabindex: "-1" }, "Queues"), h("p", { class: "muted" }, `${queues.length} ${queues.length === 1 ? "queue" : "queues"}`)),
    h(
      "div",
      { class: "tiles" },
      tiles.map(([label, n]) => h("div", { class: "tile" }, h("div", { class: "tile-label" }, label), h("div", { class: "tile-value" }, num(n)))),
      h(
        "div",
        { class: "tile" },
        h("div", { class: "tile-label" }, "Done, last minute"),
        h("div", { class: "tile-value" }, fmt.rate(sum((q) => throughputOf(q).done), windowMs)),
      ),
    ),
    queues.length === 0
      ? h("p", { class: "empty" }, "No queues yet: a queue appears here with its first job (POST /v1/jobs) or its first setting.")
      : h(
          "div",
          { class: "table-wrap" },
          h(
            "table",
            { class: "grid", id: "queues" },
            h(
              "thead",
              {},
              h(
                "tr",
                {},
                h("th", { scope: "col" }, "Queue"),
                h("th", { scope: "col" }, "Status"),
                STATES.map((s) => h("th", { scope: "col", class: "n" }, STATE_LABEL[s])),
                h("th", { scope: "col", class: "n" }, "Oldest waiting"),
                h("th", { scope: "col", class: "n" }, "Throughput"),
                h("th", { scope: "col" }, "Limits"),
                h("th", { scope: "col" }, "Endpoint"),
                h("th", { scope: "col" }, h("span", { class: "sr-only" }, "Actions")),
              ),
            ),
            h(
              "tbody",
              {},
              queues.map((q) => {
                const t = throughputOf(q);
                return h(
                  "tr",
                  { "data-key": `queue:${q.queue}`, "data-queue": q.queue },
                  h("th", { scope: "row" }, h("a", { href: queueHref(q.queue) }, q.queue)),
                  h("td", {}, pausedBadge(q.settings.paused)),
                  STATES.map((s) =>
                    h(
                      "td",
                      { class: `n count-${s}${q.counts[s] ? "" : " zero"}`, "data-count": s, "data-value": q.counts[s] },
                      h("a", { href: queueHref(q.queue, [s]), "aria-label": `${q.counts[s]} ${STATE_LABEL[s].toLowerCase()} in ${q.queue}` }, num(q.counts[s])),
                      s === "queued" && q.held_by_limits ? h("div", { class: "sub", title: "due jobs its pause or limits hold back" }, `${fmt.count(q.held_by_limits)} held`) : null,
                    ),
                  ),
                  h("td", { class: "n" }, q.oldest_queued_age_ms === null ? h("span", { class: "muted" }, "–") : fmt.duration(q.oldest_queued_age_ms)),
                  h(
                    "td",
                    { class: "n", title: `in the last ${fmt.duration(t.window_ms)}: ${t.done} done, ${t.failed} failed, ${t.cancelled} cancelled` },
                    fmt.rate(t.done, t.window_ms),
                    t.failed ? h("div", { class: "sub bad" }, `${fmt.rate(t.failed, t.window_ms)} failed`) : null,
                  ),
                  h("td", { class: "limits" }, limits(q.settings)),
                  endpointCell(q),
                  h("td", { class: "act" }, pauseButton(q)),
                );
              }),
            ),
          ),
        ),
  ];
}

function pauseButton(q) {
  const paused = q.settings.paused;
  return actionButton(
    paused ? "Resume" : "Pause",
    { "data-action": paused ? "resume" : "pause", "data-queue": q.queue, "data-waiting": q.counts.queued + q.counts.enqueue_failed, class: "secondary" },
    isAdmin(),
    NEEDS_ADMIN,
  );
}

export function queueView(data, route, now) {
  const q = data.q;
  const list = data.list;
  const selected = route.states;
  const counted = (states) => states.reduce((a, s) => a + (q.counts[s] || 0), 0);
  const filterStates = selected.length ? selected : STATES;
  const retryStates = filterStates.filter((s) => RETRYABLE.includes(s));
  const deleteStates = filterStates.filter((s) => TERMINAL.includes(s));
  const retryCount = counted(retryStates);
  const deleteCount = counted(deleteStates);
  const t = throughputOf(q);
  const chip = (label, states, n) => {
    const current = states.join(",") === selected.join(",");
    return h(
      "a",
      { href: queueHref(q.queue, states), class: `chip${current ? " current" : ""}`, "aria-current": current ? "page" : null, "data-filter": states.join(",") || "all" },
      states.length === 1 ? h("span", { class: `icon state-${states[0]}`, "aria-hidden": "true" }, STATE_ICON[states[0]]) : null,
      label,
      " ",
      h("span", { class: "chip-n" }, fmt.count(n)),
    );
  };
  return [
    h("nav", { class: "crumbs", "aria-label": "Breadcrumb" }, h("a", { href: "#/queues" }, "Queues"), " › ", h("span", {}, q.queue)),
    h("div", { class: "title" }, h("h1", { tabindex: "-1" }, q.queue), pausedBadge(q.settings.paused), h("span", { class: "spacer" }), pauseButton(q)),
    h(
      "dl",
      { class: "facts" },
      fact("Oldest waiting", q.oldest_queued_age_ms === null ? "–" : fmt.duration(q.oldest_queued_age_ms)),
      fact("Done, last minute", fmt.rate(t.done, t.window_ms)),
      fact("Failed, last minute", fmt.rate(t.failed, t.window_ms)),
      fact("Held by limits", fmt.count(q.held_by_limits)),
      fact("Retries", fmt.count(q.retries)),
      fact("Lease expiries", fmt.count(q.lease_expiries)),
      fact("Limits", limits(q.settings)),
    ),
    ...endpointFacts(q, now),
    retryPolicy(q.settings, queueHref),
    h("div", { class: "chips", role: "group", "aria-label": "Filter by state" }, chip("All", [], counted(STATES)), STATES.map((s) => chip(STATE_LABEL[s], [s], q.counts[s]))),
    h(
      "div",
      { class: "toolbar" },
      h(
        "form",
        { class: "search", "data-form": "search", role: "search" },
        h("label", { for: "job-search", class: "sr-only" }, "Job id"),
        h("input", { id: "job-search", name: "id", type: "search", placeholder: "Find a job by id", autocomplete: "off", spellcheck: "false" }),
        h("button", { type: "submit", class: "secondary" }, "Open"),
      ),
      h("span", { class: "spacer" }),
      actionButton(
        `Retry ${fmt.count(retryCount)}…`,
        { "data-action": "bulk-retry", "data-count": retryCount, "data-states": retryStates.join(","), title: `retry the ${retryStates.join(" and ")} jobs of this filter` },
        isAdmin() && retryCount > 0,
        isAdmin() ? "no failed or cancelled job in this filter" : NEEDS_ADMIN,
      ),
      actionButton(
        `Delete ${fmt.count(deleteCount)}…`,
        { "data-action": "bulk-delete", "data-count": deleteCount, "data-states": deleteStates.join(","), class: "danger", title: `delete the ${deleteStates.join(", ")} jobs of this filter` },
        isAdmin() && deleteCount > 0,
        isAdmin() ? "no finished job in this filter" : NEEDS_ADMIN,
      ),
    ),
    list.jobs.length === 0
      ? h("p", { class: "empty" }, route.cursor ? "No more jobs." : "No job in this filter.")
      : h(
          "div",
          { class: "table-wrap" },
          h(
            "table",
            { class: "grid", id: "jobs" },
            h(
              "thead",
              {},
              h(
                "tr",
                {},
                ["Job", "State", "Attempt", "Created", "Updated", "Error"].map((c) => h("th", { scope: "col", class: c === "Attempt" ? "n" : null }, c)),
              ),
            ),
            h(
              "tbody",
              {},
              list.jobs.map((j) =>
                h(
                  "tr",
                  { "data-key": `job:${j.id}`, "data-job": j.id },
                  h("th", { scope: "row" }, h("a", { href: jobHref(j.id), class: "mono", title: j.id }, fmt.shortId(j.id))),
                  h("td", {}, stateBadge(j.state), j.cancel_requested ? h("span", { class: "sub" }, " cancel requested") : null),
                  h("td", { class: "n" }, `${j.attempt}/${j.max_attempts}`),
                  h("td", {}, time(j.created_at, now)),
                  h("td", {}, time(j.updated_at, now)),
                  h("td", { class: "error-cell", title: j.error || "" }, j.error ? j.error : h("span", { class: "muted" }, "–")),
                ),
              ),
            ),
          ),
        ),
    h(
      "nav",
      { class: "pager", "aria-label": "Pages" },
      route.cursor ? h("a", { href: queueHref(q.queue, selected), class: "button secondary" }, "« First page") : null,
      h("span", { class: "muted" }, `Newest first, ${PAGE_SIZE} a page`),
      list.next_cursor ? h("a", { href: queueHref(q.queue, selected, list.next_cursor), class: "button secondary", "data-pager": "next" }, "Next page »") : null,
    ),
  ];
}

function fact(label, value, wide) {
  return h("div", { class: wide ? "fact wide" : "fact" }, h("dt", {}, label), h("dd", {}, value));
}

function timeline(job, now) {
  const start = Date.parse(job.created_at);
  const end = job.finished_at ? Date.parse(job.finished_at) : now;
  const span = Math.max(end - start, 1);
  const pct = (t) => Math.min(100, Math.max(0, ((t - start) / span) * 100));
  const attempts = job.attempts;
  return h(
    "section",
    { class: "panel", "aria-labelledby": "attempts-h" },
    h("h2", { id: "attempts-h" }, job.earlier_attempts ? `Attempts (latest ${attempts.length})` : `Attempts (${attempts.length})`),
    job.earlier_attempts
      ? h("p", { class: "muted", id: "earlier-attempts" }, "Older attempts are not shown; page through them with GET /v1/jobs/{id}/attempts.")
      : null,
    attempts.length === 0
      ? h("p", { class: "empty" }, "Not claimed yet.")
      : [
          h(
            "div",
            { class: "timeline", "aria-hidden": "true" },
            attempts.map((a) => {
              const from = pct(Date.parse(a.claimed_at));
              const to = pct(a.finished_at ? Date.parse(a.finished_at) : now);
              const outcome = a.outcome || "running";
              return h(
                "div",
                { class: "lane" },
                h("span", { class: "lane-label mono" }, `#${a.run_lease}`),
                h(
                  "div",
                  { class: "track" },
                  h("div", { class: `bar outcome-${outcome}`, "data-left": from.toFixed(2), "data-width": Math.max(to - from, 0.8).toFixed(2), title: `${a.worker_id}: ${OUTCOME_LABEL[outcome] || outcome}` }),
                ),
              );
            }),
            h("div", { class: "axis" }, h("span", {}, `created ${fmt.relative(job.created_at, now)}`), h("span", {}, job.finished_at ? `finished ${fmt.relative(job.finished_at, now)}` : "now")),
          ),
          h(
            "ol",
            { class: "attempts", id: "attempts" },
            attempts.map((a) => {
              const outcome = a.outcome || "running";
              const held = (a.finished_at ? Date.parse(a.finished_at) : now) - Date.parse(a.claimed_at);
              return h(
                "li",
                { "data-key": `lease:${a.run_lease}`, "data-outcome": outcome, class: `attempt outcome-${outcome}` },
                h("span", { class: "attempt-mark", "aria-hidden": "true" }),
                h(
                  "div",
                  {},
                  h("div", { class: "attempt-head" }, h("strong", {}, `Lease ${a.run_lease}`), " held by ", h("span", { class: "mono" }, a.worker_id), " · ", h("span", { class: `outcome-label outcome-${outcome}` }, OUTCOME_LABEL[outcome] || "running")),
                  h("div", { class: "muted" }, "claimed ", time(a.claimed_at, now), a.finished_at ? [" · ended ", time(a.finished_at, now)] : null, ` · held ${fmt.duration(held)}`),
                  a.error ? h("pre", { class: "error" }, a.error) : null,
                ),
              );
            }),
          ),
        ],
  );
}

export function jobView(data, now) {
  const j = data.job;
  const cancellable = ["blocked", "queued", "enqueue_failed", "running"].includes(j.state) && !j.cancel_requested;
  const retryable = RETRYABLE.includes(j.state);
  const total = (j.finished_at ? Date.parse(j.finished_at) : now) - Date.parse(j.created_at);
  const block = (key, title, value, cls) => h("section", { class: "panel" }, h("h2", {}, title), h("pre", { class: cls || null, "data-block": key }, value));
  return [
    h("nav", { class: "crumbs", "aria-label": "Breadcrumb" }, h("a", { href: "#/queues" }, "Queues"), " › ", h("a", { href: queueHref(j.queue) }, j.queue), " › ", h("span", { class: "mono" }, fmt.shortId(j.id))),
    h(
      "div",
      { class: "title" },
      h("h1", { tabindex: "-1" }, "Job ", h("span", { class: "mono" }, fmt.shortId(j.id))),
      stateBadge(j.state),
      j.cancel_requested ? h("span", { class: "badge cancel-requested" }, "cancel requested") : null,
      h("span", { class: "spacer" }),
      actionButton("Retry…", { "data-action": "retry", "data-job": j.id }, isAdmin() && retryable, isAdmin() ? "only failed or cancelled jobs can be retried" : NEEDS_ADMIN),
      actionButton("Cancel…", { "data-action": "cancel", "data-job": j.id, class: "danger" }, mayCancel() && cancellable, mayCancel() ? "only queued or running jobs can be cancelled" : "needs a producer or admin key"),
    ),
    h(
      "dl",
      { class: "facts" },
      fact("Id", h("span", { class: "mono selectable" }, j.id), true),
      fact("Queue", h("a", { href: queueHref(j.queue) }, j.queue)),
      fact("Attempt", `${j.attempt} of ${j.max_attempts}`),
      fact("Run lease", String(j.run_lease)),
      fact("Priority", String(j.priority)),
      fact("Created", time(j.created_at, now)),
      fact("Runs at", time(j.run_at, now)),
      fact("Updated", time(j.updated_at, now)),
      fact("Finished", time(j.finished_at, now)),
      fact(j.finished_at ? "Took" : "Age", fmt.duration(total)),
      fact("Timeout", j.timeout_ms ? fmt.duration(j.timeout_ms) : "default"),
      j.idempotency_key ? fact("Idempotency key", h("span", { class: "mono" }, j.idempotency_key)) : null,
      j.concurrency_key ? fact("Concurrency key", h("span", { class: "mono" }, j.concurrency_key)) : null,
    ),
    j.error ? block("error", j.state === "failed" ? "Error" : "Last error", j.error, "error") : null,
    dependencyPanel(j, stateBadge, MAX_DEPENDENTS_SHOWN),
    timeline(j, now),
    h("div", { class: "blocks" }, block("payload", "Payload", fmt.json(j.payload)), block("progress", "Progress", fmt.json(j.progress)), block("result", "Result", fmt.json(j.result))),
  ];
}

export function schedulesView(data, now) {
  const list = data.schedules;
  return [
    h("div", { class: "title" }, h("h1", { tabindex: "-1" }, "Schedules"), h("p", { class: "muted" }, `${list.length} ${list.length === 1 ? "schedule" : "schedules"}`)),
    list.length === 0
      ? h("p", { class: "empty" }, "No schedules. Create one with PUT /v1/schedules/{name}.")
      : h(
          "div",
          { class: "table-wrap" },
          h(
            "table",
            { class: "grid", id: "schedules" },
            h("thead", {}, h("tr", {}, ["Schedule", "Queue", "Cron", "Next fire", "Last fired", "Status"].map((c) => h("th", { scope: "col" }, c)))),
            h(
              "tbody",
              {},
              list.map((s) =>
                h(
                  "tr",
                  { "data-key": `schedule:${s.name}`, "data-schedule": s.name },
                  h("th", { scope: "row" }, s.name),
                  h("td", {}, h("a", { href: queueHref(s.queue) }, s.queue)),
                  h("td", {}, h("code", {}, s.cron), " ", h("span", { class: "muted" }, s.timezone)),
                  h("td", { "data-next": s.next_fire_at || "" }, time(s.next_fire_at, now)),
                  h("td", { "data-last": s.last_fired_at || "" }, time(s.last_fired_at, now)),
                  h("td", {}, pausedBadge(s.paused)),
                ),
              ),
            ),
          ),
        ),
  ];
}

export function errorView(e) {
  const hint =
    e.status === 403
      ? "This key may not see this. Use a key with the right role or queues."
      : e.status === 404
        ? "It may have been deleted, or pruned after its retention."
        : e.status === 0
          ? "Retrying every few seconds."
          : "";
  return [h("div", { class: "problem", role: "alert" }, h("h1", { tabindex: "-1" }, e.status ? `${e.status} ${e.code}` : "No answer"), h("p", {}, e.message), hint ? h("p", { class: "muted" }, hint) : null, h("p", {}, h("a", { href: "#/queues" }, "Back to the queues")))];
}
