//! Which Noise suite a stream uses (`secure-transport.md` §3): the suites by number, their
//! protocol names, and the client's choice by CPU features.
//!
//! Suite 0 (`Noise_IK_25519_ChaChaPoly_BLAKE2s`) is everyone's; suite 1
//! (`Noise_IK_25519_AESGCM_BLAKE2s`) is several times faster where the CPU has hardware AES
//! and carry-less multiply, and slower than ChaCha20 where it has not (a table-free software
//! AES is slow). The client writes the number in its `OPEN` frame's flags; the protocol name
//! is the first input of the handshake hash, so a number changed on the path fails the
//! handshake without any other binding. This module never reads a frame: the link drivers
//! carry the number.
//!
//! [`NoiseSuites`] is the set a server accepts (the exec server's `noise_suites` setting,
//! parsed from its comma list by `FromStr` and by serde, for the `--config` file).

use serde::Deserialize;

/// A Noise suite of `secure-transport.md` §3, by the number a client writes in bits 0–1 of its
/// `OPEN` frame's flags. The exec server's `noise_suites` setting names a set of them
/// ([`NoiseSuites`]); this module and its siblings implement them (protocol names, record
/// AEADs, the client's choice by CPU features).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NoiseSuite {
    /// Suite 0, `Noise_IK_25519_ChaChaPoly_BLAKE2s`: every implementation has it.
    ChaChaPoly = 0,
    /// Suite 1, `Noise_IK_25519_AESGCM_BLAKE2s`: several times faster where the CPU has
    /// hardware AES and carry-less multiply.
    AesGcm = 1,
}

impl NoiseSuite {
    /// Every suite this build implements, by number.
    pub const ALL: [NoiseSuite; 2] = [NoiseSuite::ChaChaPoly, NoiseSuite::AesGcm];

    /// The suite's number in the `OPEN` flags.
    pub const fn number(self) -> u16 {
        self as u16
    }

    /// The suite a number names, if this build implements it (2 and 3 are reserved).
    pub fn from_number(n: u16) -> Option<NoiseSuite> {
        NoiseSuite::ALL.into_iter().find(|s| s.number() == n)
    }

    /// The setting's spelling (`chachapoly`, `aesgcm`).
    pub const fn as_str(self) -> &'static str {
        match self {
            NoiseSuite::ChaChaPoly => "chachapoly",
            NoiseSuite::AesGcm => "aesgcm",
        }
    }
}

impl std::fmt::Display for NoiseSuite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for NoiseSuite {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "0" | "chachapoly" => Ok(NoiseSuite::ChaChaPoly),
            "1" | "aesgcm" => Ok(NoiseSuite::AesGcm),
            other => Err(format!(
                "unknown Noise suite {other:?}: use chachapoly (suite 0) or aesgcm (suite 1)"
            )),
        }
    }
}

/// The Noise suites a server accepts (`noise_suites`): a non-empty set, written as a comma
/// list (`chachapoly,aesgcm`; the numbers `0` and `1` are accepted too). An `OPEN` with a
/// suite outside it is reset `unsupported_suite`, which tells a client to retry with suite 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoiseSuites {
    bits: u8,
}

impl NoiseSuites {
    /// Both suites (the default).
    pub const ALL: NoiseSuites = NoiseSuites { bits: 0b11 };

    /// Exactly `suites` (may be empty; a configuration refuses an empty set).
    pub fn of(suites: &[NoiseSuite]) -> NoiseSuites {
        NoiseSuites {
            bits: suites.iter().fold(0, |b, s| b | 1 << s.number()),
        }
    }

    /// Whether `suite` is accepted.
    pub fn contains(self, suite: NoiseSuite) -> bool {
        self.bits & (1 << suite.number()) != 0
    }

    /// Whether no suite is accepted (a configuration error).
    pub fn is_empty(self) -> bool {
        self.bits == 0
    }
}

impl Default for NoiseSuites {
    fn default() -> Self {
        NoiseSuites::ALL
    }
}

impl std::fmt::Display for NoiseSuites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = NoiseSuite::ALL
            .into_iter()
            .filter(|s| self.contains(*s))
            .map(NoiseSuite::as_str)
            .collect();
        f.write_str(&names.join(","))
    }
}

impl std::str::FromStr for NoiseSuites {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut set = NoiseSuites { bits: 0 };
        for word in s.split(',').filter(|w| !w.trim().is_empty()) {
            let suite: NoiseSuite = word.parse()?;
            set.bits |= 1 << suite.number();
        }
        if set.is_empty() {
            return Err(
                "noise_suites lists no suite: give chachapoly, aesgcm or both (comma-separated)"
                    .into(),
            );
        }
        Ok(set)
    }
}

