//! Schedules: definitions written and read back the same on both stores, the mark moved
//! only by compare-and-set, and the leader's step creating each occurrence's task exactly
//! once even when two leaders run it at the same time on two store instances, or one runs
//! it again after a crash between the insert and the mark.

use disbatch::lifecycle::schedules::{occurrence_key, run_schedule, run_schedules, Occurrence};
use disbatch::model::schedule::{date, timestamp};
use disbatch::model::{CatchUp, Overlap, Schedule};
use disbatch::store::{ScheduleMark, ScheduleRecord};
use jiff::{SignedDuration, Timestamp};
use std::collections::BTreeMap;

use super::*;

on_both_stores!(
    schedules_are_written_read_and_deleted,
    a_mark_moves_only_from_the_mark_read,
    two_leaders_create_each_occurrence_once,
    a_crash_between_insert_and_mark_creates_nothing_twice,
    overlap_skip_waits_for_the_previous_task,
    daylight_saving_changes_through_a_test_clock,
    one_look_creates_at_most_a_hundred_and_the_next_goes_on,
);

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn every_second(name: &str, queue: ObjectId, anchor: Timestamp) -> Schedule {
    Schedule {
        name: name.into(),
        queue,
        params: doc! { "message": "tick", "n": 3_i64 },
        cron: None,
        every: Some("1s".into()),
        timezone: "UTC".into(),
        catch_up: CatchUp::All,
        catch_up_limit: 100,
        overlap: Overlap::Allow,
        paused: false,
        anchor: date(anchor),
    }
}

fn mark(t: Timestamp) -> ScheduleMark {
    ScheduleMark {
        last: date(t),
        task: None,
    }
}

/// The tasks of queue `q` by key, each key with how many tasks have it.
async fn keys_of(s: &dyn Store, q: ObjectId) -> BTreeMap<String, usize> {
    let filter = TaskFilter {
        queue: Some(q),
        ..TaskFilter::default()
    };
    let page = Page {
        skip: 0,
        limit: 10_000,
        oldest_first: true,
    };
    let mut keys = BTreeMap::new();
    for t in s.find_tasks(&filter, page).await.unwrap() {
        *keys.entry(t.key.unwrap_or_default()).or_insert(0) += 1;
    }
    keys
}

async fn schedules_are_written_read_and_deleted(s: Stores) {
    let q = queue(&*s.a, "sched", 1, Sort::Fifo).await;
    let t0 = at("2026-01-01T00:00:00Z");
    let mut def = every_second("b-every", q.id, t0);
    assert!(
        matches!(s.a.put_schedule(&def, None).await, Err(StoreError::Invalid(_))),
        "a new schedule needs its mark"
    );
    s.a.put_schedule(&def, Some(&mark(t0))).await.unwrap();
    let mut cron = every_second("a-cron", q.id, t0);
    cron.cron = Some("0 3 * * *".into());
    cron.every = None;
    cron.timezone = "Europe/Berlin".into();
    cron.catch_up = CatchUp::Last;
    cron.overlap = Overlap::Skip;
    cron.paused = true;
    s.a.put_schedule(&cron, Some(&mark(t0))).await.unwrap();
    let listed = s.b.schedules().await.unwrap();
    assert_eq!(
        listed,
        vec![
            ScheduleRecord {
                schedule: cron.clone(),
                mark: mark(t0)
            },
            ScheduleRecord {
                schedule: def.clone(),
                mark: mark(t0)
            },
        ],
        "by name, read back as written"
    );
    // A change of definition keeps the mark.
    let moved = ScheduleMark {
        last: date(at("2026-01-01T00:00:05Z")),
        task: Some(ObjectId::new()),
    };
    assert!(s.a.advance_schedule("b-every", date(t0), &moved).await.unwrap());
    def.params = doc! { "message": "changed" };
    s.b.put_schedule(&def, None).await.unwrap();
    let read = s.a.schedule("b-every").await.unwrap().unwrap();
    assert_eq!((read.schedule, read.mark), (def.clone(), moved.clone()));
    // A mark given never moves an existing one back (a leader may have moved it since the
    // writer read it), nor changes its task; a later one moves it up.
    s.b.put_schedule(&def, Some(&mark(t0))).await.unwrap();
    assert_eq!(s.a.schedule("b-every").await.unwrap().unwrap().mark, moved);
    let later = at("2026-01-01T00:00:09Z");
    s.b.put_schedule(&def, Some(&mark(later))).await.unwrap();
    assert_eq!(
        s.a.schedule("b-every").await.unwrap().unwrap().mark,
        ScheduleMark {
            last: date(later),
            task: moved.task
        }
    );
    assert!(s.b.delete_schedule("b-every").await.unwrap());
    assert!(!s.a.delete_schedule("b-every").await.unwrap());
    assert_eq!(s.a.schedule("b-every").await.unwrap(), None);
    assert_eq!(s.a.schedules().await.unwrap().len(), 1);
}

