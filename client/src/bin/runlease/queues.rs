//! `queues`: every queue's figures, or one queue's figures and settings, and
//! the admin's changes to them (pause, resume, limits, retention, endpoint
//! and its signing secret).

use runlease_client::Client;
use runlease_client::protocol::admin::{EndpointSecretResponse, SetEndpoint, UpdateQueueRequest};

use crate::args::QueuesCommand;
use crate::failure::Failure;
use crate::output::{
    backoff_text, endpoint_text, limit_text, print_json, print_queue, print_queues, rate_text,
    retention_text, when,
};

/// `queues` and its sub-verbs (`list` when none is given).
pub async fn run_queues(client: &Client, command: Option<QueuesCommand>, json: bool) -> Result<(), Failure> {
    match command {
        None | Some(QueuesCommand::List) => {
            let queues = client.queues().await?;
            if json {
                print_json(&serde_json::json!({ "queues": queues }))?
            } else {
                print_queues(&queues)
            }
        }
        Some(QueuesCommand::Show { queue }) => {
            let summary = client.queue(&queue).await?;
            if json {
                print_json(&summary)?
            } else {
                print_queue(&summary)
            }
        }
        Some(QueuesCommand::Pause { queue }) => pause(client, &queue, true, json).await?,
        Some(QueuesCommand::Resume { queue }) => pause(client, &queue, false, json).await?,
        Some(QueuesCommand::Limit {
            queue,
            max_running,
            max_running_per_key,
            rate,
        }) => {
            if max_running.is_none() && max_running_per_key.is_none() && rate.is_none() {
                return Err(Failure::invalid(
                    "nothing to change: pass --max-running, --max-running-per-key or --rate (a value, or none to clear it)",
                ));
            }
            let change = UpdateQueueRequest {
                max_running: max_running.map(|v| v.0),
                max_running_per_key: max_running_per_key.map(|v| v.0),
                rate_limit: rate.map(|v| v.0),
                ..UpdateQueueRequest::default()
            };
            let summary = client.update_queue(&queue, &change).await?;
            if json {
                print_json(&summary)?
            } else {
                let set = &summary.settings;
                println!(
                    "queue {}: max_running {}, max_running_per_key {}, rate_limit {}",
                    summary.queue,
                    limit_text(set.max_running),
                    limit_text(set.max_running_per_key),
                    rate_text(set.rate_limit)
                );
            }
        }
        Some(QueuesCommand::Retention {
            queue,
            done_ms,
            failed_ms,
        }) => {
            if done_ms.is_none() && failed_ms.is_none() {
                return Err(Failure::invalid(
                    "nothing to change: pass --done-ms or --failed-ms (a number of ms, 0 for forever, or default)",
                ));
            }
            let change = UpdateQueueRequest {
                retention_done_ms: done_ms.map(|v| v.0),
                retention_failed_ms: failed_ms.map(|v| v.0),
                ..UpdateQueueRequest::default()
            };
            let summary = client.update_queue(&queue, &change).await?;
            if json {
                print_json(&summary)?
            } else {
                let set = &summary.settings;
                println!(
                    "queue {}: retention_done {}, retention_failed {}",
                    summary.queue,
                    retention_text(set.retention_done_ms),
                    retention_text(set.retention_failed_ms)
                );
            }
        }
        Some(QueuesCommand::Retry {
            queue,
            max_attempts,
            backoff,
            retry_window_ms,
            dead_letter_queue,
        }) => {
            let change = UpdateQueueRequest {
                max_attempts: max_attempts.map(|v| v.0),
                backoff: backoff.map(|v| v.0),
                retry_window_ms: retry_window_ms.map(|v| v.0),
                dead_letter_queue: dead_letter_queue.map(|v| v.0),
                ..UpdateQueueRequest::default()
            };
            if change == UpdateQueueRequest::default() {
                return Err(Failure::invalid(
                    "nothing to change: pass --max-attempts, --backoff, --retry-window-ms or --dead-letter-queue",
                ));
            }
            let summary = client.update_queue(&queue, &change).await?;
            if json {
                print_json(&summary)?
            } else {
                let set = &summary.settings;
                println!(
                    "queue {}: max_attempts {}, backoff {}, retry_window {}, dead_letter_queue {}",
                    summary.queue,
                    set.max_attempts.map_or("default".into(), |n| n.to_string()),
                    backoff_text(set.backoff.as_ref()),
                    set.retry_window_ms.map_or("none".into(), |ms| format!("{ms} ms")),
                    set.dead_letter_queue
                        .as_ref()
                        .map_or("none".into(), |q| q.to_string())
                );
            }
        }
        Some(QueuesCommand::SetEndpoint {
            queue,
            endpoint,
            timeout_ms,
            concurrency,
        }) => {
            let endpoint = SetEndpoint {
                url: endpoint,
                timeout_ms,
                concurrency,
            };
            set_endpoint(client, &queue, Some(endpoint), json).await?
        }
        Some(QueuesCommand::RemoveEndpoint { queue }) => set_endpoint(client, &queue, None, json).await?,
        Some(QueuesCommand::EndpointSecret { queue }) => {
            let secret = client.endpoint_secret(&queue).await?;
            print_secret(&secret, json, false)?
        }
        Some(QueuesCommand::RotateEndpointSecret { queue }) => {
            let secret = client.rotate_endpoint_secret(&queue).await?;
            print_secret(&secret, json, true)?
        }
    }
    Ok(())
}

