//! TLS at the relay's own listener (`secure-transport.md` §6.1: `--listen wss://HOST:PORT
//! --tls-cert FILE --tls-key FILE`), so that a relay needs no TLS-terminating proxy.
//!
//! # What this module owns
//!
//! - **Loading** a certificate chain and its private key from PEM files
//!   ([`CertificateFiles`]): bounded reads ([`MAX_TLS_FILE_BYTES`]), a private key readable by
//!   every user refused, the key checked against the certificate, an expired or not yet valid
//!   leaf refused; every error names its flag and file ([`TlsError`]).
//! - **Renewal without a restart**: [`CertificateStore`] is rustls' certificate resolver;
//!   [`CertificateStore::poll`] looks at both files' stamps (size, modification time, inode)
//!   and, when either changed, loads the pair anew. A pair that loads replaces the current one
//!   for every handshake from then on; a pair that does not (a half-written file, a key of
//!   another certificate, an expired certificate) is kept out, the previous certificate stays,
//!   and the reason is logged once per change. Links already up are never touched: their TLS
//!   sessions do not depend on the files.
//! - The server side of the handshake ([`TlsListener::accept`]), counted by outcome.
//!
//! # What it must never do
//!
//! - Log or expose key material: only the certificate's SHA-256 fingerprint and dates.
//! - Serve a certificate whose key does not match it, or drop the certificate in force for
//!   a replacement that does not load.

pub mod validity;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sha2::Digest;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::http::MovableTcp;

use execrelay_protocol::keys::{stamp, Stamp};
use execrelay_protocol::sync::read as read_lock;
use validity::{unix_now, utc, Validity};

/// Largest certificate or key file read: a chain of a few certificates is a few KiB; 1 MiB
/// leaves room for long chains while bounding what a wrong path (a log file) costs.
pub const MAX_TLS_FILE_BYTES: u64 = 1 << 20;
/// How often the certificate and key files are checked for a change (two `stat`s; they are
/// read only when a stamp changed). A renewal is picked up within this time.
pub const CERTIFICATE_POLL_MS: u64 = 1_000;

