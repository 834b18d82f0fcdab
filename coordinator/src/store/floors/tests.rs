//! The claim floors' rules, one at a time, without a database.

use super::*;

fn key(priority: i32, secs: i64, id: u128) -> ClaimKey {
    ClaimKey {
        priority,
        run_at: DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap(),
        id: Uuid::from_u128(id),
    }
}

fn read(queue: &str, first: Option<ClaimKey>, at_secs: i64) -> Found {
    Found {
        queue: queue.into(),
        first,
        at: DateTime::from_timestamp(1_800_000_000 + at_secs, 0).unwrap(),
    }
}

#[test]
fn a_read_moves_the_floor_no_later_than_the_margin_before_it() {
    let floors = ClaimFloors::new();
    let taken = floors.take(&["q"]);
    assert_eq!(taken[0].floor, None);
    // A backlog: the first claimable job is older than the margin.
    floors.found(&taken, &[read("q", Some(key(0, 10, 7)), 100)]);
    assert_eq!(floors.take(&["q"])[0].floor, Some(key(0, 10, 7)));
    // A fresh job: the floor stops a margin before the read.
    let taken = floors.take(&["q"]);
    floors.found(&taken, &[read("q", Some(key(0, 100, 9)), 100)]);
    let floor = floors.take(&["q"])[0].floor.unwrap();
    assert_eq!(floor, key(0, 99, 0));
    // Nothing claimable: the floor stays where it was.
    let taken = floors.take(&["q"]);
    floors.found(&taken, &[read("q", None, 200)]);
    assert_eq!(floors.take(&["q"])[0].floor, Some(floor));
}

#[test]
fn a_keyed_wake_up_lowers_the_floor_and_the_reads_under_way() {
    let floors = ClaimFloors::new();
    let taken = floors.take(&["q"]);
    floors.found(&taken, &[read("q", Some(key(5, 10, 1)), 100)]);
    // An urgent job sorts below the floor: the floor follows it.
    floors.wrote("q", Some(key(0, 50, 2)));
    assert_eq!(floors.take(&["q"])[0].floor, Some(key(0, 50, 2)));
    // A read that began before another urgent write and did not see it
    // moves the floor no higher than that write.
    let taken = floors.take(&["q"]);
    floors.wrote("q", Some(key(1, 60, 3)));
    floors.found(&taken, &[read("q", Some(key(5, 20, 4)), 100)]);
    assert_eq!(floors.take(&["q"])[0].floor, Some(key(1, 60, 3)));
    // A later job does not move the floor.
    floors.wrote("q", Some(key(5, 99, 5)));
    assert_eq!(floors.take(&["q"])[0].floor, Some(key(1, 60, 3)));
}

#[test]
fn a_wake_up_without_a_key_drops_the_floor_and_the_reads_under_way() {
    let floors = ClaimFloors::new();
    let taken = floors.take(&["q", "r"]);
    floors.found(
        &taken,
        &[
            read("q", Some(key(0, 10, 1)), 100),
            read("r", Some(key(0, 10, 1)), 100),
        ],
    );
    let taken = floors.take(&["q", "r"]);
    floors.wrote("q", None);
    assert_eq!(floors.take(&["q"])[0].floor, None);
    floors.found(
        &taken,
        &[
            read("q", Some(key(0, 20, 2)), 100),
            read("r", Some(key(0, 20, 2)), 100),
        ],
    );
    assert_eq!(floors.take(&["q"])[0].floor, None, "the read missed the write");
    assert_eq!(
        floors.take(&["r"])[0].floor,
        Some(key(0, 20, 2)),
        "another queue's write"
    );
    // More keyed wake-ups than are kept: the read cannot know them all.
    let taken = floors.take(&["r"]);
    for i in 0..=RECENT_WRITES as u128 {
        floors.wrote("r", Some(key(0, 30, i)));
    }
    floors.found(&taken, &[read("r", Some(key(0, 40, 2)), 100)]);
    assert_eq!(floors.take(&["r"])[0].floor, Some(key(0, 20, 2)));
    floors.forget_all();
    assert_eq!(floors.take(&["r"])[0].floor, None);
}

#[test]
fn not_hearing_every_coordinator_means_no_floors() {
    let floors = ClaimFloors::new();
    let taken = floors.take(&["q"]);
    floors.found(&taken, &[read("q", Some(key(0, 10, 1)), 100)]);
    floors.hearing(false);
    let taken = floors.take(&["q"]);
    assert_eq!(taken[0].floor, None);
    assert!(!taken[0].reads_after());
    floors.hearing(true);
    assert!(floors.take(&["q"])[0].reads_after());
}

