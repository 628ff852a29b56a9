//! How one setting reads to people: its unit, its `--help` line and its row of a README
//! configuration table. Shared by the relay's settings (`server/settings.rs`) and the exec
//! server's (`execrelay::config`), so both binaries show values alike.
//!
//! It also holds the one [`settings!`](crate::settings) macro both servers declare their
//! settings with, and the one way a value is read back from a flag or the TOML file
//! ([`Unit::parse`], [`read_units`]): what `--help` shows (`256 MiB`, `15 000 ms`) is also what
//! a flag accepts. A leaf: it knows no setting and reads no file.

/// How a setting's value reads, for `--help`, the README table and error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A number of things.
    Count,
    /// Bytes.
    Bytes,
    /// Milliseconds.
    Millis,
}

impl Unit {
    /// The flag's value name in `--help`.
    pub const fn value_name(self) -> &'static str {
        match self {
            Unit::Count => "N",
            Unit::Bytes => "BYTES",
            Unit::Millis => "MS",
        }
    }

    /// A value of this unit for people: `256 MiB`, `15 000 ms`, `8 192`.
    pub fn display(self, value: u64) -> String {
        const KIB: u64 = 1024;
        const MIB: u64 = 1024 * 1024;
        match self {
            Unit::Bytes if value >= MIB && value % MIB == 0 => format!("{} MiB", value / MIB),
            Unit::Bytes if value >= KIB && value % KIB == 0 => format!("{} KiB", value / KIB),
            Unit::Bytes => format!("{} bytes", group_thousands(value)),
            Unit::Millis => format!("{} ms", group_thousands(value)),
            Unit::Count => group_thousands(value),
        }
    }

    /// Read a value of this unit as a person writes it in a flag or the TOML file:
    ///
    /// - a whole number, its digits optionally grouped in thousands by single spaces or
    ///   underscores (`8192`, `8 192`, `8_192`), as `--help` shows values;
    /// - for bytes, optionally a binary unit: `B`, `KiB` (or `K`), `MiB` (`M`), `GiB` (`G`),
    ///   any case, with or without a space (`256MiB`, `256 MiB`). `KB`, `MB` and `GB` are
    ///   refused: they mean 1000 to some and 1024 to others;
    /// - for milliseconds, optionally `ms`, `s`, `m` (or `min`) or `h`.
    ///
    /// The error says what was expected, with examples.
    pub fn parse(self, text: &str) -> Result<u64, String> {
        let t = text.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '_' || c == ' '))
            .unwrap_or(t.len());
        let (number, suffix) = (t[..split].trim_end(), t[split..].trim());
        let expected = || format!("`{text}` is not {}", self.expected());
        // Digits alone, or grouped in thousands as `--help` shows them (`86 400 000`): a
        // first group of one to three digits, then groups of exactly three.
        let groups: Vec<&str> = number.split(['_', ' ']).collect();
        let grouped_well = match groups.as_slice() {
            [one] => !one.is_empty(),
            [first, rest @ ..] => {
                (1..=3).contains(&first.len()) && rest.iter().all(|g| g.len() == 3)
            }
            [] => false,
        };
        if !grouped_well {
            return Err(expected());
        }
        let digits: String = number.chars().filter(char::is_ascii_digit).collect();
        let value: u64 = digits
            .parse()
            .map_err(|_| format!("`{text}` is too large"))?;
        let lower = suffix.to_ascii_lowercase();
        let factor: u64 = match (self, lower.as_str()) {
            (_, "") => 1,
            (Unit::Bytes, "b" | "byte" | "bytes") => 1,
            (Unit::Bytes, "k" | "kib") => 1 << 10,
            (Unit::Bytes, "m" | "mib") => 1 << 20,
            (Unit::Bytes, "g" | "gib") => 1 << 30,
            (Unit::Bytes, "kb" | "mb" | "gb") => {
                return Err(format!(
                    "`{text}`: `{suffix}` is ambiguous (powers of 1000 or of 1024?); write {}iB \
                     (binary) or the number of bytes",
                    &suffix[..1].to_ascii_uppercase()
                ))
            }
            (_, fraction) if fraction.starts_with(['.', ',']) => {
                return Err(format!(
                    "`{text}` has a fraction; write {} in a smaller unit",
                    self.expected()
                ))
            }
            (Unit::Millis, "ms") => 1,
            (Unit::Millis, "s") => 1_000,
            (Unit::Millis, "m" | "min") => 60_000,
            (Unit::Millis, "h") => 3_600_000,
            _ => return Err(expected()),
        };
        value
            .checked_mul(factor)
            .ok_or_else(|| format!("`{text}` is too large"))
    }

    /// [`parse`](Self::parse) into the setting's own integer type (a flag's value parser).
    pub fn parse_as<T: TryFrom<u64>>(self, text: &str) -> Result<T, String> {
        let value = self.parse(text)?;
        T::try_from(value).map_err(|_| format!("`{text}` is too large for this setting"))
    }

    /// What a value of this unit looks like, for error messages.
    fn expected(self) -> &'static str {
        match self {
            Unit::Count => "a whole number (like 8192, 8 192 or 8_192)",
            Unit::Bytes => {
                "a number of bytes (like 268435456, 256MiB, 64KiB or 1GiB; KiB = 1024 bytes)"
            }
            Unit::Millis => "a time (like 1500 or 1500ms in milliseconds, 15s, 2m or 1h)",
        }
    }
}

