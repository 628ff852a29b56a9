//! What `deploy/` ships, checked against the code: the sample relay and exec-server TOML
//! files load with the binaries' own configuration loaders (as they are, and with their paths
//! pointed at real files), every metric and label value the alert rules use is one the code
//! exports, and the systemd units name the paths the packages and the samples use. (The
//! package build and install, `systemd-analyze verify` and `promtool` need root and Debian
//! packages: `deploy/ci.sh`, run by `.ci/run`.)

mod common;

use std::path::{Path, PathBuf};

use clap::Parser;

use execrelay::cli::{Cli, Command};
use execrelay::metrics::{ContainmentStage, Metrics, StateSnapshot};
use execrelay::noise::keys::{public_line, Keypair};
use execrelay_io::driver::RelaySnapshot;
use execrelay_io::tls::TlsFigures;
use execrelay_protocol::reason::Counters;
use execrelay_relay::server::cli::RelayArgs;
use execrelay_relay::server::metrics::{render, Figures, ServerStats};
use execrelay_relay::server::settings::RelaySettings;

fn deploy(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(name)
}

fn read(name: &str) -> String {
    std::fs::read_to_string(deploy(name)).unwrap()
}

fn serve_args(args: &[&str]) -> Box<execrelay::cli::serve::ServeArgs> {
    let all = ["execrelay", "serve"]
        .into_iter()
        .chain(args.iter().copied());
    match Cli::try_parse_from(all).unwrap().command {
        Command::Serve(s) => s,
        _ => unreachable!(),
    }
}