/// The two PEM files of a TLS listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateFiles {
    /// `--tls-cert`: the certificate chain, leaf first.
    pub cert: PathBuf,
    /// `--tls-key`: the leaf's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// A certificate or key that cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The certificate file.
    #[error("--tls-cert {path}: {why}")]
    Cert {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The key file.
    #[error("--tls-key {path}: {why}")]
    Key {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The key is not the certificate's.
    #[error("--tls-key {key} is not the private key of --tls-cert {cert} (their public keys differ: replace both files together)")]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
    /// rustls refused the settings.
    #[error("cannot set up TLS: {0}")]
    Config(String),
}

/// One loaded certificate chain and key, and what the logs and metrics show of it.
#[derive(Debug)]
pub struct LoadedCertificate {
    key: Arc<CertifiedKey>,
    /// `SHA256:` and the hex of the leaf certificate's DER.
    pub fingerprint: String,
    /// The leaf's validity period.
    pub validity: Validity,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The SHA-256 fingerprint of a certificate, as `openssl x509 -fingerprint -sha256` shows it.
pub fn certificate_fingerprint(der: &[u8]) -> String {
    let hex: Vec<String> = sha2::Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect();
    format!("SHA256:{}", hex.join(":"))
}

/// Read `path` whole, at most [`MAX_TLS_FILE_BYTES`].
fn read(path: &Path) -> Result<Vec<u8>, String> {
    let meta = fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.len() > MAX_TLS_FILE_BYTES {
        return Err(format!(
            "{} bytes: larger than {MAX_TLS_FILE_BYTES} bytes, not a PEM file",
            meta.len()
        ));
    }
    fs::read(path).map_err(|e| e.to_string())
}

impl CertificateFiles {
    /// Load and check the pair as it is on disk now.
    pub fn load(&self) -> Result<LoadedCertificate, TlsError> {
        let cert_err = |why: String| TlsError::Cert {
            path: self.cert.clone(),
            why,
        };
        let key_err = |why: String| TlsError::Key {
            path: self.key.clone(),
            why,
        };
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(&read(&self.cert).map_err(cert_err)?)
                .collect::<Result<_, _>>()
                .map_err(|e| cert_err(format!("not a PEM certificate file: {e}")))?;
        let Some(leaf) = chain.first() else {
            return Err(cert_err(
                "no certificate in the file (expected PEM `-----BEGIN CERTIFICATE-----` blocks, the server's first)"
                    .into(),
            ));
        };
        let validity = Validity::of(leaf).ok_or_else(|| {
            cert_err("the first certificate is not a valid X.509 certificate".into())
        })?;
        let now = unix_now();
        if now > validity.not_after {
            return Err(cert_err(format!(
                "the certificate expired at {}",
                utc(validity.not_after)
            )));
        }
        if now < validity.not_before {
            return Err(cert_err(format!(
                "the certificate is not valid before {} (is this host's clock right?)",
                utc(validity.not_before)
            )));
        }
        let mode = fs::metadata(&self.key)
            .map_err(|e| key_err(e.to_string()))?
            .permissions()
            .mode();
        if mode & 0o004 != 0 {
            return Err(key_err(format!(
                "the private key is readable by every user (mode {:o}); run `chmod o-r {}`",
                mode & 0o777,
                self.key.display()
            )));
        }
        let key = PrivateKeyDer::from_pem_slice(&read(&self.key).map_err(key_err)?).map_err(
            |e| {
                key_err(format!(
                    "no usable private key (expected one PEM `PRIVATE KEY` block: PKCS#8, PKCS#1 or SEC1): {e}"
                ))
            },
        )?;
        let fingerprint = certificate_fingerprint(leaf);
        let certified = CertifiedKey::from_der(chain, key, &provider()).map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => TlsError::Mismatch {
                cert: self.cert.clone(),
                key: self.key.clone(),
            },
            other => key_err(format!("unusable private key: {other}")),
        })?;
        Ok(LoadedCertificate {
            key: Arc::new(certified),
            fingerprint,
            validity,
        })
    }

    fn stamps(&self) -> (Option<Stamp>, Option<Stamp>) {
        (stamp(&self.cert), stamp(&self.key))
    }
}

/// What [`CertificateStore::poll`] found.
#[derive(Debug)]
pub enum Reload {
    /// The files changed and the new pair is in force.
    Replaced(Arc<LoadedCertificate>),
    /// The files changed but the new pair cannot be used: the previous one stays.
    Kept(TlsError),
}

/// Counts of one TLS listener, for the metrics.
#[derive(Debug, Default)]
pub struct TlsStats {
    reloads: AtomicU64,
    reload_errors: AtomicU64,
    handshakes: AtomicU64,
    handshake_failures: AtomicU64,
}

/// A snapshot of [`TlsStats`] and the certificate in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFigures {
    /// Changed files loaded and put in force.
    pub reloads: u64,
    /// Changed files that could not be used (the previous certificate was kept).
    pub reload_errors: u64,
    /// TLS handshakes completed.
    pub handshakes: u64,
    /// TLS handshakes that failed or timed out.
    pub handshake_failures: u64,
    /// The certificate in force: its `notAfter`, seconds since the epoch.
    pub not_after: i64,
    /// Its fingerprint.
    pub fingerprint: String,
}

/// The certificate in force for new handshakes, re-read when its files change.
#[derive(Debug)]
pub struct CertificateStore {
    files: CertificateFiles,
    current: RwLock<Arc<LoadedCertificate>>,
    /// The stamps of the files when they were last looked at.
    seen: Mutex<(Option<Stamp>, Option<Stamp>)>,
    stats: TlsStats,
}

impl CertificateStore {
    /// Load the pair at start: an error here stops the relay before it serves.
    pub fn load(files: CertificateFiles) -> Result<CertificateStore, TlsError> {
        let seen = files.stamps();
        let loaded = files.load()?;
        Ok(CertificateStore {
            files,
            current: RwLock::new(Arc::new(loaded)),
            seen: Mutex::new(seen),
            stats: TlsStats::default(),
        })
    }

    /// The files.
    pub fn files(&self) -> &CertificateFiles {
        &self.files
    }

    /// The certificate in force.
    pub fn current(&self) -> Arc<LoadedCertificate> {
        read_lock(&self.current).clone()
    }

