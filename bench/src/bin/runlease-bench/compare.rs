//! `compare`: drains of preloaded queues (`--jobs 20000,100000`) at
//! `--workers 16,256`, each coordinator build beside graphile-worker and
//! both PostgreSQL rooflines, as ratios, with the targets they are held to.
//!
//! Each round, for each size: the finite roofline (a preloaded backlog
//! drained by pgbench, `roofline::run`), the steady roofline (insert, claim,
//! complete in a loop, `Shape::Steady`), then for each worker count every
//! build's drain (`drain::drain`: its own process on a fresh database,
//! outside HTTP workers) and graphile-worker's (`graphile::drain`). The
//! ratios are taken round by round (each against the roofline or
//! graphile-worker run of the same round, minutes apart at most) and the
//! table shows their medians over `--repeat` rounds with their range.
//!
//! Targets: at every size, each build at 256 workers ≥ 1.0× graphile-worker
//! at 256 workers, and at 16 workers ≥ 0.6× the steady roofline.

use std::path::Path;

use crate::drain::{self, Build, paired};
use crate::roofline::{self, Shape};
use crate::stats::median;

/// Workers at which a build is held to graphile-worker.
const VS_GRAPHILE_AT: usize = 256;
/// Its target there.
const VS_GRAPHILE_TARGET: f64 = 1.0;
/// Workers at which a build is held to the steady roofline.
const VS_STEADY_AT: usize = 16;
/// Its target there.
const VS_STEADY_TARGET: f64 = 0.6;

/// One system's drains, round by round (jobs/s; NaN where a round failed).
struct Series {
    name: String,
    size: usize,
    /// `None` for the rooflines.
    workers: Option<usize>,
    per_round: Vec<f64>,
}

fn series<'a>(all: &'a mut Vec<Series>, name: &str, size: usize, workers: Option<usize>) -> &'a mut Series {
    let at = all
        .iter()
        .position(|s| s.name == name && s.size == size && s.workers == workers);
    match at {
        Some(i) => &mut all[i],
        None => {
            all.push(Series {
                name: name.to_owned(),
                size,
                workers,
                per_round: Vec::new(),
            });
            all.last_mut().expect("just pushed")
        }
    }
}

const STEADY: &str = "steady roofline (pgbench: insert 100, claim 100, complete 100)";
const FINITE: &str = "finite roofline (pgbench: preloaded, claim 100, complete 100)";
const GRAPHILE: &str = "graphile-worker 0.17";

/// Runs the rounds and prints the tables.
pub async fn report(
    builds: &[Build],
    graphile: Option<&Path>,
    sizes: &[usize],
    workers: &[usize],
    concurrency: usize,
    rounds: usize,
) -> anyhow::Result<()> {
    let concurrency = u32::try_from(concurrency)?;
    for b in builds {
        anyhow::ensure!(
            b.binary.exists(),
            "{}: no such binary {}",
            b.name,
            b.binary.display()
        );
    }
    if let Some(dir) = graphile {
        crate::graphile::ensure_installed(dir).await?;
    }
    let durability = roofline::durability().await?;
    let mut all: Vec<Series> = Vec::new();
    for round in 1..=rounds {
        for &size in sizes {
            for (name, shape) in [(FINITE, Shape::Finite), (STEADY, Shape::Steady)] {
                let r = roofline::run_shape(shape, size).await?;
                eprintln!("  round {round}, {size} jobs: {name}: {:.0} jobs/s", r.jobs_per_s);
                series(&mut all, name, size, None).per_round.push(r.jobs_per_s);
            }
            for &w in workers {
                for b in builds {
                    let d = drain::drain(b, w, size, concurrency, 1).await?;
                    eprintln!(
                        "  round {round}, {size} jobs: {}, {w} workers ({}): {:.0} jobs/s",
                        b.name, d.mode, d.jobs_per_s
                    );
                    series(&mut all, &b.name, size, Some(w))
                        .per_round
                        .push(d.jobs_per_s);
                }
                if let Some(dir) = graphile {
                    let d = crate::graphile::drain(dir, w, size).await?;
                    eprintln!(
                        "  round {round}, {size} jobs: {GRAPHILE}, {w} workers: {:.0} jobs/s",
                        d.jobs_per_s
                    );
                    series(&mut all, GRAPHILE, size, Some(w))
                        .per_round
                        .push(d.jobs_per_s);
                }
            }
        }
    }
    print_tables(
        &all,
        builds,
        graphile.is_some(),
        sizes,
        concurrency,
        rounds,
        &durability,
    );
    Ok(())
}

