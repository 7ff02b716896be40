//! Timestamps: milliseconds since the Unix epoch, shown as RFC 3339 UTC with milliseconds.

use std::fmt;

use chrono::{DateTime, SecondsFormat, Utc};

/// A point in time with millisecond precision. The domain never reads the clock: a
/// [`Clock`](crate::ports::Clock) gives the app the current `Timestamp`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

impl Timestamp {
    /// The timestamp `millis` milliseconds after the Unix epoch.
    pub const fn from_millis(millis: i64) -> Self {
        Self(millis)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// This timestamp moved `millis` milliseconds later (earlier when negative), saturating.
    pub const fn plus_millis(self, millis: i64) -> Self {
        Self(self.0.saturating_add(millis))
    }

    /// Whole seconds since the Unix epoch (rounded down), as OpenAI's objects show times.
    pub const fn as_unix_seconds(self) -> i64 {
        self.0.div_euclid(1000)
    }

    /// Milliseconds from `earlier` to this timestamp, or 0 when `earlier` is later.
    pub const fn millis_since(self, earlier: Timestamp) -> u64 {
        let millis = self.0.saturating_sub(earlier.0);
        if millis < 0 {
            0
        } else {
            millis as u64
        }
    }

    /// RFC 3339 in UTC with exactly three fractional digits, e.g. `2026-12-02T18:54:38.123Z`.
    pub fn to_rfc3339(self) -> String {
        match DateTime::<Utc>::from_timestamp_millis(self.0) {
            Some(at) => at.to_rfc3339_opts(SecondsFormat::Millis, true),
            None => String::from("1970-01-01T00:00:00.000Z"),
        }
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_render_as_rfc3339_utc_with_milliseconds() {
        assert_eq!(
            Timestamp::from_millis(0).to_rfc3339(),
            "1970-01-01T00:00:00.000Z"
        );
        assert_eq!(
            Timestamp::from_millis(1_764_701_678_123).to_rfc3339(),
            "2025-12-02T18:54:38.123Z"
        );
        assert_eq!(
            Timestamp::from_millis(1_764_701_678_999).as_unix_seconds(),
            1_764_701_678
        );
        assert_eq!(Timestamp::from_millis(-1).as_unix_seconds(), -1);
        let later = Timestamp::from_millis(5_000);
        assert_eq!(later.millis_since(Timestamp::from_millis(1_500)), 3_500);
        assert_eq!(Timestamp::from_millis(1_500).millis_since(later), 0);
    }
}
