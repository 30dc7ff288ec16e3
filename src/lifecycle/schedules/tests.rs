use super::*;
use crate::model::schedule::{parse_cron, parse_every, parse_zone};

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn every_second() -> Timing {
    Timing::Every {
        anchor: at("2026-01-01T00:00:00Z"),
        every: parse_every("1s").unwrap(),
    }
}

#[test]
fn none_creates_what_is_within_the_grace() {
    let t = every_second();
    let p = plan(
        &t,
        CatchUp::None,
        100,
        at("2026-01-01T00:00:00Z"),
        at("2026-01-01T00:00:03Z"),
    );
    assert_eq!(
        p.create,
        vec![
            at("2026-01-01T00:00:01Z"),
            at("2026-01-01T00:00:02Z"),
            at("2026-01-01T00:00:03Z")
        ]
    );
    assert_eq!(p.skipped, None);
    // A minute later: only the last ten seconds.
    let p = plan(
        &t,
        CatchUp::None,
        100,
        at("2026-01-01T00:00:03Z"),
        at("2026-01-01T00:01:03Z"),
    );
    assert_eq!(p.create.len(), 10);
    assert_eq!(p.create[0], at("2026-01-01T00:00:54Z"));
    assert_eq!(
        p.skipped,
        Some((at("2026-01-01T00:00:04Z"), at("2026-01-01T00:00:53Z")))
    );
    assert_eq!(p.newest, Some(at("2026-01-01T00:01:03Z")));
}

#[test]
fn none_skips_a_daily_occurrence_long_past() {
    let t = Timing::Cron(Box::new(parse_cron("@daily").unwrap()), parse_zone("UTC").unwrap());
    let p = plan(
        &t,
        CatchUp::None,
        100,
        at("2026-01-01T12:00:00Z"),
        at("2026-01-02T01:00:00Z"),
    );
    assert!(p.create.is_empty());
    let midnight = at("2026-01-02T00:00:00Z");
    assert_eq!(p.skipped, Some((midnight, midnight)), "the occurrence past the grace");
    assert_eq!(p.newest, Some(midnight), "the mark moves over it");
    let nothing = plan(
        &t,
        CatchUp::None,
        100,
        at("2026-01-02T00:00:00Z"),
        at("2026-01-02T01:00:00Z"),
    );
    assert_eq!(nothing, Plan::default());
}

#[test]
fn last_creates_the_newest_only() {
    let t = Timing::Cron(Box::new(parse_cron("0 * * * *").unwrap()), parse_zone("UTC").unwrap());
    let p = plan(
        &t,
        CatchUp::Last,
        100,
        at("2026-01-01T00:00:00Z"),
        at("2026-01-01T05:10:00Z"),
    );
    assert_eq!(p.create, vec![at("2026-01-01T05:00:00Z")]);
    assert_eq!(
        p.skipped,
        Some((at("2026-01-01T01:00:00Z"), at("2026-01-01T04:00:00Z")))
    );
}

#[test]
fn all_creates_each_up_to_the_bound() {
    let t = Timing::Cron(Box::new(parse_cron("0 * * * *").unwrap()), parse_zone("UTC").unwrap());
    let p = plan(
        &t,
        CatchUp::All,
        100,
        at("2026-01-01T00:00:00Z"),
        at("2026-01-01T03:00:00Z"),
    );
    assert_eq!(
        p.create,
        vec![
            at("2026-01-01T01:00:00Z"),
            at("2026-01-01T02:00:00Z"),
            at("2026-01-01T03:00:00Z")
        ]
    );
    assert_eq!(p.skipped, None);
    let p = plan(
        &t,
        CatchUp::All,
        2,
        at("2026-01-01T00:00:00Z"),
        at("2026-01-01T05:30:00Z"),
    );
    assert_eq!(p.create, vec![at("2026-01-01T04:00:00Z"), at("2026-01-01T05:00:00Z")]);
    assert_eq!(
        p.skipped,
        Some((at("2026-01-01T01:00:00Z"), at("2026-01-01T03:00:00Z")))
    );
}

