//! `sdk/python`, the Python library (PyPI name `runlease`): its pytest suite
//! (the conformance scenarios in blocking and asyncio form, the producer, the
//! push adapters) against a live coordinator, `mypy --strict`, and the
//! packages `python -m build` makes, installed into an empty virtual
//! environment where README's quick start runs.
//!
//! The test environment is a virtual environment made from the package's own
//! metadata (`pip install ./sdk/python[test]`, so a dependency missing from
//! `pyproject.toml` fails), kept in `target/sdk-python-venv` and made again
//! from nothing when `pyproject.toml` changes (`scripts/sdk-python-venv.sh`);
//! the package itself is reinstalled from the working tree when its sources
//! change (not under another test starting a Python from it). A
//! dependency only the test extras bring in is caught by the last test: the
//! built packages, alone in an empty environment, run README's quick start.
//! Python 3.9+ with `venv` and PyPI must be reachable: without them these
//! tests fail, they never skip.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use runlease_tests::{TestCoordinator, TestDb};

const ADMIN_KEY: &str = "sdk-python-admin-key-0123456789";
const WORKER_KEY: &str = "sdk-python-worker-key-0123456789";
const PRODUCER_KEY: &str = "sdk-python-producer-key-0123456789";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn sdk_dir() -> PathBuf {
    let dir = repo().join("sdk/python");
    assert!(
        dir.join("pyproject.toml").exists(),
        "{} is missing",
        dir.display()
    );
    dir
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| repo().join("target"), PathBuf::from)
}

/// Runs a command, failing the test with its output when it fails.
fn run(cmd: &mut Command, what: &str) -> Output {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The test virtual environment's `bin/`, made (once per process) by
/// `scripts/sdk-python-venv.sh` from the package's metadata, as
/// `scripts/test` makes it beforehand.
pub(crate) fn venv_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let venv = target_dir().join("sdk-python-venv");
        run(
            Command::new("bash")
                .arg(repo().join("scripts/sdk-python-venv.sh"))
                .arg(&venv),
            "making the Python test environment from sdk/python's metadata (scripts/sdk-python-venv.sh)",
        );
        venv.join("bin")
    })
    .clone()
}

/// A coordinator as the conformance scenarios need it (3 s TTL, 1 s
/// heartbeats, the reaper loop on), with an admin, a worker and a producer key.
async fn coordinator(db: &TestDb) -> TestCoordinator {
    TestCoordinator::start_with(db, |cfg| {
        cfg.leases.ttl = Duration::from_millis(3_000);
        cfg.leases.heartbeat_interval = Duration::from_millis(1_000);
        cfg.leases.reaper_interval = Duration::from_millis(200);
        cfg.keys.api_keys = Some(format!(
            "admin:{ADMIN_KEY},worker:{WORKER_KEY},producer:{PRODUCER_KEY}"
        ));
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_library_passes_its_tests_and_the_conformance_scenarios_against_a_live_coordinator() {
    let bin = venv_bin();
    let db = TestDb::new().await;
    let c = coordinator(&db).await;
    let (url, sdk) = (c.api.base().to_owned(), sdk_dir());
    let out = tokio::task::spawn_blocking(move || {
        Command::new(bin.join("python"))
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
            .current_dir(&sdk)
            .env("RUNLEASE_URL", &url)
            .env("RUNLEASE_KEY", ADMIN_KEY)
            .env("RUNLEASE_WORKER_KEY", WORKER_KEY)
            .env("RUNLEASE_PRODUCER_KEY", PRODUCER_KEY)
            .stdin(Stdio::null())
            .output()
            .expect("the test environment's python")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "pytest failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(" passed"), "pytest ran no test:\n{stdout}");
    c.stop().await.unwrap();
}

#[test]
fn the_python_library_is_mypy_strict_clean() {
    let bin = venv_bin();
    run(
        Command::new(bin.join("mypy"))
            .args(["--strict", "src/runlease"])
            .current_dir(sdk_dir()),
        "mypy --strict src/runlease",
    );
}

/// The first ```python block after README's quick-start marker.
fn readme_quick_start(readme: &Path) -> String {
    let text = std::fs::read_to_string(readme).unwrap();
    let after = text
        .split("<!-- example: quickstart")
        .nth(1)
        .expect("README.md has no quick-start marker");
    let code = after
        .split("```python\n")
        .nth(1)
        .expect("no python block after the marker");
    code.split("\n```").next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn python_m_build_makes_packages_that_install_into_an_empty_venv_and_run_the_readme_example() {
    let bin = venv_bin();
    let work = tempfile::tempdir().unwrap();
    let dist = work.path().join("dist");
    run(
        Command::new(bin.join("python"))
            .args(["-m", "build", "--outdir"])
            .arg(&dist)
            .arg(sdk_dir()),
        "python -m build sdk/python",
    );
    let found = |ext: &str| {
        std::fs::read_dir(&dist)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.to_string_lossy().ends_with(ext))
            .unwrap_or_else(|| panic!("python -m build made no {ext}"))
    };
    let (wheel, sdist) = (found(".whl"), found(".tar.gz"));

    let db = TestDb::new().await;
    let c = coordinator(&db).await;
    let example = work.path().join("quickstart.py");
    std::fs::write(&example, readme_quick_start(&sdk_dir().join("README.md"))).unwrap();
    for (name, package) in [("wheel", &wheel), ("sdist", &sdist)] {
        let venv = work.path().join(format!("venv-{name}"));
        run(
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
            "python3 -m venv",
        );
        run(
            Command::new(venv.join("bin/python"))
                .args(["-m", "pip", "install", "--quiet"])
                .arg(package),
            &format!("pip install the {name} into an empty venv"),
        );
        let (python, url, example) = (venv.join("bin/python"), c.api.base().to_owned(), example.clone());
        let out = tokio::task::spawn_blocking(move || {
            run(
                Command::new(python)
                    .arg(&example)
                    .env("RUNLEASE_URL", url)
                    .env("RUNLEASE_KEY", ADMIN_KEY),
                "README's quick start",
            )
        })
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            stdout.trim(),
            "done {'greeting': 'hello, Ada'}",
            "README's quick start from the {name}"
        );
        // The package is typed: py.typed is installed.
        let typed = run(
            Command::new(venv.join("bin/python")).args([
                "-c",
                "import importlib.resources as r; print(r.files('runlease').joinpath('py.typed').is_file())",
            ]),
            "py.typed",
        );
        assert_eq!(String::from_utf8_lossy(&typed.stdout).trim(), "True", "{name}");
    }
    c.stop().await.unwrap();
}
