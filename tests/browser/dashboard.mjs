// Drives the coordinator's dashboard (GET /ui) in headless Chromium for
// tests/tests/e2e/dashboard.rs, which starts the coordinator, prepares the
// jobs through the API, runs this script and checks the API afterwards.
//
//   node dashboard.mjs '<json plan>'
//
// The plan names the coordinator (`base`), the scenario (`admin`,
// `producer`, `open`, `endpoint`, `graph`), the keys, the figures the page must show and where
// screenshots go. The script fails (exit 1, the reason on stderr) when a
// step's condition is not met in time, when the page logs a console error
// or throws, when it requests anything not served by the coordinator, or
// when an answer is a 5xx. On success it prints one JSON line of what it
// measured.

import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";
import { join } from "node:path";

const plan = JSON.parse(process.argv[2] || "{}");
const STEP_TIMEOUT = 15_000;
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
// Without the background-networking flags Chromium calls home and logs
// refused connections.
const FLAGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--disable-dev-shm-usage",
];

const origin = new URL(plan.base).origin;
const problems = [];
const measured = {};
let allowedUnauthorized = false;

function fail(message) {
  throw new Error(message);
}

function check(condition, message) {
  if (!condition) fail(message);
}

/** Waits until `fn(arg)` is truthy in the page; the failure says `what`. */
async function until(page, what, fn, arg) {
  try {
    return await page.waitForFunction(fn, arg, { timeout: STEP_TIMEOUT, polling: 50 });
  } catch (e) {
    const hash = await page.evaluate(() => location.hash).catch(() => "?");
    const main = await page.evaluate(() => document.getElementById("main")?.innerText.slice(0, 600)).catch(() => "?");
    fail(`${what}: not seen within ${STEP_TIMEOUT} ms (at ${hash}; page says: ${main})`);
  }
}

function screenshotPath(name) {
  mkdirSync(plan.screenshots, { recursive: true });
  return join(plan.screenshots, `dashboard-${name}.png`);
}

async function shot(page, name) {
  // The last action's notice would cover part of the page.
  await page.evaluate(() => (document.getElementById("toast").hidden = true));
  await page.screenshot({ path: screenshotPath(name), fullPage: false, animations: "disabled" });
}

function watch(page, context) {
  page.on("console", (msg) => {
    if (msg.type() !== "error" && msg.type() !== "warning") return;
    const where = msg.location().url || "";
    if (allowedUnauthorized && msg.text().includes("401") && where.includes("/v1/whoami")) return;
    problems.push(`console ${msg.type()}: ${msg.text()} (${where})`);
  });
  page.on("pageerror", (e) => problems.push(`uncaught: ${e.message}`));
  page.on("response", (r) => {
    if (r.status() >= 500) problems.push(`${r.status()} from ${r.url()}`);
  });
  // Only the coordinator may be asked for anything.
  return context.route("**/*", (route) => {
    const url = route.request().url();
    if (new URL(url).origin === origin) return route.continue();
    problems.push(`request to something the coordinator does not serve: ${url}`);
    return route.abort();
  });
}

function checkProblems(where) {
  check(problems.length === 0, `${where}: ${problems.join("; ")}`);
}

async function openPage(browser, colorScheme) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 }, colorScheme, deviceScaleFactor: 1 });
  const page = await context.newPage();
  await watch(page, context);
  return { context, page };
}

/** Loads /ui, answers the key dialog with `key` and waits for the queues table. */
async function signIn(page, key) {
  const started = Date.now();
  await page.goto(`${plan.base}/ui`);
  await until(page, "the key dialog", () => document.getElementById("key-dialog").open);
  measured.key_dialog_ms = Date.now() - started;
  await page.fill("#key-input", key);
  await page.press("#key-input", "Enter");
  await until(page, "the queues page after the key", () => document.querySelector("#main[data-view=queues] h1") && !document.getElementById("key-dialog").open);
}

