//! Calendar windows: boundaries at midnight of the zone (DST days of 23 and 25 hours, months of
//! 28 to 31 days, ISO weeks from Monday), and a FixedWindow on a manual clock that resets on them.
#![cfg(feature = "calendar")]

use std::time::Duration;

use tollgate::{Calendar, CalendarUnit, FixedWindow, Limiter, ManualClock};

const S: u64 = 1_000_000_000;

/// Seconds since the epoch of a UTC date and time.
fn utc(text: &str) -> u64 {
    let t: jiff::Timestamp = text.parse().unwrap();
    t.as_second() as u64
}

fn window(unit: CalendarUnit, zone: &str, at: &str) -> (u64, u64) {
    let (start, end) = Calendar::new(unit, zone).unwrap().window_at(utc(at) * S);
    (start / S, end / S)
}

#[test]
fn days_follow_the_zones_midnight_across_dst() {
    // Berlin springs forward on 2026-03-29: that day has 23 hours, 2026-10-25 has 25.
    let spring = window(CalendarUnit::Day, "Europe/Berlin", "2026-03-29T12:00:00Z");
    assert_eq!(spring, (utc("2026-03-28T23:00:00Z"), utc("2026-03-29T22:00:00Z")));
    assert_eq!(spring.1 - spring.0, 23 * 3600);
    let fall = window(CalendarUnit::Day, "Europe/Berlin", "2026-10-25T12:00:00Z");
    assert_eq!(fall.1 - fall.0, 25 * 3600);
    // 23:30 UTC on the 28th is already the 29th in Berlin.
    assert_eq!(window(CalendarUnit::Day, "Europe/Berlin", "2026-03-28T23:30:00Z"), spring);
    assert_eq!(
        window(CalendarUnit::Day, "UTC", "2026-11-24T02:00:00Z"),
        (utc("2026-11-24T00:00:00Z"), utc("2026-11-25T00:00:00Z"))
    );
}

#[test]
fn months_have_their_own_lengths_and_weeks_start_on_monday() {
    let days = |at: &str| {
        let (start, end) = window(CalendarUnit::Month, "UTC", at);
        (end - start) / 86_400
    };
    assert_eq!(days("2026-01-31T23:59:59Z"), 31);
    assert_eq!(days("2026-02-10T00:00:00Z"), 28);
    assert_eq!(days("2028-02-29T12:00:00Z"), 29, "leap year");
    assert_eq!(days("2026-04-30T00:00:00Z"), 30);
    assert_eq!(
        window(CalendarUnit::Month, "America/New_York", "2026-03-01T03:00:00Z"),
        (utc("2026-02-01T05:00:00Z"), utc("2026-03-01T05:00:00Z")),
        "22:00 on Feb 28 in New York is still February"
    );
    // 2026-11-24 is a Tuesday; its week began on Monday the 23rd.
    assert_eq!(
        window(CalendarUnit::Week, "UTC", "2026-11-24T10:00:00Z"),
        (utc("2026-11-23T00:00:00Z"), utc("2026-11-30T00:00:00Z"))
    );
    assert_eq!(window(CalendarUnit::Week, "UTC", "2026-11-23T00:00:00Z").0, utc("2026-11-23T00:00:00Z"));
}

