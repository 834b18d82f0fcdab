//! `jobs`: list a queue's jobs a page at a time, and the bulk actions
//! (retry, cancel, delete) with their preview.

use runlease_client::Client;
use runlease_client::protocol::admin::{BulkActionName, BulkJobsRequest, ListJobsResponse, ListedJob};
use runlease_client::protocol::limits::MAX_LIST_LIMIT;
use runlease_client::protocol::{JobId, JobState, QueueName};

use crate::args::BulkArgs;
use crate::failure::{Failure, NOT_CONFIRMED};
use crate::output::{print_job_header, print_job_rows, print_json, when};
use crate::parse_id;

/// Most jobs a bulk preview reads when it must filter the listing itself
/// (by --id or --created-before); beyond, it says "at least".
const PREVIEW_SCAN: usize = 10_000;

fn state_list(states: &[JobState]) -> String {
    let names: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
    names.join(",")
}

fn action_name(action: BulkActionName) -> &'static str {
    match action {
        BulkActionName::Retry => "retry",
        BulkActionName::Cancel => "cancel",
        BulkActionName::Delete => "delete",
    }
}

/// The states `action` can change (its single-job rule), and the rule in words.
fn action_rule(action: BulkActionName) -> (&'static [JobState], &'static str) {
    match action {
        BulkActionName::Retry => (
            &[JobState::Failed, JobState::Cancelled],
            "retry changes only failed and cancelled jobs",
        ),
        BulkActionName::Cancel => (
            &[JobState::Queued, JobState::EnqueueFailed, JobState::Running],
            "cancel changes only queued, enqueue_failed and running jobs",
        ),
        BulkActionName::Delete => (
            &[JobState::Done, JobState::Failed, JobState::Cancelled],
            "delete changes only done, failed and cancelled jobs",
        ),
    }
}

/// How many jobs a bulk request matches now, and whether that count is
/// exact: the queue's figures when only states filter; otherwise the
/// listing, filtered here, read up to [`PREVIEW_SCAN`] jobs.
async fn count_matching(client: &Client, req: &BulkJobsRequest) -> Result<(u64, bool), Failure> {
    let queue = req.queue.as_str();
    if req.ids.is_none() && req.created_before.is_none() {
        let summary = client.queue(queue).await?;
        let n: i64 = req
            .states
            .iter()
            .map(|s| summary.counts.get(s.as_str()).copied().unwrap_or(0))
            .sum();
        return Ok((u64::try_from(n).unwrap_or(0), true));
    }
    let wanted: Option<std::collections::HashSet<JobId>> =
        req.ids.as_ref().map(|ids| ids.iter().copied().collect());
    let mut matched = 0u64;
    let mut read = 0usize;
    let mut cursor: Option<String> = None;
    loop {
        let page = client
            .list_jobs(queue, &req.states, Some(MAX_LIST_LIMIT), cursor.as_deref())
            .await?;
        read += page.jobs.len();
        matched += page
            .jobs
            .iter()
            .filter(|ListedJob(job)| {
                wanted.as_ref().is_none_or(|w| w.contains(&job.id))
                    && req.created_before.is_none_or(|t| job.created_at < t)
            })
            .count() as u64;
        if wanted.as_ref().is_some_and(|w| matched as usize >= w.len()) {
            return Ok((matched, true));
        }
        match page.next_cursor {
            None => return Ok((matched, true)),
            Some(_) if read >= PREVIEW_SCAN => return Ok((matched, false)),
            next => cursor = next,
        }
    }
}

/// A bulk action: without `--yes` only its preview (how many jobs match),
/// refused as `not_confirmed`.
pub async fn run_bulk(
    client: &Client,
    action: BulkActionName,
    args: BulkArgs,
    json: bool,
) -> Result<(), Failure> {
    let queue = QueueName::new(args.queue).map_err(|e| Failure::invalid(e.to_string()))?;
    let ids = args
        .ids
        .iter()
        .map(|id| parse_id(id))
        .collect::<Result<Vec<JobId>, Failure>>()?;
    let mut states = args.state;
    states.sort_unstable_by_key(|s| JobState::ALL.iter().position(|a| a == s));
    states.dedup();
    let req = BulkJobsRequest {
        action,
        queue,
        states,
        ids: (!ids.is_empty()).then_some(ids),
        created_before: args.created_before,
    };
    let name = action_name(action);
    let (changeable, rule) = action_rule(action);
    if !args.yes {
        let (n, exact) = count_matching(client, &req).await?;
        let plural = if req.states.len() == 1 { "" } else { "s" };
        let mut what = format!(
            "jobs of queue {} in state{plural} {}",
            req.queue,
            state_list(&req.states)
        );
        if let Some(t) = req.created_before {
            what.push_str(&format!(" created before {}", when(Some(t))));
        }
        if let Some(ids) = &req.ids {
            what.push_str(&format!(" among the {} ids given", ids.len()));
        }
        let count = if exact {
            format!("{n} match now")
        } else {
            format!("at least {n} match now (counted among the newest {PREVIEW_SCAN} in those states)")
        };
        let note = if req.states.iter().all(|s| changeable.contains(s)) {
            String::new()
        } else {
            format!(" ({rule})")
        };
        if json {
            // What was counted, for a script; the refusal follows on stderr.
            print_json(&serde_json::json!({"matched": n, "exact": exact, "changed": 0}))?;
        }
        return Err(Failure::new(
            NOT_CONFIRMED,
            format!("would {name} the {what}: {count}{note}; nothing changed, pass --yes to {name} them"),
        ));
    }
    let answer = client.bulk(&req).await?;
    if json {
        print_json(&answer)?
    } else if answer.changed < answer.matched {
        println!(
            "matched {}, changed {} (the other {} were left as they were: {rule})",
            answer.matched,
            answer.changed,
            answer.matched - answer.changed
        );
    } else {
        println!("matched {}, changed {}", answer.matched, answer.changed);
    }
    Ok(())
}

/// `jobs list`: one page, or every page with `all`.
pub async fn run_list(
    client: &Client,
    queue: String,
    states: Vec<JobState>,
    limit: Option<u32>,
    cursor: Option<String>,
    all: bool,
    json: bool,
) -> Result<(), Failure> {
    let limit = limit.or(all.then_some(MAX_LIST_LIMIT));
    let mut cursor = cursor;
    let mut every: Vec<ListedJob> = Vec::new();
    let mut first = true;
    loop {
        let page = client
            .list_jobs(&queue, &states, limit, cursor.as_deref())
            .await?;
        if !all {
            if json {
                print_json(&page)?;
                return Ok(());
            }
            print_job_header();
            print_job_rows(&page.jobs);
            match &page.next_cursor {
                Some(next) => {
                    let mut again = format!("runlease jobs list --queue {queue}");
                    if !states.is_empty() {
                        again.push_str(&format!(" --state {}", state_list(&states)));
                    }
                    if let Some(limit) = limit {
                        again.push_str(&format!(" --limit {limit}"));
                    }
                    eprintln!("more jobs: {again} --cursor {next}   (or --all)");
                }
                None if page.jobs.is_empty() => eprintln!("no matching jobs"),
                None => {}
            }
            return Ok(());
        }
        if json {
            every.extend(page.jobs);
        } else {
            if first {
                print_job_header();
            }
            print_job_rows(&page.jobs);
        }
        first = false;
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    if json {
        print_json(&ListJobsResponse {
            jobs: every,
            next_cursor: None,
        })?;
    }
    Ok(())
}