/** The figures of every expected queue, as the queues table shows them. */
async function checkQueueCounts(page) {
  for (const [queue, counts] of Object.entries(plan.queues)) {
    for (const [state, n] of Object.entries(counts)) {
      await until(
        page,
        `queue ${queue} showing ${n} ${state}`,
        ([q, s, n]) => {
          const row = [...document.querySelectorAll("#queues tbody tr")].find((r) => r.getAttribute("data-queue") === q);
          const cell = row && row.querySelector(`td[data-count="${s}"]`);
          return cell && cell.getAttribute("data-value") === String(n) && cell.querySelector(".num").textContent === String(n);
        },
        [queue, state, n],
      );
    }
  }
}

/** The page's own load: its HTML, style sheet and modules, parsed and run. */
function navigationTiming(page) {
  return page.evaluate(() => {
    const n = performance.getEntriesByType("navigation")[0];
    const files = performance.getEntriesByType("resource").filter((r) => r.name.includes("/ui/"));
    return {
      dom_content_loaded_ms: Math.round(n.domContentLoadedEventEnd),
      load_ms: Math.round(n.loadEventEnd),
      files: files.length + 1,
      transferred_bytes: n.transferSize + files.reduce((a, r) => a + r.transferSize, 0),
      // Waiting for the coordinator, against the browser's own work.
      network_ms: Math.round(Math.max(n.responseEnd, ...files.map((r) => r.responseEnd)) - n.startTime),
    };
  });
}

async function confirmDialog(page, expectText) {
  await until(page, "the confirmation", () => document.getElementById("confirm").open);
  const text = await page.locator("#confirm").innerText();
  for (const t of expectText) check(text.includes(t), `the confirmation should say ${JSON.stringify(t)}; it says ${JSON.stringify(text)}`);
  await page.click("#confirm-ok");
  await until(page, "the confirmation closed", () => !document.getElementById("confirm").open);
  return text;
}

