//! UTC days as the usage store counts them (days since 1970-01-01), their
//! months and their `YYYY-MM-DD` form.

/// The day (days since 1970-01-01, UTC) of unix second `s`.
pub fn day_of(s: u64) -> u32 {
    (s / 86_400) as u32
}

/// The first day of the month of `day`, and of the next month.
pub(super) fn month_bounds(day: u32) -> (u32, u32) {
    let (y, m, _) = crate::audit::civil_from_days(i64::from(day));
    let first = days_from_civil(y, m, 1);
    let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    (first, days_from_civil(ny, nm, 1))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Hinnant's
/// `days_from_civil`).
fn days_from_civil(y: i64, m: u32, d: u32) -> u32 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe - 719_468).max(0) as u32
}

/// `YYYY-MM-DD` of a day.
pub fn day_string(day: u32) -> String {
    let (y, m, d) = crate::audit::civil_from_days(i64::from(day));
    format!("{y:04}-{m:02}-{d:02}")
}

/// The day of `YYYY-MM-DD`.
pub fn parse_day(s: &str) -> Option<u32> {
    let mut it = s.splitn(3, '-');
    let y: i64 = it.next()?.parse().ok()?;
    let m: u32 = it.next()?.parse().ok()?;
    let d: u32 = it.next()?.parse().ok()?;
    if !(1970..=9999).contains(&y) || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let day = days_from_civil(y, m, d);
    (day_string(day) == s).then_some(day) // no 31 February
}
