//! Small statistics: latency samples with nearest-rank quantiles, and the min / median / max
//! spread of a figure over repetitions.

use std::time::Duration;

/// Latency samples in microseconds.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    micros: Vec<u64>,
    sorted: bool,
}

impl Latencies {
    /// No samples.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one sample.
    pub fn push(&mut self, latency: Duration) {
        self.micros
            .push(u64::try_from(latency.as_micros()).unwrap_or(u64::MAX));
        self.sorted = false;
    }

    /// Adds one sample given in milliseconds (negative values count as zero).
    pub fn push_millis(&mut self, millis: f64) {
        self.micros.push((millis.max(0.0) * 1000.0).round() as u64);
        self.sorted = false;
    }

    /// Adds every sample of `other`.
    pub fn extend(&mut self, other: Latencies) {
        self.micros.extend(other.micros);
        self.sorted = false;
    }

    /// How many samples.
    pub fn len(&self) -> usize {
        self.micros.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.micros.is_empty()
    }

    /// The `q`-quantile (0.0…1.0, nearest rank) in milliseconds; zero when empty.
    pub fn quantile_ms(&mut self, q: f64) -> f64 {
        if self.micros.is_empty() {
            return 0.0;
        }
        if !self.sorted {
            self.micros.sort_unstable();
            self.sorted = true;
        }
        let last = self.micros.len() - 1;
        let rank = ((q.clamp(0.0, 1.0) * last as f64).round() as usize).min(last);
        self.micros[rank] as f64 / 1000.0
    }
}

/// A figure measured once per repetition.
#[derive(Debug, Clone, Default)]
pub struct Spread {
    values: Vec<f64>,
}

impl Spread {
    /// No values yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one repetition's value.
    pub fn push(&mut self, value: f64) {
        self.values.push(value);
    }

    /// Whether no repetition ran.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    fn sorted(&self) -> Vec<f64> {
        let mut values = self.values.clone();
        values.sort_by(f64::total_cmp);
        values
    }

    /// The smallest value (NaN when empty).
    pub fn min(&self) -> f64 {
        self.sorted().first().copied().unwrap_or(f64::NAN)
    }

    /// The largest value (NaN when empty).
    pub fn max(&self) -> f64 {
        self.sorted().last().copied().unwrap_or(f64::NAN)
    }

    /// The median (mean of the middle two for an even count; NaN when empty).
    pub fn median(&self) -> f64 {
        let values = self.sorted();
        let n = values.len();
        match n {
            0 => f64::NAN,
            _ if n % 2 == 1 => values[n / 2],
            _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
        }
    }

    /// `min / median / max` formatted with `digits` decimals.
    pub fn format(&self, digits: usize) -> String {
        if self.values.is_empty() {
            return String::from("not run");
        }
        format!(
            "{} / {} / {}",
            fmt_num(self.min(), digits),
            fmt_num(self.median(), digits),
            fmt_num(self.max(), digits)
        )
    }
}

/// A number with `digits` decimals and thousands separators (thin spaces are avoided: plain
/// spaces keep the table copy-pastable).
pub fn fmt_num(value: f64, digits: usize) -> String {
    if !value.is_finite() {
        return String::from("n/a");
    }
    let text = format!("{value:.digits$}");
    let (int, frac) = match text.split_once('.') {
        Some((int, frac)) => (int.to_owned(), Some(frac.to_owned())),
        None => (text.clone(), None),
    };
    let (sign, digits_only) = match int.strip_prefix('-') {
        Some(rest) => ("-", rest.to_owned()),
        None => ("", int),
    };
    let mut grouped = String::new();
    for (i, c) in digits_only.chars().enumerate() {
        if i > 0 && (digits_only.len() - i) % 3 == 0 {
            grouped.push(' ');
        }
        grouped.push(c);
    }
    match frac {
        Some(frac) => format!("{sign}{grouped}.{frac}"),
        None => format!("{sign}{grouped}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_use_the_nearest_rank() {
        let mut l = Latencies::new();
        for ms in 1..=100 {
            l.push(Duration::from_millis(ms));
        }
        assert!(
            (l.quantile_ms(0.5) - 51.0).abs() < 1e-9 || (l.quantile_ms(0.5) - 50.0).abs() < 1e-9
        );
        assert!((l.quantile_ms(0.99) - 99.0).abs() < 1.01);
        assert!((l.quantile_ms(1.0) - 100.0).abs() < 1e-9);
        assert_eq!(Latencies::new().quantile_ms(0.99), 0.0);
    }

    #[test]
    fn spreads_and_numbers() {
        let mut s = Spread::new();
        for v in [3.0, 1.0, 2.0] {
            s.push(v);
        }
        assert_eq!((s.min(), s.median(), s.max()), (1.0, 2.0, 3.0));
        s.push(10.0);
        assert_eq!(s.median(), 2.5);
        assert_eq!(fmt_num(1234567.891, 1), "1 234 567.9");
        assert_eq!(fmt_num(-1234.0, 0), "-1 234");
        assert_eq!(fmt_num(12.0, 2), "12.00");
        assert_eq!(Spread::new().format(1), "not run");
    }
}