impl<'de> Deserialize<'de> for NoiseSuites {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The Noise protocol name of `suite`.
pub const fn protocol_name(suite: NoiseSuite) -> &'static str {
    match suite {
        NoiseSuite::ChaChaPoly => "Noise_IK_25519_ChaChaPoly_BLAKE2s",
        NoiseSuite::AesGcm => "Noise_IK_25519_AESGCM_BLAKE2s",
    }
}

/// Whether this CPU has hardware AES and carry-less multiply, which is what makes AES-GCM
/// fast (x86-64: AES-NI and PCLMULQDQ; aarch64: AES and PMULL).
pub fn hardware_aes() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes")
            && std::arch::is_aarch64_feature_detected!("pmull")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// How a client picks the suite of its streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SuiteChoice {
    /// Suite 1 where the CPU has hardware AES ([`hardware_aes`]), else suite 0; a server that
    /// answers `unsupported_suite` to suite 1 is asked again with suite 0 (and the link
    /// remembers it).
    #[default]
    Auto,
    /// This suite first, suite 0 when the server answers `unsupported_suite` (what `Auto`
    /// is once the CPU is known; for callers that decide themselves).
    Prefer(NoiseSuite),
    /// Exactly this suite; a server that does not accept it refuses the stream, with no
    /// fallback (the user asked for it).
    Pinned(NoiseSuite),
}

impl SuiteChoice {
    /// The suite to try first.
    pub fn preferred(self) -> NoiseSuite {
        match self {
            SuiteChoice::Pinned(s) | SuiteChoice::Prefer(s) => s,
            SuiteChoice::Auto if hardware_aes() => NoiseSuite::AesGcm,
            SuiteChoice::Auto => NoiseSuite::ChaChaPoly,
        }
    }

    /// Whether a refusal `unsupported_suite` may be retried with suite 0.
    pub fn may_fall_back(self) -> bool {
        !matches!(self, SuiteChoice::Pinned(_))
    }
}

impl std::fmt::Display for SuiteChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SuiteChoice::Auto => f.write_str("auto"),
            SuiteChoice::Prefer(s) => write!(f, "{s} (else chachapoly)"),
            SuiteChoice::Pinned(s) => s.fmt(f),
        }
    }
}

impl std::str::FromStr for SuiteChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().eq_ignore_ascii_case("auto") {
            return Ok(SuiteChoice::Auto);
        }
        s.parse()
            .map(SuiteChoice::Pinned)
            .map_err(|e: String| format!("{e}, or auto"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_names_and_choices() {
        assert_eq!(NoiseSuite::from_number(0), Some(NoiseSuite::ChaChaPoly));
        assert_eq!(NoiseSuite::from_number(1), Some(NoiseSuite::AesGcm));
        assert_eq!(NoiseSuite::from_number(2), None);
        assert_eq!(NoiseSuite::from_number(3), None);
        for s in NoiseSuite::ALL {
            assert_eq!(s.as_str().parse::<NoiseSuite>(), Ok(s));
            assert_eq!(s.number().to_string().parse::<NoiseSuite>(), Ok(s));
        }
        assert!("aes"
            .parse::<NoiseSuite>()
            .unwrap_err()
            .contains("chachapoly"));
        assert_eq!("auto".parse(), Ok(SuiteChoice::Auto));
        assert_eq!(
            "AESGCM".parse(),
            Ok(SuiteChoice::Pinned(NoiseSuite::AesGcm))
        );
        assert!("x".parse::<SuiteChoice>().unwrap_err().ends_with("or auto"));
        assert_eq!(
            SuiteChoice::Pinned(NoiseSuite::ChaChaPoly).preferred(),
            NoiseSuite::ChaChaPoly
        );
        let auto = SuiteChoice::Auto.preferred();
        assert_eq!(auto == NoiseSuite::AesGcm, hardware_aes());
        assert!(SuiteChoice::Auto.may_fall_back());
        assert!(SuiteChoice::Prefer(NoiseSuite::AesGcm).may_fall_back());
        assert_eq!(
            SuiteChoice::Prefer(NoiseSuite::AesGcm).preferred(),
            NoiseSuite::AesGcm
        );
        assert!(!SuiteChoice::Pinned(NoiseSuite::AesGcm).may_fall_back());
    }

    #[test]
    fn suite_sets_parse_and_print() {
        assert_eq!("chachapoly,aesgcm".parse(), Ok(NoiseSuites::ALL));
        assert_eq!("1, 0".parse(), Ok(NoiseSuites::ALL));
        let zero: NoiseSuites = "chachapoly".parse().unwrap();
        assert!(zero.contains(NoiseSuite::ChaChaPoly) && !zero.contains(NoiseSuite::AesGcm));
        assert_eq!(zero.to_string(), "chachapoly");
        assert_eq!(NoiseSuites::ALL.to_string(), "chachapoly,aesgcm");
        assert!("".parse::<NoiseSuites>().is_err());
        assert!("chachapoly,2".parse::<NoiseSuites>().is_err());
        assert!(NoiseSuites::of(&[]).is_empty());
    }
}
