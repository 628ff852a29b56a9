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

pub use crate::config::{NoiseSuite, NoiseSuites};

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