/// `deploy/NAME` with every path under `/etc/execrelay/` and `/var/lib/execrelay*/` moved
/// into `dir`, written as `DIR/NAME`.
fn relocated(name: &str, dir: &Path) -> PathBuf {
    let d = dir.display();
    let text = read(name)
        .replace("/etc/execrelay/", &format!("{d}/"))
        .replace("/var/lib/execrelay-relay/", &format!("{d}/"))
        .replace("/var/lib/execrelay/", &format!("{d}/"));
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn the_sample_relay_configuration_loads() {
    let config = deploy("relay.toml");
    let args = RelayArgs::try_parse_from(["execrelay-relay", "--config", config.to_str().unwrap()])
        .unwrap();
    let s = args.settings().unwrap();
    assert_eq!(s.max_environments, 10_000);
    assert_eq!(s.max_queued_bytes, 256 << 20);
    // As shipped, its files are the installed host's: the first one missing is named by its
    // key in the file.
    let err = args.prepare().err().expect("no relay key here").to_string();
    assert!(
        err.starts_with("key (in --config ") && err.contains("/var/lib/execrelay-relay/relay.key"),
        "{err}"
    );

    // With its files present (a TLS pair, the relay's key, the environments file): ready to
    // serve wss://.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("tls")).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["relay.example.com".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(dir.path().join("tls/relay.crt"), cert.pem()).unwrap();
    std::fs::write(dir.path().join("tls/relay.key"), key.serialize_pem()).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        dir.path().join("tls/relay.key"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    Keypair::generate()
        .unwrap()
        .write(&dir.path().join("relay.key"), "relay")
        .unwrap();
    std::fs::copy(deploy("environments"), dir.path().join("environments")).unwrap();
    let config = relocated("relay.toml", dir.path());
    let prepared =
        RelayArgs::try_parse_from(["execrelay-relay", "--config", config.to_str().unwrap()])
            .unwrap()
            .prepare()
            .unwrap();
    assert!(prepared.listen.tls);
    assert_eq!(prepared.listen.addr, "0.0.0.0:443".parse().unwrap());
    assert_eq!(prepared.metrics, Some("127.0.0.1:9465".parse().unwrap()));
}

#[test]
fn the_sample_exec_server_configuration_loads() {
    let config = deploy("server.toml");
    let s = serve_args(&["--config", config.to_str().unwrap()]);
    let c = s.config().unwrap();
    assert_eq!((c.max_sessions, c.max_processes), (64, 256));
    assert_eq!(c.relay_refused_backoff_max_ms, 300_000);
    assert!(s.listen().unwrap().is_none(), "relay mode only");
    assert_eq!(
        s.probe_listeners().unwrap(),
        (
            Some("127.0.0.1:9464".parse().unwrap()),
            Some("127.0.0.1:9466".parse().unwrap())
        )
    );
    let err = s.relay_dial().expect_err("no relay key here").to_string();
    assert!(
        err.starts_with("relay_key (in --config ") && err.contains("/etc/execrelay/relay.pub"),
        "{err}"
    );

    // With its files present: the relay dial and the keys load.
    let dir = tempfile::tempdir().unwrap();
    let relay = Keypair::generate().unwrap();
    std::fs::write(
        dir.path().join("relay.pub"),
        public_line(&relay.public, "relay"),
    )
    .unwrap();
    Keypair::generate()
        .unwrap()
        .write(&dir.path().join("server.key"), "server")
        .unwrap();
    std::fs::copy(
        deploy("authorized_keys"),
        dir.path().join("authorized_keys"),
    )
    .unwrap();
    let config = relocated("server.toml", dir.path());
    let s = serve_args(&["--config", config.to_str().unwrap()]);
    let dial = s.relay_dial().unwrap().expect("relay mode");
    assert_eq!(dial.relay_url, "wss://relay.example.com");
    assert_eq!(dial.env_id, "sandbox-1");
    assert_eq!(dial.relay_public, relay.public);
    s.noise_config(&dial.env_id).unwrap();
}

/// The exec server's and the relay's metrics text, every family populated at least once.
fn exported() -> String {
    let m = Metrics::new();
    m.environment_link().set_state("up");
    m.containment_failure(ContainmentStage::Kill);
    let mut text = m.render(&StateSnapshot::default());
    let figures = Figures {
        hub: RelaySnapshot {
            links: 0,
            environments: 0,
            streams: 0,
            queued_bytes: 0,
            deepest_link_queue_bytes: 0,
            counters: Counters::default(),
        },
        environments_listed: 0,
        environments_file_ok: true,
        max_client_links: 4096,
        cluster: None,
        tls: Some(TlsFigures {
            reloads: 0,
            reload_errors: 0,
            handshakes: 0,
            handshake_failures: 0,
            not_after: 0,
            fingerprint: String::new(),
        }),
        runtimes: vec![execrelay_io::runtimes::RuntimeFigures {
            alive_tasks: 2,
            connections_placed: 1,
        }],
    };
    text.push_str(&render(
        &figures,
        &ServerStats::default(),
        &RelaySettings::default(),
    ));
    text
}

/// `execrelay_…` names in `line` (those ending in `_`, prefixes in comments, excluded).
fn metric_names(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("execrelay_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        if !name.ends_with('_') {
            out.push(name.to_string());
        }
        rest = &tail[end..];
    }
    out
}

/// `label="value"` and `label=~"a|b"` matchers in `line`: (label, value) pairs, each
/// alternative of a regex that is a plain word on its own.
fn matchers(line: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let bytes = line.as_bytes();
    for (i, _) in line.match_indices("=\"").chain(line.match_indices("=~\"")) {
        let label_end = i;
        let label_start = line[..label_end]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |p| p + 1);
        let label = &line[label_start..label_end];
        let open = i + if bytes[i + 1] == b'~' { 3 } else { 2 };
        let Some(close) = line[open..].find('"') else {
            continue;
        };
        for alt in line[open..open + close].split('|') {
            if !label.is_empty() && alt.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                out.push((label.to_string(), alt.to_string()));
            }
        }
    }
    out
}

#[test]
fn every_metric_and_label_the_alerts_use_is_exported() {
    let text = exported();
    let rules = read("alerts.yml");
    let mut names = 0;
    for line in rules.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with("summary:") {
            continue;
        }
        for name in metric_names(line) {
            names += 1;
            let sampled = text.lines().any(|l| {
                l.strip_prefix(name.as_str())
                    .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
            });
            assert!(
                sampled,
                "alerts.yml uses {name}, which is not exported:\n{text}"
            );
        }
        for (label, value) in matchers(line) {
            let pair = format!("{label}=\"{value}\"");
            assert!(
                text.contains(&pair),
                "alerts.yml matches {pair}, which no exported series has"
            );
        }
    }
    assert!(names >= 20, "found only {names} metric names in alerts.yml");
}