/// Read every number setting of `settings` written as a string in a TOML table
/// (`output_budget_bytes = "256MiB"`) into an integer, as [`Unit::parse`] reads a flag; the
/// table then deserializes as usual. Integers are left as they are. The error names the key.
pub fn read_units(table: &mut toml::Table, settings: &[Setting]) -> Result<(), String> {
    for s in settings {
        if let Some(toml::Value::String(text)) = table.get(s.name) {
            let value = s.unit.parse(text).map_err(|e| format!("{}: {e}", s.name))?;
            let value =
                i64::try_from(value).map_err(|_| format!("{}: `{text}` is too large", s.name))?;
            table.insert(s.name.to_string(), toml::Value::Integer(value));
        }
    }
    Ok(())
}

/// `86400000` → `86 400 000` (a thin grouping that reads the same in every locale).
fn group_thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

/// One setting, as its flag, TOML key, `--help` line and README row show it.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// The field and TOML key (`snake_case`); the flag is the same in `kebab-case`.
    pub name: &'static str,
    /// Its default: the named constant.
    pub default: u64,
    /// How the value reads.
    pub unit: Unit,
    /// What it bounds, in one line.
    pub bounds: &'static str,
}

impl Setting {
    /// The flag, without the leading dashes.
    pub fn flag(&self) -> String {
        self.name.replace('_', "-")
    }

    /// The flag's help line: what it bounds, and the real default.
    pub fn help(&self) -> String {
        format!(
            "{} [default: {}]",
            self.bounds,
            self.unit.display(self.default)
        )
    }

    /// The setting's row of a README configuration table.
    pub fn readme_row(&self) -> String {
        format!(
            "| `{}` | {} | {} |",
            self.name,
            self.unit.display(self.default),
            self.bounds
        )
    }
}

/// A setting whose value is a word (a backend's name, a cgroup name) rather than a number:
/// the flag, the TOML key, `--help` and the README show it as [`Setting`] does.
#[derive(Debug, Clone, Copy)]
pub struct TextSetting {
    /// The field and TOML key (`snake_case`); the flag is the same in `kebab-case`.
    pub name: &'static str,
    /// Its default, as written in a flag or the TOML file.
    pub default: &'static str,
    /// The flag's value name in `--help` (the accepted words, or what the value is).
    pub values: &'static str,
    /// What it decides, in one line (the flag's help, the README's table).
    pub bounds: &'static str,
}

impl TextSetting {
    /// The flag, without the leading dashes.
    pub fn flag(&self) -> String {
        self.name.replace('_', "-")
    }

    /// The flag's help line: what it decides, and the real default.
    pub fn help(&self) -> String {
        format!("{} [default: {}]", self.bounds, self.default)
    }

    /// The setting's row of the README's configuration table.
    pub fn readme_row(&self) -> String {
        format!("| `{}` | `{}` | {} |", self.name, self.default, self.bounds)
    }
}

