//! The worker's finishing queue: outcomes of concurrent jobs are sent
//! together in `POST /v1/finish` requests (while one request is in flight the
//! next gathers), each outcome answered on its own. Finishing is idempotent per
//! lease, so the client retries a request whose answer was lost.
//!
//! An outcome may bring its job's slot: the request that carries it then
//! also claims a job for each such slot (a claim riding on the finish, made
//! by the coordinator once the outcomes are committed), so a busy worker
//! spends one request per cycle.

use std::sync::{Arc, Mutex};

use runlease_protocol::limits::MAX_LEASES_PER_REQUEST;
use runlease_protocol::worker::{ClaimRequest, FinishItem, FinishRequest, FinishResult, Lease};
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::client::Client;
use crate::error::{Error, Result};

struct Pending {
    item: FinishItem,
    slot: Option<OwnedSemaphorePermit>,
    reply: oneshot::Sender<Result<FinishResult>>,
}

/// Who claims on a finish request's back: makes the claim for the slots the
/// request's outcomes free, and starts the leases it brings.
pub(crate) trait ClaimRider: Send + Sync {
    /// The claim for `slots` slots; `None` when the worker claims no more.
    fn claim(&self, slots: usize) -> Option<ClaimRequest>;
    /// Starts `leases` (as many as `slots` at most; the other slots go back).
    fn start(&self, leases: Vec<Lease>, slots: Vec<OwnedSemaphorePermit>, sent: Instant, received: Instant);
}

/// Sends finishing outcomes in shared requests.
#[derive(Clone)]
pub struct FinishQueue {
    tx: mpsc::UnboundedSender<Pending>,
    rider: Arc<Mutex<Option<Arc<dyn ClaimRider>>>>,
}

impl FinishQueue {
    /// Starts the sender on `tracker`; it stops once `stop` fires and the
    /// queue is empty.
    pub fn spawn(client: Client, tracker: &TaskTracker, stop: CancellationToken) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Pending>();
        let rider: Arc<Mutex<Option<Arc<dyn ClaimRider>>>> = Arc::new(Mutex::new(None));
        let riding = rider.clone();
        tracker.spawn(async move {
            loop {
                let first = tokio::select! {
                    p = rx.recv() => match p { Some(p) => p, None => return },
                    () = stop.cancelled() => match rx.try_recv() { Ok(p) => p, Err(_) => return },
                };
                let mut batch = vec![first];
                // Jobs claimed together often end together: let the tasks
                // that are about to hand in their outcome do so (a few
                // scheduler turns, no timer), so they share this request.
                for _ in 0..4 {
                    while batch.len() < MAX_LEASES_PER_REQUEST {
                        match rx.try_recv() {
                            Ok(p) => batch.push(p),
                            Err(_) => break,
                        }
                    }
                    if batch.len() >= MAX_LEASES_PER_REQUEST {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                let mut items = Vec::with_capacity(batch.len());
                let mut replies = Vec::with_capacity(batch.len());
                let mut slots = Vec::new();
                for p in batch {
                    items.push(p.item);
                    replies.push(p.reply);
                    slots.extend(p.slot);
                }
                let rider = riding.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let claim = match &rider {
                    Some(rider) if !slots.is_empty() && !stop.is_cancelled() => rider.claim(slots.len()),
                    _ => None,
                };
                let claims = claim.is_some();
                let mut request = FinishRequest { items, claim };
                let sent = Instant::now();
                let answer = client.finish(&request).await;
                if matches!(answer, Err(Error::Invalid { .. })) && request.items.len() > 1 {
                    // One item the coordinator refuses must not take the
                    // others down: send each alone (without a claim; the
                    // slots go back to the claim loop), so only it fails.
                    drop(slots);
                    request.claim = None;
                    for (item, reply) in request.items.into_iter().zip(replies) {
                        let one = client
                            .finish(&FinishRequest {
                                items: vec![item],
                                claim: None,
                            })
                            .await;
                        let _ = reply.send(one.and_then(|mut a| {
                            a.items
                                .pop()
                                .ok_or_else(|| Error::Decode("finish answered no item".into()))
                        }));
                    }
                    continue;
                }
                match answer {
                    Ok(answer) if answer.items.len() == replies.len() => {
                        for (reply, result) in replies.into_iter().zip(answer.items) {
                            let _ = reply.send(Ok(result));
                        }
                        if let (true, Some(rider)) = (claims, rider) {
                            rider.start(answer.leases.unwrap_or_default(), slots, sent, Instant::now());
                        }
                    }
                    Ok(answer) => {
                        let e = Error::Decode(format!(
                            "finish answered {} items for {}",
                            answer.items.len(),
                            replies.len()
                        ));
                        for reply in replies {
                            let _ = reply.send(Err(e.clone()));
                        }
                    }
                    Err(e) => {
                        for reply in replies {
                            let _ = reply.send(Err(e.clone()));
                        }
                    }
                }
            }
        });
        Self { tx, rider }
    }

    /// Lets `rider` claim on the back of requests whose outcomes bring
    /// slots, until [`FinishQueue::stop_riding`].
    pub(crate) fn ride_claims(&self, rider: Arc<dyn ClaimRider>) {
        *self.rider.lock().unwrap_or_else(|p| p.into_inner()) = Some(rider);
    }

    /// No more claims ride on finishes (and the rider, which holds this
    /// queue, is let go).
    pub(crate) fn stop_riding(&self) {
        self.rider.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// Sends `item` with the next request; answers its own result. `slot`,
    /// the job's slot, is claimed again by that request when claims ride on
    /// finishes (and freed otherwise).
    pub async fn submit(&self, item: FinishItem, slot: Option<OwnedSemaphorePermit>) -> Result<FinishResult> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Pending { item, slot, reply })
            .map_err(|_| Error::Config("the worker's finishing queue has stopped".into()))?;
        answer
            .await
            .map_err(|_| Error::Config("the worker's finishing queue has stopped".into()))?
    }
}