#[test]
fn the_units_name_the_files_the_samples_and_packages_use() {
    let server_unit = read("systemd/execrelay.service");
    let relay_unit = read("systemd/execrelay-relay.service");
    let build = read("debian/build.sh");
    for (unit, config, state, key, toml) in [
        (
            &server_unit,
            "/etc/execrelay/server.toml",
            "StateDirectory=execrelay\n",
            "/var/lib/execrelay/server.key",
            read("server.toml"),
        ),
        (
            &relay_unit,
            "/etc/execrelay/relay.toml",
            "StateDirectory=execrelay-relay\n",
            "/var/lib/execrelay-relay/relay.key",
            read("relay.toml"),
        ),
    ] {
        assert!(unit.contains(&format!("--config {config}")), "{config}");
        assert!(unit.contains(state), "{state}");
        assert!(
            unit.contains(&format!("keygen --if-missing -o {key}")),
            "the unit makes {key}"
        );
        assert!(
            toml.contains(&format!("key = \"{key}\"")),
            "the sample uses {key}"
        );
        let file = Path::new(config).file_name().unwrap().to_str().unwrap();
        assert!(
            build.contains(&format!("{file}:{file}")),
            "the package installs {config}"
        );
    }
    assert!(
        server_unit.contains("Delegate=yes"),
        "containment needs its cgroup"
    );
    assert!(server_unit.contains("CapabilityBoundingSet=\n"));
    assert!(relay_unit.contains("CapabilityBoundingSet=CAP_NET_BIND_SERVICE\n"));
    for unit in [&server_unit, &relay_unit] {
        assert!(unit.contains("NoNewPrivileges=yes"));
        assert!(unit.contains("ProtectSystem="));
        assert!(unit.contains("StandardError=journal"));
    }
}

