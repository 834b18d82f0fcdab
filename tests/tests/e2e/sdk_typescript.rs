//! `sdk/typescript`, the `runlease` npm package, against a live coordinator in
//! every runtime it claims: Node.js, Deno, Bun and workerd (the last three
//! from npm, pinned in its `package-lock.json`). Each runtime runs the shared
//! conformance scenarios of `sdk/conformance/` and the library's own tests;
//! a further test fails when the built package imports anything but its own
//! files (a Web-standard runtime has no Node.js modules), and another packs it
//! (`npm pack`), installs the tarball into an empty project and runs README's
//! quick start there.
//!
//! The package is built here as `scripts/test` builds it beforehand: `npm ci`
//! unless `node_modules` was installed from this very `package-lock.json`
//! (its copy there is the stamp), then `tsc` and the test bundles unless
//! they are newer than their inputs. Node.js 20
//! or later and npm must be on PATH: without them these tests fail, they
//! never skip.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use runlease_tests::{TestCoordinator, TestDb};

/// The admin key the tests run with (keys on, so the library's `Authorization` is exercised).
const ADMIN_KEY: &str = "sdk-typescript-admin-key-0123456789";

/// The package's directory.
fn sdk_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sdk/typescript");
    assert!(dir.join("package.json").exists(), "{} is missing", dir.display());
    dir
}

/// Runs `program args` in `dir`, failing the test with its output if it fails.
fn run(dir: &Path, program: &str, args: &[&str]) {
    runlease_tests::process::run_tool(
        dir,
        program,
        args,
        "(Node.js 20 or later and npm) to build sdk/typescript",
    );
}

/// `npm ci` when the stamp differs from `package-lock.json`, then the build
/// of the package and of its test bundles; once per test process, one
/// process at a time (a file lock beside the test binaries).
pub(crate) fn built() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = sdk_dir();
        let exe = std::env::current_exe().unwrap();
        let lock = File::create(exe.parent().unwrap().join("sdk_typescript.build.lock")).unwrap();
        lock.lock().unwrap();
        let lockfile = std::fs::read(dir.join("package-lock.json")).expect("package-lock.json is committed");
        let stamp = dir.join("node_modules/.runlease-package-lock.json");
        if std::fs::read(&stamp).ok().as_deref() != Some(lockfile.as_slice()) {
            run(&dir, "npm", &["ci", "--no-audit", "--no-fund"]);
            std::fs::write(&stamp, &lockfile).unwrap();
        }
        // Built again only when an input is newer than an output: another
        // test process may be running the example worker, which loads dist/.
        let inputs = [
            "src",
            "test",
            "package.json",
            "tsconfig.json",
            "node_modules/.runlease-package-lock.json",
        ]
        .iter()
        .map(|p| crate::typescript_worker::newest(&dir.join(p)))
        .max()
        .unwrap();
        let outputs = ["dist/index.js", "test-dist/main.mjs", "test-dist/workerd.mjs"]
            .iter()
            .map(|p| std::fs::metadata(dir.join(p)).and_then(|m| m.modified()).ok())
            .min()
            .flatten();
        if outputs.is_none_or(|at| at <= inputs) {
            run(&dir, "npm", &["run", "--silent", "build:test"]);
        }
        drop(lock);
        dir
    })
    .clone()
}

/// Starts a coordinator with the settings the conformance scenarios need
/// (TTL 3 s, heartbeats every second, the reaper every 200 ms) and an admin
/// key, runs `program args` in the package's directory with its URL and key,
/// and fails with the runner's report unless every scenario and test passed.
async fn run_suite(runtime: &str, program: &str, args: &[&str]) {
    let dir = built();
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.keys.api_keys = Some(format!("admin:{ADMIN_KEY}"));
        cfg.leases.ttl = Duration::from_millis(3_000);
        cfg.leases.heartbeat_interval = Duration::from_millis(1_000);
        cfg.leases.reaper_interval = Duration::from_millis(200);
    })
    .await;
    let program = if program.starts_with("node_modules/") {
        dir.join(program).to_string_lossy().into_owned()
    } else {
        program.to_owned()
    };
    let out = tokio::time::timeout(
        Duration::from_secs(180),
        tokio::process::Command::new(&program)
            .args(args)
            .current_dir(&dir)
            .env("RUNLEASE_URL", format!("http://{}", c.addr))
            .env("RUNLEASE_KEY", ADMIN_KEY)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("the {runtime} run of sdk/typescript's tests took over 180 s"))
    .unwrap_or_else(|e| panic!("{program} must be installed to run sdk/typescript's tests in {runtime} (npm ci in sdk/typescript): {e}"));
    let report = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{report}");
    assert!(
        out.status.success(),
        "sdk/typescript's tests failed in {runtime} ({}):\n{report}\n{stderr}",
        out.status
    );
    // The runner's last line sums up; a run that tested nothing is a failure.
    let summary: serde_json::Value =
        serde_json::from_str(report.trim().lines().last().unwrap_or("null")).unwrap_or_default();
    assert_eq!(summary["runtime"], runtime, "{report}");
    assert_eq!(summary["failed"], 0, "{report}");
    let scenarios = std::fs::read_dir(dir.join("../conformance/scenarios"))
        .unwrap()
        .count();
    let passed = report.lines().filter(|l| l.contains("\"ok\":true")).count();
    assert!(
        passed > scenarios,
        "{runtime}: {passed} passed lines, want every one of the {scenarios} scenarios and the library's tests:\n{report}"
    );
    c.stop().await.unwrap();
}