async function admin(browser) {
  const { context, page } = await openPage(browser, "light");

  // A wrong key gets a clear message (the page's one expected 401).
  allowedUnauthorized = true;
  await page.goto(`${plan.base}/ui`);
  await until(page, "the key dialog", () => document.getElementById("key-dialog").open);
  await page.fill("#key-input", plan.wrong_key);
  await page.press("#key-input", "Enter");
  await until(page, "the message for a wrong key", () => {
    const m = document.getElementById("key-message");
    return document.getElementById("key-dialog").open && !m.hidden && m.textContent.includes("unknown API key");
  });
  measured.wrong_key_message = await page.locator("#key-message").innerText();
  await page.fill("#key-input", plan.admin_key);
  await page.press("#key-input", "Enter");
  await until(page, "the queues page", () => document.querySelector("#main[data-view=queues] #queues"));
  allowedUnauthorized = false;
  check(
    (await page.evaluate(() => sessionStorage.getItem("runlease.key"))) === plan.admin_key,
    "the key lives in session storage",
  );
  check((await page.evaluate(() => localStorage.length)) === 0, "nothing is kept in local storage");

  // The queues page, with the figures the API holds.
  await checkQueueCounts(page);
  measured.queues_checked = Object.keys(plan.queues).length;
  await shot(page, "queues");

  // A fresh load, timed: page, modules and the first figures.
  const t0 = Date.now();
  await page.reload();
  await until(page, "the queues table after a reload", () => document.querySelector("#queues tbody tr"));
  measured.reload_to_figures_ms = Date.now() - t0;
  measured.navigation = await navigationTiming(page);

  // Keyboard: from the page's heading (focused on each view), Tab reaches
  // the actions, Enter opens the confirmation and Escape dismisses it.
  check((await page.evaluate(() => document.activeElement.tagName)) === "H1", "a view's heading has the focus");
  let reached = false;
  for (let i = 0; i < 40 && !reached; i++) {
    await page.keyboard.press("Tab");
    reached = await page.evaluate(
      (q) => document.activeElement.getAttribute("data-action") === "pause" && document.activeElement.getAttribute("data-queue") === q,
      plan.pause_queue,
    );
  }
  check(reached, `Tab reaches the Pause button of ${plan.pause_queue}`);
  await page.keyboard.press("Enter");
  await until(page, "the pause confirmation from the keyboard", () => document.getElementById("confirm").open);
  await page.keyboard.press("Escape");
  await until(page, "the confirmation dismissed with Escape", () => !document.getElementById("confirm").open);

  // A failed job: its attempts, who held each lease and how it ended.
  const f = plan.failed_job;
  await page.goto(`${plan.base}/ui#/jobs/${f.id}`);
  await until(page, "the failed job", (id) => document.querySelector("#main[data-view=job] [data-state=failed]") && document.body.innerText.includes(id), f.id);
  await until(page, `${f.attempts.length} attempts`, (n) => document.querySelectorAll("#attempts li").length === n, f.attempts.length);
  const attempts = await page.$$eval("#attempts li", (lis) => lis.map((li) => ({ outcome: li.getAttribute("data-outcome"), text: li.innerText })));
  f.attempts.forEach((a, i) => {
    check(attempts[i].outcome === a.outcome, `attempt ${i + 1} ended ${a.outcome}, the page says ${attempts[i].outcome}`);
    check(attempts[i].text.includes(a.worker_id), `attempt ${i + 1} was held by ${a.worker_id}: ${attempts[i].text}`);
    if (a.error) check(attempts[i].text.includes(a.error), `attempt ${i + 1} shows its error ${a.error}`);
  });
  check((await page.locator("[data-block=error]").innerText()).includes(f.error), "the job's error is shown");
  check((await page.locator("[data-block=payload]").innerText()).includes(f.payload_text), "the payload is shown");
  check(await page.locator(".timeline .bar").count() === f.attempts.length, "one bar per attempt in the timeline");
  await shot(page, "job");

  // Retry it from the page.
  await page.click("button[data-action=retry]");
  measured.retry_confirmation = await confirmDialog(page, ["1 job", f.id]);
  await until(page, "the retried job queued", () => document.querySelector("#main h1 ~ [data-state=queued], #main .title [data-state=queued]"));

  // The failed set of a queue: 200 retried at once, after a confirmation with the count.
  const b = plan.bulk;
  await page.goto(`${plan.base}/ui#/queues/${encodeURIComponent(b.queue)}?state=failed`);
  await until(page, `${b.count} failed jobs to retry`, (n) => {
    const btn = document.querySelector("button[data-action=bulk-retry]");
    return btn && !btn.disabled && btn.getAttribute("data-count") === String(n) && btn.textContent.includes(String(n));
  }, b.count);
  await until(page, "a page of failed jobs", () => document.querySelectorAll("#jobs tbody tr").length === 50);
  check(await page.locator("#jobs [data-state]:not([data-state=failed])").count() === 0, "the filter shows failed jobs only");
  await shot(page, "jobs");

  // Refreshes keep the filter, the scroll position and the very rows.
  await page.evaluate(() => {
    window.scrollTo(0, document.body.scrollHeight);
    document.querySelector("#jobs tbody tr").__kept = true;
  });
  const scrollY = await page.evaluate(() => window.scrollY);
  check(scrollY > 0, "the jobs page is long enough to scroll");
  const first = await page.locator("#updated").innerText();
  await until(page, "a refresh", (t) => document.getElementById("updated").textContent !== t, first);
  const second = await page.locator("#updated").innerText();
  await until(page, "another refresh", (t) => document.getElementById("updated").textContent !== t, second);
  const kept = await page.evaluate(() => ({
    y: window.scrollY,
    hash: location.hash,
    row: document.querySelector("#jobs tbody tr").__kept === true,
  }));
  check(kept.y === scrollY, `the scroll position survives a refresh (${scrollY} then ${kept.y})`);
  check(kept.hash.endsWith("?state=failed"), `the filter survives a refresh (${kept.hash})`);
  check(kept.row, "a refresh patches the rows in place instead of redrawing them");
  // The next page, by the listing's cursor.
  await page.click("[data-pager=next]");
  await until(page, "the second page", () => location.hash.includes("cursor=") && document.querySelectorAll("#jobs tbody tr").length === 50);

  await page.goto(`${plan.base}/ui#/queues/${encodeURIComponent(b.queue)}?state=failed`);
  await until(page, "the bulk button", () => document.querySelector("button[data-action=bulk-retry]:not([disabled])"));
  await page.click("button[data-action=bulk-retry]");
  measured.bulk_confirmation = await confirmDialog(page, [`Retry ${b.count} jobs`, `${b.count} jobs of ${b.queue}`]);
  await until(page, "the bulk answer", (n) => document.getElementById("toast").textContent.includes(`Retried ${n} jobs (${n} matched)`), b.count);
  await until(page, "no failed job left in the filter", () => document.querySelector("#main .empty"));

  // Pause a queue from the queues page.
  await page.goto(`${plan.base}/ui#/queues`);
  const pause = `#queues tr[data-queue="${plan.pause_queue}"] button[data-action=pause]`;
  await until(page, "the pause button", (sel) => document.querySelector(sel), pause);
  await page.click(pause);
  await confirmDialog(page, [`Pause ${plan.pause_queue}?`, `${plan.queues[plan.pause_queue].queued} queued jobs wait`]);
  await until(page, "the queue shown paused", (q) => document.querySelector(`#queues tr[data-queue="${q}"] [data-status=paused]`), plan.pause_queue);

  // Pause and resume another queue from its own page (resume asks nothing).
  await page.goto(`${plan.base}/ui#/queues/${encodeURIComponent(plan.resume_queue)}`);
  await until(page, "the queue's pause button", () => document.querySelector("#main[data-view=queue] .title button[data-action=pause]"));
  await page.click(".title button[data-action=pause]");
  await confirmDialog(page, [`Pause ${plan.resume_queue}?`]);
  await until(page, "the queue's page shown paused", () => document.querySelector(".title [data-status=paused]"));
  await page.click(".title button[data-action=resume]");
  await until(page, "the queue's page shown active again", () => document.querySelector(".title [data-status=active]"));

  // Schedules, with their next and last fire.
  await page.goto(`${plan.base}/ui#/schedules`);
  await until(page, `schedule ${plan.schedule}`, (s) => {
    const row = document.querySelector(`#schedules tr[data-schedule="${s}"]`);
    return row && row.querySelector("[data-next]").getAttribute("data-next") !== "" && row.innerText.includes("in ");
  }, plan.schedule);
  await shot(page, "schedules");

  // Dark, following the system setting.
  await page.emulateMedia({ colorScheme: "dark" });
  const dark = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
  check(dark === "rgb(17, 20, 24)", `the dark palette follows prefers-color-scheme (background ${dark})`);
  await page.goto(`${plan.base}/ui#/queues`);
  await until(page, "the queues page, dark", () => document.querySelector("#queues tbody tr"));
  await shot(page, "queues-dark");
  await page.goto(`${plan.base}/ui#/jobs/${f.id}`);
  await until(page, "the job page, dark", () => document.querySelectorAll("#attempts li").length > 0);
  await shot(page, "job-dark");
  await page.emulateMedia({ colorScheme: "light" });

  // A phone-width window: nothing wider than the screen but the tables' own scroll.
  await page.setViewportSize({ width: 390, height: 844 });
  await page.goto(`${plan.base}/ui#/queues`);
  await until(page, "the queues page at 390 px", () => document.querySelector("#queues tbody tr"));
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  const wide = await page.evaluate(() =>
    [...document.querySelectorAll("body *")]
      .filter((el) => el.getBoundingClientRect().right > window.innerWidth + 1 && !el.closest(".table-wrap table"))
      .slice(0, 5)
      .map((el) => `${el.tagName.toLowerCase()}.${el.className} ${Math.round(el.getBoundingClientRect().right)} px`),
  );
  check(overflow <= 0, `the page fits a 390 px window (${overflow} px too wide: ${wide.join(", ")})`);
  await shot(page, "queues-phone");

  checkProblems("admin");
  await context.close();
}

