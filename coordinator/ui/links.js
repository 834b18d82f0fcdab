// A job's place in its dependency graph, drawn as three columns: the jobs
// it waits on, the job itself, the jobs that wait on it. Every other job is
// a link to its own page with its state now, so the graph is walked one
// page at a time in either direction. Also the retry policy facts of a
// queue page.

import { h } from "./dom.js";
import * as fmt from "./format.js";

const DEPENDENTS_SHOWN_NOTE = "Only the oldest dependents are listed here.";

function node(link, badge) {
  if (!link.state) {
    return h("li", { class: "dep-node deleted", "data-job": link.id }, h("span", { class: "mono" }, fmt.shortId(link.id)), " ", h("span", { class: "badge deleted" }, "deleted"));
  }
  return h(
    "li",
    { class: "dep-node", "data-job": link.id, "data-state": link.state },
    h("a", { href: `#/jobs/${encodeURIComponent(link.id)}`, class: "mono" }, fmt.shortId(link.id)),
    " ",
    badge(link.state),
  );
}

function column(title, key, links, badge, empty) {
  return h(
    "div",
    { class: `dep-col dep-${key}` },
    h("h3", {}, `${title} (${links.length})`),
    links.length ? h("ul", { id: `dep-${key}` }, links.map((l) => node(l, badge))) : h("p", { class: "muted" }, empty),
  );
}

// The dependency panel of a job page; null for a job with neither
// dependencies nor dependents.
export function dependencyPanel(job, badge, maxDependentsShown) {
  const deps = job.dependencies || [];
  const dependents = job.dependents || [];
  if (!deps.length && !dependents.length) return null;
  const arrow = () => h("div", { class: "dep-arrow", "aria-hidden": "true" }, "→");
  const policy = job.on_dependency_failure === "run" ? "runs anyway" : "is cancelled";
  return h(
    "section",
    { class: "panel", "aria-labelledby": "deps-h", id: "dependencies" },
    h("h2", { id: "deps-h" }, "Dependencies"),
    deps.length
      ? h("p", { class: "muted" }, `Runs once every job it waits on is done; if one fails or is deleted, this job ${policy}.`)
      : null,
    h(
      "div",
      { class: "dep-graph" },
      column("Waits on", "on", deps, badge, "Nothing."),
      arrow(),
      h("div", { class: "dep-col dep-self" }, h("h3", {}, "This job"), h("ul", {}, h("li", { class: "dep-node self" }, h("span", { class: "mono" }, fmt.shortId(job.id)), " ", badge(job.state)))),
      arrow(),
      column("Needed by", "by", dependents, badge, "No job waits on it."),
    ),
    maxDependentsShown && dependents.length >= maxDependentsShown ? h("p", { class: "muted" }, DEPENDENTS_SHOWN_NOTE) : null,
  );
}

// The retry policy of a queue page: what a job enqueued without its own
// policy gets, field by field ("default": the coordinator's setting), and
// where a job that fails for good leaves its follow-up.
export function retryPolicy(settings, queueHref) {
  const s = settings || {};
  const b = s.backoff || {};
  const or = (v, show) => (v === null || v === undefined ? h("span", { class: "muted" }, "default") : show(v));
  const ms = (v) => fmt.duration(v);
  const fact = (label, value) => h("div", { class: "fact" }, h("dt", {}, label), h("dd", {}, value));
  return h(
    "section",
    { class: "panel retry-facts", id: "retry-policy", "aria-labelledby": "retry-policy-h" },
    h("h2", { id: "retry-policy-h" }, "Retry policy"),
    h(
      "dl",
      { class: "facts" },
      fact("Attempts", or(s.max_attempts, String)),
      fact("First delay", or(b.base_ms, ms)),
      fact("Longest delay", or(b.max_ms, ms)),
      fact("Growth", or(b.factor, (f) => `×${f}`)),
      fact("Jitter", or(b.jitter, (j) => `${Math.round(j * 100)}%`)),
      fact("Retry window", or(s.retry_window_ms, ms)),
      fact("Dead letters to", s.dead_letter_queue ? h("a", { href: queueHref(s.dead_letter_queue) }, s.dead_letter_queue) : h("span", { class: "muted" }, "none")),
    ),
  );
}
