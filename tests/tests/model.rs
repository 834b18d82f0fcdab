//! The protocol's model check (`runlease_tests::model`, `docs/model.md`):
//! the correct protocol keeps every property over every interleaving within
//! the bounds, and each deliberately broken variant produces a counterexample
//! for the property it breaks. No database or network: the checker explores
//! the model's states in memory.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Instant;

use runlease_tests::model::{
    ACK_NEVER_LOST, Action, Bounds, CURRENT_LEASE_ONLY, DEPENDENCY_SOMETIMES, DEPS_MET, EVERY_JOB_TERMINATES,
    NONE_STUCK_BLOCKED, ONE_LIVE_LEASE, PROMOTED_ONCE, ProtocolModel, SAFETY, SOMETIMES, Variant,
    representative,
};
use stateright::{Checker, Model};

/// Checker threads: the machines that run the suite have two cores, shared
/// with the other tests.
const THREADS: usize = 2;

/// Runs a breadth-first check of `model` to its end (or, for a model that
/// checks one property only, to that property's first discovery: the
/// shortest counterexample) and prints what it explored.
fn check_bfs(name: &str, model: ProtocolModel) -> impl Checker<ProtocolModel> + use<> {
    let started = Instant::now();
    let checker = model.checker().threads(THREADS).spawn_bfs().join();
    report(name, &checker, started);
    checker
}

/// Runs a depth-first check of `model` to its end with symmetry reduction
/// (jobs, workers and coordinators renumbered count as one world).
fn check_symmetric(name: &str, model: ProtocolModel) -> impl Checker<ProtocolModel> + use<> {
    let started = Instant::now();
    let checker = model
        .checker()
        .threads(THREADS)
        .symmetry_fn(representative)
        .spawn_dfs()
        .join();
    report(name, &checker, started);
    checker
}

fn report(name: &str, checker: &impl Checker<ProtocolModel>, started: Instant) {
    eprintln!(
        "{name}: {} unique states ({} generated), depth {}, {:.1} s",
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
}

/// Checks the correct protocol under `bounds` for every property in
/// `names` (all safety properties, liveness, and the scenarios of
/// `sometimes`) and asserts that it explored more than `at_least` states.
fn keeps_every_property(bounds: Bounds, names: &[&'static str], at_least: usize) {
    let model = ProtocolModel::new(Variant::Correct, bounds).checking(names);
    let checker = check_symmetric(&format!("Correct {bounds:?}"), model);
    // No counterexample to any safety property or to liveness, an example
    // of every scenario, and the check ran to its end.
    checker.assert_properties();
    assert!(checker.is_done());
    for name in SAFETY.iter().chain(&[EVERY_JOB_TERMINATES]) {
        assert!(names.contains(name), "{name} must be checked");
        assert!(checker.discovery(name).is_none(), "{name}");
    }
    // A model that explores next to nothing cannot pass.
    let states = checker.unique_state_count();
    assert!(states > at_least, "only {states} states explored");
}

fn all_properties() -> Vec<&'static str> {
    let mut names = SAFETY.to_vec();
    names.push(EVERY_JOB_TERMINATES);
    names.extend(SOMETIMES);
    names
}

#[test]
fn correct_protocol_keeps_every_property() {
    keeps_every_property(Bounds::default(), &all_properties(), 200_000);
}

#[test]
fn correct_protocol_keeps_every_property_with_two_jobs() {
    // Without faults or admin actions, the scenarios that need them are out
    // of reach: every job terminal, and a stale call in a batch, remain.
    let mut names = SAFETY.to_vec();
    names.push(EVERY_JOB_TERMINATES);
    names.extend(&SOMETIMES[..2]);
    keeps_every_property(Bounds::two_jobs(), &names, 100_000);
}

/// Checks `variant` for `property` alone and expects a counterexample;
/// answers its path's actions.
fn counterexample(variant: Variant, property: &'static str) -> Vec<Action> {
    let model = ProtocolModel::new(variant, Bounds::default()).checking(&[property]);
    let checker = check_bfs(&format!("{variant:?}"), model);
    let path = checker.discovery(property).unwrap_or_else(|| {
        panic!("{variant:?} must break \"{property}\", but the checker found no counterexample")
    });
    eprintln!("{variant:?} breaks \"{property}\":\n{path}");
    let last = path.last_state().clone();
    // The checker's own verdict, re-checked on the path's last state.
    let model = ProtocolModel::new(variant, Bounds::default()).checking(&[property]);
    let prop = model
        .properties()
        .into_iter()
        .find(|p| p.name == property)
        .unwrap();
    assert!(
        !(prop.condition)(&model, &last),
        "the counterexample's last state keeps \"{property}\""
    );
    path.into_actions()
}

#[test]
fn reaper_without_recheck_reaps_a_renewed_lease() {
    let actions = counterexample(Variant::ReaperWithoutRecheck, ONE_LIVE_LEASE);
    assert!(actions.iter().any(|a| matches!(a, Action::ReapWrite { .. })));
}

#[test]
fn guard_on_attempt_lands_a_stale_outcome_on_a_newer_lease() {
    let actions = counterexample(Variant::GuardOnAttempt, CURRENT_LEASE_ONLY);
    assert!(actions.iter().any(|a| matches!(a, Action::Commit { .. })));
}

#[test]
fn heartbeat_without_guard_grants_a_stale_lease() {
    let actions = counterexample(Variant::HeartbeatWithoutGuard, ONE_LIVE_LEASE);
    assert!(actions.iter().any(|a| matches!(a, Action::Heartbeat { .. })));
}

#[test]
fn acknowledgement_before_commit_loses_an_outcome() {
    let actions = counterexample(Variant::AckBeforeCommit, ACK_NEVER_LOST);
    assert!(actions.iter().any(|a| matches!(a, Action::Crash { .. })));
}

#[test]
fn without_a_reaper_a_vanished_holder_strands_its_job() {
    counterexample(Variant::NoReaper, EVERY_JOB_TERMINATES);
}

/// The safety properties and liveness, every scenario of `SOMETIMES` in
/// `plain`, and the dependency scenarios in `deps`.
fn names_with(plain: &[usize], deps: &[usize]) -> Vec<&'static str> {
    let mut names = SAFETY.to_vec();
    names.push(EVERY_JOB_TERMINATES);
    names.extend(plain.iter().map(|&i| SOMETIMES[i]));
    names.extend(deps.iter().map(|&i| DEPENDENCY_SOMETIMES[i]));
    names
}