async function producer(browser) {
  const { context, page } = await openPage(browser, "light");
  await signIn(page, plan.producer_key);
  await checkQueueCounts(page);
  check(await page.locator("#banner").isVisible(), "a read-only banner for the producer key");
  check((await page.locator("#who").innerText()).includes("read-only"), "the header says the key is read-only");
  const pauses = page.locator("#queues button[data-action=pause]");
  check((await pauses.count()) > 0, "pause buttons are there");
  for (const b of await pauses.all()) check(await b.isDisabled(), "a producer key cannot pause");

  const f = plan.failed_job;
  await page.goto(`${plan.base}/ui#/jobs/${f.id}`);
  await until(page, "the failed job for the producer", () => document.querySelector("#main[data-view=job] [data-state=failed]"));
  const retry = page.locator("button[data-action=retry]");
  check(await retry.isDisabled(), "a producer key cannot retry");
  check((await retry.getAttribute("title")).includes("admin key"), "the disabled retry says why");
  measured.producer_retry_disabled = true;

  const b = plan.bulk;
  await page.goto(`${plan.base}/ui#/queues/${encodeURIComponent(b.queue)}?state=failed`);
  await until(page, "the failed jobs for the producer", () => document.querySelectorAll("#jobs tbody tr").length > 0);
  check(await page.locator("button[data-action=bulk-retry]").isDisabled(), "a producer key cannot bulk-retry");
  check(await page.locator("button[data-action=bulk-delete]").isDisabled(), "a producer key cannot bulk-delete");
  checkProblems("producer");
  await context.close();
}

