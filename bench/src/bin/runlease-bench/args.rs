//! The options of the comparison modes (`compare`, `open-loop`, `enqueue`)
//! and what they share: the builds named and the graphile-worker peer.

use std::path::PathBuf;

use clap::Args;
use clap::builder::RangedU64ValueParser;

use crate::{at_least_one, drain, graphile};

/// The peer: graphile-worker from `--graphile DIR` (default: the bench's
/// own `peers/graphile-worker`), unless `--no-graphile`.
#[derive(Args)]
pub struct PeerArgs {
    /// graphile-worker's directory (`peer.mjs`, `package-lock.json`); `npm
    /// ci` runs there first if its `node_modules` is missing.
    #[arg(long, value_name = "DIR")]
    pub graphile: Option<PathBuf>,
    /// Leave graphile-worker out.
    #[arg(long, conflicts_with = "graphile")]
    pub no_graphile: bool,
}

impl PeerArgs {
    pub fn dir(&self) -> Option<PathBuf> {
        (!self.no_graphile).then(|| self.graphile.clone().unwrap_or_else(graphile::default_dir))
    }
}

#[derive(Args)]
pub struct CompareArgs {
    /// `[NAME=]BINARY` of each coordinator build (default: this build's,
    /// beside the bench binary).
    #[arg(value_name = "[NAME=]BINARY", value_delimiter = ',')]
    pub builds: Vec<String>,
    #[command(flatten)]
    pub peer: PeerArgs,
    /// Preloaded jobs per drain, one size after another.
    #[arg(long, value_delimiter = ',', default_value = "20000,100000", value_parser = at_least_one())]
    pub jobs: Vec<usize>,
    /// HTTP worker counts (and graphile-worker concurrencies).
    #[arg(long, value_delimiter = ',', default_value = "16,256", value_parser = at_least_one())]
    pub workers: Vec<usize>,
    /// Leases each worker claims and finishes at once.
    #[arg(long, default_value_t = 8, value_parser = at_least_one())]
    pub concurrency: usize,
    /// Interleaved rounds; the table is their medians.
    #[arg(long, default_value_t = 3, value_parser = at_least_one())]
    pub repeat: usize,
}

#[derive(Args)]
pub struct OpenLoopArgs {
    /// `[NAME=]BINARY` of each coordinator build (default: this build's).
    #[arg(value_name = "[NAME=]BINARY", value_delimiter = ',')]
    pub builds: Vec<String>,
    #[command(flatten)]
    pub peer: PeerArgs,
    /// Offered rates (jobs/s), one run each.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000,10000", value_parser = at_least_one())]
    pub rates: Vec<usize>,
    /// Seconds of offer per run.
    #[arg(long, default_value_t = 60, value_parser = RangedU64ValueParser::<u64>::new().range(1..=3600))]
    pub seconds: u64,
    /// Outside workers (and graphile-worker's concurrent jobs).
    #[arg(long, default_value_t = 64, value_parser = at_least_one())]
    pub workers: usize,
    /// Leases each worker claims and finishes at once.
    #[arg(long, default_value_t = 8, value_parser = at_least_one())]
    pub concurrency: usize,
    /// Keep-alive HTTP connections for the enqueues (default: one per 100
    /// jobs/s offered, at least 8).
    #[arg(long, value_parser = at_least_one())]
    pub connections: Option<usize>,
    /// graphile-worker's PostgreSQL connections for its addJob calls
    /// (default 20, the coordinator's default database pool).
    #[arg(long, default_value_t = 20, value_parser = at_least_one())]
    pub graphile_connections: usize,
    /// Seconds after the last enqueue was due that the jobs have to run.
    #[arg(long, default_value_t = 30)]
    pub grace_s: u64,
    /// Interleaved rounds; every run is printed.
    #[arg(long, default_value_t = 1, value_parser = at_least_one())]
    pub repeat: usize,
}

#[derive(Args)]
pub struct EnqueueArgs {
    /// `[NAME=]BINARY` of each coordinator build (default: this build's).
    #[arg(value_name = "[NAME=]BINARY", value_delimiter = ',')]
    pub builds: Vec<String>,
    #[command(flatten)]
    pub peer: PeerArgs,
    /// Jobs per run, 1,000 per request.
    #[arg(long, default_value_t = 100_000, value_parser = at_least_one())]
    pub jobs: usize,
    /// Interleaved rounds; the table is their medians.
    #[arg(long, default_value_t = 3, value_parser = at_least_one())]
    pub repeat: usize,
}

/// The builds named (`[NAME=]BINARY`), or this build's coordinator.
pub fn builds(specs: &[String]) -> Vec<drain::Build> {
    let named: Vec<_> = specs
        .iter()
        .filter(|b| !b.is_empty())
        .map(|b| drain::Build::parse(b))
        .collect();
    if named.is_empty() {
        vec![drain::Build {
            name: "this build".to_owned(),
            binary: runlease_tests::process::coordinator_binary(),
        }]
    } else {
        named
    }
}

/// Options of `graph`.
#[derive(Args)]
pub struct GraphArgs {
    /// `[NAME=]BINARY` of the coordinator build (default: this build's,
    /// beside the bench binary).
    #[arg(value_name = "[NAME=]BINARY")]
    pub build: Option<String>,
    /// Jobs in the graph, and in the plain drain.
    #[arg(long, default_value_t = 10_000, value_parser = at_least_one())]
    pub jobs: usize,
    /// Merges, each waiting on its share of the leaves (at most 100 each).
    #[arg(long, default_value_t = 100, value_parser = at_least_one())]
    pub fan_in: usize,
    /// HTTP workers.
    #[arg(long, default_value_t = 256, value_parser = at_least_one())]
    pub workers: usize,
    /// Leases each worker claims and finishes at once.
    #[arg(long, default_value_t = 8)]
    pub concurrency: u32,
    /// Interleaved rounds; the report ends with their medians.
    #[arg(long, default_value_t = 1, value_parser = at_least_one())]
    pub repeat: usize,
}
