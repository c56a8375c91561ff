//! Calendar windows: a day, an ISO week (from Monday) or a month of a time zone, for quotas that
//! are billed that way ("1,000 per UTC day", "10,000 per calendar month in Europe/Berlin"), and
//! the clock's own seconds, minutes and hours ("60 per minute, from :00 to :00"), the windows
//! Redis-based limiters such as envoy/ratelimit count in, and envoy/ratelimit's weeks, months and
//! years (7, 30 and 365 days from 1970-01-01 UTC).
//!
//! Boundaries are midnight in the zone, so a day is 23 or 25 hours across a DST change and a
//! month has its own length; a second, minute or hour starts where the zone's clock shows a
//! whole one and lasts that long. [`jiff`] and its bundled time zone database compute them.

use std::time::Duration;

use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan, Zoned};

use crate::seqlock::{SeqCell, Words};

/// The calendar unit a window spans.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CalendarUnit {
    /// From a whole second of the clock to the next.
    Second,
    /// From hh:mm:00 to the next minute.
    Minute,
    /// From hh:00:00 to the next hour.
    Hour,
    /// From 00:00 to the next 00:00.
    Day,
    /// From Monday 00:00 to the next Monday 00:00 (ISO weeks).
    Week,
    /// From the 1st at 00:00 to the next 1st.
    Month,
    /// 7 days, counted from 1970-01-01T00:00Z (a Thursday) in every time zone: envoy/ratelimit's
    /// `unit: week` (its windows are `now / 604800`, `src/utils/utilities.go` `UnitToDivider`).
    EpochWeek,
    /// 30 days, counted from 1970-01-01T00:00Z in every time zone: envoy/ratelimit's `unit: month`.
    EpochMonth,
    /// 365 days, counted from 1970-01-01T00:00Z in every time zone: envoy/ratelimit's `unit: year`.
    EpochYear,
}

impl CalendarUnit {
    /// Every unit, shortest first.
    pub const ALL: [CalendarUnit; 9] = [
        CalendarUnit::Second,
        CalendarUnit::Minute,
        CalendarUnit::Hour,
        CalendarUnit::Day,
        CalendarUnit::Week,
        CalendarUnit::Month,
        CalendarUnit::EpochWeek,
        CalendarUnit::EpochMonth,
        CalendarUnit::EpochYear,
    ];

    /// The name used in limits files: `second`, `minute`, `hour`, `day`, `week`, `month`,
    /// `epoch_week`, `epoch_month`, `epoch_year`.
    pub fn name(self) -> &'static str {
        match self {
            CalendarUnit::Second => "second",
            CalendarUnit::Minute => "minute",
            CalendarUnit::Hour => "hour",
            CalendarUnit::Day => "day",
            CalendarUnit::Week => "week",
            CalendarUnit::Month => "month",
            CalendarUnit::EpochWeek => "epoch_week",
            CalendarUnit::EpochMonth => "epoch_month",
            CalendarUnit::EpochYear => "epoch_year",
        }
    }

    /// The length of every window of a unit counted from the epoch (`None` for the units of a
    /// time zone's calendar).
    fn epoch_span(self) -> Option<u64> {
        match self {
            CalendarUnit::EpochWeek => Some(7 * 86_400),
            CalendarUnit::EpochMonth => Some(30 * 86_400),
            CalendarUnit::EpochYear => Some(365 * 86_400),
            _ => None,
        }
    }

    /// Parses [`CalendarUnit::name`].
    pub fn from_name(name: &str) -> Option<CalendarUnit> {
        CalendarUnit::ALL.into_iter().find(|u| u.name() == name)
    }
}

/// A calendar unit in a time zone: where each window starts and ends.
///
/// ```
/// use tollgate::{Calendar, CalendarUnit};
/// let month = Calendar::new(CalendarUnit::Month, "UTC")?;
/// // 2026-02-14T12:00:00Z is in February: 2026-02-01T00:00Z to 2026-03-01T00:00Z.
/// let (start, end) = month.window_at(1_771_070_400 * 1_000_000_000);
/// assert_eq!((start / 1_000_000_000, end / 1_000_000_000), (1_769_904_000, 1_772_323_200));
/// assert!(Calendar::new(CalendarUnit::Day, "Mars/Olympus_Mons").is_err());
/// # Ok::<(), tollgate::CalendarError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Calendar {
    unit: CalendarUnit,
    zone: String,
    tz: TimeZone,
}

/// A time zone name that is neither `UTC` nor in the IANA time zone database.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown time zone {zone:?}: expected UTC or an IANA name such as Europe/Berlin")]
pub struct CalendarError {
    /// The name given.
    pub zone: String,
}

impl Calendar {
    /// Windows of `unit` in the time zone named `zone` (`UTC`, or an IANA name).
    pub fn new(unit: CalendarUnit, zone: &str) -> Result<Calendar, CalendarError> {
        let tz = if zone == "UTC" { Ok(TimeZone::UTC) } else { jiff::tz::db().get(zone) };
        let tz = tz.map_err(|_| CalendarError { zone: zone.to_string() })?;
        Ok(Calendar { unit, zone: zone.to_string(), tz })
    }

