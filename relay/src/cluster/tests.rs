use super::*;
use execrelay_protocol::keys::{public_line, Keypair};

fn write_keys(dir: &Path, lines: &str) -> PathBuf {
    let p = dir.join("cluster-keys");
    std::fs::write(&p, lines).unwrap();
    p
}

fn flags(keys: Option<PathBuf>) -> ClusterFlags {
    ClusterFlags {
        cluster: Some("nats://127.0.0.1:4222".into()),
        node_id: Some("relay-a".into()),
        advertise: Some("ws://127.0.0.1:7001".into()),
        cluster_keys: keys,
        node_key: None,
    }
}

#[test]
fn standalone_without_any_cluster_flag() {
    let own = Keypair::generate().unwrap();
    assert!(ClusterFlags::default().resolve(&own).unwrap().is_none());
    let only_node = ClusterFlags {
        node_id: Some("a".into()),
        ..Default::default()
    };
    let err = only_node.resolve(&own).unwrap_err();
    assert_eq!(err, ClusterError::WithoutCluster("--node-id".into()));
    assert!(err.to_string().contains("goes with --cluster"));
}

#[test]
fn a_listed_node_with_its_own_key_joins() {
    let dir = tempfile::tempdir().unwrap();
    let own = Keypair::generate().unwrap();
    let other = Keypair::generate().unwrap();
    let keys = write_keys(
        dir.path(),
        &format!(
            "# the cluster\nrelay-a {}\nrelay-b {}\n",
            public_line(&own.public, "a"),
            public_line(&other.public, "b")
        ),
    );
    let spec = flags(Some(keys)).resolve(&own).unwrap().unwrap();
    assert_eq!(spec.node_id, "relay-a");
    assert_eq!(spec.advertise, "ws://127.0.0.1:7001");
    assert_eq!(spec.keys.len(), 2);
    assert_eq!(spec.keys.node_of(&other.public), Some("relay-b"));
}

#[test]
fn every_bad_cluster_setting_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let own = Keypair::generate().unwrap();
    let other = Keypair::generate().unwrap();
    let listed = write_keys(
        dir.path(),
        &format!("relay-a {}\n", public_line(&own.public, "a")),
    );
    for url in [
        "http://x:1",
        "127.0.0.1:4222",
        "nats://:4222",
        "nats://h:0",
        "nats://h:x",
    ] {
        let f = ClusterFlags {
            cluster: Some(url.into()),
            ..flags(Some(listed.clone()))
        };
        assert_eq!(
            f.resolve(&own).unwrap_err(),
            ClusterError::BadNatsUrl(url.into()),
            "{url}"
        );
    }
    for adv in ["wss://h:1", "ws://h", "ws://h:1/x", "h:1"] {
        let f = ClusterFlags {
            advertise: Some(adv.into()),
            ..flags(Some(listed.clone()))
        };
        assert!(
            matches!(f.resolve(&own), Err(ClusterError::BadAdvertise(_))),
            "{adv}"
        );
    }
    // The unspecified address is where a relay listens, not where another dials it.
    for adv in ["ws://0.0.0.0:7000", "ws://[::]:7000"] {
        let f = ClusterFlags {
            advertise: Some(adv.into()),
            ..flags(Some(listed.clone()))
        };
        let err = f.resolve(&own).unwrap_err();
        assert!(
            matches!(err, ClusterError::UnspecifiedAdvertise(..)),
            "{adv}: {err}"
        );
        assert!(
            err.to_string().contains("--advertise") && err.to_string().contains("other relays"),
            "{err}"
        );
    }
    let f = ClusterFlags {
        node_id: Some("bad id".into()),
        ..flags(Some(listed.clone()))
    };
    assert!(matches!(f.resolve(&own), Err(ClusterError::BadNodeId(_))));
    assert_eq!(
        flags(None).resolve(&own).unwrap_err(),
        ClusterError::Incomplete("--cluster-keys".into())
    );
    // Missing or unreadable file.
    let missing = dir.path().join("nope");
    let err = flags(Some(missing.clone())).resolve(&own).unwrap_err();
    assert!(matches!(err, ClusterError::KeysFile { .. }), "{err}");
    let said = err.to_string();
    assert!(
        said.starts_with(&format!(
            "--cluster-keys {}: No such file or directory",
            missing.display()
        )) && said.contains("one `NODE_ID execrelay-x25519 <base64>` line each"),
        "the file named once, and what it holds: {said}"
    );
    // A broken line.
    let broken = write_keys(dir.path(), "relay-a not-a-key\n");
    assert!(matches!(
        flags(Some(broken)).resolve(&own),
        Err(ClusterError::KeysFile { .. })
    ));
    // This node not listed.
    let others = write_keys(
        dir.path(),
        &format!("relay-b {}\n", public_line(&other.public, "b")),
    );
    let err = flags(Some(others)).resolve(&own).unwrap_err();
    assert!(matches!(err, ClusterError::NodeNotListed { .. }));
    assert!(err.to_string().contains("relay-a"), "{err}");
    // Listed with another key.
    let wrong = write_keys(
        dir.path(),
        &format!("relay-a {}\n", public_line(&other.public, "b")),
    );
    let err = flags(Some(wrong)).resolve(&own).unwrap_err();
    assert!(matches!(err, ClusterError::KeyMismatch { .. }));
    // Without --node-key: the likely mistake is a forgotten --node-key.
    assert!(
        err.to_string().contains("no --node-key was given")
            && err.to_string().contains("give --node-key FILE"),
        "{err}"
    );
}

#[test]
fn a_node_key_apart_from_the_relays_key() {
    // Relays behind one front share the key environments pin (--key); each has its own node
    // key for relay-to-relay links.
    let dir = tempfile::tempdir().unwrap();
    let shared = Keypair::generate().unwrap();
    let node = Keypair::generate().unwrap();
    let node_file = dir.path().join("node");
    node.write(&node_file, "node").unwrap();
    let keys = write_keys(
        dir.path(),
        &format!("relay-a {}\n", public_line(&node.public, "a")),
    );
    let f = ClusterFlags {
        node_key: Some(node_file),
        ..flags(Some(keys.clone()))
    };
    let spec = f.resolve(&shared).unwrap().unwrap();
    assert_eq!(spec.node_keys.public, node.public);
    // Without --node-key the relay's --key is its node key: not the listed one here.
    assert!(matches!(
        flags(Some(keys.clone())).resolve(&shared),
        Err(ClusterError::KeyMismatch { .. })
    ));
    // A --node-key whose public line is not the listed one: the file named, and the fix.
    let stray = dir.path().join("stray");
    Keypair::generate().unwrap().write(&stray, "stray").unwrap();
    let err = ClusterFlags {
        node_key: Some(stray.clone()),
        ..flags(Some(keys.clone()))
    }
    .resolve(&shared)
    .unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("--node-key {}", stray.display()))
            && err.to_string().contains(".pub's line on the relay-a line"),
        "{err}"
    );
    let missing = ClusterFlags {
        node_key: Some(dir.path().join("nope")),
        ..flags(Some(keys))
    };
    let err = missing.resolve(&shared).unwrap_err();
    assert!(matches!(err, ClusterError::NodeKey { .. }));
    assert!(err.to_string().contains("--node-key"), "{err}");
}