/// Both binaries name the flag of every file they cannot find (`--environments: …`), and
/// fail before serving anything.
#[test]
fn every_missing_file_names_its_flag() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = |name: &str| d.join(name).to_str().unwrap().to_string();
    let key = Keypair::generate().unwrap();
    key.write(&d.join("key"), "k").unwrap();
    std::fs::write(d.join("auth"), "").unwrap();
    std::fs::write(d.join("envs"), "").unwrap();
    let pub_line = public_line(&key.public, "k");
    let run = |bin: &Path, args: &[String]| {
        let out = std::process::Command::new(bin)
            .args(args)
            .env("RUST_LOG", "off")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let relay = common::relay::relay_bin();
    let exec = PathBuf::from(common::bin());
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let relay_base = |key: &str, envs: &str| {
        s(&[
            "--listen",
            "ws://127.0.0.1:0",
            "--key",
            key,
            "--environments",
            envs,
        ])
    };
    let serve_base = |extra: &[&str]| {
        let mut v = s(&["serve", "--listen", "noise+ws://127.0.0.1:0"]);
        v.extend(s(extra));
        v
    };
    let relay_dial = |extra: &[&str]| {
        let mut v = s(&[
            "serve",
            "--relay",
            "ws://127.0.0.1:9",
            "--environment-id",
            "e",
            "--key",
            &p("key"),
            "--authorized-keys",
            &p("auth"),
        ]);
        v.extend(s(extra));
        v
    };
    let cases: Vec<(&Path, Vec<String>, &str, &str)> = vec![
        (
            &relay,
            relay_base(&p("nokey"), &p("envs")),
            "--key: ",
            "nokey",
        ),
        (
            &relay,
            relay_base(&p("key"), &p("noenvs")),
            "--environments: ",
            "noenvs",
        ),
        (
            &relay,
            s(&["--config", &p("no.toml")]),
            "--config ",
            "no.toml",
        ),
        (
            &relay,
            {
                let mut v = relay_base(&p("key"), &p("envs"));
                v[1] = "wss://127.0.0.1:0".into();
                v.extend(s(&["--tls-cert", &p("no.crt"), "--tls-key", &p("no.key")]));
                v
            },
            "--tls-cert ",
            "no.crt",
        ),
        (
            &exec,
            serve_base(&["--key", &p("nokey"), "--authorized-keys", &p("auth")]),
            "--key: ",
            "nokey",
        ),
        (
            &exec,
            serve_base(&["--key", &p("key"), "--authorized-keys", &p("noauth")]),
            "--authorized-keys: ",
            "noauth",
        ),
        (
            &exec,
            serve_base(&[
                "--key",
                &p("key"),
                "--authorized-keys",
                &p("auth"),
                "--auth-token-file",
                &p("notoken"),
            ]),
            "--auth-token-file ",
            "notoken",
        ),
        (
            &exec,
            s(&["serve", "--exec-policy", &p("nopolicy")]),
            "--exec-policy: ",
            "nopolicy",
        ),
        (
            &exec,
            s(&["serve", "--config", &p("no.toml")]),
            "--config ",
            "no.toml",
        ),
        (
            &exec,
            relay_dial(&["--relay-key", &p("norelay.pub")]),
            "--relay-key: ",
            "norelay.pub",
        ),
        (
            &exec,
            relay_dial(&["--relay-key", &pub_line, "--ca-file", &p("noca.pem")]),
            "--ca-file ",
            "noca.pem",
        ),
        (
            &exec,
            s(&[
                "run",
                "noise+ws://127.0.0.1:9",
                "--server-key",
                &pub_line,
                "--key",
                &p("nokey"),
                "--",
                "true",
            ]),
            "--key: ",
            "nokey",
        ),
        (
            &exec,
            s(&[
                "run",
                "noise+ws://127.0.0.1:9",
                "--server-key",
                &p("noserver.pub"),
                "--key",
                &p("key"),
                "--",
                "true",
            ]),
            "--server-key: ",
            "noserver.pub",
        ),
    ];
    for (bin, args, flag, file) in cases {
        let (code, err) = run(bin, &args);
        // `serve` and the relay exit 2 for bad flags or files; `run` 255, as ssh does for
        // its own errors (its exit code is otherwise the remote process's).
        let expected = if args[0] == "run" { 255 } else { 2 };
        assert_eq!(code, Some(expected), "{args:?}: {err}");
        let line = err.lines().find(|l| l.contains(file)).unwrap_or("");
        assert!(
            line.contains(&format!(": {flag}")) || line.starts_with(flag),
            "{args:?}: the error should name {flag:?} and {file}: {err}"
        );
    }
}

/// The units' `ExecStartPre`: `keygen --if-missing` makes the key once and keeps it after
/// (both binaries); plain `keygen` never overwrites a key.
#[test]
fn keygen_if_missing_makes_a_key_once() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    // Each binary's status for a failure of its own: the relay's 1, execrelay's 255 (its
    // command line keeps 1–254 for the commands it runs).
    for (bin, name, refused) in [
        (common::relay::relay_bin(), "relay.key", 1),
        (PathBuf::from(common::bin()), "server.key", 255),
    ] {
        let key = dir.path().join(name);
        let keygen = |extra: &[&str]| {
            std::process::Command::new(&bin)
                .arg("keygen")
                .args(extra)
                .arg("-o")
                .arg(&key)
                .output()
                .unwrap()
        };
        let first = keygen(&["--if-missing"]);
        assert!(first.status.success(), "{first:?}");
        let line = String::from_utf8(first.stdout).unwrap();
        assert!(line.starts_with("execrelay-x25519 "), "{line}");
        let public = std::fs::read_to_string(key.with_extension("key.pub")).unwrap();
        assert_eq!(public, line);
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = keygen(&["--if-missing"]);
        assert!(again.status.success(), "{again:?}");
        assert!(String::from_utf8_lossy(&again.stderr).contains("exists; kept"));
        assert_eq!(
            std::fs::read_to_string(key.with_extension("key.pub")).unwrap(),
            public,
            "kept"
        );
        let overwrite = keygen(&[]);
        assert_eq!(overwrite.status.code(), Some(refused));
        let err = String::from_utf8_lossy(&overwrite.stderr);
        assert!(err.contains("-o ") && err.contains(name), "{err}");
    }
}
