//! Tests of the gather-and-flush loop of [`super::Batcher`].

use std::sync::Mutex;

use tokio::sync::Semaphore;

use super::*;

fn settings(enabled: bool) -> BatchSettings {
    BatchSettings {
        enabled,
        max_size: 100,
        max_delay: Duration::ZERO,
        flushers: 1,
        parallel_min: 1,
        claim_shards: 1,
    }
}

/// What each flush was handed, in order.
type Seen = Arc<Mutex<Vec<Vec<(u32, u32)>>>>;

fn metrics() -> Arc<Metrics> {
    Arc::new(Metrics::new(Duration::from_secs(25)))
}

/// A batcher of `(id, passes left)` requests answered with `id`.
type TestBatcher = Batcher<(u32, u32), u32>;

/// A [`TestBatcher`] that is never cancelled.
fn spawn_test<F, Fut>(
    settings: BatchSettings,
    tracker: &TaskTracker,
    orphaned: Option<Arc<OrphanFn<u32>>>,
    flush: F,
) -> TestBatcher
where
    F: Fn(Arc<Vec<(u32, u32)>>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<Pass<(u32, u32), u32>>, StoreError>> + Send + 'static,
{
    Batcher::spawn(
        "test",
        settings,
        metrics(),
        tracker,
        CancellationToken::new(),
        orphaned,
        flush,
    )
}

/// A request `(id, passes left)`: answered `id` once no pass is left,
/// else handed back with one pass less.
fn pass((id, left): (u32, u32)) -> Pass<(u32, u32), u32> {
    if left == 0 {
        Pass::Answer(id)
    } else {
        Pass::Again((id, left - 1))
    }
}

#[tokio::test]
async fn a_request_handed_back_is_answered_by_a_later_batch_with_requests_that_came_meanwhile() {
    let tracker = TaskTracker::new();
    let batches: Seen = Arc::default();
    // The first flush waits at the gate until every request is queued.
    let gate = Arc::new(Semaphore::new(0));
    let (seen, opened) = (batches.clone(), gate.clone());
    let batcher = spawn_test(
        settings(true),
        &tracker,
        None,
        move |reqs: Arc<Vec<(u32, u32)>>| {
            let (seen, opened) = (seen.clone(), opened.clone());
            async move {
                let first = seen.lock().unwrap().is_empty();
                seen.lock().unwrap().push(reqs.to_vec());
                if first {
                    opened.acquire().await.unwrap().forget();
                }
                Ok(reqs.iter().copied().map(pass).collect())
            }
        },
    );
    // Request 0 (two passes) is flushed alone and held at the gate;
    // 1 (one pass) and 2 (none) queue meanwhile.
    let first = tokio::spawn({
        let b = batcher.clone();
        async move { b.submit((0, 2)).await }
    });
    while batches.lock().unwrap().is_empty() {
        tokio::task::yield_now().await;
    }
    let (b1, b2) = (batcher.clone(), batcher.clone());
    let others = tokio::spawn(async move { tokio::join!(b1.submit((1, 1)), b2.submit((2, 0))) });
    while batcher.gathering.get() < 2 {
        tokio::task::yield_now().await;
    }
    gate.add_permits(1);
    assert_eq!(first.await.unwrap().unwrap(), 0);
    let (one, two) = others.await.unwrap();
    assert_eq!((one.unwrap(), two.unwrap()), (1, 2));
    let batches = batches.lock().unwrap().clone();
    // 0's second pass went with the two that queued during its first;
    // each later pass is in a later batch than the one before it.
    assert_eq!(batches[0], vec![(0, 2)]);
    assert!(
        batches[1].contains(&(1, 1)) && batches[1].contains(&(2, 0)),
        "{batches:?}"
    );
    assert!(batches[1].contains(&(0, 1)), "{batches:?}");
    let at = |req| batches.iter().position(|b| b.contains(&req)).unwrap();
    assert!(at((0, 0)) > at((0, 1)) && at((1, 0)) > at((1, 1)), "{batches:?}");
    assert_eq!(batcher.gathering.get(), 0, "the gauge counts what waits");
}

/// A batcher of two flushers whose flushes log their start and end and
/// hold at `gate` while it is closed.
fn gated(
    parallel_min: usize,
    tracker: &TaskTracker,
    gate: Arc<Semaphore>,
    log: Arc<Mutex<Vec<String>>>,
) -> TestBatcher {
    let mut s = settings(true);
    s.flushers = 2;
    s.parallel_min = parallel_min;
    spawn_test(s, tracker, None, move |reqs: Arc<Vec<(u32, u32)>>| {
        let (gate, log) = (gate.clone(), log.clone());
        async move {
            let ids: Vec<u32> = reqs.iter().map(|r| r.0).collect();
            log.lock().unwrap().push(format!("start {ids:?}"));
            gate.acquire().await.unwrap().forget();
            log.lock().unwrap().push(format!("end {ids:?}"));
            Ok(reqs.iter().copied().map(pass).collect())
        }
    })
}

async fn until(check: impl Fn() -> bool) {
    while !check() {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn beside_a_flush_in_flight_a_second_starts_only_once_its_batch_is_large_enough() {
    let tracker = TaskTracker::new();
    let gate = Arc::new(Semaphore::new(0));
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let batcher = gated(3, &tracker, gate.clone(), log.clone());
    let submit = |id| {
        let b = batcher.clone();
        tokio::spawn(async move { b.submit((id, 0)).await })
    };
    let mut answers = vec![submit(0)];
    until(|| log.lock().unwrap().len() == 1).await;
    // Two requests, fewer than 3: they wait beside the flush in flight.
    answers.push(submit(1));
    until(|| batcher.gathering.get() == 1).await;
    answers.push(submit(2));
    until(|| batcher.gathering.get() == 2).await;
    // The third makes the batch large enough: a second flush starts
    // with all three while the first is still held.
    answers.push(submit(3));
    until(|| log.lock().unwrap().len() == 2).await;
    assert_eq!(*log.lock().unwrap(), vec!["start [0]", "start [1, 2, 3]"]);
    gate.add_permits(2);
    for (id, answer) in answers.into_iter().enumerate() {
        assert_eq!(answer.await.unwrap().unwrap(), id as u32);
    }
}

#[tokio::test]
async fn a_small_batch_waits_for_the_flush_in_flight_then_goes() {
    let tracker = TaskTracker::new();
    let gate = Arc::new(Semaphore::new(0));
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let batcher = gated(10, &tracker, gate.clone(), log.clone());
    let b = batcher.clone();
    let first = tokio::spawn(async move { b.submit((0, 0)).await });
    until(|| log.lock().unwrap().len() == 1).await;
    let b = batcher.clone();
    let second = tokio::spawn(async move { b.submit((1, 0)).await });
    until(|| batcher.gathering.get() == 1).await;
    // A free flusher, but a batch of one beside a flush in flight: it
    // waits, and goes once that flush has ended.
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(*log.lock().unwrap(), vec!["start [0]"]);
    gate.add_permits(2);
    assert_eq!(first.await.unwrap().unwrap(), 0);
    assert_eq!(second.await.unwrap().unwrap(), 1);
    assert_eq!(
        *log.lock().unwrap(),
        vec!["start [0]", "end [0]", "start [1]", "end [1]"]
    );
}

#[tokio::test]
async fn alone_each_pass_is_its_own_flush() {
    let tracker = TaskTracker::new();
    let flushes: Seen = Arc::default();
    let seen = flushes.clone();
    let batcher = spawn_test(
        settings(false),
        &tracker,
        None,
        move |reqs: Arc<Vec<(u32, u32)>>| {
            seen.lock().unwrap().push(reqs.to_vec());
            std::future::ready(Ok(reqs.iter().copied().map(pass).collect()))
        },
    );
    assert!(!batcher.batching());
    assert_eq!(batcher.submit((7, 2)).await.unwrap(), 7);
    assert_eq!(
        *flushes.lock().unwrap(),
        vec![vec![(7, 2)], vec![(7, 1)], vec![(7, 0)]]
    );
}

#[tokio::test]
async fn an_answer_whose_requester_left_goes_to_the_orphan_hook() {
    let tracker = TaskTracker::new();
    let gate = Arc::new(Semaphore::new(0));
    let orphans: Arc<Mutex<Vec<u32>>> = Arc::default();
    let kept = orphans.clone();
    let opened = gate.clone();
    let (flushing, mut flushed) = mpsc::unbounded_channel::<()>();
    let batcher = spawn_test(
        settings(true),
        &tracker,
        Some(Arc::new(move |id| kept.lock().unwrap().push(id))),
        move |reqs: Arc<Vec<(u32, u32)>>| {
            let (opened, flushing) = (opened.clone(), flushing.clone());
            async move {
                let _ = flushing.send(());
                opened.acquire().await.unwrap().forget();
                Ok(reqs.iter().copied().map(pass).collect())
            }
        },
    );
    let b = batcher.clone();
    let left = tokio::spawn(async move { b.submit((9, 0)).await });
    flushed.recv().await.unwrap();
    left.abort();
    assert!(left.await.unwrap_err().is_cancelled());
    gate.add_permits(1);
    // A second request is flushed only once the first flush answered.
    let b = batcher.clone();
    let next = tokio::spawn(async move { b.submit((10, 0)).await });
    flushed.recv().await.unwrap();
    gate.add_permits(1);
    assert_eq!(next.await.unwrap().unwrap(), 10);
    assert_eq!(*orphans.lock().unwrap(), vec![9]);
}