async function open(browser) {
  const { context, page } = await openPage(browser, "light");
  let t0 = Date.now();
  await page.goto(`${plan.base}/ui`);
  await until(page, "the queues page without a key", () => document.querySelector("#queues tbody tr"));
  // The first load also starts the browser's renderer: timed apart.
  measured.first_load_to_figures_ms = Date.now() - t0;
  t0 = Date.now();
  await page.reload();
  await until(page, "the queues page after a reload", () => document.querySelector("#queues tbody tr"));
  measured.reload_to_figures_ms = Date.now() - t0;
  measured.navigation = await navigationTiming(page);
  check(!(await page.evaluate(() => document.getElementById("key-dialog").open)), "no key is asked for");
  check((await page.locator("#who").innerText()).includes("no keys"), "the header says the coordinator is open");
  await checkQueueCounts(page);
  checkProblems("open");
  await context.close();
}

/**
 * Queues served by endpoints (no keys): the queues table shows each one's
 * health and requests in flight, a pull-only queue a dash; a queue's page
 * shows its endpoint's URL, health, in flight, time-out and last error.
 * `plan.endpoints`: {queue: {url, healthy, in_flight, concurrency, last_error}}
 * (last_error: a piece of it, or null), `plan.pull_queue`.
 */
async function endpoint(browser) {
  const { context, page } = await openPage(browser, "light");
  await page.goto(`${plan.base}/ui`);
  await until(page, "the queues page", () => document.querySelector("#queues tbody tr"));
  await until(page, "an Endpoint column", () => [...document.querySelectorAll("#queues thead th")].some((th) => th.textContent === "Endpoint"));
  for (const [queue, e] of Object.entries(plan.endpoints)) {
    await until(
      page,
      `queue ${queue}: endpoint ${e.healthy ? "healthy" : "unhealthy"}, ${e.in_flight}/${e.concurrency} in flight`,
      ([q, e]) => {
        const row = [...document.querySelectorAll("#queues tbody tr")].find((r) => r.getAttribute("data-queue") === q);
        const cell = row && row.querySelector("td.endpoint");
        if (!cell || cell.getAttribute("data-endpoint") !== e.url) return false;
        const health = cell.querySelector("[data-endpoint-health]");
        return (
          health.getAttribute("data-endpoint-health") === (e.healthy ? "healthy" : "unhealthy") &&
          health.textContent.includes(e.healthy ? "Healthy" : "Unhealthy") &&
          cell.textContent.includes(`${e.in_flight}/${e.concurrency} in flight`) &&
          (e.last_error === null || cell.title.includes(e.last_error))
        );
      },
      [queue, e],
    );
  }
  const pull = page.locator(`#queues tbody tr[data-queue="${plan.pull_queue}"] td.endpoint`);
  check((await pull.getAttribute("data-endpoint")) === "none", "a pull-only queue has no endpoint");
  await shot(page, "endpoints");

  for (const [queue, e] of Object.entries(plan.endpoints)) {
    await page.goto(`${plan.base}/ui#/queues/${encodeURIComponent(queue)}`);
    await until(
      page,
      `the endpoint facts of ${queue}`,
      ([q, e]) => {
        const section = document.querySelector("#main[data-view=queue] section.endpoint-facts");
        if (!section || document.querySelector("#main h1")?.textContent !== q) return false;
        const text = section.innerText;
        const error = section.querySelector("[data-endpoint-last-error]").textContent;
        return (
          section.querySelector("[data-endpoint-url]").textContent === e.url &&
          section.querySelector("[data-endpoint-health]").getAttribute("data-endpoint-health") === (e.healthy ? "healthy" : "unhealthy") &&
          text.includes(`${e.in_flight} of ${e.concurrency}`) &&
          (e.last_error === null ? error === "–" : error.includes(e.last_error))
        );
      },
      [queue, e],
    );
    if (!e.healthy) await shot(page, "endpoint-unhealthy");
  }
  await page.goto(`${plan.base}/ui#/queues/${encodeURIComponent(plan.pull_queue)}`);
  await until(page, "the pull-only queue's page", ([q]) => document.querySelector("#main[data-view=queue] h1")?.textContent === q, [plan.pull_queue]);
  check((await page.locator("section.endpoint-facts").count()) === 0, "a pull-only queue shows no endpoint");
  measured.endpoints_checked = Object.keys(plan.endpoints).length;
  checkProblems("endpoint");
  await context.close();
}

