//! `schedules`: list, set, show and delete cron schedules.

use runlease_client::Client;
use runlease_client::protocol::QueueName;
use runlease_client::protocol::schedules::{ListSchedulesResponse, PutScheduleRequest};

use crate::args::SchedulesCommand;
use crate::failure::Failure;
use crate::output::{print_json, print_schedule, print_schedules};
use crate::read_payload;

/// `schedules` and its sub-verbs (`list` when none is given).
pub async fn run_schedules(
    client: &Client,
    command: Option<SchedulesCommand>,
    json: bool,
) -> Result<(), Failure> {
    match command {
        None | Some(SchedulesCommand::List) => {
            let schedules = client.schedules().await?;
            if json {
                print_json(&ListSchedulesResponse { schedules })?
            } else {
                print_schedules(&schedules);
                if schedules.is_empty() {
                    eprintln!("no schedules");
                }
            }
        }
        Some(SchedulesCommand::Set(args)) => {
            let queue = QueueName::new(args.queue).map_err(|e| Failure::invalid(e.to_string()))?;
            let payload = read_payload(
                args.payload,
                "pass --payload JSON or pipe the JSON on standard input",
            )?;
            let req = PutScheduleRequest {
                queue,
                cron: args.cron,
                timezone: args.timezone,
                payload,
                priority: args.priority,
                max_attempts: args.max_attempts,
                timeout_ms: args.timeout_ms,
                paused: args.paused.then_some(true),
            };
            let schedule = client.put_schedule(&args.name, &req).await?;
            if json {
                print_json(&schedule)?
            } else {
                print_schedule(&schedule)
            }
        }
        Some(SchedulesCommand::Show { name }) => {
            let schedule = client.schedule(&name).await?;
            if json {
                print_json(&schedule)?
            } else {
                print_schedule(&schedule)
            }
        }
        Some(SchedulesCommand::Delete { name }) => {
            let schedule = client.delete_schedule(&name).await?;
            if json {
                print_json(&schedule)?
            } else {
                println!("schedule {} deleted (the jobs it enqueued stay)", schedule.name);
            }
        }
    }
    Ok(())
}
