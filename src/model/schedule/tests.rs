use super::*;

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn cron(expr: &str, zone: &str) -> Timing {
    Timing::Cron(Box::new(parse_cron(expr).unwrap()), parse_zone(zone).unwrap())
}

fn sched(cron: Option<&str>, every: Option<&str>) -> Schedule {
    Schedule {
        name: "nightly".into(),
        queue: ObjectId::new(),
        params: Document::new(),
        cron: cron.map(Into::into),
        every: every.map(Into::into),
        timezone: "UTC".into(),
        catch_up: CatchUp::None,
        catch_up_limit: DEFAULT_CATCH_UP_LIMIT,
        overlap: Overlap::Allow,
        paused: false,
        anchor: date(at("2026-01-01T00:00:00Z")),
    }
}

#[test]
fn five_six_and_seven_fields_and_shorthands() {
    let t0 = at("2026-01-01T00:00:00Z");
    let five = cron("*/15 * * * *", "UTC");
    assert_eq!(
        five.upcoming(t0, 2),
        vec![at("2026-01-01T00:15:00Z"), at("2026-01-01T00:30:00Z")]
    );
    let six = cron("30 * * * * *", "UTC");
    assert_eq!(
        six.upcoming(t0, 2),
        vec![at("2026-01-01T00:00:30Z"), at("2026-01-01T00:01:30Z")]
    );
    let seven = cron("0 0 12 1 1 * 2027", "UTC");
    assert_eq!(seven.upcoming(t0, 2), vec![at("2027-01-01T12:00:00Z")]);
    let hourly = cron("@hourly", "UTC");
    assert_eq!(hourly.next_after(t0), Some(at("2026-01-01T01:00:00Z")));
    let daily = cron("@daily", "Europe/Berlin");
    assert_eq!(
        daily.next_after(t0),
        Some(at("2026-01-01T23:00:00Z")),
        "midnight in Berlin"
    );
    assert_eq!(parse_cron("* * *").unwrap_err().field, "cron");
    assert_eq!(parse_cron("61 * * * *").unwrap_err().field, "cron");
}

#[test]
fn intervals_count_from_the_anchor() {
    let t = Timing::Every {
        anchor: at("2026-01-01T00:00:00Z"),
        every: parse_every("1h30m").unwrap(),
    };
    assert_eq!(
        t.next_after(at("2025-12-31T00:00:00Z")),
        Some(at("2026-01-01T00:00:00Z"))
    );
    assert_eq!(
        t.next_after(at("2026-01-01T00:00:00Z")),
        Some(at("2026-01-01T01:30:00Z"))
    );
    assert_eq!(
        t.next_after(at("2026-01-01T01:29:59Z")),
        Some(at("2026-01-01T01:30:00Z"))
    );
    assert_eq!(
        t.upcoming(at("2026-01-01T00:00:00Z"), 2),
        vec![at("2026-01-01T01:30:00Z"), at("2026-01-01T03:00:00Z")]
    );
    for (text, secs) in [("30s", 30), ("5m", 300), ("2h", 7200), ("1d", 86400), ("PT5M", 300)] {
        assert_eq!(parse_every(text).unwrap(), SignedDuration::from_secs(secs), "{text}");
    }
    for text in ["0s", "-5s", "500ms", "1.5s", "5", "1mo", "soon"] {
        assert_eq!(parse_every(text).unwrap_err().field, "every", "{text}");
    }
}

#[test]
fn checks_name_each_field() {
    let now = at("2026-01-01T00:00:00Z");
    assert!(sched(Some("@daily"), None).timing(now).is_ok());
    assert_eq!(sched(None, None).timing(now).unwrap_err().field, "cron");
    assert_eq!(sched(Some("@daily"), Some("5m")).timing(now).unwrap_err().field, "cron");
    let never = sched(Some("0 0 0 30 2 *"), None).timing(now).unwrap_err();
    assert_eq!((never.field, never.message.contains("never fires")), ("cron", true));
    let past = sched(Some("0 0 0 1 1 * 2020"), None).timing(now).unwrap_err();
    assert_eq!(past.field, "cron");
    let mut zone = sched(Some("@daily"), None);
    zone.timezone = "Mars/Olympus".into();
    assert_eq!(zone.timing(now).unwrap_err().field, "timezone");
    let mut limit = sched(None, Some("5m"));
    limit.catch_up_limit = 0;
    assert_eq!(limit.timing(now).unwrap_err().field, "catch_up_limit");
    let mut name = sched(None, Some("5m"));
    name.name = "a b".into();
    assert_eq!(name.timing(now).unwrap_err().field, "name");
}

// Daylight-saving changes, walked from the previous occurrence as the leader walks them.