async fn a_mark_moves_only_from_the_mark_read(s: Stores) {
    let q = queue(&*s.a, "sched", 1, Sort::Fifo).await;
    let t0 = at("2026-01-01T00:00:00Z");
    s.a.put_schedule(&every_second("s", q.id, t0), Some(&mark(t0)))
        .await
        .unwrap();
    let one = mark(at("2026-01-01T00:00:01Z"));
    let two = mark(at("2026-01-01T00:00:02Z"));
    // Two leaders read the same mark; one moves it, the other's write changes nothing.
    let (ra, rb) = tokio::join!(
        s.a.advance_schedule("s", date(t0), &one),
        s.b.advance_schedule("s", date(t0), &two)
    );
    assert_eq!(
        [ra.unwrap(), rb.unwrap()].iter().filter(|w| **w).count(),
        1,
        "one winner"
    );
    let now = s.a.schedule("s").await.unwrap().unwrap().mark;
    assert!(now == one || now == two);
    assert!(
        !s.a.advance_schedule("gone", date(t0), &one).await.unwrap(),
        "no such schedule"
    );
}

async fn two_leaders_create_each_occurrence_once(s: Stores) {
    let q = queue(&*s.a, "sched", 1, Sort::Fifo).await;
    let t0 = at("2026-01-01T00:00:00Z");
    s.a.put_schedule(&every_second("tick", q.id, t0), Some(&mark(t0)))
        .await
        .unwrap();
    // Two leaders step through the same minute, a second at a time, side by side.
    for i in 1..=60 {
        let now = t0.checked_add(SignedDuration::from_secs(i)).unwrap();
        let (a, b) = tokio::join!(run_schedules(&*s.a, now), run_schedules(&*s.b, now));
        for (name, outcome) in a.unwrap().into_iter().chain(b.unwrap()) {
            outcome.unwrap_or_else(|e| panic!("schedule {name}: {e}"));
        }
    }
    // And both look again long after, with every occurrence handled already.
    let later = t0.checked_add(SignedDuration::from_secs(60)).unwrap();
    let again = run_schedules(&*s.b, later).await.unwrap();
    assert_eq!(again[0].1.as_ref().unwrap().occurrences, vec![]);
    let keys = keys_of(&*s.a, q.id).await;
    let expected: BTreeMap<String, usize> = (1..=60)
        .map(|i| {
            (
                occurrence_key("tick", t0.checked_add(SignedDuration::from_secs(i)).unwrap()),
                1,
            )
        })
        .collect();
    assert_eq!(keys, expected, "each second's task exactly once");
    let r = s.a.schedule("tick").await.unwrap().unwrap();
    assert_eq!(timestamp(r.mark.last), later);
    let last = s.a.task(r.mark.task.unwrap()).await.unwrap().unwrap();
    assert_eq!(last.key.as_deref(), Some(occurrence_key("tick", later).as_str()));
    assert_eq!(last.params, doc! { "message": "tick", "n": 3_i64 });
    assert_eq!(last.status, status::QUEUED);
}

