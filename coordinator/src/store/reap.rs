//! The reaper's statement: expired leases taken back, and what that sets
//! off (dead-letter follow-ups, dependents), in one transaction.

use crate::store::retry::{self, DeadLetter};
use crate::store::rows::JobRow;
use crate::store::tally::{Open, Tallied};
use crate::store::{Store, StoreError, dependencies, ms, sql};

impl Store {
    /// Reaps up to `limit` expired leases; returns the jobs as the reaper
    /// left them, each with the dead-letter follow-up it enqueued, if any.
    /// The dependents of a job it failed or cancelled are settled in the
    /// same transaction.
    pub async fn reap(&self, limit: i64) -> Result<Vec<(JobRow, Option<DeadLetter>)>, StoreError> {
        let (rows, settled) = self
            .timed("reap", || async move {
                let client = self.conn().await?;
                let terms = self.lease_settings();
                let timeout = ms(terms.default_timeout);
                let tx = Tallied::new(&client);
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&limit, &timeout];
                let (begun, reaped) =
                    tokio::join!(tx.begin(Open::States), tx.query(&sql::LEASE_REAP, &params));
                let outcome = async {
                    let reaped = begun.and(reaped)?;
                    retry::enqueue_follow_ups(&tx, &reaped, terms.default_max_attempts).await?;
                    let rows = reaped
                        .iter()
                        .map(|row| Ok((JobRow::from_row(row)?, DeadLetter::from_row(row)?)))
                        .collect::<Result<Vec<_>, StoreError>>()?;
                    let ended = rows
                        .iter()
                        .filter(|(r, _)| r.state.is_terminal() && r.dependent_count > 0)
                        .map(|(r, _)| (r.id.0, dependencies::ended_as(r.state)))
                        .collect();
                    let settled = dependencies::settle(&tx, ended).await?;
                    Ok((rows, settled))
                }
                .await;
                tx.end(outcome).await
            })
            .await?;
        self.report_settled(settled);
        Ok(rows)
    }
}
