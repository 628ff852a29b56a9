//! Durations as people type them on a command line: `90` (seconds), `90s`, `1.5s`, `500ms`,
//! `5m`, `1h`, `2d`. One parser for every flag that takes one (`run --timeout`,
//! `serve --max-session-ttl`), and one way to print them back (`timed out after 5s`).

use std::time::Duration;

/// Parse `N[.F][ms|s|m|h|d]` (no unit: seconds). Refuses empty, negative, non-finite and
/// absurd values (more than 100 years) with a message naming the accepted forms.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let bad = || {
        format!("{text:?} is not a duration: give seconds (90), or a number with ms, s, m, h or d (500ms, 90s, 5m, 1h)")
    };
    let (number, unit) = match t.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let scale = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        _ => return Err(bad()),
    };
    if number.is_empty() || number.starts_with('.') || number.matches('.').count() > 1 {
        return Err(bad());
    }
    let value: f64 = number.parse().map_err(|_| bad())?;
    let secs = value * scale;
    if !secs.is_finite() || secs > 100.0 * 365.0 * 86_400.0 {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A duration as a person reads it: `1h`, `5m`, `90s`, `1.5s`, `500ms` (the largest unit that
/// divides it).
pub fn show_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    for (unit, size) in [
        ("d", 86_400_000u128),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
    ] {
        if ms % size == 0 {
            return format!("{}{unit}", ms / size);
        }
    }
    if ms > 1000 {
        return format!("{}s", d.as_secs_f64());
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_people_type_parse() {
        let s = Duration::from_secs;
        assert_eq!(parse_duration("90"), Ok(s(90)));
        assert_eq!(parse_duration("90s"), Ok(s(90)));
        assert_eq!(parse_duration("5m"), Ok(s(300)));
        assert_eq!(parse_duration("1h"), Ok(s(3600)));
        assert_eq!(parse_duration("2d"), Ok(s(172_800)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration(" 7 "), Ok(s(7)));
        for bad in [
            "",
            "s",
            "-1",
            "1x",
            "1.2.3",
            ".5",
            "5 m",
            "1e9",
            "99999999999d",
        ] {
            let e = parse_duration(bad).expect_err(bad);
            assert!(e.contains("is not a duration"), "{e}");
        }
    }

    #[test]
    fn durations_print_in_the_largest_unit_that_divides_them() {
        let ms = Duration::from_millis;
        assert_eq!(show_duration(ms(5000)), "5s");
        assert_eq!(show_duration(ms(90_000)), "90s");
        assert_eq!(show_duration(ms(300_000)), "5m");
        assert_eq!(show_duration(ms(3_600_000)), "1h");
        assert_eq!(show_duration(ms(86_400_000)), "1d");
        assert_eq!(show_duration(ms(1500)), "1.5s");
        assert_eq!(show_duration(ms(250)), "250ms");
        assert_eq!(show_duration(ms(0)), "0s");
    }
}
