//! Tests of the `execrelay-relay` command line.

use super::*;
use clap::CommandFactory;

#[test]
fn listen_addresses() {
    let plain = |a: &str| Listen {
        addr: a.parse().unwrap(),
        tls: false,
    };
    assert_eq!(
        parse_listen("ws://127.0.0.1:0").unwrap(),
        plain("127.0.0.1:0")
    );
    assert_eq!(
        parse_listen("ws://localhost:8080/").unwrap(),
        plain("127.0.0.1:8080")
    );
    assert!(parse_listen("ws://[::1]:9").is_ok());
    assert!(parse_listen("ws://0.0.0.0:443").is_ok(), "any address");
    assert_eq!(
        parse_listen("wss://0.0.0.0:443").unwrap(),
        Listen {
            addr: "0.0.0.0:443".parse().unwrap(),
            tls: true
        }
    );
    for bad in [
        "https://127.0.0.1:1",
        "127.0.0.1:1",
        "ws://host",
        "noise+ws://1.2.3.4:5",
    ] {
        let err = parse_listen(bad).unwrap_err().to_string();
        assert!(err.contains("ws://HOST:PORT"), "{bad}: {err}");
    }
}

#[test]
fn every_setting_has_a_flag_with_its_default_in_the_help() {
    RelayArgs::command().debug_assert();
    let help = RelayArgs::command().render_long_help().to_string();
    for s in super::super::settings::SETTINGS {
        assert!(
            help.contains(&format!("--{}", s.flag())),
            "no flag for {}",
            s.name
        );
    }
    let args = RelayArgs::try_parse_from([
        "execrelay-relay",
        "--listen",
        "ws://127.0.0.1:0",
        "--key",
        "k",
        "--environments",
        "e",
        "--pong-timeout-ms",
        "700",
        "--max-environments",
        "2",
    ])
    .unwrap();
    let s = args.settings().unwrap();
    assert_eq!((s.pong_timeout_ms, s.max_environments), (700, 2));
    assert_eq!(s.keepalive_interval_ms, 15_000);
}

#[test]
fn flags_win_over_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("relay.toml");
    std::fs::write(&path, "max_environments = 5\nopens_per_second = 9\n").unwrap();
    let args = RelayArgs::try_parse_from([
        "execrelay-relay",
        "--listen",
        "ws://127.0.0.1:0",
        "--key",
        "k",
        "--environments",
        "e",
        "--config",
        path.to_str().unwrap(),
        "--opens-per-second",
        "3",
    ])
    .unwrap();
    let s = args.settings().unwrap();
    assert_eq!((s.max_environments, s.opens_per_second), (5, 3));
    std::fs::write(&path, "no_such_key = 1\n").unwrap();
    let err = args.settings().unwrap_err().to_string();
    assert!(
        err.contains("relay.toml") && err.contains("no_such_key"),
        "{err}"
    );
}

#[test]
fn the_help_says_what_the_binary_is_in_one_line() {
    for help in [
        RelayArgs::command().render_help().to_string(),
        RelayArgs::command().render_long_help().to_string(),
    ] {
        let mut lines = help.lines();
        let first = lines.next().unwrap();
        assert!(first.starts_with("The execrelay relay: "), "{first}");
        assert_eq!(lines.next(), Some(""), "one line, then the usage:\n{help}");
    }
}

