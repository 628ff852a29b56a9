//! One config: every setting of `config.rs` has a flag of `execrelay serve` and a key of the
//! TOML file, its default is its named constant, `--help` shows that default, flags win over
//! the file, and the README's configuration table is the one `SETTINGS` generates.

use clap::{CommandFactory, Parser};

use execrelay::cli::{Cli, Command};
use execrelay::config::*;

/// Every setting with its constant, written out by hand: a second source to check the one the
/// settings macro (`execrelay_io::settings!`) uses.
const CONSTANTS: &[(&str, u64)] = &[
    ("max_message_bytes", MAX_MESSAGE_BYTES as u64),
    ("max_processes", MAX_PROCESSES as u64),
    ("max_sessions", MAX_SESSIONS as u64),
    ("retained_output_bytes", RETAINED_OUTPUT_BYTES as u64),
    ("output_budget_bytes", OUTPUT_BUDGET_BYTES as u64),
    ("detached_session_ttl_ms", DETACHED_SESSION_TTL_MS),
    ("max_read_wait_ms", MAX_READ_WAIT_MS),
    ("exited_retention_ms", EXITED_RETENTION_MS),
    ("stall_watchdog_ms", STALL_WATCHDOG_MS),
    ("max_pending_requests", MAX_PENDING_REQUESTS as u64),
    ("max_kill_grace_ms", MAX_KILL_GRACE_MS),
    ("max_drain_timeout_ms", MAX_DRAIN_TIMEOUT_MS),
    ("max_timeout_ms", MAX_TIMEOUT_MS),
    ("max_connections", MAX_CONNECTIONS as u64),
    ("max_links", MAX_LINKS as u64),
    ("request_head_timeout_ms", REQUEST_HEAD_TIMEOUT_MS),
    ("max_pending_handshakes", MAX_PENDING_HANDSHAKES as u64),
    (
        "max_pending_handshakes_per_address",
        MAX_PENDING_HANDSHAKES_PER_ADDRESS as u64,
    ),
    (
        "max_pending_authorizations",
        MAX_PENDING_AUTHORIZATIONS as u64,
    ),
    ("max_streams_per_link", MAX_STREAMS_PER_LINK as u64),
    ("max_streams_per_key", MAX_STREAMS_PER_KEY as u64),
    ("noise_window_records", NOISE_WINDOW_RECORDS as u64),
    ("handshake_failure_burst", HANDSHAKE_FAILURE_BURST as u64),
    ("handshake_failure_refill_ms", HANDSHAKE_FAILURE_REFILL_MS),
    (
        "relay_link_handshake_failure_burst",
        RELAY_LINK_HANDSHAKE_FAILURE_BURST as u64,
    ),
    (
        "relay_link_handshake_failure_refill_ms",
        RELAY_LINK_HANDSHAKE_FAILURE_REFILL_MS,
    ),
    ("handshake_clock_window_ms", HANDSHAKE_CLOCK_WINDOW_MS),
    (
        "max_handshakes_per_key_window",
        MAX_HANDSHAKES_PER_KEY_WINDOW as u64,
    ),
    ("keepalive_interval_ms", KEEPALIVE_INTERVAL_MS),
    ("pong_timeout_ms", PONG_TIMEOUT_MS),
    ("relay_backoff_initial_ms", RELAY_BACKOFF_INITIAL_MS),
    ("relay_backoff_max_ms", RELAY_BACKOFF_MAX_MS),
    ("relay_backoff_reset_ms", RELAY_BACKOFF_RESET_MS),
    ("relay_refused_backoff_max_ms", RELAY_REFUSED_BACKOFF_MAX_MS),
    (
        "max_pending_request_bytes",
        MAX_PENDING_REQUEST_BYTES as u64,
    ),
    ("max_inbound_bytes", MAX_INBOUND_BYTES as u64),
    (
        "max_link_reassembly_bytes",
        MAX_LINK_REASSEMBLY_BYTES as u64,
    ),
    ("max_sessions_per_key", MAX_SESSIONS_PER_KEY as u64),
    ("max_sessions_per_address", MAX_SESSIONS_PER_ADDRESS as u64),
    ("max_processes_per_key", MAX_PROCESSES_PER_KEY as u64),
    (
        "max_processes_per_address",
        MAX_PROCESSES_PER_ADDRESS as u64,
    ),
    ("descriptor_reserve", DESCRIPTOR_RESERVE as u64),
    ("idle_connection_timeout_ms", IDLE_CONNECTION_TIMEOUT_MS),
    ("idle_link_timeout_ms", IDLE_LINK_TIMEOUT_MS),
    ("approval_timeout_ms", APPROVAL_TIMEOUT_MS),
    ("session_pids_max", DEFAULT_SESSION_PIDS_MAX),
    ("max_session_ttl_ms", MAX_SESSION_TTL_MS),
    ("max_output_tail_bytes", MAX_OUTPUT_TAIL_BYTES as u64),
];

