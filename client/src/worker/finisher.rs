//! The worker's finishing queue: outcomes of concurrent jobs are sent
//! together in `POST /v1/finish` requests (while one request is in flight the
//! next gathers), each outcome answered on its own. Finishing is idempotent per
//! lease, so the client retries a request whose answer was lost.

use runlease_protocol::limits::MAX_LEASES_PER_REQUEST;
use runlease_protocol::worker::{FinishItem, FinishRequest, FinishResult};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::client::Client;
use crate::error::{Error, Result};

type Pending = (FinishItem, oneshot::Sender<Result<FinishResult>>);

/// Sends finishing outcomes in shared requests.
#[derive(Clone)]
pub struct FinishQueue {
    tx: mpsc::UnboundedSender<Pending>,
}

impl FinishQueue {
    /// Starts the sender on `tracker`; it stops once `stop` fires and the
    /// queue is empty.
    pub fn spawn(client: Client, tracker: &TaskTracker, stop: CancellationToken) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Pending>();
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
                let (items, replies): (Vec<FinishItem>, Vec<_>) = batch.into_iter().unzip();
                let request = FinishRequest { items };
                let answer = client.finish(&request).await;
                if matches!(answer, Err(Error::Invalid { .. })) && request.items.len() > 1 {
                    // One item the coordinator refuses must not take the
                    // others down: send each alone, so only it fails.
                    for (item, reply) in request.items.into_iter().zip(replies) {
                        let one = client.finish(&FinishRequest { items: vec![item] }).await;
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
        Self { tx }
    }

    /// Sends `item` with the next request; answers its own result.
    pub async fn submit(&self, item: FinishItem) -> Result<FinishResult> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((item, reply))
            .map_err(|_| Error::Config("the worker's finishing queue has stopped".into()))?;
        answer
            .await
            .map_err(|_| Error::Config("the worker's finishing queue has stopped".into()))?
    }
}
