//! W3C trace context from producer to worker: a `traceparent` sent with an
//! enqueue is stored with the job, shown on its JSON, handed out on its
//! lease, carried by the coordinator's request spans, and the worker
//! runtime's job span carries the producer's trace id. Spans are captured
//! with a tracing layer of the test's own over the real coordinator and the
//! real worker runtime.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use runlease_client::protocol::{QueueName, TraceParent, WorkerId};
use runlease_client::{Client, JobContext, JobError, Worker};
use runlease_tests::{TestCoordinator, TestDb};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

const PRODUCER: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const PRODUCER_TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";

/// One span as the capture layer saw it.
#[derive(Debug, Clone, Default)]
struct Captured {
    name: String,
    fields: HashMap<String, String>,
    parent: Option<u64>,
}

/// Every span opened in this process, by id.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<HashMap<u64, Captured>>>);

impl Spans {
    fn get(&self, id: u64) -> Option<Captured> {
        self.0.lock().unwrap().get(&id).cloned()
    }

    fn matching(&self, pred: impl Fn(&Captured) -> bool) -> Vec<Captured> {
        self.0
            .lock()
            .unwrap()
            .values()
            .filter(|s| pred(s))
            .cloned()
            .collect()
    }
}

struct FieldsOf<'a>(&'a mut HashMap<String, String>);

impl Visit for FieldsOf<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut captured = Captured {
            name: attrs.metadata().name().to_owned(),
            parent: ctx.span(id).and_then(|s| s.parent()).map(|p| p.id().into_u64()),
            ..Captured::default()
        };
        attrs.record(&mut FieldsOf(&mut captured.fields));
        self.0.lock().unwrap().insert(id.into_u64(), captured);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(span) = self.0.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut FieldsOf(&mut span.fields));
        }
    }
}

/// The process-wide capture (each test binary process installs it once;
/// nextest runs every test in a process of its own).
fn spans() -> Spans {
    static SPANS: OnceLock<Spans> = OnceLock::new();
    SPANS
        .get_or_init(|| {
            let spans = Spans::default();
            let subscriber = tracing_subscriber::registry().with(spans.clone());
            tracing::subscriber::set_global_default(subscriber)
                .expect("no other global tracing subscriber in this test process");
            spans
        })
        .clone()
}