    /// Look at the files; when either changed since the last look, load the pair and put it
    /// in force, or keep the current one if it cannot be used. `None` when nothing changed.
    pub fn poll(&self) -> Option<Reload> {
        let now = self.files.stamps();
        {
            let mut seen = execrelay_protocol::sync::lock(&self.seen);
            if *seen == now {
                return None;
            }
            // Remembered whatever the outcome: a pair that fails is tried again only when a
            // file changes again (the second of the two files being written, typically).
            *seen = now;
        }
        match self.files.load() {
            Ok(loaded) => {
                let loaded = Arc::new(loaded);
                *execrelay_protocol::sync::write(&self.current) = loaded.clone();
                self.stats.reloads.fetch_add(1, Ordering::Relaxed);
                Some(Reload::Replaced(loaded))
            }
            Err(e) => {
                self.stats.reload_errors.fetch_add(1, Ordering::Relaxed);
                Some(Reload::Kept(e))
            }
        }
    }

    /// The counts and the certificate in force.
    pub fn figures(&self) -> TlsFigures {
        let current = self.current();
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        TlsFigures {
            reloads: load(&self.stats.reloads),
            reload_errors: load(&self.stats.reload_errors),
            handshakes: load(&self.stats.handshakes),
            handshake_failures: load(&self.stats.handshake_failures),
            not_after: current.validity.not_after,
            fingerprint: current.fingerprint.clone(),
        }
    }
}

impl CertificateStore {
    /// What the resolver hands rustls now.
    fn read_current_key(&self) -> Arc<CertifiedKey> {
        read_lock(&self.current).key.clone()
    }
}

impl ResolvesServerCert for CertificateStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.read_current_key())
    }
}

/// A listener's TLS: the certificate store and the acceptor built on it.
#[derive(Clone)]
pub struct TlsListener {
    store: Arc<CertificateStore>,
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for TlsListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsListener")
            .field("files", self.store.files())
            .finish_non_exhaustive()
    }
}

impl TlsListener {
    /// Load `files` and build the acceptor (TLS 1.2 and 1.3, `ring`, no client certificates,
    /// ALPN `http/1.1`).
    pub fn new(files: CertificateFiles) -> Result<TlsListener, TlsError> {
        let store = Arc::new(CertificateStore::load(files)?);
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(store.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(TlsListener {
            store,
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// The certificate store.
    pub fn store(&self) -> &Arc<CertificateStore> {
        &self.store
    }

    /// The server side of one TLS handshake (the caller bounds it in time).
    pub async fn accept(&self, tcp: TcpStream) -> std::io::Result<TlsStream<MovableTcp>> {
        let counter = |c: &AtomicU64| {
            c.fetch_add(1, Ordering::Relaxed);
        };
        match self.acceptor.accept(MovableTcp::new(tcp)).await {
            Ok(tls) => {
                counter(&self.store.stats.handshakes);
                Ok(tls)
            }
            Err(e) => {
                counter(&self.store.stats.handshake_failures);
                Err(e)
            }
        }
    }

    /// Count a handshake that did not finish in time.
    pub fn handshake_timed_out(&self) {
        self.store
            .stats
            .handshake_failures
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Look at the files every `every` until `stop`, logging each replacement and each
    /// replacement kept out.
    pub async fn watch(self, every: Duration, stop: CancellationToken) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let store = self.store.clone();
            // A `stat` each, and a read of a few KiB when a file changed: off the runtime.
            let Ok(polled) = tokio::task::spawn_blocking(move || store.poll()).await else {
                continue;
            };
            match polled {
                None => {}
                Some(Reload::Replaced(c)) => tracing::info!(
                    fingerprint = %c.fingerprint,
                    not_after = %utc(c.validity.not_after),
                    "TLS certificate reloaded: new links use it (links up keep theirs)"
                ),
                Some(Reload::Kept(error)) => {
                    let kept = self.store.current();
                    tracing::error!(
                        %error,
                        kept = %kept.fingerprint,
                        not_after = %utc(kept.validity.not_after),
                        "TLS certificate files changed but cannot be used: keeping the previous certificate"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
