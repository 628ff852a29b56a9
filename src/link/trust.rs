//! What a `wss://` dialer (the client's `relay+wss://`, the exec server's `--relay wss://`)
//! trusts, and why it refused a certificate, in words.
//!
//! # What this module owns
//!
//! - [`TlsRoots`]: the platform's roots (`rustls-native-certs`), or the certificates of one
//!   PEM file (`--ca-file`).
//! - [`RelayCertVerifier`], rustls' `ServerCertVerifier` for the relay, with two ways to
//!   trust a certificate, tried in order:
//!   1. **pinned**: the relay's certificate is, byte for byte, one of the `--ca-file`'s
//!      certificates. This is how a single self-signed certificate (`openssl req -x509 …`)
//!      is trusted: webpki refuses such a certificate as a server's (`CaUsedAsEndEntity`,
//!      since the one-liner marks it `CA:TRUE`), and a pin needs no chain. The pin is the
//!      trust, as for an SSH host key: the name is not checked (the operator handed out
//!      exactly this certificate for exactly this relay), the dates are.
//!   2. **issued by a CA**: webpki's verification against the file's certificates (or the
//!      platform's) as roots, the relay's name included.
//!
//!   When both fail, the error says that the certificate is not pinned and why the CA path
//!   refused it (unknown issuer, wrong name and the names it has, expired, a CA certificate
//!   that is not pinned).
//!
//! The TLS handshake itself still proves that the relay holds the certificate's key (the
//! signature checks are webpki's, for either path).
//!
//! It must never accept a certificate that is neither pinned nor verified, and never read
//! a payload.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, OtherError, RootCertStore};

use super::dial_error::DialError;
use execrelay_io::tls::certificate_fingerprint;
use execrelay_io::tls::validity::{utc, Validity};

/// How `wss://` verifies the server: the platform's roots, or one CA file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum TlsRoots {
    /// The platform's trust store (`rustls-native-certs`).
    #[default]
    Platform,
    /// Only the certificates (PEM) in this file (`--ca-file`): CAs, and certificates pinned
    /// as they are (a self-signed relay certificate).
    CaFile(PathBuf),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates of a PEM file (`--ca-file`), at least one.
pub fn load_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, DialError> {
    let what = |e: String| DialError::Tls(format!("--ca-file {}: {e}", path.display()));
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| what(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| what(e.to_string()))?;
    if certs.is_empty() {
        return Err(what(
            "no certificate in the file (expected PEM `-----BEGIN CERTIFICATE-----` blocks)".into(),
        ));
    }
    Ok(certs)
}

impl TlsRoots {
    /// The rustls settings for these roots (the platform's are loaded once per process; a CA
    /// file is read at every call, so a replaced file is used by the next dial).
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, DialError> {
        match self {
            TlsRoots::CaFile(path) => {
                let certs = load_ca_file(path)?;
                let source = format!("--ca-file {}", path.display());
                let mut roots = RootCertStore::empty();
                for c in &certs {
                    roots
                        .add(c.clone())
                        .map_err(|e| DialError::Tls(format!("{source}: {e}")))?;
                }
                client_config(RelayCertVerifier::new(certs, roots, source)?)
            }
            TlsRoots::Platform => {
                static PLATFORM: OnceLock<Result<Arc<ClientConfig>, DialError>> = OnceLock::new();
                PLATFORM
                    .get_or_init(|| {
                        let loaded = rustls_native_certs::load_native_certs();
                        let mut roots = RootCertStore::empty();
                        let (added, _) = roots.add_parsable_certificates(loaded.certs);
                        if added == 0 {
                            return Err(DialError::Tls(
                                "no trusted root certificate found on this system; pass --ca-file"
                                    .into(),
                            ));
                        }
                        let verifier = RelayCertVerifier::new(
                            Vec::new(),
                            roots,
                            "this system's trust store".into(),
                        )?;
                        client_config(verifier)
                    })
                    .clone()
            }
        }
    }
}