/**
 * A job's dependency graph: the job page lists the jobs it waits on and the
 * jobs waiting on it, each with its state now and a link to its page; a
 * dependency's page links back. The queue page counts blocked jobs and shows
 * the queue's retry policy. `plan.graph`: {job, dependencies: [{id, state}],
 * dependents: [{id, state}]}; `plan.queue`, `plan.blocked`, `plan.policy`
 * (pieces of text the retry policy facts must hold).
 */
async function graph(browser) {
  const { context, page } = await openPage(browser, "light");
  const g = plan.graph;
  const listed = ([sel, links]) => {
    const items = [...document.querySelectorAll(`${sel} li.dep-node`)];
    return (
      items.length === links.length &&
      links.every((l) => items.some((li) => li.getAttribute("data-job") === l.id && li.getAttribute("data-state") === l.state && li.querySelector("a")?.getAttribute("href") === `#/jobs/${l.id}`))
    );
  };
  await page.goto(`${plan.base}/ui#/jobs/${g.job}`);
  await until(page, "the job's dependencies with their states", listed, ["#dep-on", g.dependencies]);
  await until(page, "the job's dependents with their states", listed, ["#dep-by", g.dependents]);
  await shot(page, "dependencies");
  // Follow a dependency: its page names this job among its dependents.
  const first = g.dependencies[0].id;
  await page.click(`#dep-on li[data-job="${first}"] a`);
  await until(page, "the dependency's page links back", ([id]) => !!document.querySelector(`#dep-by li[data-job="${id}"] a[href="#/jobs/${id}"]`), [g.job]);
  // And a dependent's page names it among its dependencies.
  await page.goto(`${plan.base}/ui#/jobs/${g.dependents[0].id}`);
  await until(page, "the dependent's page links back", ([id]) => !!document.querySelector(`#dep-on li[data-job="${id}"] a`), [g.job]);
  // The queue page: blocked jobs have a filter of their own, and the retry policy is shown.
  await page.goto(`${plan.base}/ui#/queues/${encodeURIComponent(plan.queue)}`);
  await until(page, `${plan.blocked} blocked on the queue page`, ([n]) => document.querySelector('.chips [data-filter="blocked"] .chip-n')?.textContent === String(n), [plan.blocked]);
  await until(page, "the retry policy", ([pieces]) => {
    const facts = document.querySelector("#retry-policy");
    return facts && pieces.every((p) => facts.innerText.includes(p));
  }, [plan.policy]);
  await shot(page, "retry-policy");
  measured.dependencies_checked = g.dependencies.length + g.dependents.length;
  checkProblems("graph");
  await context.close();
}

const browser = await chromium.launch({ executablePath: CHROMIUM, args: FLAGS, headless: true });
try {
  const scenarios = { admin, producer, open, endpoint, graph };
  const run = scenarios[plan.scenario];
  check(run, `unknown scenario ${plan.scenario}`);
  await run(browser);
  console.log(JSON.stringify({ ok: true, scenario: plan.scenario, ...measured }));
} catch (e) {
  console.error(`dashboard ${plan.scenario}: ${e.message}`);
  process.exitCode = 1;
} finally {
  await browser.close();
}