/// Every word setting with its default and two other valid values (for the file and the flag),
/// written out by hand.
const WORDS: &[(&str, &str, &str, &str)] = &[
    ("containment_backend", "auto", "none", "cgroup1"),
    ("cgroup_name", DEFAULT_CGROUP_NAME, "from-file", "from-flag"),
    ("noise_suites", "chachapoly,aesgcm", "chachapoly", "aesgcm"),
];

fn serve_config(args: &[&str]) -> ServerConfig {
    let cli = Cli::try_parse_from(["execrelay", "serve"].iter().chain(args))
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    match cli.command {
        Command::Serve(serve) => serve.config().expect("valid configuration"),
        _ => unreachable!(),
    }
}

#[test]
fn every_default_is_its_constant() {
    let defaults = ServerConfig::default();
    assert_eq!(CONSTANTS.len(), SETTINGS.len(), "a setting is missing here");
    for (name, constant) in CONSTANTS {
        let setting = SETTINGS
            .iter()
            .find(|s| s.name == *name)
            .unwrap_or_else(|| panic!("{name} is not a setting"));
        assert_eq!(setting.default, *constant, "{name}");
        assert_eq!(defaults.value_of(name), Some(*constant), "{name}");
    }
    assert_eq!(
        WORDS.len(),
        TEXT_SETTINGS.len(),
        "a word setting is missing here"
    );
    for (name, default, _, _) in WORDS {
        let setting = TEXT_SETTINGS
            .iter()
            .find(|s| s.name == *name)
            .unwrap_or_else(|| panic!("{name} is not a word setting"));
        assert_eq!(setting.default, *default, "{name}");
        assert_eq!(
            defaults.text_value_of(name).as_deref(),
            Some(*default),
            "{name}"
        );
    }
    // And the command line without flags gives exactly the defaults.
    let parsed = serve_config(&[]);
    for s in SETTINGS {
        assert_eq!(parsed.value_of(s.name), Some(s.default), "{}", s.name);
    }
    for s in TEXT_SETTINGS {
        assert_eq!(
            parsed.text_value_of(s.name).as_deref(),
            Some(s.default),
            "{}",
            s.name
        );
    }
}

#[test]
fn every_setting_has_a_flag_whose_help_shows_the_real_default() {
    let cli = Cli::command();
    let serve = cli.find_subcommand("serve").expect("serve");
    for s in SETTINGS {
        let flag = s.flag();
        let arg = serve
            .get_arguments()
            .find(|a| a.get_long() == Some(flag.as_str()))
            .unwrap_or_else(|| panic!("no --{flag}"));
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        let shown = format!("[default: {}]", s.unit.display(s.default));
        assert!(help.ends_with(&shown), "--{flag}: {help:?} lacks {shown:?}");
    }
    for s in TEXT_SETTINGS {
        let flag = s.flag();
        let arg = serve
            .get_arguments()
            .find(|a| a.get_long() == Some(flag.as_str()))
            .unwrap_or_else(|| panic!("no --{flag}"));
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        let shown = format!("[default: {}]", s.default);
        assert!(help.ends_with(&shown), "--{flag}: {help:?} lacks {shown:?}");
    }
}