    /// The unit.
    pub fn unit(&self) -> CalendarUnit {
        self.unit
    }

    /// The time zone's name, as given.
    pub fn zone(&self) -> &str {
        &self.zone
    }

    /// A typical window's length (a second, a minute, an hour, a day, 7 days, 30 days, 365 days): what a
    /// quota over this calendar is written per, and what estimates use for windows after the
    /// current one.
    pub fn nominal(&self) -> Duration {
        Duration::from_secs(match self.unit {
            CalendarUnit::Second => 1,
            CalendarUnit::Minute => 60,
            CalendarUnit::Hour => 3600,
            CalendarUnit::Day => 86_400,
            CalendarUnit::Week => 7 * 86_400,
            CalendarUnit::Month => 30 * 86_400,
            epoch => epoch.epoch_span().expect("the other units count from the epoch"),
        })
    }

    /// The window holding the instant `unix_ns` (nanoseconds since 1970-01-01T00:00Z): its start
    /// and end, in the same units.
    pub fn window_at(&self, unix_ns: u64) -> (u64, u64) {
        if let Some(secs) = self.unit.epoch_span() {
            let span = secs * 1_000_000_000;
            let start = unix_ns - unix_ns % span;
            return (start, start.saturating_add(span));
        }
        let at = Timestamp::from_nanosecond(i128::from(unix_ns)).unwrap_or(Timestamp::MAX);
        let zoned = at.to_zoned(self.tz.clone());
        let bounds = self.bounds(&zoned);
        let ns = |z: Zoned| u64::try_from(z.timestamp().as_nanosecond()).unwrap_or(0);
        match bounds {
            Some((start, end)) => (ns(start), ns(end)),
            // Beyond what jiff can represent (year 9999): one endless window.
            None => (unix_ns, u64::MAX),
        }
    }

    fn bounds(&self, zoned: &Zoned) -> Option<(Zoned, Zoned)> {
        // A second, minute or hour: truncated on the zone's clock (in a repeated hour jiff keeps
        // the offset in force), lasting the unit's length.
        let whole =
            |unit: jiff::Unit| zoned.round(jiff::ZonedRound::new().smallest(unit).mode(jiff::RoundMode::Trunc)).ok();
        let (start, step) = match self.unit {
            CalendarUnit::Second => (whole(jiff::Unit::Second)?, 1.second()),
            CalendarUnit::Minute => (whole(jiff::Unit::Minute)?, 1.minute()),
            CalendarUnit::Hour => (whole(jiff::Unit::Hour)?, 1.hour()),
            CalendarUnit::Day => (zoned.start_of_day().ok()?, 1.day()),
            CalendarUnit::Week => {
                let back = i64::from(zoned.weekday().to_monday_zero_offset());
                (zoned.start_of_day().ok()?.checked_sub(back.days()).ok()?.start_of_day().ok()?, 1.week())
            }
            CalendarUnit::Month => (zoned.first_of_month().ok()?.start_of_day().ok()?, 1.month()),
            CalendarUnit::EpochWeek | CalendarUnit::EpochMonth | CalendarUnit::EpochYear => {
                unreachable!("window_at counts units from the epoch itself")
            }
        };
        let end = start.checked_add(step).ok()?;
        let end = match self.unit {
            CalendarUnit::Second | CalendarUnit::Minute | CalendarUnit::Hour => end,
            // Adding a calendar span to a zoned midnight lands on the next midnight, DST or not.
            _ => end.start_of_day().ok()?,
        };
        Some((start, end))
    }
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Calendar) -> bool {
        self.unit == other.unit && self.zone == other.zone
    }
}

impl Eq for Calendar {}

/// A calendar seen from a clock: windows in the clock's nanoseconds, the current one cached so
/// that a decision computes a boundary only when it crosses one.
pub(crate) struct ClockCalendar {
    pub(crate) calendar: Calendar,
    unix_origin_ns: u64,
    current: SeqCell<Bounds>,
}

#[derive(Clone, Copy)]
struct Bounds {
    start: u64,
    end: u64,
}

impl Words for Bounds {
    fn to_words(self) -> [u64; 4] {
        [self.start, self.end, 0, 0]
    }
    fn from_words(w: [u64; 4]) -> Bounds {
        Bounds { start: w[0], end: w[1] }
    }
}

impl ClockCalendar {
    pub(crate) fn new(calendar: Calendar, unix_origin_ns: u64) -> ClockCalendar {
        // An empty range: the first decision computes the window.
        ClockCalendar { calendar, unix_origin_ns, current: SeqCell::new(Bounds { start: 1, end: 0 }) }
    }

    /// The window holding clock instant `now`, in clock nanoseconds (a window that began before
    /// the clock's origin starts at 0).
    #[inline]
    pub(crate) fn window(&self, now: u64) -> (u64, u64) {
        let b = self.current.load();
        if b.start <= now && now < b.end {
            return (b.start, b.end);
        }
        let (start, end) = self.calendar.window_at(self.unix_origin_ns.saturating_add(now));
        let b =
            Bounds { start: start.saturating_sub(self.unix_origin_ns), end: end.saturating_sub(self.unix_origin_ns) };
        self.current.store(b);
        (b.start, b.end)
    }
}