fn prepare_err(args: &[&str]) -> String {
    let mut all = vec!["execrelay-relay"];
    all.extend_from_slice(args);
    match RelayArgs::try_parse_from(all).unwrap().prepare() {
        Ok(_) => panic!("{args:?} prepared"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn every_missing_file_names_its_flag() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let err = prepare_err(&[
        "--listen",
        "ws://127.0.0.1:0",
        "--key",
        &p("nokey"),
        "--environments",
        &p("e"),
    ]);
    assert!(
        err.starts_with("--key: ") && err.contains("nokey") && err.contains("No such file"),
        "{err}"
    );
    Keypair::generate()
        .unwrap()
        .write(&dir.path().join("key"), "relay")
        .unwrap();
    let err = prepare_err(&[
        "--listen",
        "ws://127.0.0.1:0",
        "--key",
        &p("key"),
        "--environments",
        &p("noenvs"),
    ]);
    assert!(
        err.starts_with("--environments: ") && err.contains("noenvs"),
        "{err}"
    );
    std::fs::write(dir.path().join("envs"), "# none yet\n").unwrap();
    let base = [
        "--listen",
        "wss://127.0.0.1:0",
        "--key",
        &p("key"),
        "--environments",
        &p("envs"),
    ];
    let err = prepare_err(&base);
    assert!(err.contains("--tls-cert FILE and --tls-key FILE"), "{err}");
    let mut with_tls = base.to_vec();
    let (cert, key) = (p("nocert.pem"), p("nokey.pem"));
    with_tls.extend(["--tls-cert", &cert, "--tls-key", &key]);
    let err = prepare_err(&with_tls);
    assert!(
        err.starts_with("--tls-cert ") && err.contains("nocert.pem"),
        "{err}"
    );
    let mut plain_with_tls = with_tls.clone();
    plain_with_tls[1] = "ws://127.0.0.1:0";
    let err = prepare_err(&plain_with_tls);
    assert!(err.contains("go with --listen wss://"), "{err}");
    let err = prepare_err(&["--config", &p("norelay.toml")]);
    assert!(
        err.starts_with("--config ") && err.contains("norelay.toml"),
        "{err}"
    );
    let err = prepare_err(&["--key", &p("key")]);
    assert!(err.contains("--listen is required"), "{err}");
}

#[test]
fn the_config_file_holds_the_locations_relative_to_itself() {
    let dir = tempfile::tempdir().unwrap();
    Keypair::generate()
        .unwrap()
        .write(&dir.path().join("relay.key"), "relay")
        .unwrap();
    std::fs::write(dir.path().join("envs"), "# none yet\n").unwrap();
    let config = dir.path().join("relay.toml");
    std::fs::write(
        &config,
        "listen = \"ws://127.0.0.1:0\"\nkey = \"relay.key\"\nenvironments = \"missing\"\nmax_environments = 7\n",
    )
    .unwrap();
    let args = |extra: &[&str]| {
        let mut all = vec!["execrelay-relay", "--config", config.to_str().unwrap()];
        all.extend_from_slice(extra);
        RelayArgs::try_parse_from(all).unwrap()
    };
    let err = match args(&[]).prepare() {
        Ok(_) => panic!("a missing environments file was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.starts_with("environments (in --config ") && err.contains("missing"),
        "{err}"
    );
    let envs = dir.path().join("envs");
    let prepared = args(&["--environments", envs.to_str().unwrap()])
        .prepare()
        .unwrap();
    assert!(!prepared.listen.tls);
    assert_eq!(prepared.server.shared.settings.max_environments, 7);
    std::fs::write(&config, "listen = 5\n").unwrap();
    let err = args(&[]).settings().unwrap_err().to_string();
    assert!(
        err.contains("relay.toml") && err.contains("listen"),
        "{err}"
    );
}

#[test]
fn the_cluster_from_flags_or_the_config_file_and_its_mistakes_named() {
    let dir = tempfile::tempdir().unwrap();
    let shared = Keypair::generate().unwrap();
    shared
        .write(&dir.path().join("relay.key"), "relay")
        .unwrap();
    let node = Keypair::generate().unwrap();
    node.write(&dir.path().join("node.key"), "node").unwrap();
    std::fs::write(dir.path().join("envs"), "# none yet\n").unwrap();
    std::fs::write(
        dir.path().join("cluster-keys"),
        format!(
            "relay-a {}\n",
            execrelay_protocol::keys::public_line(&node.public, "a")
        ),
    )
    .unwrap();
    let config = dir.path().join("relay.toml");
    std::fs::write(
        &config,
        "listen = \"ws://127.0.0.1:0\"\nkey = \"relay.key\"\nenvironments = \"envs\"\n\
         cluster = \"nats://127.0.0.1:4222\"\nnode_id = \"relay-a\"\n\
         advertise = \"ws://127.0.0.1:7001\"\ncluster_keys = \"cluster-keys\"\n\
         node_key = \"node.key\"\nmoves_per_second = 3\n",
    )
    .unwrap();
    let args = |extra: &[&str]| {
        let mut all = vec!["execrelay-relay", "--config", config.to_str().unwrap()];
        all.extend_from_slice(extra);
        RelayArgs::try_parse_from(all).unwrap()
    };
    let prepared = args(&[]).prepare().unwrap();
    let spec = prepared.server.cluster().expect("in a cluster");
    assert_eq!(
        (spec.node_id.as_str(), spec.advertise.as_str()),
        ("relay-a", "ws://127.0.0.1:7001")
    );
    assert_eq!(spec.node_keys.public, node.public);
    assert_eq!(prepared.server.shared.settings.moves_per_second, 3);
    // A flag wins over the file, and its mistake names the flag.
    let err = match args(&["--cluster", "127.0.0.1:4222"]).prepare() {
        Ok(_) => panic!("a bad --cluster was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(err.starts_with("bad --cluster \"127.0.0.1:4222\""), "{err}");
    let err = match args(&["--node-id", "relay-b"]).prepare() {
        Ok(_) => panic!("an unlisted node was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("\"relay-b\" is not listed"), "{err}");
    // Standalone: no cluster flag at all.
    let p = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let mut all = vec!["execrelay-relay"];
    let (key, envs) = (p("relay.key"), p("envs"));
    all.extend([
        "--listen",
        "ws://127.0.0.1:0",
        "--key",
        &key,
        "--environments",
        &envs,
    ]);
    let alone = RelayArgs::try_parse_from(all.clone())
        .unwrap()
        .prepare()
        .unwrap();
    assert!(alone.server.cluster().is_none());
    all.extend(["--node-id", "relay-a"]);
    let err = prepare_err(&all[1..]);
    assert!(err.contains("--node-id goes with --cluster"), "{err}");
}

/// The least a relay's command line needs (listen, key, environments), then `extra`.
fn with_minimal_args(extra: &[&str]) -> Result<RelayArgs, clap::Error> {
    let base = [
        "execrelay-relay",
        "--listen",
        "ws://127.0.0.1:0",
        "--key",
        "k",
        "--environments",
        "e",
    ];
    RelayArgs::try_parse_from(base.iter().chain(extra))
}

#[test]
fn trusted_front_from_the_flag_or_the_file_and_bad_values_name_the_setting() {
    use crate::cluster::trusted_front::MAX_TRUSTED_FRONTS;
    let with = with_minimal_args;
    let local: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    // Nobody by default.
    let s = with(&[]).unwrap().settings().unwrap();
    assert!(s.trusted_front.is_empty());
    assert!(!s.trusted_front.contains(local));
    // The flag.
    let s = with(&["--trusted-front", "127.0.0.1,10.0.0.0/8"])
        .unwrap()
        .settings()
        .unwrap();
    assert!(s.trusted_front.contains(local));
    assert!(s.trusted_front.contains("10.9.8.7".parse().unwrap()));
    // A bad flag: clap's error names the flag, ours what is wrong.
    for (bad, says) in [
        ("10.0.0.1/8", "did you mean 10.0.0.0/8?"),
        ("haproxy.local", "not an IP address or a CIDR block"),
        ("10.0.0.0/40", "longer than the address"),
    ] {
        let err = with(&["--trusted-front", bad]).unwrap_err().to_string();
        assert!(
            err.contains("--trusted-front") && err.contains(says),
            "{bad}: {err}"
        );
    }
    let too_many = (0..=MAX_TRUSTED_FRONTS)
        .map(|i| format!("10.1.0.{i}"))
        .collect::<Vec<_>>()
        .join(",");
    let err = with(&["--trusted-front", &too_many])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--trusted-front")
            && err.contains(&format!("more than {MAX_TRUSTED_FRONTS} entries")),
        "{err}"
    );
    // The file: a comma list or an array; a bad entry names the key and the file.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("relay.toml");
    let config = ["--config", path.to_str().unwrap()];
    std::fs::write(&path, "trusted_front = [\"127.0.0.1\", \"fd00::/8\"]\n").unwrap();
    let s = with(&config).unwrap().settings().unwrap();
    assert!(s.trusted_front.contains(local));
    assert!(s.trusted_front.contains("fd00::5".parse().unwrap()));
    // The flag wins over the file.
    let s = with(&[&config[..], &["--trusted-front", "none"][..]].concat())
        .unwrap()
        .settings()
        .unwrap();
    assert!(s.trusted_front.is_empty());
    for bad in [
        "trusted_front = \"127.0.0.1,nope\"",
        "trusted_front = [\"10.0.0.1/8\"]",
        "trusted_front = 127",
    ] {
        std::fs::write(&path, bad).unwrap();
        let err = with(&config).unwrap().settings().unwrap_err().to_string();
        assert!(
            err.contains("relay.toml") && err.contains("trusted_front (--trusted-front)"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn runtime_threads_from_the_flag_or_the_file_and_bad_values_name_the_setting() {
    use super::super::runtime_threads::RuntimeThreads;
    use execrelay_io::runtimes::MAX_RUNTIME_THREADS;
    let with = with_minimal_args;
    // One per core by default.
    let s = with(&[]).unwrap().settings().unwrap();
    assert_eq!(s.runtime_threads, RuntimeThreads::Cores);
    let s = with(&["--runtime-threads", "3"])
        .unwrap()
        .settings()
        .unwrap();
    assert_eq!(s.runtime_threads, RuntimeThreads::Count(3));
    // 0, past the cap and words: clap's error names the flag, ours the range.
    let too_many = (MAX_RUNTIME_THREADS + 1).to_string();
    for bad in ["0", too_many.as_str(), "all"] {
        let err = with(&["--runtime-threads", bad]).unwrap_err().to_string();
        assert!(
            err.contains("--runtime-threads")
                && err.contains(&format!("from 1 to {MAX_RUNTIME_THREADS}")),
            "{bad}: {err}"
        );
    }
    // The file; the flag wins over it; a bad value names the key and the file.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("relay.toml");
    let config = ["--config", path.to_str().unwrap()];
    std::fs::write(&path, "runtime_threads = 2\n").unwrap();
    let s = with(&config).unwrap().settings().unwrap();
    assert_eq!(s.runtime_threads, RuntimeThreads::Count(2));
    let s = with(&[&config[..], &["--runtime-threads", "cores"][..]].concat())
        .unwrap()
        .settings()
        .unwrap();
    assert_eq!(s.runtime_threads, RuntimeThreads::Cores);
    for bad in ["runtime_threads = 0", "runtime_threads = 100000"] {
        std::fs::write(&path, bad).unwrap();
        let err = with(&config).unwrap().settings().unwrap_err().to_string();
        assert!(
            err.contains("relay.toml") && err.contains("runtime_threads (--runtime-threads)"),
            "{bad}: {err}"
        );
    }
}