#[test]
fn every_word_setting_has_a_flag_and_a_toml_key_and_flags_win() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, _, from_file, from_flag) in WORDS {
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, format!("{name} = \"{from_file}\"\n")).expect("write");
        let path = path.to_str().expect("utf-8");
        let flag = format!("--{}", name.replace('_', "-"));

        let c = serve_config(&["--config", path]);
        assert_eq!(
            c.text_value_of(name).as_deref(),
            Some(*from_file),
            "TOML {name}"
        );
        let c = serve_config(&[&flag, from_flag]);
        assert_eq!(c.text_value_of(name).as_deref(), Some(*from_flag), "{flag}");
        let c = serve_config(&["--config", path, &flag, from_flag]);
        assert_eq!(
            c.text_value_of(name).as_deref(),
            Some(*from_flag),
            "{flag} wins over the file"
        );
    }
}

/// Word settings are checked at start: an unknown backend and a cgroup name that cannot be a
/// directory name are refused by the flag and by the file.
#[test]
fn bad_word_settings_are_refused() {
    assert!(Cli::try_parse_from(["execrelay", "serve", "--containment-backend", "v2"]).is_err());
    for bad in ["", "a/b", "-x", ".x"] {
        let flag = format!("--cgroup-name={bad}");
        let cli = Cli::try_parse_from(["execrelay", "serve", flag.as_str()])
            .unwrap_or_else(|e| panic!("{bad:?}: {e}"));
        let Command::Serve(serve) = cli.command else {
            unreachable!()
        };
        assert!(serve.config().is_err(), "cgroup name {bad:?} accepted");
    }
    assert!(ServerConfig::from_toml("containment_backend = \"v2\"\n").is_err());
    assert!(ServerConfig::from_toml("cgroup_name = \"a b\"\n").is_err());
    // Noise suites: only the ones this build implements, and at least one.
    for bad in ["", "rc4", "chachapoly,2", ","] {
        let flag = format!("--noise-suites={bad}");
        let err = Cli::try_parse_from(["execrelay", "serve", flag.as_str()])
            .err()
            .unwrap_or_else(|| panic!("--noise-suites {bad:?} accepted"));
        assert!(err.to_string().contains("noise"), "{bad:?}: {err}");
    }
    let err = ServerConfig::from_toml("noise_suites = \"3\"\n").unwrap_err();
    assert!(err.to_string().contains("chachapoly"), "{err}");
    let c = ServerConfig::from_toml("noise_suites = \"1,0\"\n").expect("numbers work too");
    assert_eq!(
        c.text_value_of("noise_suites").as_deref(),
        Some("chachapoly,aesgcm")
    );
}

#[test]
fn every_setting_has_a_flag_and_a_toml_key_and_flags_win() {
    let dir = tempfile::tempdir().expect("temp dir");
    for s in SETTINGS {
        // A valid value other than the default, so that a flag or key that set nothing fails.
        let from_file = s.default + 1;
        let from_flag = s.default + 2;
        let path = dir.path().join(format!("{}.toml", s.name));
        std::fs::write(&path, format!("{} = {from_file}\n", s.name)).expect("write");
        let path = path.to_str().expect("utf-8");
        let flag = format!("--{}", s.flag());

        let c = serve_config(&["--config", path]);
        assert_eq!(c.value_of(s.name), Some(from_file), "TOML key {}", s.name);
        let c = serve_config(&[&flag, &from_flag.to_string()]);
        assert_eq!(c.value_of(s.name), Some(from_flag), "flag {flag}");
        let c = serve_config(&["--config", path, &flag, &from_flag.to_string()]);
        assert_eq!(
            c.value_of(s.name),
            Some(from_flag),
            "{flag} wins over the file"
        );
    }
}