#[test]
fn a_full_scan_lowers_a_floor_a_job_sorts_below_and_counts_it() {
    let floors = ClaimFloors::new();
    let taken = floors.take(&["q"]);
    floors.found(&taken, &[read("q", Some(key(0, 10, 1)), 100)]);
    let before = floors.floored();
    assert_eq!(floors.lower(&before, &[read("q", Some(key(0, 20, 1)), 100)]), 0);
    assert_eq!(floors.lower(&before, &[read("q", Some(key(-1, 20, 1)), 100)]), 1);
    assert_eq!(floors.take(&["q"])[0].floor, Some(key(-1, 20, 1)));
    // A job below a floor raised during the scan, not below the one
    // before it, was claimable when the scan read it: no miss.
    let before = floors.floored();
    let taken = floors.take(&["q"]);
    floors.found(&taken, &[read("q", Some(key(0, 50, 1)), 100)]);
    assert_eq!(floors.lower(&before, &[read("q", Some(key(0, 30, 1)), 100)]), 0);
    assert_eq!(floors.take(&["q"])[0].floor, Some(key(0, 50, 1)));
}

#[test]
fn queues_beyond_the_cap_have_no_floor() {
    let floors = ClaimFloors::new();
    let names: Vec<String> = (0..MAX_QUEUES).map(|i| format!("q{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    assert!(floors.take(&refs).iter().all(Taken::reads_after));
    assert!(!floors.take(&["one-more"])[0].reads_after());
}

fn names(queues: &[&str]) -> Vec<QueueName> {
    queues
        .iter()
        .map(|q| QueueName::new((*q).to_owned()).unwrap())
        .collect()
}

#[test]
fn a_read_that_finds_nothing_marks_the_queue_empty_until_a_wake_up() {
    let floors = ClaimFloors::new();
    assert!(!floors.empty(&names(&["q"])), "never read");
    let taken = floors.take(&["q", "r"]);
    floors.found(
        &taken,
        &[read("q", None, 100), read("r", Some(key(0, 10, 1)), 100)],
    );
    assert!(floors.empty(&names(&["q"])));
    assert!(!floors.empty(&names(&["r"])), "r holds a job");
    assert!(!floors.empty(&names(&["q", "r"])), "a claim of both may find r's");
    // Any wake-up of the queue clears the mark, with a key or without.
    floors.wrote("q", Some(key(0, 20, 2)));
    assert!(!floors.empty(&names(&["q"])));
    let taken = floors.take(&["q"]);
    floors.found(&taken, &[read("q", None, 200)]);
    assert!(floors.empty(&names(&["q"])));
    floors.wrote("q", None);
    assert!(!floors.empty(&names(&["q"])));
    // A read that another queue's wake-up passed still marks its own.
    let taken = floors.take(&["q"]);
    floors.wrote("r", None);
    floors.found(&taken, &[read("q", None, 300)]);
    assert!(floors.empty(&names(&["q"])));
    floors.forget_all();
    assert!(!floors.empty(&names(&["q"])));
}

#[test]
fn a_read_that_a_wake_up_passed_marks_nothing() {
    let floors = ClaimFloors::new();
    // A keyed wake-up while the read was under way: the job it announced
    // may have been committed after the read's snapshot.
    let taken = floors.take(&["q"]);
    floors.wrote("q", Some(key(0, 10, 1)));
    floors.found(&taken, &[read("q", None, 100)]);
    assert!(!floors.empty(&names(&["q"])));
    // One without a key.
    let taken = floors.take(&["q"]);
    floors.wrote("q", None);
    floors.found(&taken, &[read("q", None, 100)]);
    assert!(!floors.empty(&names(&["q"])));
    // Not hearing every coordinator: no marks, and none kept.
    let taken = floors.take(&["q"]);
    floors.found(&taken, &[read("q", None, 100)]);
    assert!(floors.empty(&names(&["q"])));
    floors.hearing(false);
    assert!(!floors.empty(&names(&["q"])));
    floors.hearing(true);
    assert!(!floors.empty(&names(&["q"])));
}

#[test]
fn a_full_scan_clears_an_empty_mark_a_job_contradicts_and_counts_it() {
    let floors = ClaimFloors::new();
    let taken = floors.take(&["q", "r", "s"]);
    floors.found(
        &taken,
        &[read("q", None, 100), read("r", None, 100), read("s", None, 100)],
    );
    let before = floors.floored();
    assert_eq!(before.len(), 3, "marked queues are scanned");
    // q: an old job the mark stood over (a miss); r: still empty; s: a job
    // due just before the scan read it (its wake-up may be on its way):
    // its mark goes, uncounted.
    assert_eq!(
        floors.lower(
            &before,
            &[
                read("q", Some(key(0, 20, 1)), 100),
                read("r", None, 100),
                read("s", Some(key(0, 100, 1)), 100),
            ]
        ),
        1
    );
    assert!(!floors.empty(&names(&["q"])));
    assert!(floors.empty(&names(&["r"])));
    assert!(!floors.empty(&names(&["s"])));
    // A mark cleared and set again during the scan (the job the scan saw
    // was claimed meanwhile): it goes, uncounted.
    let before = floors.floored();
    floors.wrote("r", None);
    let taken = floors.take(&["r"]);
    floors.found(&taken, &[read("r", None, 200)]);
    assert_eq!(floors.lower(&before, &[read("r", Some(key(0, 20, 2)), 200)]), 0);
    assert!(!floors.empty(&names(&["r"])));
}
