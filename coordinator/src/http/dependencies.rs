//! The dependencies of an enqueue's jobs, checked: each `ref` unique in its
//! batch, each `depends_on` entry the `ref` of an earlier job of the batch
//! or the id of a job, at most [`MAX_DEPENDENCIES`] of them, none twice.

use std::collections::HashMap;

use runlease_protocol::JobId;
use runlease_protocol::limits::{MAX_DEPENDENCIES, MAX_REF_LEN};
use runlease_protocol::producer::EnqueueJobRequest;
use uuid::Uuid;

use crate::store::dependencies::{Dependencies, DependsOn};

/// The dependencies of each job of `reqs`, in order (`None`: it has none);
/// the error names the job (`jobs[i]`) and what is wrong.
pub fn resolve(reqs: &[EnqueueJobRequest]) -> Result<Vec<Option<Dependencies>>, String> {
    let mut refs: HashMap<&str, usize> = HashMap::new();
    for (i, req) in reqs.iter().enumerate() {
        let Some(name) = req.job_ref.as_deref() else {
            continue;
        };
        if name.is_empty() || name.len() > MAX_REF_LEN || name.contains('\0') {
            return Err(format!(
                "jobs[{i}]: ref must be 1 to {MAX_REF_LEN} bytes long, without NUL"
            ));
        }
        if Uuid::parse_str(name).is_ok() {
            return Err(format!(
                "jobs[{i}]: ref {name:?} reads as a job id; choose a ref that does not"
            ));
        }
        if let Some(first) = refs.insert(name, i) {
            return Err(format!(
                "jobs[{i}]: ref {name:?} is already the ref of jobs[{first}]"
            ));
        }
    }
    reqs.iter()
        .enumerate()
        .map(|(i, req)| dependencies_of(i, req, &refs).map_err(|e| format!("jobs[{i}]: {e}")))
        .collect()
}

/// The dependencies of job `i` of a batch whose refs are `refs`.
fn dependencies_of(
    i: usize,
    req: &EnqueueJobRequest,
    refs: &HashMap<&str, usize>,
) -> Result<Option<Dependencies>, String> {
    if req.depends_on.is_empty() {
        if req.on_dependency_failure.is_some() {
            return Err("on_dependency_failure is only for a job with depends_on".into());
        }
        return Ok(None);
    }
    if req.depends_on.len() > MAX_DEPENDENCIES {
        return Err(format!(
            "depends_on names {} jobs; at most {MAX_DEPENDENCIES}",
            req.depends_on.len()
        ));
    }
    let mut on: Vec<DependsOn> = Vec::with_capacity(req.depends_on.len());
    for entry in &req.depends_on {
        let dep = match refs.get(entry.as_str()) {
            Some(&k) if k < i => DependsOn::Earlier(k),
            Some(&k) if k == i => return Err(format!("depends_on names the job's own ref {entry:?}")),
            Some(&k) => {
                return Err(format!(
                    "depends_on names {entry:?}, the ref of a later job (jobs[{k}]): a job may depend only on earlier jobs of its batch"
                ));
            }
            None => match Uuid::parse_str(entry) {
                Ok(id) => DependsOn::Existing(JobId(id)),
                Err(_) => {
                    return Err(format!(
                        "depends_on names {entry:?}, which is neither the ref of an earlier job of the batch nor a job id"
                    ));
                }
            },
        };
        if on.contains(&dep) {
            return Err(format!("depends_on names {entry:?} twice"));
        }
        on.push(dep);
    }
    Ok(Some(Dependencies {
        on,
        on_failure: req.on_dependency_failure.unwrap_or_default(),
    }))
}

#[cfg(test)]
mod tests {
    use runlease_protocol::{OnDependencyFailure, QueueName};
    use serde_json::json;

    use super::*;

    fn job(job_ref: Option<&str>, depends_on: &[&str]) -> EnqueueJobRequest {
        let mut req = EnqueueJobRequest::new(QueueName::new("q").unwrap(), json!({}));
        req.job_ref = job_ref.map(str::to_owned);
        req.depends_on = depends_on.iter().map(|s| (*s).to_owned()).collect();
        req
    }

    #[test]
    fn refs_of_earlier_jobs_and_ids_resolve() {
        let id = JobId::new();
        let mut c = job(Some("c"), &["a", &id.to_string(), "b"]);
        c.on_dependency_failure = Some(OnDependencyFailure::Run);
        let reqs = [job(Some("a"), &[]), job(Some("b"), &["a"]), c];
        let deps = resolve(&reqs).unwrap();
        assert_eq!(deps[0], None);
        assert_eq!(deps[1].as_ref().unwrap().on, [DependsOn::Earlier(0)]);
        assert_eq!(deps[1].as_ref().unwrap().on_failure, OnDependencyFailure::Cancel);
        let c = deps[2].as_ref().unwrap();
        assert_eq!(
            c.on,
            [
                DependsOn::Earlier(0),
                DependsOn::Existing(id),
                DependsOn::Earlier(1)
            ]
        );
        assert_eq!(c.on_failure, OnDependencyFailure::Run);
    }

    #[test]
    fn each_mistake_names_its_job() {
        let cases: Vec<(Vec<EnqueueJobRequest>, &str)> = vec![
            (
                vec![job(Some("a"), &[]), job(None, &["b"])],
                "jobs[1]: depends_on names \"b\", which is neither",
            ),
            (
                vec![job(None, &["a"]), job(Some("a"), &[])],
                "jobs[0]: depends_on names \"a\", the ref of a later job (jobs[1])",
            ),
            (
                vec![job(Some("a"), &[]), job(Some("a"), &[])],
                "jobs[1]: ref \"a\" is already the ref of jobs[0]",
            ),
            (
                vec![job(Some("a"), &[]), job(None, &["a", "a"])],
                "jobs[1]: depends_on names \"a\" twice",
            ),
            (
                vec![job(Some("a"), &["a"])],
                "jobs[0]: depends_on names the job's own ref",
            ),
            (
                vec![job(Some(&JobId::new().to_string()), &[])],
                "reads as a job id",
            ),
            (vec![job(Some(""), &[])], "jobs[0]: ref must be 1 to"),
        ];
        for (reqs, expected) in cases {
            let err = resolve(&reqs).unwrap_err();
            assert!(err.contains(expected), "{err:?} should contain {expected:?}");
        }
        let many: Vec<String> = (0..=MAX_DEPENDENCIES).map(|_| JobId::new().to_string()).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let err = resolve(&[job(None, &many)]).unwrap_err();
        assert!(
            err.starts_with("jobs[0]: depends_on names 101 jobs; at most 100"),
            "{err}"
        );
        let mut lone = job(None, &[]);
        lone.on_dependency_failure = Some(OnDependencyFailure::Run);
        assert!(
            resolve(&[lone])
                .unwrap_err()
                .contains("only for a job with depends_on")
        );
    }
}