#[test]
fn spring_forward_shifts_a_time_in_the_missing_hour() {
    // 2026-03-08 in New York: 02:00 EST becomes 03:00 EDT.
    let daily = cron("30 2 * * *", "America/New_York");
    assert_eq!(
        daily.upcoming(at("2026-03-07T07:30:00Z"), 2),
        vec![at("2026-03-08T07:30:00Z"), at("2026-03-09T06:30:00Z")],
        "02:30 does not exist on March 8: it fires at 03:30 EDT, then 02:30 EDT"
    );
    let hourly = cron("0 * * * *", "America/New_York");
    assert_eq!(
        hourly.upcoming(at("2026-03-08T05:00:00Z"), 2),
        vec![at("2026-03-08T06:00:00Z"), at("2026-03-08T07:00:00Z")],
        "01:00 EST, then 03:00 EDT: no 02:00"
    );
}

#[test]
fn fall_back_fires_a_daily_time_once_and_finer_ones_twice() {
    // 2026-11-01 in New York: 02:00 EDT becomes 01:00 EST; 01:00–02:00 happens twice.
    let daily = cron("30 1 * * *", "America/New_York");
    assert_eq!(
        daily.upcoming(at("2026-10-31T05:30:00Z"), 2),
        vec![at("2026-11-01T06:30:00Z"), at("2026-11-02T06:30:00Z")],
        "a daily 01:30 fires once, at the second 01:30 (EST)"
    );
    let half_hourly = cron("*/30 * * * *", "America/New_York");
    assert_eq!(
        half_hourly.upcoming(at("2026-11-01T04:30:00Z"), 5),
        vec![
            at("2026-11-01T05:00:00Z"),
            at("2026-11-01T05:30:00Z"),
            at("2026-11-01T06:00:00Z"),
            at("2026-11-01T06:30:00Z"),
            at("2026-11-01T07:00:00Z"),
        ],
        "01:00 and 01:30 in EDT, then again in EST"
    );
}

#[test]
fn a_definition_round_trips_through_bson() {
    let s = sched(Some("@daily"), None);
    let d = bson::to_document(&s).unwrap();
    assert_eq!(d.get_str("catch_up").unwrap(), "none");
    assert_eq!(bson::from_document::<Schedule>(d).unwrap(), s);
}

#[test]
fn days_of_the_week_are_crontabs() {
    // 2026-01-05 is a Monday.
    let t0 = at("2026-01-04T12:00:00Z");
    let weekdays = cron("0 9 * * 1-5", "UTC");
    assert_eq!(
        weekdays.upcoming(t0, 6),
        ["05", "06", "07", "08", "09", "12"].map(|d| at(&format!("2026-01-{d}T09:00:00Z"))),
        "Monday to Friday"
    );
    for sunday in ["0 9 * * 0", "0 9 * * 7", "0 9 * * SUN", "0 0 9 * * 0"] {
        assert_eq!(
            cron(sunday, "UTC").next_after(t0),
            Some(at("2026-01-11T09:00:00Z")),
            "{sunday}"
        );
    }
    let weekend = cron("0 9 * * 5-7", "UTC");
    assert_eq!(
        weekend.upcoming(t0, 3),
        ["09", "10", "11"].map(|d| at(&format!("2026-01-{d}T09:00:00Z"))),
        "Friday to Sunday"
    );
    let names = cron("0 9 * * MON-FRI", "UTC");
    assert_eq!(names.next_after(t0), Some(at("2026-01-05T09:00:00Z")));
    let every_other = cron("0 9 * * 1-5/2", "UTC");
    assert_eq!(
        every_other.upcoming(t0, 3),
        ["05", "07", "09"].map(|d| at(&format!("2026-01-{d}T09:00:00Z"))),
        "Monday, Wednesday, Friday"
    );
    for bad in ["0 9 * * 8", "0 9 * * 5-1", "0 9 * * 1/0"] {
        assert_eq!(parse_cron(bad).unwrap_err().field, "cron", "{bad}");
    }
}

#[test]
fn names_start_with_a_letter_or_digit() {
    for ok in ["nightly", "a.b", "0-report", "x_y"] {
        assert!(check_name(ok).is_ok(), "{ok}");
    }
    for bad in [".", "..", "-x", "_x", "", "a/b", "a b", "é"] {
        assert_eq!(check_name(bad).unwrap_err().field, "name", "{bad:?}");
    }
}

#[test]
fn a_definition_written_by_another_tool_is_read_leniently() {
    let d = bson::doc! {
        "name": "other", "queue": bson::oid::ObjectId::new(), "cron": "@daily",
        "catch_up": "all", "catch_up_limit": 25.0_f64,
    };
    let s: Schedule = bson::from_document(d).unwrap();
    assert_eq!((s.catch_up_limit, s.timezone.as_str(), s.paused), (25, "UTC", false));
    assert_eq!(s.params, bson::Document::new());
    let d = bson::doc! { "name": "n", "queue": bson::oid::ObjectId::new(), "every": "5s", "catch_up_limit": "7" };
    assert_eq!(bson::from_document::<Schedule>(d).unwrap().catch_up_limit, 7);
    let d = bson::doc! { "name": "n", "queue": bson::oid::ObjectId::new(), "every": "5s", "catch_up_limit": 2.5_f64 };
    assert!(bson::from_document::<Schedule>(d).is_err(), "a fraction is no limit");
}
