//! How one setting reads to people: its unit, its `--help` line and its row of a README
//! configuration table. Shared by the relay's settings (`server/settings.rs`) and the exec
//! server's (`execrelay::config`), so both binaries show values alike.
//!
//! It also holds the one [`settings!`](crate::settings) macro both servers declare their
//! settings with. A leaf: it knows no setting, reads no file and parses nothing.

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