async fn a_crash_between_insert_and_mark_creates_nothing_twice(s: Stores) {
    let q = queue(&*s.a, "sched", 1, Sort::Fifo).await;
    let t0 = at("2026-01-01T00:00:00Z");
    let def = every_second("tick", q.id, t0);
    s.a.put_schedule(&def, Some(&mark(t0))).await.unwrap();
    let record = s.a.schedule("tick").await.unwrap().unwrap();
    let t3 = at("2026-01-01T00:00:03Z");
    // A leader creates the three occurrences, but its marks never land (it died): the
    // next leader reads the old mark.
    let first = run_schedule(&*s.a, &record, t3).await.unwrap();
    assert_eq!(
        first
            .occurrences
            .iter()
            .filter(|o| matches!(o, Occurrence::Created(..)))
            .count(),
        3
    );
    // Its marks as they would stand had they never landed (a write never moves a mark
    // back, so the schedule is written anew).
    assert!(s.a.delete_schedule("tick").await.unwrap());
    s.a.put_schedule(&def, Some(&mark(t0))).await.unwrap();
    let stale = s.b.schedule("tick").await.unwrap().unwrap();
    let second = run_schedule(&*s.b, &stale, at("2026-01-01T00:00:04Z")).await.unwrap();
    let existed = second
        .occurrences
        .iter()
        .filter(|o| matches!(o, Occurrence::Existed(..)))
        .count();
    let created = second
        .occurrences
        .iter()
        .filter(|o| matches!(o, Occurrence::Created(..)))
        .count();
    assert_eq!((existed, created), (3, 1), "{second:?}");
    assert_eq!(keys_of(&*s.a, q.id).await.values().sum::<usize>(), 4);
    // A leader acting on a mark another moved meanwhile stops at its first write.
    let lost = run_schedule(&*s.a, &stale, at("2026-01-01T00:00:04Z")).await.unwrap();
    assert!(lost.lost);
    assert_eq!(keys_of(&*s.a, q.id).await.values().sum::<usize>(), 4);
}

async fn overlap_skip_waits_for_the_previous_task(s: Stores) {
    let q = queue(&*s.a, "sched", 1, Sort::Fifo).await;
    let t0 = at("2026-01-01T00:00:00Z");
    let mut def = every_second("tick", q.id, t0);
    def.overlap = Overlap::Skip;
    s.a.put_schedule(&def, Some(&mark(t0))).await.unwrap();
    let step = |secs: i64| t0.checked_add(SignedDuration::from_secs(secs)).unwrap();
    let run = |secs: i64| {
        let store = s.b.clone();
        async move {
            let r = store.schedule("tick").await.unwrap().unwrap();
            run_schedule(&*store, &r, step(secs)).await.unwrap()
        }
    };
    let one = run(1).await;
    let Occurrence::Created(_, first) = one.occurrences[0] else {
        panic!("{one:?}")
    };
    // Still queued at 2 and 3: both skipped, the mark moves on.
    let two = run(3).await;
    assert_eq!(
        two.occurrences,
        vec![Occurrence::Overlapped(step(2)), Occurrence::Overlapped(step(3))]
    );
    assert_eq!(
        timestamp(s.a.schedule("tick").await.unwrap().unwrap().mark.last),
        step(3)
    );
    // Once it ended, the next one is created.
    let claimed = claim_run(&*s.a, &q, "n1").await;
    assert_eq!(claimed, first);
    let out = OutputValue::Inline(String::new());
    disbatch::lifecycle::run::finish(&*s.a, first, "n1", status::SUCCEEDED, out.clone(), out)
        .await
        .unwrap();
    assert_eq!(task(&*s.a, first).await.status, status::SUCCEEDED);
    let four = run(4).await;
    assert!(
        matches!(four.occurrences[..], [Occurrence::Created(at, _)] if at == step(4)),
        "{four:?}"
    );
    assert_eq!(keys_of(&*s.a, q.id).await.len(), 2);
}

/// Steps a leader's clock from `from` to `to` by `step` seconds, looking at every schedule
/// at each step; the keys created, by schedule.
async fn step_clock(s: &dyn Store, from: &str, to: &str, step: i64) {
    let (mut now, end) = (at(from), at(to));
    while now <= end {
        for (name, outcome) in run_schedules(s, now).await.unwrap() {
            outcome.unwrap_or_else(|e| panic!("schedule {name}: {e}"));
        }
        now = now.checked_add(SignedDuration::from_secs(step)).unwrap();
    }
}