/// Declares every setting of a server once: the field of its settings struct (and so its TOML
/// key), its default (the named constant), its flag in the flags struct, and its row in
/// `SETTINGS` (numbers) or `TEXT_SETTINGS` (words, after `@text:`). Nothing else lists the
/// settings, so a default cannot drift from its constant and no setting can lack a flag or a
/// key. The one macro of the exec server's `ServerConfig` and the relay's `RelaySettings`.
///
/// The caller gives both structs' attributes (the settings struct derives
/// `serde::Deserialize` with `#[serde(default, deny_unknown_fields)]`, the flags struct
/// `clap::Args` and `Default`), and has `serde` and `clap` among its dependencies.
#[macro_export]
macro_rules! settings {
    (
        $(#[$smeta:meta])* pub struct $settings:ident;
        $(#[$fmeta:meta])* pub struct $flags:ident;
        $( $(#[doc = $doc:literal])* $name:ident : $ty:ty = $default:expr, $unit:ident, $bounds:literal; )*
        @text:
        $( $(#[doc = $tdoc:literal])* $tname:ident : $tty:ty = $tdefault:expr, shown $tshown:expr, values $tvalues:literal, $tbounds:literal; )*
    ) => {
        $(#[$smeta])*
        pub struct $settings {
            $( $(#[doc = $doc])* pub $name: $ty, )*
            $( $(#[doc = $tdoc])* pub $tname: $tty, )*
        }

        impl Default for $settings {
            fn default() -> Self {
                $settings { $( $name: $default, )* $( $tname: $tdefault, )* }
            }
        }

        /// Every setting whose value is a word, in the order of `--help` and the README's
        /// table (after [`SETTINGS`]).
        pub const TEXT_SETTINGS: &[$crate::setting::TextSetting] = &[
            $( $crate::setting::TextSetting {
                name: stringify!($tname),
                default: $tshown,
                values: $tvalues,
                bounds: $tbounds,
            }, )*
        ];

        /// Every setting whose value is a number, in the order of `--help` and the README's
        /// table.
        pub const SETTINGS: &[$crate::setting::Setting] = &[
            $( $crate::setting::Setting {
                name: stringify!($name),
                default: $default as u64,
                unit: $crate::setting::Unit::$unit,
                bounds: $bounds,
            }, )*
        ];

        $(#[$fmeta])*
        pub struct $flags {
            $(
                #[arg(
                    long,
                    value_name = $crate::setting::Unit::$unit.value_name(),
                    value_parser = |text: &str| $crate::setting::Unit::$unit.parse_as::<$ty>(text),
                    help = $crate::setting::Setting {
                        name: stringify!($name),
                        default: $default as u64,
                        unit: $crate::setting::Unit::$unit,
                        bounds: $bounds,
                    }.help(),
                )]
                pub $name: Option<$ty>,
            )*
            $(
                #[arg(
                    long,
                    value_name = $tvalues,
                    help = $crate::setting::TextSetting {
                        name: stringify!($tname),
                        default: $tshown,
                        values: $tvalues,
                        bounds: $tbounds,
                    }.help(),
                )]
                pub $tname: Option<$tty>,
            )*
        }

        impl $flags {
            /// Write every given flag into `settings`.
            pub fn apply(&self, settings: &mut $settings) {
                $( if let Some(value) = self.$name { settings.$name = value; } )*
                $( if let Some(value) = &self.$tname { settings.$tname = value.clone(); } )*
            }
        }

        impl $settings {
            /// A number setting's value by name (as in [`SETTINGS`]), for tests and
            /// diagnostics.
            pub fn value_of(&self, name: &str) -> Option<u64> {
                match name {
                    $( stringify!($name) => Some(self.$name as u64), )*
                    _ => None,
                }
            }

            /// A word setting's value by name (as in [`TEXT_SETTINGS`]), spelled as in a flag.
            pub fn text_value_of(&self, name: &str) -> Option<String> {
                match name {
                    $( stringify!($tname) => Some(self.$tname.to_string()), )*
                    _ => None,
                }
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_in_their_unit() {
        assert_eq!(Unit::Bytes.display(256 * 1024 * 1024), "256 MiB");
        assert_eq!(Unit::Bytes.display(16 * 1024), "16 KiB");
        assert_eq!(Unit::Bytes.display(65_579), "65 579 bytes");
        assert_eq!(Unit::Millis.display(15_000), "15 000 ms");
        assert_eq!(Unit::Count.display(8192), "8 192");
        assert_eq!(Unit::Count.display(256), "256");
    }

    #[test]
    fn values_are_read_as_they_are_shown() {
        let mib = 1u64 << 20;
        for (text, want) in [
            ("268435456", 256 * mib),
            ("256MiB", 256 * mib),
            ("256 MiB", 256 * mib),
            ("256mib", 256 * mib),
            ("256M", 256 * mib),
            ("64KiB", 64 << 10),
            ("64 k", 64 << 10),
            ("1GiB", 1 << 30),
            ("65 579 bytes", 65_579),
            ("65_579B", 65_579),
            ("1_048_576", 1 << 20),
            (" 0 ", 0),
        ] {
            assert_eq!(Unit::Bytes.parse(text), Ok(want), "{text:?}");
        }
        for (text, want) in [
            ("15 000 ms", 15_000),
            ("1500", 1_500),
            ("15s", 15_000),
            ("2m", 120_000),
            ("2 min", 120_000),
            ("1h", 3_600_000),
        ] {
            assert_eq!(Unit::Millis.parse(text), Ok(want), "{text:?}");
        }
        assert_eq!(Unit::Count.parse("8 192"), Ok(8192));
        assert_eq!(Unit::Count.parse("18446744073709551615"), Ok(u64::MAX));
        // Every default as `--help` shows it reads back to itself.
        for (unit, value) in [
            (Unit::Bytes, 256 * mib),
            (Unit::Bytes, 65_579),
            (Unit::Bytes, 16 << 10),
            (Unit::Millis, 86_400_000),
            (Unit::Count, 8192),
        ] {
            assert_eq!(unit.parse(&unit.display(value)), Ok(value));
        }
    }

    #[test]
    fn bad_values_say_what_was_expected() {
        for bad in [
            "",
            "MiB",
            "-1",
            "1.5GiB",
            "_1",
            "1_",
            "1__0",
            "1  0",
            "0x10",
            "12 parsecs",
            "1 2",
            "1_0000",
            "1234_567",
        ] {
            let err = Unit::Bytes.parse(bad).unwrap_err();
            assert!(err.contains("256MiB"), "{bad:?}: {err}");
        }
        let err = Unit::Bytes.parse("32MB").unwrap_err();
        assert!(err.contains("ambiguous") && err.contains("MiB"), "{err}");
        let err = Unit::Count.parse("8K").unwrap_err();
        assert!(err.contains("whole number"), "{err}");
        let err = Unit::Millis.parse("5 days").unwrap_err();
        assert!(err.contains("15s"), "{err}");
        // At the edge of u64, and of the setting's own type.
        assert!(Unit::Bytes
            .parse("18446744073709551616")
            .unwrap_err()
            .contains("too large"));
        assert!(Unit::Bytes
            .parse("17179869184GiB")
            .unwrap_err()
            .contains("too large"));
        assert_eq!(Unit::Count.parse_as::<u32>("4294967295"), Ok(u32::MAX));
        assert!(Unit::Count
            .parse_as::<u32>("4294967296")
            .unwrap_err()
            .contains("too large for this setting"));
    }

    #[test]
    fn a_toml_string_is_read_in_the_settings_unit() {
        let settings = [
            Setting {
                name: "queue_bytes",
                default: 0,
                unit: Unit::Bytes,
                bounds: "",
            },
            Setting {
                name: "wait_ms",
                default: 0,
                unit: Unit::Millis,
                bounds: "",
            },
        ];
        let mut t: toml::Table =
            toml::from_str("queue_bytes = \"32MiB\"\nwait_ms = 1500\nother = \"x\"").unwrap();
        read_units(&mut t, &settings).unwrap();
        assert_eq!(t["queue_bytes"], toml::Value::Integer(32 << 20));
        assert_eq!(t["wait_ms"], toml::Value::Integer(1500));
        assert_eq!(t["other"], toml::Value::String("x".into()));
        let mut t: toml::Table = toml::from_str("wait_ms = \"soon\"").unwrap();
        let err = read_units(&mut t, &settings).unwrap_err();
        assert!(err.starts_with("wait_ms: `soon` is not a time"), "{err}");
        let mut t: toml::Table = toml::from_str("queue_bytes = \"16EiB\"").unwrap();
        assert!(read_units(&mut t, &settings).is_err());
    }

    #[test]
    fn flag_help_and_row_come_from_one_declaration() {
        let s = Setting {
            name: "max_queued_bytes",
            default: 1024,
            unit: Unit::Bytes,
            bounds: "bytes queued",
        };
        assert_eq!(s.flag(), "max-queued-bytes");
        assert_eq!(s.help(), "bytes queued [default: 1 KiB]");
        assert_eq!(
            s.readme_row(),
            "| `max_queued_bytes` | 1 KiB | bytes queued |"
        );
    }
}
