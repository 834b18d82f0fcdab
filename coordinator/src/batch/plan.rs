//! [`ClaimPlan`]: where the slots of claims go, for every way a claim is
//! made (a claim parked in the claim batcher, a claim riding a finish, a
//! claim made alone). Pure: no I/O, no clock.
//!
//! Claims of the same queues whose remaining run time falls in the same
//! band share one claim statement (a group). Each claim takes one slot per
//! lease it wants, in arrival order, as far as the statement has room
//! (`max_slots`); a claim that finds its group's statement full is not
//! placed and waits for the next statement. A group's statement hands out
//! only jobs that fit the least time left among its claimers, so every job
//! fits every claimer it may be dealt to.

use runlease_protocol::{QueueName, WorkerId};

use crate::batch::claims::ClaimAsk;
use crate::store::leases::ClaimGroup;
use crate::store::rows::ClaimedJob;

/// The band of a remaining run time: its value with all but the three
/// highest bits cleared, so at most four bands per doubling (under 64 in
/// all for run times up to a day). Bands, not exact values: each group
/// costs a statement per wake-up and per re-check, so a client parking
/// claims with thousands of distinct `time_left_ms` must not make
/// thousands of groups. A claimer gives up at most a fifth of its time.
pub fn time_left_band(ms: u64) -> u64 {
    let bits = 64 - ms.leading_zeros();
    if bits <= 3 {
        ms
    } else {
        ms >> (bits - 3) << (bits - 3)
    }
}

/// Which group a claim belongs to: its queues and its time-left band.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupKey {
    /// Queues, sorted and without repeats.
    pub queues: Vec<QueueName>,
    /// The band of the claimers' time left (`None`: no time limit).
    pub time_left_band: Option<u64>,
}

impl GroupKey {
    /// The group of `ask`.
    pub fn of(ask: &ClaimAsk) -> Self {
        Self {
            queues: ask.queues.clone(),
            time_left_band: ask.time_left_ms.map(time_left_band),
        }
    }
}

/// Where one claim's slots went: its group and its run of slots there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The group (statement) the claim is in.
    pub group: usize,
    /// Its first slot in the group's statement.
    pub first: usize,
    /// How many slots it has (at most what it asked for).
    pub count: usize,
}

/// One statement of a plan.
#[derive(Debug)]
struct PlannedGroup<'a> {
    key: GroupKey,
    queues: &'a [QueueName],
    time_left_ms: Option<u64>,
    slots: Vec<&'a WorkerId>,
}

/// Claim statements and the slots of each, built claim by claim.
#[derive(Debug)]
pub struct ClaimPlan<'a> {
    max_slots: usize,
    groups: Vec<PlannedGroup<'a>>,
}

impl<'a> ClaimPlan<'a> {
    /// An empty plan whose statements take at most `max_slots` slots each.
    pub fn new(max_slots: usize) -> Self {
        Self {
            max_slots: max_slots.max(1),
            groups: Vec::new(),
        }
    }

    /// Places `ask` after the claims placed before it: as many of its
    /// slots as its group's statement has room for, or `None` when it has
    /// none left (the claim waits for the next statement).
    pub fn place(&mut self, ask: &'a ClaimAsk) -> Option<Placement> {
        // Found by reference: a claim's queues are copied only for a new group.
        let band = ask.time_left_ms.map(time_left_band);
        let found = self
            .groups
            .iter()
            .position(|g| g.key.time_left_band == band && g.key.queues == ask.queues);
        let group = match found {
            Some(g) => g,
            None => {
                self.groups.push(PlannedGroup {
                    key: GroupKey::of(ask),
                    queues: &ask.queues,
                    time_left_ms: ask.time_left_ms,
                    slots: Vec::new(),
                });
                self.groups.len() - 1
            }
        };
        let planned = &mut self.groups[group];
        let room = self.max_slots - planned.slots.len();
        if room == 0 {
            return None;
        }
        let count = (ask.max_jobs as usize).min(room);
        let first = planned.slots.len();
        planned.slots.extend(std::iter::repeat_n(&ask.worker, count));
        // Every job handed out must fit every claimer of the group (all
        // of a band have a time left, or none has).
        planned.time_left_ms = planned.time_left_ms.min(ask.time_left_ms);
        Some(Placement { group, first, count })
    }

    /// Whether no slot was placed.
    pub fn is_empty(&self) -> bool {
        self.groups.iter().all(|g| g.slots.is_empty())
    }

    /// The statements to run, one per group, in the order of the groups.
    pub fn claims(&self) -> Vec<ClaimGroup<'_>> {
        self.groups
            .iter()
            .filter(|g| !g.slots.is_empty())
            .map(|g| ClaimGroup {
                queues: g.queues,
                slots: g.slots.clone(),
                time_left_ms: g.time_left_ms,
            })
            .collect()
    }

    /// Slots in all, for the batch-size metric.
    pub fn slots(&self) -> usize {
        self.groups.iter().map(|g| g.slots.len()).sum()
    }

    /// Deals what each statement of [`ClaimPlan::claims`] claimed (each
    /// job with the slot it filled) to the slots, so each placement can
    /// take its own.
    pub fn deal(&self, claimed: Vec<Vec<(usize, ClaimedJob)>>) -> Dealt {
        let mut by_slot: Vec<Vec<Option<ClaimedJob>>> = self
            .groups
            .iter()
            .map(|g| (0..g.slots.len()).map(|_| None).collect())
            .collect();
        let ran = (0..self.groups.len()).filter(|&g| !self.groups[g].slots.is_empty());
        for (g, rows) in ran.zip(claimed) {
            for (slot, row) in rows {
                if let Some(at) = by_slot[g].get_mut(slot) {
                    *at = Some(row);
                }
            }
        }
        Dealt { by_slot }
    }
}