#[test]
fn all_walks_each_step_from_the_mark_and_a_walk_too_long_skips() {
    let t = every_second();
    let day = plan(
        &t,
        CatchUp::All,
        100,
        at("2026-01-01T00:00:00Z"),
        at("2026-01-02T00:00:00Z"),
    );
    assert_eq!(day.create.len(), 100);
    assert_eq!(day.create[99], at("2026-01-02T00:00:00Z"));
    assert_eq!(
        day.skipped,
        Some((at("2026-01-01T00:00:01Z"), at("2026-01-01T23:58:20Z")))
    );
    let far = plan(
        &t,
        CatchUp::All,
        100,
        at("2026-01-01T00:00:00Z"),
        at("2026-01-10T00:00:00Z"),
    );
    let stop = at("2026-01-01T00:00:00Z")
        .checked_add(SignedDuration::from_secs(MAX_STEPS as i64))
        .unwrap();
    assert_eq!(
        (far.create.len(), far.newest),
        (0, Some(stop)),
        "the next look goes on from there"
    );
    assert_eq!(far.skipped, Some((at("2026-01-01T00:00:01Z"), stop)));
}

#[test]
fn all_across_a_dst_change_in_berlin() {
    // 2026-03-29 in Berlin: 02:00 CET becomes 03:00 CEST; hourly from 00:00 to 04:00 local.
    let t = Timing::Cron(
        Box::new(parse_cron("0 * * * *").unwrap()),
        parse_zone("Europe/Berlin").unwrap(),
    );
    let p = plan(
        &t,
        CatchUp::All,
        100,
        at("2026-03-28T22:30:00Z"),
        at("2026-03-29T02:00:00Z"),
    );
    assert_eq!(
        p.create,
        vec![
            at("2026-03-28T23:00:00Z"),
            at("2026-03-29T00:00:00Z"),
            at("2026-03-29T01:00:00Z"),
            at("2026-03-29T02:00:00Z")
        ],
        "00:00, 01:00, 03:00 and 04:00 local: no 02:00"
    );
    // 2026-10-25: 03:00 CEST becomes 02:00 CET; 02:00 local happens twice.
    let p = plan(
        &t,
        CatchUp::All,
        100,
        at("2026-10-24T23:30:00Z"),
        at("2026-10-25T02:00:00Z"),
    );
    assert_eq!(
        p.create,
        vec![
            at("2026-10-25T00:00:00Z"),
            at("2026-10-25T01:00:00Z"),
            at("2026-10-25T02:00:00Z")
        ],
        "02:00 CEST, 02:00 CET, 03:00 CET"
    );
}

#[test]
fn keys_name_the_schedule_and_the_time_in_utc() {
    assert_eq!(
        occurrence_key("nightly", at("2026-03-08T06:30:00Z")),
        "schedule:nightly:2026-03-08T06:30:00Z"
    );
}

#[test]
fn a_resume_moves_the_mark_past_the_pause() {
    let now = at("2026-01-02T00:00:00Z");
    let def = Schedule {
        name: "s".into(),
        queue: ObjectId::new(),
        params: bson::Document::new(),
        cron: None,
        every: Some("1s".into()),
        timezone: "UTC".into(),
        catch_up: CatchUp::All,
        catch_up_limit: 100,
        overlap: Overlap::Allow,
        paused: false,
        anchor: date(at("2026-01-01T00:00:00Z")),
    };
    assert_eq!(
        mark_on_write(None, &def, now).unwrap().last,
        date(now),
        "new: starts now"
    );
    let paused = ScheduleRecord {
        schedule: Schedule {
            paused: true,
            ..def.clone()
        },
        mark: ScheduleMark {
            last: date(at("2026-01-01T00:00:00Z")),
            task: None,
        },
    };
    assert_eq!(
        mark_on_write(Some(&paused), &def, now).unwrap().last,
        date(now),
        "resumed"
    );
    let running = ScheduleRecord {
        schedule: def.clone(),
        mark: paused.mark.clone(),
    };
    assert_eq!(
        mark_on_write(Some(&running), &def, now),
        None,
        "a change keeps the mark"
    );
    let retimed = Schedule {
        every: Some("5s".into()),
        ..def.clone()
    };
    assert_eq!(
        mark_on_write(Some(&running), &retimed, now).unwrap().last,
        date(now),
        "new times"
    );
    let moved = Schedule {
        queue: ObjectId::new(),
        ..def.clone()
    };
    assert_eq!(
        mark_on_write(Some(&running), &moved, now).unwrap().last,
        date(now),
        "another queue: no occurrence handled in the old one is created again in the new one"
    );
}

