use std::fs;

use sha2::Digest;

use super::*;
use crate::keys::environments::EnvironmentsFile;
use crate::keys::public_line;

const NOW: u64 = 1_764_547_200_000_000;

fn keypair(byte: u8) -> Keypair {
    Keypair::from_private([byte; KEY_BYTES]).unwrap()
}

/// An environments file listing `entries` (id, key), in a directory kept alive by the caller.
fn environments(dir: &tempfile::TempDir, entries: &[(&str, &Keypair)]) -> EnvironmentsFile {
    let path = dir.path().join("environments");
    let text: String = entries
        .iter()
        .map(|(id, kp)| format!("{id} {}\n", public_line(&kp.public, "test")))
        .collect();
    fs::write(&path, text).unwrap();
    EnvironmentsFile::load(&path).unwrap()
}

/// A relay's cache that started an hour before `NOW`.
fn fresh() -> LinkTimestamps {
    link_timestamps(crate::replay::HANDSHAKE_CLOCK_WINDOW, NOW - 3_600_000_000)
}

struct Setup {
    _dir: tempfile::TempDir,
    relay: Keypair,
    env: Keypair,
    file: EnvironmentsFile,
    timestamps: LinkTimestamps,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let (relay, env) = (keypair(1), keypair(2));
    let file = environments(&dir, &[("sandbox-1", &env)]);
    Setup {
        _dir: dir,
        relay,
        env,
        file,
        timestamps: fresh(),
    }
}

impl Setup {
    fn admit(&mut self, id: &str, open: &Frame, now: u64) -> Result<AdmittedLink, LinkRefusal> {
        admit_link(
            &self.relay,
            id,
            open,
            &self.file,
            &mut self.timestamps,
            now,
            "relay-test",
        )
    }
}

#[test]
fn prologue_layout() {
    let mut want = b"execrelay/relay/v1".to_vec();
    want.extend_from_slice(&[0, 9]);
    want.extend_from_slice(b"sandbox-1");
    assert_eq!(prologue("sandbox-1"), want);
    assert_eq!(&prologue("")[18..], &[0, 0]);
}

