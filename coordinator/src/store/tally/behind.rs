//! [`Tallied::commit_behind`]: a transaction's last statements sent with
//! its deltas and its COMMIT, in one round trip, and the rules that keep
//! that safe: the last statements change no tally (the deltas are written
//! as they stand when they are sent), all of them are sent at their first
//! poll (so none can run after the COMMIT, outside the transaction), and
//! one that fails before it reached PostgreSQL makes the COMMIT a ROLLBACK.

use std::sync::atomic::Ordering;
use std::task::Poll;

use crate::store::StoreError;
use crate::store::tally::Tallied;

/// Statements of every kind may be sent.
pub(super) const OPEN: u8 = 0;
/// The deltas are taken and the last statements are being sent: one that
/// changes tallies is refused, and any failure rolls the transaction back.
const SENDING: u8 = 1;
/// The COMMIT (or ROLLBACK) is handed over: nothing more may be sent.
const CLOSED: u8 = 2;

impl Tallied<'_> {
    /// Ends the transaction with the statements `last` sends, in one
    /// round trip: `last` is polled once first, and everything it sends
    /// then (its statements prepared before) goes ahead of the deltas and
    /// the COMMIT, which PostgreSQL runs in that order. It may send only
    /// statements that change no tally ([`crate::store::tally::Changes::untallied`],
    /// [`Tallied::read`], [`Tallied::set`]), and only at that first poll:
    /// one that changes tallies, or one sent later, is refused without
    /// being sent. When a statement failed or was refused at that poll (a
    /// parameter that could not be encoded, say), the transaction is
    /// rolled back instead. A statement PostgreSQL refuses aborts the
    /// transaction, so its COMMIT rolls it back. Either way `last`'s error
    /// is answered; otherwise what it made, once the commit went through
    /// (or the commit's error). The transaction is over after it.
    ///
    /// `last` should answer rows as PostgreSQL sent them and leave reading
    /// them to the caller: an error `last` makes of rows comes after the
    /// COMMIT was sent, when the transaction may already stand.
    pub async fn commit_behind<T>(
        &self,
        last: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let delta = std::mem::take(&mut *self.lock());
        self.stage.store(SENDING, Ordering::Relaxed);
        let mut last = std::pin::pin!(last);
        let first = std::future::poll_fn(|cx| Poll::Ready(last.as_mut().poll(cx))).await;
        self.stage.store(CLOSED, Ordering::Relaxed);
        let failed = self.refused.load(Ordering::Relaxed) || matches!(first, Poll::Ready(Err(_)));
        let made = async {
            match first {
                Poll::Ready(made) => made,
                Poll::Pending => last.await,
            }
        };
        if failed {
            let (made, _) = tokio::join!(made, self.or_roll_back(Err::<(), _>(refusal())));
            return Err(made.err().unwrap_or_else(refusal));
        }
        let (made, committed) = tokio::join!(made, self.write_and_commit(delta, std::future::ready(())));
        let made = made?;
        committed?;
        Ok(made)
    }

    /// Whether a statement may be sent now: not once the COMMIT is handed
    /// over, nor one that changes tallies (`tallies`) once the deltas are.
    pub(super) fn may_send(&self, tallies: bool) -> Result<(), StoreError> {
        match self.stage.load(Ordering::Relaxed) {
            OPEN => Ok(()),
            SENDING if !tallies => Ok(()),
            SENDING => {
                self.refused.store(true, Ordering::Relaxed);
                Err(StoreError::Database(
                    "a statement that changes tallies was sent with the COMMIT".to_owned(),
                ))
            }
            _ => Err(StoreError::Database(
                "a statement was sent after its transaction's COMMIT".to_owned(),
            )),
        }
    }

    /// The outcome of sending a statement: an error while the last
    /// statements are being sent rolls the transaction back.
    pub(super) fn sent<T>(&self, outcome: Result<T, tokio_postgres::Error>) -> Result<T, StoreError> {
        if outcome.is_err() && self.stage.load(Ordering::Relaxed) == SENDING {
            self.refused.store(true, Ordering::Relaxed);
        }
        Ok(outcome?)
    }
}

/// The error answered when the last statements were refused and none of
/// them says why.
fn refusal() -> StoreError {
    StoreError::Database("the transaction's last statements were refused; it was rolled back".to_owned())
}