fn client_config(verifier: RelayCertVerifier) -> Result<Arc<ClientConfig>, DialError> {
    let cfg = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| DialError::Tls(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// A name as rustls presents it (`DnsName("relay.example")`, `IpAddress(…)`) as it reads in
/// a certificate (`relay.example`).
fn bare_name(presented: &str) -> &str {
    match (presented.find("(\""), presented.rfind("\")")) {
        (Some(start), Some(end)) if start + 2 <= end => &presented[start + 2..end],
        _ => presented,
    }
}

/// The words of a refusal by [`RelayCertVerifier`] inside a failed TLS handshake's error, if
/// that is what failed (rustls shows its own wrapper's debug form otherwise).
pub fn untrusted_certificate(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        if let Some(rustls::Error::InvalidCertificate(CertificateError::Other(other))) =
            e.downcast_ref::<rustls::Error>()
        {
            if let Some(u) = other.0.downcast_ref::<UntrustedCertificate>() {
                return Some(u.0.clone());
            }
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if let Some(inner) = io.get_ref() {
                cause = Some(inner);
                continue;
            }
        }
        cause = e.source();
    }
    None
}

/// Why a relay's certificate was refused: the words of the dial error.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct UntrustedCertificate(pub String);

/// Trusts a relay's certificate that is pinned (one of `pinned`, exactly) or that webpki
/// verifies against the roots, name included.
#[derive(Debug)]
pub struct RelayCertVerifier {
    pinned: Vec<CertificateDer<'static>>,
    webpki: Arc<WebPkiServerVerifier>,
    /// Where the trust comes from, for messages (`--ca-file FILE`).
    source: String,
}

impl RelayCertVerifier {
    /// Pin `pinned` and trust the CAs of `roots`; `source` names them in errors.
    pub fn new(
        pinned: Vec<CertificateDer<'static>>,
        roots: RootCertStore,
        source: String,
    ) -> Result<RelayCertVerifier, DialError> {
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| DialError::Tls(format!("{source}: {e}")))?;
        Ok(RelayCertVerifier {
            pinned,
            webpki,
            source,
        })
    }

    fn refuse(message: String) -> rustls::Error {
        rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(
            UntrustedCertificate(message),
        ))))
    }

    /// Why the CA path refused, in words.
    fn ca_refusal(&self, e: &rustls::Error) -> String {
        let rustls::Error::InvalidCertificate(e) = e else {
            return e.to_string();
        };
        match e {
            CertificateError::UnknownIssuer => format!("no certificate in {} issued it", self.source),
            CertificateError::NotValidForNameContext { expected, presented } => format!(
                "it is issued by a CA in {} but is not valid for the name {:?} the relay was dialled by (it names {}): dial the relay by one of those names, or issue the certificate for this one",
                self.source,
                expected.to_str(),
                if presented.is_empty() {
                    "nothing in its subjectAltName".to_string()
                } else {
                    presented
                        .iter()
                        .map(|n| bare_name(n))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ),
            CertificateError::NotValidForName => {
                "it is not valid for the name the relay was dialled by".to_string()
            }
            CertificateError::ExpiredContext { not_after, .. } => format!(
                "it expired at {}",
                utc(i64::try_from(not_after.as_secs()).unwrap_or(i64::MAX))
            ),
            CertificateError::NotValidYetContext { not_before, .. } => format!(
                "it is not valid before {} (is this host's clock right?)",
                utc(i64::try_from(not_before.as_secs()).unwrap_or(i64::MAX))
            ),
            CertificateError::Other(other) if other.to_string().contains("CaUsedAsEndEntity") => {
                "it is a CA certificate (basicConstraints CA:TRUE, as `openssl req -x509` makes one), which a server may present only when it is pinned: put exactly this certificate in the --ca-file".to_string()
            }
            other => other.to_string(),
        }
    }
}

impl ServerCertVerifier for RelayCertVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let fingerprint = certificate_fingerprint(end_entity);
        if self
            .pinned
            .iter()
            .any(|p| p.as_ref() == end_entity.as_ref())
        {
            let now = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
            return match Validity::of(end_entity) {
                Some(v) if v.contains(now) => Ok(ServerCertVerified::assertion()),
                Some(v) if now > v.not_after => Err(Self::refuse(format!(
                    "the relay's certificate ({fingerprint}) is the one pinned in {}, but it expired at {}: the relay needs a new certificate, and {} the new one",
                    self.source,
                    utc(v.not_after),
                    self.source
                ))),
                Some(v) => Err(Self::refuse(format!(
                    "the relay's certificate ({fingerprint}) is the one pinned in {}, but it is not valid before {} (is this host's clock right?)",
                    self.source,
                    utc(v.not_before)
                ))),
                None => Err(Self::refuse(format!(
                    "the relay's certificate ({fingerprint}) is pinned in {} but is not a valid X.509 certificate",
                    self.source
                ))),
            };
        }
        self.webpki
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
            .map_err(|e| {
                let pinned = if self.pinned.is_empty() {
                    String::new()
                } else {
                    format!(
                        "is not pinned in {} (none of its {} certificates is this one), and ",
                        self.source,
                        self.pinned.len()
                    )
                };
                let hint = if self.pinned.is_empty() {
                    " (for a private CA or a self-signed certificate, pass --ca-file)"
                } else {
                    ""
                };
                Self::refuse(format!(
                    "the relay's certificate ({fingerprint}) {pinned}is not trusted through a CA: {}{hint}",
                    self.ca_refusal(&e)
                ))
            })
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_as_in_a_certificate() {
        assert_eq!(bare_name("DnsName(\"relay.example\")"), "relay.example");
        assert_eq!(bare_name("relay.example"), "relay.example");
        assert_eq!(bare_name("IpAddress(10.0.0.1)"), "IpAddress(10.0.0.1)");
    }

    #[test]
    fn a_refusal_is_found_inside_the_io_error_that_carries_it() {
        let refusal = RelayCertVerifier::refuse("the words".into());
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, refusal);
        assert_eq!(untrusted_certificate(&io).as_deref(), Some("the words"));
        let other = std::io::Error::new(std::io::ErrorKind::InvalidData, "plain");
        assert_eq!(untrusted_certificate(&other), None);
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("empty.pem");
        std::fs::write(&p, "not a certificate\n").unwrap();
        let e = TlsRoots::CaFile(p.clone()).client_config().unwrap_err();
        assert!(
            e.to_string().contains("--ca-file") && e.to_string().contains("no certificate"),
            "{e}"
        );
        let missing = dir.path().join("missing.pem");
        let e = TlsRoots::CaFile(missing).client_config().unwrap_err();
        assert!(
            e.to_string().starts_with("--ca-file ") && e.to_string().contains("missing.pem"),
            "{e}"
        );
    }
}