/// A known transcript: fixed static and ephemeral keys and a fixed `ts` give fixed bytes.
/// Message 1 is byte for byte what `snow` itself writes for the documented protocol name,
/// prologue and payload (so any Noise implementation given the spec's inputs interoperates),
/// it round-trips through the relay's admission, and the environment verifies message 2.
/// The digests pin the transcript against silent changes of the format.
#[test]
fn a_known_transcript_round_trips() {
    let mut s = setup();
    let (env_e, relay_e) = ([3u8; KEY_BYTES], [4u8; KEY_BYTES]);
    let ts = NOW + 1;
    let (hs, open) =
        EnvironmentHandshake::start_with(&s.env, &s.relay.public, "sandbox-1", ts, Some(&env_e))
            .unwrap();
    assert_eq!(
        (open.ftype, open.stream, open.seq),
        (FrameType::Open, LINK_STREAM, 0)
    );

    // The same message from snow directly, from the spec's inputs.
    let mut raw = snow::Builder::new("Noise_IK_25519_ChaChaPoly_BLAKE2s".parse().unwrap())
        .local_private_key(&s.env.private)
        .unwrap()
        .fixed_ephemeral_key_for_testing_only(&env_e)
        .prologue(b"execrelay/relay/v1\x00\x09sandbox-1")
        .unwrap()
        .remote_public_key(&s.relay.public)
        .unwrap()
        .build_initiator()
        .unwrap();
    let mut m1 = vec![0u8; 512];
    let payload = format!(r#"{{"version":1,"ts":{ts}}}"#);
    let n = raw.write_message(payload.as_bytes(), &mut m1).unwrap();
    assert_eq!(&open.payload[..], &m1[..n]);
    assert_eq!(
        hex(&sha2::Sha256::digest(&open.payload)),
        MSG1_SHA256,
        "message 1 changed"
    );

    // The relay's side, with its ephemeral fixed too.
    let pending = read_link_open(&s.relay, "sandbox-1", &open).unwrap();
    assert_eq!((pending.env_key, pending.ts), (s.env.public, ts));
    let mut fixed = pending;
    fixed.hs = snow::Builder::new(NOISE_PARAMS.parse().unwrap())
        .local_private_key(&s.relay.private)
        .unwrap()
        .fixed_ephemeral_key_for_testing_only(&relay_e)
        .prologue(&prologue("sandbox-1"))
        .unwrap()
        .build_responder()
        .unwrap();
    let mut scratch = vec![0u8; 512];
    fixed.hs.read_message(&open.payload, &mut scratch).unwrap();
    let accept = fixed.accept("relay-test").unwrap();
    assert_eq!(
        (accept.ftype, accept.stream),
        (FrameType::Accept, LINK_STREAM)
    );
    assert_eq!(
        hex(&sha2::Sha256::digest(&accept.payload)),
        MSG2_SHA256,
        "message 2 changed"
    );
    let welcome = hs.finish(&accept).unwrap();
    assert_eq!(
        welcome,
        LinkWelcome {
            version: 1,
            relay_version: "relay-test".into()
        }
    );

    // And through the whole admission, with fresh ephemerals.
    let (hs, open) = EnvironmentHandshake::start(&s.env, &s.relay.public, "sandbox-1", ts).unwrap();
    let admitted = s.admit("sandbox-1", &open, NOW).unwrap();
    assert_eq!((admitted.env_key, admitted.ts), (s.env.public, ts));
    assert!(s.timestamps.accepted(&"sandbox-1".to_string(), ts));
    assert_eq!(
        hs.finish(&admitted.accept).unwrap().relay_version,
        "relay-test"
    );
}

const MSG1_SHA256: &str = "2e83e284da9e7630f75b05dc93b80ff1a76204dbf93a4b51d5cb68b1428e1193";
const MSG2_SHA256: &str = "fee83c2d776ff76037c808e67148a3d59795a6aa5c7fb9887647932fd7b395c8";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn an_environment_pinning_another_relay_key_is_refused_and_learns_unauthorized() {
    let mut s = setup();
    let impostor = keypair(9);
    let (hs, open) =
        EnvironmentHandshake::start(&s.env, &impostor.public, "sandbox-1", NOW).unwrap();
    let err = s.admit("sandbox-1", &open, NOW).unwrap_err();
    assert_eq!(err, LinkRefusal::Undecryptable);
    assert!(err.to_string().contains("--relay-key"), "{err}");
    let reset = err.reset_frame();
    assert_eq!((reset.ftype, reset.stream), (FrameType::Reset, LINK_STREAM));
    assert_eq!(
        hs.finish(&reset).unwrap_err(),
        LinkRefusal::Refused("unauthorized".into())
    );
    assert!(s.timestamps.is_empty(), "nothing recorded for a refusal");
}

#[test]
fn a_relay_without_the_pinned_key_cannot_answer() {
    // Message 2 from another relay (one that could read message 1 only if it had the key):
    // here a relay keyed differently answering its own handshake.
    let s = setup();
    let other = keypair(8);
    let (hs, _) = EnvironmentHandshake::start(&s.env, &s.relay.public, "sandbox-1", NOW).unwrap();
    let (_, open_for_other) =
        EnvironmentHandshake::start(&s.env, &other.public, "sandbox-1", NOW).unwrap();
    let accept = read_link_open(&other, "sandbox-1", &open_for_other)
        .unwrap()
        .accept("other")
        .unwrap();
    assert_eq!(hs.finish(&accept).unwrap_err(), LinkRefusal::WrongRelay);
}

#[test]
fn an_unlisted_key_or_id_is_refused() {
    let mut s = setup();
    let stranger = keypair(5);
    let (_, open) =
        EnvironmentHandshake::start(&stranger, &s.relay.public, "sandbox-1", NOW).unwrap();
    let err = s.admit("sandbox-1", &open, NOW).unwrap_err();
    assert!(
        matches!(err, LinkRefusal::NotAdmitted(NotAdmitted::WrongKey { .. })),
        "{err:?}"
    );
    assert_eq!(err.reset_reason(), "unauthorized");
    assert!(err.to_string().contains("SHA256:"), "{err}");

    // A listed key for an id that is not listed.
    let (_, open) = EnvironmentHandshake::start(&s.env, &s.relay.public, "sandbox-2", NOW).unwrap();
    let err = s.admit("sandbox-2", &open, NOW).unwrap_err();
    assert_eq!(err, LinkRefusal::NotAdmitted(NotAdmitted::UnknownId));
    assert_eq!(err.reset_reason(), "unauthorized");
    assert!(s.timestamps.is_empty());
}

#[test]
fn a_message_1_for_another_id_does_not_open_this_one() {
    // The environment of sandbox-1 names sandbox-1 in its prologue but dials sandbox-2's path,
    // which is listed with the same key: the prologues differ, decryption fails.
    let dir = tempfile::tempdir().unwrap();
    let (relay, env) = (keypair(1), keypair(2));
    let file = environments(&dir, &[("sandbox-1", &env), ("sandbox-2", &env)]);
    let mut ts = fresh();
    let (_, open) = EnvironmentHandshake::start(&env, &relay.public, "sandbox-1", NOW).unwrap();
    let err = admit_link(&relay, "sandbox-2", &open, &file, &mut ts, NOW, "r").unwrap_err();
    assert_eq!(err, LinkRefusal::Undecryptable);
    assert_eq!(err.reset_reason(), "unauthorized");
    // The same message for its own id is fine.
    admit_link(&relay, "sandbox-1", &open, &file, &mut ts, NOW, "r").unwrap();
}

/// A replayed message 1 is refused, however much later within the window; the
/// environment's other stamps pass in any order (a stamp ahead of the clock locks nobody out).
#[test]
fn a_replayed_message_1_is_refused_and_fresh_ones_admitted_in_any_order() {
    let mut s = setup();
    let (_, open) = EnvironmentHandshake::start(&s.env, &s.relay.public, "sandbox-1", NOW).unwrap();
    s.admit("sandbox-1", &open, NOW).unwrap();
    // The very same message again (a replay), even a minute later.
    let err = s.admit("sandbox-1", &open, NOW + 60_000_000).unwrap_err();
    assert_eq!(err, LinkRefusal::Stamp(ReplayError::Replayed { ts: NOW }));
    assert_eq!(err.reset_reason(), "replayed_handshake");
    // A stamp ahead of the clock, then an older one: both fresh, both admitted.
    for ts in [NOW + 90_000_000, NOW - 1] {
        let (_, m) = EnvironmentHandshake::start(&s.env, &s.relay.public, "sandbox-1", ts).unwrap();
        s.admit("sandbox-1", &m, NOW).unwrap();
    }
    assert!(s.timestamps.accepted(&"sandbox-1".to_string(), NOW - 1));
}

/// A message 1 captured before a relay restart is refused by the new relay (nothing stamped
/// before it started), even though the new relay has never seen it.
#[test]
fn a_message_1_captured_before_a_restart_is_refused_after_it() {
    let mut s = setup();
    let (_, open) =
        EnvironmentHandshake::start(&s.env, &s.relay.public, "sandbox-1", NOW - 5).unwrap();
    s.admit("sandbox-1", &open, NOW - 5).unwrap();
    // The relay restarts at NOW: an empty cache.
    let mut restarted = link_timestamps(crate::replay::HANDSHAKE_CLOCK_WINDOW, NOW);
    let err = admit_link(
        &s.relay,
        "sandbox-1",
        &open,
        &s.file,
        &mut restarted,
        NOW + 1,
        "r",
    )
    .unwrap_err();
    assert!(
        matches!(err, LinkRefusal::Stamp(ReplayError::BeforeStart { .. })),
        "{err:?}"
    );
    assert_eq!(err.reset_reason(), "replayed_handshake");
    let (_, fresh_open) =
        EnvironmentHandshake::start(&s.env, &s.relay.public, "sandbox-1", NOW + 1).unwrap();
    admit_link(
        &s.relay,
        "sandbox-1",
        &fresh_open,
        &s.file,
        &mut restarted,
        NOW + 1,
        "r",
    )
    .unwrap();
}

#[test]
fn a_clock_too_far_off_is_refused_at_the_edge() {
    let mut s = setup();
    let skew = crate::replay::HANDSHAKE_CLOCK_WINDOW.as_micros() as u64;
    for (ts, ok) in [
        (NOW - skew - 1, false),
        (NOW - skew, true),
        (NOW + skew, true),
        (NOW + skew + 1, false),
    ] {
        let mut t = fresh();
        let (_, open) =
            EnvironmentHandshake::start(&s.env, &s.relay.public, "sandbox-1", ts).unwrap();
        let r = admit_link(&s.relay, "sandbox-1", &open, &s.file, &mut t, NOW, "r");
        assert_eq!(r.is_ok(), ok, "ts {ts}: {r:?}");
        if let Err(e) = r {
            assert_eq!(e.reset_reason(), "clock_skew");
            assert!(e.to_string().contains("120 s allowed"), "{e}");
        }
    }
    let (_, open) =
        EnvironmentHandshake::start(&s.env, &s.relay.public, "sandbox-1", NOW - skew - 1).unwrap();
    assert!(s.admit("sandbox-1", &open, NOW).is_err());
}

#[test]
fn wrong_frames_and_oversized_messages_are_refused_before_cryptography() {
    let mut s = setup();
    let (_, open) = EnvironmentHandshake::start(&s.env, &s.relay.public, "sandbox-1", NOW).unwrap();
    let mut on_stream = open.clone();
    on_stream.stream = [1; 16];
    let mut data = open.clone();
    data.ftype = FrameType::Data;
    // The environment link's handshake is suite 0 only.
    let mut suite_1 = open.clone();
    suite_1.flags = 1;
    for f in [on_stream, data, suite_1] {
        let err = s.admit("sandbox-1", &f, NOW).unwrap_err();
        assert!(
            matches!(err, LinkRefusal::UnexpectedFrame { .. }),
            "{err:?}"
        );
        assert_eq!(err.reset_reason(), "malformed_frame");
    }
    let big = Frame::new(
        FrameType::Open,
        LINK_STREAM,
        0,
        Bytes::from(vec![0u8; MAX_LINK_MSG1_BYTES + 1]),
    );
    assert_eq!(
        s.admit("sandbox-1", &big, NOW).unwrap_err(),
        LinkRefusal::TooLarge(MAX_LINK_MSG1_BYTES + 1)
    );
    // A truncated or tampered message 1 does not decrypt.
    let mut tampered = open.payload.to_vec();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    let f = Frame::new(FrameType::Open, LINK_STREAM, 0, Bytes::from(tampered));
    assert_eq!(
        s.admit("sandbox-1", &f, NOW).unwrap_err(),
        LinkRefusal::Undecryptable
    );
    // The environment refuses anything but an ACCEPT or RESET on stream 0.
    let (hs, _) = EnvironmentHandshake::start(&s.env, &s.relay.public, "sandbox-1", NOW).unwrap();
    assert!(matches!(
        hs.finish(&Frame::reset([2; 16], "busy")),
        Err(LinkRefusal::UnexpectedFrame { .. })
    ));
}

#[test]
fn a_message_1_without_a_ts_is_refused() {
    let s = setup();
    for payload in [
        &br#"{"version":1}"#[..],
        br#"{"version":2,"ts":1}"#,
        b"not json",
    ] {
        let mut i = snow::Builder::new(NOISE_PARAMS.parse().unwrap())
            .local_private_key(&s.env.private)
            .unwrap()
            .prologue(&prologue("sandbox-1"))
            .unwrap()
            .remote_public_key(&s.relay.public)
            .unwrap()
            .build_initiator()
            .unwrap();
        let mut m1 = vec![0u8; 512];
        let n = i.write_message(payload, &mut m1).unwrap();
        let f = Frame::new(
            FrameType::Open,
            LINK_STREAM,
            0,
            Bytes::copy_from_slice(&m1[..n]),
        );
        let err = read_link_open(&s.relay, "sandbox-1", &f).unwrap_err();
        assert!(matches!(err, LinkRefusal::Payload(_)), "{err:?}");
    }
}

#[test]
fn the_timestamp_table_is_bounded_by_ids() {
    let mut t = fresh();
    let ids = TRACKED_ENVIRONMENTS + 5;
    for n in 0..ids {
        t.admit(&format!("env-{n}"), NOW + n as u64, NOW).unwrap();
    }
    assert_eq!(t.len(), TRACKED_ENVIRONMENTS);
    // The least recently admitted went first.
    assert!(!t.accepted(&"env-0".to_string(), NOW));
    assert!(t.accepted(&format!("env-{}", ids - 1), NOW + ids as u64 - 1));
}
