//! The certificate files: loading, every refusal, and reloads (a good replacement put in
//! force, a broken one kept out).

use std::os::unix::fs::PermissionsExt;

use rcgen::{date_time_ymd, CertificateParams, KeyPair};

use super::*;

/// A self-signed certificate for `localhost` valid from `from` to `until` (years): PEM of
/// the certificate and of its key.
fn self_signed(from: i32, until: i32) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params.not_before = date_time_ymd(from, 1, 1);
    params.not_after = date_time_ymd(until, 1, 1);
    (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
}

struct Files {
    _dir: tempfile::TempDir,
    files: CertificateFiles,
}

impl Files {
    fn new() -> Files {
        let dir = tempfile::tempdir().unwrap();
        let files = CertificateFiles {
            cert: dir.path().join("cert.pem"),
            key: dir.path().join("key.pem"),
        };
        Files { _dir: dir, files }
    }

    /// Replace both files, as a renewal does (new inodes).
    fn write(&self, (cert, key): &(String, String)) {
        self.write_cert(cert);
        self.write_key(key);
    }

    fn write_cert(&self, cert: &str) {
        let tmp = self.files.cert.with_extension("new");
        std::fs::write(&tmp, cert).unwrap();
        std::fs::rename(&tmp, &self.files.cert).unwrap();
    }

    fn write_key(&self, key: &str) {
        let tmp = self.files.key.with_extension("new");
        std::fs::write(&tmp, key).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::rename(&tmp, &self.files.key).unwrap();
    }
}

fn fingerprint_of(cert_pem: &str) -> String {
    let der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap();
    certificate_fingerprint(&der)
}

#[test]
fn a_pair_loads_with_its_fingerprint_and_dates() {
    let f = Files::new();
    let pair = self_signed(2020, 2090);
    f.write(&pair);
    let loaded = f.files.load().unwrap();
    assert_eq!(loaded.fingerprint, fingerprint_of(&pair.0));
    assert!(loaded.fingerprint.starts_with("SHA256:") && loaded.fingerprint.len() == 7 + 95);
    assert_eq!(utc(loaded.validity.not_before), "2020-01-01 00:00:00 UTC");
    assert_eq!(utc(loaded.validity.not_after), "2090-01-01 00:00:00 UTC");
}

#[test]
fn every_unusable_pair_is_refused_naming_its_flag() {
    let f = Files::new();
    let good = self_signed(2020, 2090);
    let other = self_signed(2020, 2090);
    let err = |f: &Files| f.files.load().map(|_| ()).unwrap_err().to_string();

    let e = err(&f);
    assert!(
        e.starts_with("--tls-cert ") && e.contains("No such file"),
        "{e}"
    );
    f.write(&(good.0.clone(), other.1.clone()));
    let e = err(&f);
    assert!(
        e.starts_with("--tls-key ") && e.contains("is not the private key of --tls-cert"),
        "{e}"
    );
    f.write(&(String::from("garbage\n"), good.1.clone()));
    let e = err(&f);
    assert!(
        e.starts_with("--tls-cert ") && e.contains("no certificate"),
        "{e}"
    );
    f.write(&(good.0.clone(), String::from("garbage\n")));
    let e = err(&f);
    assert!(
        e.starts_with("--tls-key ") && e.contains("no usable private key"),
        "{e}"
    );
    let expired = self_signed(2000, 2001);
    f.write(&expired);
    let e = err(&f);
    assert!(e.contains("expired at 2001-01-01 00:00:00 UTC"), "{e}");
    let future = self_signed(2090, 2091);
    f.write(&future);
    let e = err(&f);
    assert!(e.contains("not valid before 2090-01-01"), "{e}");
    f.write(&good);
    std::fs::set_permissions(&f.files.key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = err(&f);
    assert!(e.contains("readable by every user (mode 644)"), "{e}");
    // Group-readable keys are the usual `ssl-cert` arrangement: allowed.
    std::fs::set_permissions(&f.files.key, std::fs::Permissions::from_mode(0o640)).unwrap();
    assert!(f.files.load().is_ok());
    let big = "x".repeat(MAX_TLS_FILE_BYTES as usize + 1);
    f.write_cert(&big);
    let e = err(&f);
    assert!(e.contains("larger than"), "{e}");
}

#[test]
fn a_good_replacement_is_put_in_force_and_a_broken_one_kept_out() {
    let f = Files::new();
    let first = self_signed(2020, 2090);
    f.write(&first);
    let store = CertificateStore::load(f.files.clone()).unwrap();
    assert!(store.poll().is_none(), "nothing changed");
    assert_eq!(store.current().fingerprint, fingerprint_of(&first.0));

    let second = self_signed(2021, 2091);
    f.write(&second);
    match store.poll() {
        Some(Reload::Replaced(c)) => assert_eq!(c.fingerprint, fingerprint_of(&second.0)),
        other => panic!("{other:?}"),
    }
    assert!(store.poll().is_none(), "looked at once per change");

    // Half a renewal: the certificate is new, the key still the old one. Kept out, and the
    // second pair stays in force; once the key follows, the new pair loads.
    let third = self_signed(2022, 2092);
    f.write_cert(&third.0);
    match store.poll() {
        Some(Reload::Kept(TlsError::Mismatch { .. })) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(store.current().fingerprint, fingerprint_of(&second.0));
    assert!(
        store.poll().is_none(),
        "a failure is not retried until a file changes"
    );
    f.write_key(&third.1);
    assert!(matches!(store.poll(), Some(Reload::Replaced(_))));
    assert_eq!(store.current().fingerprint, fingerprint_of(&third.0));

    // A broken file, then a missing one: kept out each time.
    f.write_cert("-----BEGIN CERTIFICATE-----\nnot base64\n");
    assert!(matches!(
        store.poll(),
        Some(Reload::Kept(TlsError::Cert { .. }))
    ));
    std::fs::remove_file(&f.files.cert).unwrap();
    assert!(matches!(
        store.poll(),
        Some(Reload::Kept(TlsError::Cert { .. }))
    ));
    assert_eq!(store.current().fingerprint, fingerprint_of(&third.0));
    let figures = store.figures();
    assert_eq!((figures.reloads, figures.reload_errors), (2, 3));
    assert_eq!(figures.fingerprint, fingerprint_of(&third.0));
    assert_eq!(utc(figures.not_after), "2092-01-01 00:00:00 UTC");
}

#[test]
fn the_resolver_hands_out_the_pair_in_force() {
    let f = Files::new();
    let first = self_signed(2020, 2090);
    f.write(&first);
    let store = CertificateStore::load(f.files.clone()).unwrap();
    let served = |s: &CertificateStore| s.read_current_key().cert[0].clone();
    assert_eq!(
        certificate_fingerprint(&served(&store)),
        fingerprint_of(&first.0)
    );
    let second = self_signed(2021, 2091);
    f.write(&second);
    store.poll();
    assert_eq!(
        certificate_fingerprint(&served(&store)),
        fingerprint_of(&second.0)
    );
}