/// The jobs a plan's statements claimed, by group and slot.
#[derive(Debug, Default)]
pub struct Dealt {
    by_slot: Vec<Vec<Option<ClaimedJob>>>,
}

impl Dealt {
    /// The jobs of one placement's slots, in slot order (fewer than it has
    /// slots when fewer were claimable).
    pub fn take(&mut self, placement: Placement) -> Vec<ClaimedJob> {
        self.by_slot
            .get_mut(placement.group)
            .and_then(|slots| slots.get_mut(placement.first..placement.first + placement.count))
            .map(|slots| slots.iter_mut().filter_map(Option::take).collect())
            .unwrap_or_default()
    }

    /// Jobs no placement took (their claimer left): to be given back.
    pub fn rest(self) -> Vec<ClaimedJob> {
        self.by_slot.into_iter().flatten().flatten().collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use runlease_protocol::{JobId, RunLease};
    use serde_json::json;

    use super::*;

    fn ask(queues: &[&str], worker: &str, max_jobs: u32, time_left_ms: Option<u64>) -> ClaimAsk {
        ClaimAsk {
            queues: queues.iter().map(|q| QueueName::new(*q).unwrap()).collect(),
            worker: WorkerId::new(worker).unwrap(),
            max_jobs,
            time_left_ms,
            wait: Duration::ZERO,
        }
    }

    fn job(n: i64) -> ClaimedJob {
        ClaimedJob {
            id: JobId::new(),
            queue: QueueName::new("q").unwrap(),
            run_lease: RunLease(n),
            payload: json!(n),
            attempt: 1,
            progress: None,
            timeout_ms: None,
            traceparent: None,
            max_attempts: 3,
            has_dependencies: false,
            dependencies: Vec::new(),
        }
    }

    #[test]
    fn slots_go_in_arrival_order_and_a_full_statement_places_no_more() {
        let (a, b, c) = (
            ask(&["q"], "a", 3, None),
            ask(&["q"], "b", 4, None),
            ask(&["q"], "c", 1, None),
        );
        let mut plan = ClaimPlan::new(5);
        assert_eq!(
            plan.place(&a),
            Some(Placement {
                group: 0,
                first: 0,
                count: 3
            })
        );
        // b asked for 4 and gets the 2 left: a large claim is never passed
        // over for smaller ones.
        assert_eq!(
            plan.place(&b),
            Some(Placement {
                group: 0,
                first: 3,
                count: 2
            })
        );
        assert_eq!(plan.place(&c), None);
        let claims = plan.claims();
        assert_eq!(claims.len(), 1);
        let workers: Vec<&str> = claims[0].slots.iter().map(|w| w.as_str()).collect();
        assert_eq!(workers, ["a", "a", "a", "b", "b"]);
        assert_eq!(plan.slots(), 5);
    }

    #[test]
    fn other_queues_and_time_left_bands_get_statements_of_their_own() {
        let plain = ask(&["q"], "a", 1, None);
        let other = ask(&["r"], "b", 1, None);
        let lambda = ask(&["q"], "c", 1, Some(300_000));
        let same_band = ask(&["q"], "d", 1, Some(290_000));
        let mut plan = ClaimPlan::new(10);
        let placed: Vec<usize> = [&plain, &other, &lambda, &same_band]
            .into_iter()
            .map(|a| plan.place(a).unwrap().group)
            .collect();
        assert_eq!(placed, [0, 1, 2, 2]);
        let claims = plan.claims();
        // The band's statement fits the least time left of its claimers.
        assert_eq!(claims[2].time_left_ms, Some(290_000));
        assert_eq!(claims[0].time_left_ms, None);
    }

    #[test]
    fn each_placement_takes_the_jobs_of_its_own_slots() {
        let (a, b) = (ask(&["q"], "a", 2, None), ask(&["q"], "b", 2, None));
        let mut plan = ClaimPlan::new(10);
        let (pa, pb) = (plan.place(&a).unwrap(), plan.place(&b).unwrap());
        // Three jobs were claimable: slots 0, 1 and 2.
        let mut dealt = plan.deal(vec![vec![(0, job(1)), (1, job(2)), (2, job(3))]]);
        let leases = |jobs: Vec<ClaimedJob>| jobs.iter().map(|j| j.run_lease.0).collect::<Vec<_>>();
        assert_eq!(leases(dealt.take(pb)), [3]);
        assert_eq!(leases(dealt.take(pa)), [1, 2]);
        assert!(dealt.rest().is_empty());
    }

    #[test]
    fn jobs_of_placements_nobody_took_are_left_to_give_back() {
        let a = ask(&["q"], "a", 2, None);
        let mut plan = ClaimPlan::new(10);
        plan.place(&a).unwrap();
        let dealt = plan.deal(vec![vec![(0, job(1)), (1, job(2))]]);
        assert_eq!(dealt.rest().len(), 2);
    }

    #[test]
    fn time_left_bands_are_few_and_never_above_the_value() {
        let mut bands = std::collections::BTreeSet::new();
        for ms in (0..100_000u64).chain((100_000..=86_400_000).step_by(997)) {
            let band = time_left_band(ms);
            assert!(band <= ms && band * 5 >= ms * 4, "{ms} -> {band}");
            bands.insert(band);
        }
        assert!(bands.len() < 110, "{} bands", bands.len());
        // 2,000 distinct values of a hostile client fall into a few dozen bands.
        let hostile: std::collections::BTreeSet<u64> = (1..=2000).map(time_left_band).collect();
        assert!(hostile.len() <= 40, "{} bands", hostile.len());
        assert_eq!(time_left_band(300_000), 262_144);
        assert_eq!(time_left_band(7), 7);
    }
}
