//! The validity period of an X.509 certificate (`notBefore`, `notAfter`), read from its DER
//! bytes, and a UTC date for messages. Sans-IO: bytes in, seconds since the Unix epoch out.
//!
//! Why here: the relay reports when its certificate expires (a metric and its alert, a log
//! line on every reload), and the dialers check the dates of a pinned certificate, which
//! webpki's chain verification never looks at (a pinned certificate is not verified as a
//! chain). Neither rustls nor webpki exposes the dates of a certificate, and a whole X.509
//! parser would be a dependency for two fields; this walks only the DER path to them.
//!
//! It must never trust a length before checking it against the bytes present: a malformed
//! certificate gives `None`, never a panic.

/// A certificate's validity period, in seconds since the Unix epoch (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    /// The first second it is valid.
    pub not_before: i64,
    /// The last second it is valid.
    pub not_after: i64,
}

impl Validity {
    /// The validity period of the certificate `der`, or `None` when it does not parse.
    pub fn of(der: &[u8]) -> Option<Validity> {
        // Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version OPTIONAL,
        //   serialNumber INTEGER, signature SEQUENCE, issuer SEQUENCE,
        //   validity SEQUENCE { notBefore Time, notAfter Time }, … }, … }
        let (tag, cert, _) = tlv(der)?;
        if tag != SEQUENCE {
            return None;
        }
        let (tag, tbs, _) = tlv(cert)?;
        if tag != SEQUENCE {
            return None;
        }
        let mut rest = tbs;
        let (tag, _, after) = tlv(rest)?;
        if tag == VERSION {
            rest = after;
        }
        // serialNumber, signature, issuer.
        for expected in [INTEGER, SEQUENCE, SEQUENCE] {
            let (tag, _, after) = tlv(rest)?;
            if tag != expected {
                return None;
            }
            rest = after;
        }
        let (tag, validity, _) = tlv(rest)?;
        if tag != SEQUENCE {
            return None;
        }
        let (tag, before, after) = tlv(validity)?;
        let not_before = time(tag, before)?;
        let (tag, not_after, _) = tlv(after)?;
        let not_after = time(tag, not_after)?;
        Some(Validity {
            not_before,
            not_after,
        })
    }

    /// Whether `now` (seconds since the epoch) is inside the period.
    pub fn contains(&self, now: i64) -> bool {
        self.not_before <= now && now <= self.not_after
    }
}

const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const VERSION: u8 = 0xa0;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// One DER element: (tag, contents, what follows). Single-byte tags only (all this walk
/// needs); definite lengths of up to four bytes.
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (bytes, after) = rest.split_at(n);
        rest = after;
        bytes
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b))
    };
    if rest.len() < len {
        return None;
    }
    let (contents, after) = rest.split_at(len);
    Some((tag, contents, after))
}

/// A `UTCTime` (`YYMMDDHHMMSSZ`, years 1950–2049) or `GeneralizedTime` (`YYYYMMDDHHMMSSZ`) as
/// seconds since the epoch. RFC 5280 §4.1.2.5 requires exactly these forms (UTC, seconds, no
/// fraction).
fn time(tag: u8, s: &[u8]) -> Option<i64> {
    let digits = |b: &[u8]| -> Option<i64> {
        b.iter().try_fold(0i64, |acc, &c| {
            c.is_ascii_digit().then(|| acc * 10 + i64::from(c - b'0'))
        })
    };
    let (year, rest) = match (tag, s.len()) {
        (UTC_TIME, 13) => {
            let yy = digits(&s[..2])?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, &s[2..])
        }
        (GENERALIZED_TIME, 15) => (digits(&s[..4])?, &s[4..]),
        _ => return None,
    };
    if rest.last() != Some(&b'Z') {
        return None;
    }
    let field = |i: usize| digits(&rest[i..i + 2]);
    let (month, day, hour, minute, second) =
        (field(0)?, field(2)?, field(4)?, field(6)?, field(8)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some(days * 86_400 + hour * 3_600 + minute * 60 + second)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `seconds` since the epoch as `YYYY-MM-DD HH:MM:SS UTC`, for messages.
pub fn utc(seconds: i64) -> String {
    let days = seconds.div_euclid(86_400);
    let secs = seconds.rem_euclid(86_400);
    // The inverse of `days_from_civil`.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        secs / 3_600,
        secs % 3_600 / 60,
        secs % 60
    )
}

/// Seconds since the epoch now (0 if the clock is before it).
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_convert_both_ways() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(4_102_444_799), "2099-12-31 23:59:59 UTC");
        assert_eq!(time(UTC_TIME, b"491231235959Z"), Some(2_524_607_999));
        assert_eq!(time(UTC_TIME, b"500101000000Z"), Some(-631_152_000));
        assert_eq!(
            time(GENERALIZED_TIME, b"20991231235959Z"),
            Some(4_102_444_799)
        );
        for bad in [
            &b"49123123595Z"[..],
            b"491231235959+",
            b"4912312359599",
            b"491331235959Z",
        ] {
            assert_eq!(time(UTC_TIME, bad), None, "{bad:?}");
        }
    }

    #[test]
    fn truncated_or_foreign_bytes_give_none() {
        assert_eq!(Validity::of(&[]), None);
        assert_eq!(Validity::of(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(Validity::of(&[0x30, 0x02, 0x30, 0x00]), None);
        assert_eq!(Validity::of(b"not a certificate"), None);
    }
}