async fn post_with_header(base: &str, path: &str, traceparent: &str, body: &Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .header("traceparent", traceparent)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

#[tokio::test]
async fn a_producers_trace_reaches_the_workers_job_span() {
    let spans = spans();
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let traceparent = TraceParent::parse(PRODUCER).unwrap();
    let producer = Client::new(c.api.base())
        .unwrap()
        .with_traceparent(traceparent.clone());

    let job = producer.enqueue("traced", &json!({"order": 42})).await.unwrap();
    assert_eq!(job.traceparent.as_ref(), Some(&traceparent), "the enqueue answer");
    let (status, read) = c.api.get(&format!("/v1/jobs/{}", job.id)).await;
    assert_eq!(status, 200);
    assert_eq!(read["traceparent"], PRODUCER, "the job JSON: {read}");

    // The coordinator's request span for the enqueue carries the trace.
    let enqueue_spans = spans.matching(|s| {
        s.name == "request"
            && s.fields.get("route").is_some_and(|r| r == "/v1/jobs")
            && s.fields.get("job_id").is_some_and(|id| *id == job.id.to_string())
    });
    assert_eq!(
        enqueue_spans.len(),
        1,
        "one request span for the enqueue: {enqueue_spans:?}"
    );
    assert_eq!(
        enqueue_spans[0].fields.get("trace_id").map(String::as_str),
        Some(PRODUCER_TRACE_ID)
    );
    assert_eq!(
        enqueue_spans[0].fields.get("traceparent").map(String::as_str),
        Some(PRODUCER)
    );

    // The worker runtime claims it; the handler runs inside the job span.
    let (ran_tx, mut ran_rx) = mpsc::unbounded_channel();
    let worker = Worker::builder(Client::new(c.api.base()).unwrap())
        .worker_id(WorkerId::new("traced-worker").unwrap())
        .claim_wait(Duration::from_millis(500))
        .handle(QueueName::new("traced").unwrap(), move |ctx: JobContext| {
            let ran_tx = ran_tx.clone();
            async move {
                let span = tracing::Span::current().id().map(|id| id.into_u64());
                let _ = ran_tx.send((ctx.job_id(), span));
                Ok::<_, JobError>(json!("traced"))
            }
        })
        .build()
        .unwrap();
    let stop = CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    let (ran_id, span_id) = tokio::time::timeout(Duration::from_secs(30), ran_rx.recv())
        .await
        .expect("the worker ran the job within 30 s")
        .unwrap();
    assert_eq!(ran_id, job.id);
    let span_id = span_id.expect("the handler runs inside a span");
    // The handler's span or one of its ancestors is the runtime's job span.
    let mut at = spans.get(span_id);
    let mut job_span = None;
    while let Some(span) = at {
        if span.name == "job" {
            job_span = Some(span);
            break;
        }
        at = span.parent.and_then(|p| spans.get(p));
    }
    let job_span = job_span.expect("the handler's span is inside the worker's job span");
    assert_eq!(job_span.fields.get("job_id"), Some(&job.id.to_string()));
    assert_eq!(
        job_span.fields.get("trace_id").map(String::as_str),
        Some(PRODUCER_TRACE_ID),
        "the worker's job span carries the producer's trace id: {job_span:?}"
    );
    assert_eq!(
        job_span.fields.get("traceparent").map(String::as_str),
        Some(PRODUCER)
    );

    let done = runlease_tests::api::terminal(&c.api, job.id).await;
    assert_eq!(done.result, Some(json!("traced")));
    assert_eq!(
        done.traceparent.as_ref(),
        Some(&traceparent),
        "kept after the job ended"
    );
    stop.cancel();
    running.await.unwrap();
    c.stop().await.unwrap();
}

#[tokio::test]
async fn each_lease_and_each_batch_job_carries_the_traceparent() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let base = c.api.base().to_owned();

    // A batch: the header is the trace context of every job in it.
    let (status, body) = post_with_header(
        &base,
        "/v1/jobs/batch",
        PRODUCER,
        &json!({"jobs": [{"queue": "tb", "payload": 1}, {"queue": "tb", "payload": 2}]}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    for job in body["jobs"].as_array().unwrap() {
        assert_eq!(job["traceparent"], PRODUCER, "{job}");
    }

    // The lease JSON hands it out, on the first attempt and after a release.
    let (status, claimed) = c
        .api
        .post(
            "/v1/claim",
            &json!({"queues": ["tb"], "worker_id": "w", "max_jobs": 2}),
        )
        .await;
    assert_eq!(status, 200, "{claimed}");
    let leases = claimed["leases"].as_array().unwrap();
    assert_eq!(leases.len(), 2);
    for lease in leases {
        assert_eq!(lease["traceparent"], PRODUCER, "{lease}");
    }
    let (status, _) = c
        .api
        .post("/v1/release", &json!({"lease_token": leases[0]["lease_token"]}))
        .await;
    assert_eq!(status, 200);
    let again = c.api.claim_one("tb", "w2").await;
    assert_eq!(
        again.traceparent.as_ref().map(TraceParent::as_str),
        Some(PRODUCER)
    );

    // Without a header, or with one that is not valid W3C trace context,
    // the job is enqueued without trace context (never refused), and its
    // JSON and leases leave the field out.
    for header in [
        None,
        Some("garbage"),
        Some("00-00000000000000000000000000000000-b7ad6b7169203331-01"),
        Some("00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01"),
        Some("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    ] {
        let body = json!({"queue": "untraced", "payload": header});
        let (status, job) = match header {
            Some(h) => post_with_header(&base, "/v1/jobs", h, &body).await,
            None => c.api.post("/v1/jobs", &body).await,
        };
        assert_eq!(status, 201, "{header:?}: {job}");
        assert!(job.get("traceparent").is_none(), "{header:?}: {job}");
        let (_, lease) = c
            .api
            .post("/v1/claim", &json!({"queues": ["untraced"], "worker_id": "w"}))
            .await;
        assert!(
            lease["leases"][0].get("traceparent").is_none(),
            "{header:?}: {lease}"
        );
        assert_eq!(lease["leases"][0]["job_id"], job["id"]);
    }
    // A later version is accepted and handed on in the version-00 form.
    let (status, job) = post_with_header(
        &base,
        "/v1/jobs",
        "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-future",
        &json!({"queue": "untraced", "payload": "v1"}),
    )
    .await;
    assert_eq!(status, 201);
    assert_eq!(job["traceparent"], PRODUCER);
    c.stop().await.unwrap();
}