/// Sets (`Some`) or removes (`None`) a queue's endpoint.
async fn set_endpoint(
    client: &Client,
    queue: &str,
    endpoint: Option<SetEndpoint>,
    json: bool,
) -> Result<(), Failure> {
    let change = UpdateQueueRequest {
        endpoint: Some(endpoint),
        ..UpdateQueueRequest::default()
    };
    let summary = client.update_queue(queue, &change).await?;
    if json {
        return print_json(&summary);
    }
    match &summary.endpoint {
        Some(e) => println!(
            "queue {}: served by {} (timeout {} ms, concurrency {}); `runlease queues endpoint-secret {}` prints its signing secret",
            summary.queue, e.url, e.timeout_ms, e.concurrency, summary.queue
        ),
        None => println!("queue {}: {}", summary.queue, endpoint_text(None)),
    }
    Ok(())
}

/// The secret alone on standard output (to pipe into the endpoint's
/// settings), what else to know on standard error; or the whole answer.
fn print_secret(secret: &EndpointSecretResponse, json: bool, rotated: bool) -> Result<(), Failure> {
    if json {
        return print_json(secret);
    }
    println!("{}", secret.secret);
    if secret.previous_secret.is_some() {
        let until = when(secret.previous_expires_at);
        if rotated {
            eprintln!(
                "a new secret: the previous one signs beside it until {until}; give the endpoint the new one before then"
            );
        } else {
            eprintln!("in rotation: the previous secret also signs until {until} (--json shows it)");
        }
    }
    Ok(())
}

/// Pauses (`paused`) or resumes a queue.
async fn pause(client: &Client, queue: &str, paused: bool, json: bool) -> Result<(), Failure> {
    let change = UpdateQueueRequest {
        paused: Some(Some(paused)),
        ..UpdateQueueRequest::default()
    };
    let summary = client.update_queue(queue, &change).await?;
    let queued = summary.counts.get("queued").copied().unwrap_or(0);
    if json {
        print_json(&summary)?
    } else if paused {
        println!(
            "queue {} paused: it takes enqueues and hands out no claims until `runlease queues resume {}` ({queued} queued)",
            summary.queue, summary.queue,
        );
    } else {
        println!(
            "queue {} resumed: claims get its jobs again ({queued} queued)",
            summary.queue
        );
    }
    Ok(())
}