/// The occurrences a leader looking every 997 ms (so at every fraction of a second) from
/// `from` to `to` creates, its mark starting at `mark` and moving as [`run_schedule`]
/// moves it.
fn looked_at_each_tick(t: &Timing, catch_up: CatchUp, mark: &str, from: &str, to: &str) -> Vec<Timestamp> {
    let (mut last, mut now, to) = (at(mark), at(from), at(to));
    let mut created = Vec::new();
    while now <= to {
        let p = plan(t, catch_up, 100, last, now);
        created.extend(&p.create);
        if let Some(newest) = p.newest {
            last = newest;
        }
        now = now.checked_add(SignedDuration::from_millis(997)).unwrap();
    }
    created
}

fn cron_in(expr: &str, zone: &str) -> Timing {
    Timing::Cron(Box::new(parse_cron(expr).unwrap()), parse_zone(zone).unwrap())
}

#[test]
fn a_weekday_schedule_looked_at_every_fraction_of_a_second_fires_on_weekdays_only() {
    // Friday 2026-01-02 to Monday 2026-01-05, 09:00 UTC each weekday.
    let t = cron_in("0 9 * * 1-5", "UTC");
    for (from, to, want) in [
        (
            "2026-01-02T08:59:30Z",
            "2026-01-02T09:00:30Z",
            vec![at("2026-01-02T09:00:00Z")],
        ),
        ("2026-01-03T08:59:30Z", "2026-01-03T09:00:30Z", vec![]),
        ("2026-01-04T08:59:30Z", "2026-01-04T09:00:30Z", vec![]),
        (
            "2026-01-05T08:59:30Z",
            "2026-01-05T09:00:30Z",
            vec![at("2026-01-05T09:00:00Z")],
        ),
    ] {
        for catch_up in [CatchUp::None, CatchUp::Last, CatchUp::All] {
            let mark = at(from)
                .checked_add(SignedDuration::from_millis(123))
                .unwrap()
                .to_string();
            assert_eq!(
                looked_at_each_tick(&t, catch_up, &mark, from, to),
                want,
                "{from} with {catch_up:?}"
            );
        }
    }
}

#[test]
fn daylight_saving_changes_looked_at_every_fraction_of_a_second_with_catch_up_none() {
    // New York, 2026-11-01: 01:00–02:00 happens twice; a daily 01:30 fires once, in EST.
    let fall = cron_in("30 1 * * *", "America/New_York");
    assert_eq!(
        looked_at_each_tick(
            &fall,
            CatchUp::None,
            "2026-10-31T05:30:00Z",
            "2026-11-01T05:20:00Z",
            "2026-11-01T06:40:00Z"
        ),
        vec![at("2026-11-01T06:30:00Z")],
        "the daily 01:30 on the day the clocks go back"
    );
    // 2026-03-08: 02:00–03:00 does not happen; a daily 02:30 fires at 03:30 EDT.
    let spring = cron_in("30 2 * * *", "America/New_York");
    assert_eq!(
        looked_at_each_tick(
            &spring,
            CatchUp::None,
            "2026-03-07T07:30:00Z",
            "2026-03-08T06:50:00Z",
            "2026-03-08T07:40:00Z"
        ),
        vec![at("2026-03-08T07:30:00Z")],
        "the daily 02:30 on the day the clocks go forward"
    );
}