#[tokio::test]
async fn the_typescript_sdk_passes_the_conformance_suite_in_node() {
    run_suite("node", "node", &["test-dist/main.mjs"]).await;
}

#[tokio::test]
async fn the_typescript_sdk_passes_the_conformance_suite_in_deno() {
    run_suite(
        "deno",
        "node_modules/.bin/deno",
        &[
            "run",
            "--allow-net",
            "--allow-env",
            "--allow-read",
            "test-dist/main.mjs",
        ],
    )
    .await;
}

#[tokio::test]
async fn the_typescript_sdk_passes_the_conformance_suite_in_bun() {
    run_suite("bun", "node_modules/.bin/bun", &["test-dist/main.mjs"]).await;
}

#[tokio::test]
async fn the_typescript_sdk_passes_the_conformance_suite_in_workerd() {
    run_suite("workerd", "node", &["test/workerd-host.mjs"]).await;
}

#[test]
fn the_typescript_sdk_bundle_imports_only_its_own_files() {
    let dir = built();
    run(&dir, "node", &["test/no-imports.mjs"]);
    // The check itself refuses what a Web-standard runtime lacks.
    for (bad, why) in [
        (
            "import { readFile } from \"node:fs/promises\";\nexport const f = readFile;\n",
            "imports node:fs/promises",
        ),
        ("export { z } from \"zod\";\n", "imports zod"),
        ("export const b = Buffer.from(\"x\");\n", "uses a Node.js global"),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("index.js"), bad).unwrap();
        let out = std::process::Command::new("node")
            .arg("test/no-imports.mjs")
            .arg(tmp.path())
            .current_dir(&dir)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(why),
            "the check let `{bad}` through: {stderr}"
        );
    }
}

/// The first ```js block after README's quick-start marker.
fn readme_quick_start(readme: &Path) -> String {
    let text = std::fs::read_to_string(readme).unwrap();
    let after = text
        .split("<!-- example: quickstart")
        .nth(1)
        .expect("README.md has no quick-start marker");
    let code = after
        .split("```js\n")
        .nth(1)
        .expect("no js block after the marker");
    code.split("\n```").next().unwrap().to_owned()
}

#[tokio::test]
async fn npm_pack_makes_a_package_that_installs_into_an_empty_project_and_runs_the_readme_example() {
    let dir = built();
    let work = tempfile::tempdir().unwrap();
    // dist/ is built (under the build lock): pack it as it is, without
    // prepack's rebuild under the feet of the other tests.
    run(
        &dir,
        "npm",
        &[
            "pack",
            "--silent",
            "--ignore-scripts",
            "--pack-destination",
            work.path().to_str().unwrap(),
        ],
    );
    let tarball = std::fs::read_dir(work.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "tgz"))
        .expect("npm pack made no .tgz");
    let listing = std::process::Command::new("tar")
        .arg("tzf")
        .arg(&tarball)
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    for file in [
        "package/package.json",
        "package/README.md",
        "package/LICENSE",
        "package/CHANGELOG.md",
        "package/dist/index.js",
        "package/dist/index.d.ts",
    ] {
        assert!(
            listing.lines().any(|l| l == file),
            "{file} is not in the package:\n{listing}"
        );
    }
    assert!(
        !listing
            .lines()
            .any(|l| l.starts_with("package/src/") || l.starts_with("package/test")),
        "sources or tests are in the package:\n{listing}"
    );

    // An empty project: the package is its only dependency.
    let app = work.path().join("app");
    std::fs::create_dir(&app).unwrap();
    std::fs::write(
        app.join("package.json"),
        r#"{"name": "app", "private": true, "type": "module"}"#,
    )
    .unwrap();
    run(
        &app,
        "npm",
        &["install", "--no-audit", "--no-fund", tarball.to_str().unwrap()],
    );
    std::fs::write(
        app.join("quickstart.mjs"),
        readme_quick_start(&dir.join("README.md")),
    )
    .unwrap();
    // Its types resolve from the installed package (exports, .d.ts).
    std::fs::write(
        app.join("check.mts"),
        r#"import { Producer, Worker, type JobContext, type WorkerEvent } from "runlease";
const events: WorkerEvent[] = [];
const worker: Worker<{ name: string }> = new Worker({ url: "http://127.0.0.1:8080", queues: ["q"], onEvent: (e) => events.push(e), handler: (j: JobContext<{ name: string }>) => j.payload.name });
const job = await new Producer({ url: "http://127.0.0.1:8080" }).enqueue({ queue: "q", payload: { name: "Ada" } });
export const id: string = job.id + worker.workerId;
"#,
    )
    .unwrap();
    let tsc = dir.join("node_modules/.bin/tsc");
    run(
        &app,
        tsc.to_str().unwrap(),
        &[
            "--noEmit",
            "--strict",
            "--module",
            "nodenext",
            "--moduleResolution",
            "nodenext",
            "--target",
            "es2022",
            "--lib",
            "es2022,dom",
            "check.mts",
        ],
    );

    let db = TestDb::new().await;
    let c =
        TestCoordinator::start_with(&db, |cfg| cfg.keys.api_keys = Some(format!("admin:{ADMIN_KEY}"))).await;
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("node")
            .arg("quickstart.mjs")
            .current_dir(&app)
            .env("RUNLEASE_URL", format!("http://{}", c.addr))
            .env("RUNLEASE_KEY", ADMIN_KEY)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("README's quick start took over 60 s")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "README's quick start failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.trim(), r#"done {"greeting":"hello, Ada"}"#);
    c.stop().await.unwrap();
}