/// A value reads back as `--help` shows it: every setting by flag and by TOML key, given as
/// its unit displays it (`65 581 bytes`, `60 002 ms`), and the short forms people type.
#[test]
fn every_setting_reads_its_value_as_help_shows_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    for s in SETTINGS {
        let (from_file, from_flag) = (s.default + 1, s.default + 2);
        let path = dir.path().join(format!("{}.toml", s.name));
        let shown = s.unit.display(from_file);
        std::fs::write(&path, format!("{} = \"{shown}\"\n", s.name)).expect("write");
        let c = serve_config(&["--config", path.to_str().expect("utf-8")]);
        assert_eq!(
            c.value_of(s.name),
            Some(from_file),
            "TOML {} = {shown:?}",
            s.name
        );
        let flag = format!("--{}={}", s.flag(), s.unit.display(from_flag));
        let c = serve_config(&[&flag]);
        assert_eq!(c.value_of(s.name), Some(from_flag), "{flag}");
    }
    let c = serve_config(&[
        "--output-budget-bytes",
        "32MiB",
        "--detached-session-ttl-ms",
        "90s",
    ]);
    assert_eq!(c.output_budget_bytes, 32 << 20);
    assert_eq!(c.detached_session_ttl_ms, 90_000);
    let c =
        ServerConfig::from_toml("output_budget_bytes = \"64 MiB\"\nmax_read_wait_ms = \"2m\"\n")
            .expect("units in the file");
    assert_eq!(c.output_budget_bytes, 64 << 20);
    assert_eq!(c.max_read_wait_ms, 120_000);
}

/// A value that is not one says what was expected, by flag and by file.
#[test]
fn a_bad_value_names_what_was_expected() {
    for (flag, bad, expected) in [
        ("--output-budget-bytes", "32MB", "MiB"),
        ("--output-budget-bytes", "lots", "256MiB"),
        ("--output-budget-bytes", "-1", "256MiB"),
        ("--max-sessions", "8K", "whole number"),
        ("--detached-session-ttl-ms", "1 day", "15s"),
        ("--noise-window-records", "4294967296", "too large"),
    ] {
        let given = format!("{flag}={bad}");
        let err = Cli::try_parse_from(["execrelay", "serve", given.as_str()])
            .err()
            .unwrap_or_else(|| panic!("{flag} {bad:?} accepted"))
            .to_string();
        assert!(
            err.contains(flag) && err.contains(expected),
            "{flag} {bad:?}: {err}"
        );
    }
    let err = ServerConfig::from_toml("max_read_wait_ms = \"soon\"\n").unwrap_err();
    assert!(
        err.to_string()
            .contains("max_read_wait_ms: `soon` is not a time"),
        "{err}"
    );
}

/// The README's configuration table is exactly the generated one (run this test and paste
/// the table it prints when a setting changes).
#[test]
fn the_readme_table_is_generated_from_settings() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let header = "| setting | default | what it bounds |\n|---|---|---|\n";
    let mut expected = header.to_string();
    for s in SETTINGS {
        expected.push_str(&s.readme_row());
        expected.push('\n');
    }
    for s in TEXT_SETTINGS {
        expected.push_str(&s.readme_row());
        expected.push('\n');
    }
    assert!(
        readme.contains(&format!("{expected}\n")),
        "README.md's configuration table is stale; it should read:\n\n{expected}"
    );
}

/// SECURITY.md's limits table names every setting.
#[test]
fn security_md_names_every_setting() {
    let security = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/SECURITY.md"))
        .expect("SECURITY.md");
    let names = SETTINGS
        .iter()
        .map(|s| s.name)
        .chain(TEXT_SETTINGS.iter().map(|s| s.name));
    for name in names {
        assert!(
            security.contains(&format!("`{name}`")),
            "SECURITY.md does not name `{name}`"
        );
    }
}