/// `m (lo–hi)` of a paired ratio, or `–`.
fn ratio_cell(base: Option<&Series>, this: &Series) -> String {
    base.and_then(|b| paired(&b.per_round, &this.per_round))
        .map_or_else(
            || "–".to_owned(),
            |(m, lo, hi)| format!("{m:.2} ({lo:.2}–{hi:.2})"),
        )
}

fn find<'a>(all: &'a [Series], name: &str, size: usize, workers: Option<usize>) -> Option<&'a Series> {
    all.iter()
        .find(|s| s.name == name && s.size == size && s.workers == workers)
}

fn print_tables(
    all: &[Series],
    builds: &[Build],
    with_graphile: bool,
    sizes: &[usize],
    concurrency: u32,
    rounds: usize,
    durability: &str,
) {
    println!(
        "runlease-bench compare: drains of preloaded queues; each coordinator build its own process on a fresh database (default settings), outside HTTP workers claiming up to {concurrency} and finishing them in one /v1/finish; graphile-worker 0.17 in its batched mode from its own Node process; rooflines by pgbench with 16 clients; {durability}; medians of {rounds} interleaved rounds, ratios taken round by round (median, range)\n"
    );
    println!(
        "| jobs | system | workers | drain jobs/s | × steady roofline | × finite roofline | × graphile-worker (same workers) | rounds (jobs/s) |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---|");
    for &size in sizes {
        let steady = find(all, STEADY, size, None);
        let finite = find(all, FINITE, size, None);
        for s in all.iter().filter(|s| s.size == size) {
            let vs_graphile = match s.workers {
                Some(w) if s.name != GRAPHILE => ratio_cell(find(all, GRAPHILE, size, Some(w)), s),
                _ => "–".to_owned(),
            };
            let rounds: Vec<String> = s.per_round.iter().map(|j| format!("{j:.0}")).collect();
            println!(
                "| {size} | {} | {} | {:.0} | {} | {} | {vs_graphile} | {} |",
                s.name,
                s.workers
                    .map_or_else(|| "16 clients".to_owned(), |w| w.to_string()),
                median(s.per_round.clone()),
                ratio_cell(steady, s),
                ratio_cell(finite, s),
                rounds.join(", ")
            );
        }
    }
    println!("\ntargets (issue #40), at every size\n");
    println!("| build | jobs | target | reads | met |");
    println!("|---|---:|---|---:|---|");
    for b in builds {
        for &size in sizes {
            let mut cells = Vec::new();
            if with_graphile {
                cells.push((
                    format!("≥ {VS_GRAPHILE_TARGET:.1}× graphile-worker at {VS_GRAPHILE_AT} workers"),
                    find(all, GRAPHILE, size, Some(VS_GRAPHILE_AT)),
                    find(all, &b.name, size, Some(VS_GRAPHILE_AT)),
                    VS_GRAPHILE_TARGET,
                ));
            }
            cells.push((
                format!("≥ {VS_STEADY_TARGET:.1}× the steady roofline at {VS_STEADY_AT} workers"),
                find(all, STEADY, size, None),
                find(all, &b.name, size, Some(VS_STEADY_AT)),
                VS_STEADY_TARGET,
            ));
            for (target, base, this, goal) in cells {
                let reads = this.and_then(|t| paired(&base?.per_round, &t.per_round));
                let (cell, met) = match reads {
                    Some((m, _, _)) => (format!("{m:.2}×"), if m >= goal { "yes" } else { "no" }),
                    None => ("not run".to_owned(), "–"),
                };
                println!("| {} | {size} | {target} | {cell} | {met} |", b.name);
            }
        }
    }
}