#[test]
fn a_monthly_window_resets_at_midnight_utc_on_the_first() {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(utc("2026-02-27T08:00:00Z")));
    let month = Calendar::new(CalendarUnit::Month, "UTC").unwrap();
    let limiter = Limiter::builder(FixedWindow::calendar(10, month, &clock).unwrap()).clock(clock.clone()).build();
    let first = limiter.try_acquire(7).unwrap();
    assert_eq!(first.meta().reset_ns / S, utc("2026-03-01T00:00:00Z") - utc("2026-02-27T08:00:00Z"));
    drop(first);
    clock.advance(Duration::from_secs(utc("2026-02-28T23:59:59Z") - utc("2026-02-27T08:00:00Z")));
    assert!(limiter.try_acquire(3).is_ok());
    let no = limiter.try_acquire(1).unwrap_err();
    assert_eq!(no.retry_after(), Some(Duration::from_secs(1)));
    clock.advance(Duration::from_secs(1));
    let march = limiter.try_acquire(10).unwrap();
    assert_eq!(march.meta().reset_ns / S, 31 * 86_400, "March has 31 days");
    // The window does not slide: 10 more only on April 1st.
    clock.advance(Duration::from_secs(31 * 86_400 - 1));
    assert!(limiter.try_acquire(1).is_err());
    clock.advance(Duration::from_secs(1));
    assert!(limiter.try_acquire(10).is_ok());
}

#[test]
fn seconds_minutes_and_hours_start_on_the_clocks_whole_ones() {
    assert_eq!(
        window(CalendarUnit::Minute, "UTC", "2026-11-24T10:17:42Z"),
        (utc("2026-11-24T10:17:00Z"), utc("2026-11-24T10:18:00Z"))
    );
    assert_eq!(
        window(CalendarUnit::Hour, "UTC", "2026-11-24T10:17:42Z"),
        (utc("2026-11-24T10:00:00Z"), utc("2026-11-24T11:00:00Z"))
    );
    assert_eq!(
        window(CalendarUnit::Second, "UTC", "2026-11-24T10:17:42Z"),
        (utc("2026-11-24T10:17:42Z"), utc("2026-11-24T10:17:43Z"))
    );
    // In UTC they are multiples of the unit since the epoch: what `now / unit` gives.
    for at in ["1970-01-01T00:00:00Z", "2026-02-28T23:59:59Z", "2031-07-09T04:05:06Z"] {
        for (unit, secs) in [(CalendarUnit::Second, 1), (CalendarUnit::Minute, 60), (CalendarUnit::Hour, 3600)] {
            let t = utc(at);
            assert_eq!(window(unit, "UTC", at), (t / secs * secs, t / secs * secs + secs), "{unit:?} at {at}");
        }
    }
    // India is 5:30 ahead of UTC: its hours start at half past in UTC.
    assert_eq!(
        window(CalendarUnit::Hour, "Asia/Kolkata", "2026-11-24T10:17:42Z"),
        (utc("2026-11-24T09:30:00Z"), utc("2026-11-24T10:30:00Z"))
    );
    // New York's clock repeats 01:00-02:00 on 2026-11-01: each repeat is an hour of its own.
    let first = window(CalendarUnit::Hour, "America/New_York", "2026-11-01T05:30:00Z");
    let second = window(CalendarUnit::Hour, "America/New_York", "2026-11-01T06:30:00Z");
    assert_eq!(first, (utc("2026-11-01T05:00:00Z"), utc("2026-11-01T06:00:00Z")));
    assert_eq!(second, (utc("2026-11-01T06:00:00Z"), utc("2026-11-01T07:00:00Z")));
    assert_eq!(CalendarUnit::from_name("minute"), Some(CalendarUnit::Minute));
    assert_eq!(Calendar::new(CalendarUnit::Hour, "UTC").unwrap().nominal(), Duration::from_secs(3600));
}

#[test]
fn a_minute_window_resets_on_the_minute() {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(utc("2026-02-27T08:00:50Z")));
    let minute = Calendar::new(CalendarUnit::Minute, "UTC").unwrap();
    let limiter = Limiter::builder(FixedWindow::calendar(2, minute, &clock).unwrap()).clock(clock.clone()).build();
    assert_eq!(limiter.try_acquire(2).unwrap().meta().reset_ns / S, 10);
    assert_eq!(limiter.try_acquire(1).unwrap_err().retry_after(), Some(Duration::from_secs(10)));
    clock.advance(Duration::from_secs(10));
    assert!(limiter.try_acquire(2).is_ok(), "a new minute at 08:01:00, not 60 s after the first hit");
}