#[test]
fn correct_protocol_keeps_every_property_with_a_fan_in() {
    // Two coordinators ending the two dependencies at once; a cancel of one
    // racing the finish of the other.
    keeps_every_property(Bounds::fan_in(), &names_with(&[0], &[0, 1, 3]), 5_000);
}

#[test]
fn correct_protocol_keeps_every_property_with_a_fan_in_and_a_stale_lease() {
    // A dependency finished under a stale lease is refused and promotes
    // nothing.
    keeps_every_property(Bounds::fan_in_stale(), &names_with(&[0, 1], &[0, 1, 2]), 20_000);
}

#[test]
fn correct_protocol_keeps_every_property_with_a_fan_in_and_a_crash() {
    keeps_every_property(Bounds::fan_in_crash(), &names_with(&[0], &[0, 1]), 5_000);
}

#[test]
fn correct_protocol_keeps_every_property_with_a_fan_in_under_run() {
    keeps_every_property(Bounds::fan_in_run(), &names_with(&[0], &[0, 5, 6]), 10_000);
}

#[test]
fn correct_protocol_keeps_every_property_with_a_chain() {
    keeps_every_property(Bounds::chain(), &names_with(&[0], &[0, 4]), 2_000);
}

/// Checks `variant` under `bounds` for `property` alone and expects a
/// counterexample; answers its path's actions.
fn counterexample_in(variant: Variant, bounds: Bounds, property: &'static str) -> Vec<Action> {
    let model = ProtocolModel::new(variant, bounds).checking(&[property]);
    let checker = check_bfs(&format!("{variant:?} {property}"), model);
    let path = checker.discovery(property).unwrap_or_else(|| {
        panic!("{variant:?} must break \"{property}\", but the checker found no counterexample")
    });
    eprintln!("{variant:?} breaks \"{property}\":\n{path}");
    path.into_actions()
}

#[test]
fn promotion_after_the_commit_promotes_twice() {
    // Both coordinators' checks read the dependent ready; both write it.
    let actions = counterexample_in(Variant::PromoteAfterCommit, Bounds::fan_in_stale(), PROMOTED_ONCE);
    let writes = actions
        .iter()
        .filter(|a| matches!(a, Action::PromoteWrite { .. }))
        .count();
    assert_eq!(writes, 2, "{actions:?}");
}

#[test]
fn promotion_after_the_commit_revives_a_cancelled_job() {
    // The dependent is cancelled between the check's read and its write.
    let actions = counterexample_in(Variant::PromoteAfterCommit, Bounds::fan_in(), PROMOTED_ONCE);
    assert!(
        actions.iter().any(|a| matches!(a, Action::Cancel { .. })),
        "{actions:?}"
    );
}

#[test]
fn promotion_after_the_commit_loses_a_promotion() {
    let actions = counterexample_in(
        Variant::PromoteAfterCommit,
        Bounds::fan_in_crash(),
        NONE_STUCK_BLOCKED,
    );
    assert!(
        actions.iter().any(|a| matches!(a, Action::Crash { .. })),
        "{actions:?}"
    );
}

#[test]
fn promotion_after_the_commit_strands_a_dependent() {
    // The liveness property covers dependents: a lost promotion leaves a job
    // blocked that nothing ends.
    let actions = counterexample_in(
        Variant::PromoteAfterCommit,
        Bounds::fan_in_crash(),
        EVERY_JOB_TERMINATES,
    );
    assert!(
        actions.iter().any(|a| matches!(a, Action::Crash { .. })),
        "{actions:?}"
    );
}

#[test]
fn counter_without_the_edge_mark_promotes_early() {
    let actions = counterexample_in(Variant::CounterWithoutEdge, Bounds::fan_in_run(), DEPS_MET);
    assert!(
        actions.iter().any(|a| matches!(a, Action::AdminRetry { .. })),
        "{actions:?}"
    );
}

#[test]
fn counter_without_the_row_lock_loses_a_promotion() {
    let actions = counterexample_in(Variant::CounterWithoutLock, Bounds::fan_in(), NONE_STUCK_BLOCKED);
    let begins = actions
        .iter()
        .filter(|a| matches!(a, Action::CommitBegin { .. }))
        .count();
    assert_eq!(begins, 2, "{actions:?}");
}

#[test]
fn counter_without_the_guard_promotes_a_cancelled_job() {
    let actions = counterexample_in(Variant::CounterWithoutGuard, Bounds::fan_in(), PROMOTED_ONCE);
    assert!(
        actions.iter().any(|a| matches!(a, Action::Cancel { .. })),
        "{actions:?}"
    );
}
