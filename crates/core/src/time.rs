//! Dates and times as the contract writes them: ISO-8601 text to and from milliseconds since
//! the epoch (UTC). Shared by the views (dateTime columns), the where language (literals) and
//! the flows (trace records).

/// Milliseconds since the epoch, now (0 on a clock before it).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// `YYYY-MM-DD`, optionally followed by `T` or a space and `hh:mm[:ss[.fff]]`, optionally
/// `Z` or `±hh:mm`; no zone means UTC. Milliseconds since the epoch.
pub fn parse_datetime(s: &str) -> Option<i64> {
    let s = s.trim();
    let b = s.as_bytes();
    if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        if t.bytes().all(|c| c.is_ascii_digit()) {
            t.parse().ok()
        } else {
            None
        }
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) {
        return None;
    }
    let mut ms = days_from_civil(y, mo, d) * 86_400_000;
    let rest = &s[10..];
    if rest.is_empty() {
        return Some(ms);
    }
    let rest = rest.strip_prefix(['T', ' '])?;
    let rb = rest.as_bytes();
    if rb.len() < 5 || rb[2] != b':' {
        return None;
    }
    let two = |t: &str, i: usize| -> Option<i64> {
        let p = t.get(i..i + 2)?;
        if p.bytes().all(|c| c.is_ascii_digit()) {
            p.parse().ok()
        } else {
            None
        }
    };
    let (h, mi) = (two(rest, 0)?, two(rest, 3)?);
    let mut sec = 0i64;
    let mut frac_ms = 0i64;
    let mut i = 5;
    if rb.get(5) == Some(&b':') {
        sec = two(rest, 6)?;
        i = 8;
        if rb.get(8) == Some(&b'.') {
            let digits: String = rest[9..]
                .chars()
                .take_while(|c| c.is_ascii_digit())
                .collect();
            let padded = format!("{digits:0<3}");
            frac_ms = padded[..3].parse().ok()?;
            i = 9 + digits.len();
        }
    }
    if h > 24 || mi > 59 || sec > 60 {
        return None;
    }
    ms += ((h * 60 + mi) * 60 + sec) * 1000 + frac_ms;
    let zone = &rest[i..];
    let offset_min = match zone {
        "" | "Z" | "z" => 0,
        z if (z.starts_with('+') || z.starts_with('-'))
            && z.len() == 6
            && z.as_bytes()[3] == b':' =>
        {
            let sign = if z.starts_with('-') { -1 } else { 1 };
            sign * (two(z, 1)? * 60 + two(z, 4)?)
        }
        _ => return None,
    };
    Some(ms - offset_min * 60_000)
}

fn push_digits(out: &mut Vec<u8>, mut v: i64, n: usize) {
    let mut buf = [b'0'; 4];
    for i in (0..n).rev() {
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
    }
    out.extend_from_slice(&buf[..n]);
}

/// Append ISO-8601 UTC with milliseconds (`2017-05-24T06:00:00.000Z`) to `out`, without
/// going through `format!` (it is on every response).
pub fn write_datetime(out: &mut Vec<u8>, ms: i64) {
    let days = ms.div_euclid(86_400_000);
    let rem = ms.rem_euclid(86_400_000);
    let (y, m, d) = civil_from_days(days);
    if !(0..=9999).contains(&y) {
        out.extend_from_slice(format_datetime(ms).as_bytes());
        return;
    }
    push_digits(out, y, 4);
    for (sep, v, n) in [
        (b'-', m, 2),
        (b'-', d, 2),
        (b'T', rem / 3_600_000, 2),
        (b':', rem / 60_000 % 60, 2),
        (b':', rem / 1000 % 60, 2),
        (b'.', rem % 1000, 3),
    ] {
        out.push(sep);
        push_digits(out, v, n);
    }
    out.push(b'Z');
}

/// ISO-8601 UTC with milliseconds: `2017-05-24T06:00:00.000Z`.
pub fn format_datetime(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let rem = ms.rem_euclid(86_400_000);
    let (y, m, d) = civil_from_days(days);
    let (h, mi, s, f) = (
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000,
    );
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{f:03}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datetimes() {
        assert_eq!(parse_datetime("1970-01-01"), Some(0));
        // Zones of six bytes whose fourth is inside a character (the first found by the where
        // fuzzer): refused, not sliced.
        for zone in ["-\u{FFFD}:0", "+0é:0", "+é:00", "-€00"] {
            assert_eq!(zone.len(), 6);
            let s = format!("4034-05-24 05:59{zone}");
            assert_eq!(parse_datetime(&s), None, "{s:?}");
        }
        assert_eq!(
            parse_datetime("2017-05-24T06:00:00Z"),
            Some(1_495_605_600_000)
        );
        assert_eq!(
            parse_datetime("2017-05-24 08:00:00+02:00"),
            Some(1_495_605_600_000)
        );
        assert_eq!(
            parse_datetime("2017-05-24T06:00:00.5Z"),
            Some(1_495_605_600_500)
        );
        assert_eq!(parse_datetime("1969-12-31T23:59:59Z"), Some(-1000));
        assert_eq!(parse_datetime("2017-13-01"), None);
        assert_eq!(parse_datetime("yesterday"), None);
        assert_eq!(
            format_datetime(1_495_605_600_500),
            "2017-05-24T06:00:00.500Z"
        );
        assert_eq!(format_datetime(-1000), "1969-12-31T23:59:59.000Z");
        for ms in [0i64, 1_495_605_600_500, -1000, 4_102_444_799_999] {
            let mut out = Vec::new();
            write_datetime(&mut out, ms);
            assert_eq!(String::from_utf8(out).unwrap(), format_datetime(ms));
        }
        for ms in [0i64, 951_782_400_000, 4_102_444_800_000, -2_208_988_800_000] {
            assert_eq!(parse_datetime(&format_datetime(ms)), Some(ms));
        }
    }
}