async fn daylight_saving_changes_through_a_test_clock(s: Stores) {
    let hourly_q = queue(&*s.a, "hourly", 1, Sort::Fifo).await;
    let daily_q = queue(&*s.a, "daily", 1, Sort::Fifo).await;
    let zoned = |name: &str, q: ObjectId, cron: &str| Schedule {
        cron: Some(cron.into()),
        every: None,
        timezone: "America/New_York".into(),
        ..every_second(name, q, at("2026-01-01T00:00:00Z"))
    };
    // Fall back in New York, 2026-11-01: 01:00–02:00 happens twice.
    let start = at("2026-11-01T03:30:00Z");
    s.a.put_schedule(&zoned("hourly", hourly_q.id, "0 * * * *"), Some(&mark(start)))
        .await
        .unwrap();
    // Spring forward, 2026-03-08: 02:00–03:00 does not happen.
    let spring = at("2026-03-07T12:00:00Z");
    s.a.put_schedule(&zoned("daily", daily_q.id, "30 2 * * *"), Some(&mark(spring)))
        .await
        .unwrap();
    // Two leaders' clocks, ten minutes apart in their steps, over each change.
    let (a, b) = (s.a.clone(), s.b.clone());
    tokio::join!(
        step_clock(&*a, "2026-03-07T12:00:00Z", "2026-03-10T12:00:00Z", 1800),
        step_clock(&*b, "2026-03-07T12:10:00Z", "2026-03-10T12:10:00Z", 1800),
    );
    let daily: Vec<String> = ["2026-03-08T07:30:00Z", "2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"]
        .iter()
        .map(|t| occurrence_key("daily", at(t)))
        .collect();
    assert_eq!(
        keys_of(&*s.a, daily_q.id).await,
        daily.into_iter().map(|k| (k, 1)).collect::<BTreeMap<_, _>>(),
        "02:30 on March 8 does not exist: 03:30 EDT that day, then 02:30 EDT"
    );
    assert!(s.a.delete_schedule("daily").await.unwrap());
    tokio::join!(
        step_clock(&*a, "2026-11-01T03:30:00Z", "2026-11-01T08:30:00Z", 600),
        step_clock(&*b, "2026-11-01T03:35:00Z", "2026-11-01T08:35:00Z", 600),
    );
    let hourly: Vec<String> = ["04", "05", "06", "07", "08"]
        .iter()
        .map(|h| occurrence_key("hourly", at(&format!("2026-11-01T{h}:00:00Z"))))
        .collect();
    assert_eq!(
        keys_of(&*s.a, hourly_q.id).await,
        hourly.into_iter().map(|k| (k, 1)).collect::<BTreeMap<_, _>>(),
        "00:00 EDT, 01:00 EDT, 01:00 EST, 02:00 EST, 03:00 EST: each once"
    );
}

async fn one_look_creates_at_most_a_hundred_and_the_next_goes_on(s: Stores) {
    let q = queue(&*s.a, "sched", 1, Sort::Fifo).await;
    let t0 = at("2026-01-01T00:00:00Z");
    let mut def = every_second("behind", q.id, t0);
    def.catch_up_limit = 1000;
    s.a.put_schedule(&def, Some(&mark(t0))).await.unwrap();
    // Five minutes behind: 300 occurrences due, 100 a look.
    let now = at("2026-01-01T00:05:00Z");
    for (look, created) in [(1, 100), (2, 200), (3, 300), (4, 300)] {
        let record = s.a.schedule("behind").await.unwrap().unwrap();
        run_schedule(&*s.a, &record, now).await.unwrap();
        let keys = keys_of(&*s.b, q.id).await;
        assert_eq!(keys.len(), created, "look {look}");
        assert!(keys.values().all(|n| *n == 1), "look {look}: each once");
        let mark = s.b.schedule("behind").await.unwrap().unwrap().mark;
        let want = t0.checked_add(SignedDuration::from_secs(created as i64)).unwrap();
        assert_eq!(timestamp(mark.last), want, "look {look}: the mark at the last created");
    }
}
