use super::*;
use crate::keys::{public_line, Keypair};

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
    }
}

#[test]
fn standalone_without_any_cluster_flag() {
    let own = Keypair::generate().unwrap();
    assert!(ClusterFlags::default()
        .resolve(&own.public)
        .unwrap()
        .is_none());
    let only_node = ClusterFlags {
        node_id: Some("a".into()),
        ..Default::default()
    };
    let err = only_node.resolve(&own.public).unwrap_err();
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
    let spec = flags(Some(keys)).resolve(&own.public).unwrap().unwrap();
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
            f.resolve(&own.public).unwrap_err(),
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
            matches!(f.resolve(&own.public), Err(ClusterError::BadAdvertise(_))),
            "{adv}"
        );
    }
    let f = ClusterFlags {
        node_id: Some("bad id".into()),
        ..flags(Some(listed.clone()))
    };
    assert!(matches!(
        f.resolve(&own.public),
        Err(ClusterError::BadNodeId(_))
    ));
    assert_eq!(
        flags(None).resolve(&own.public).unwrap_err(),
        ClusterError::Incomplete("--cluster-keys".into())
    );
    // Missing or unreadable file.
    let missing = dir.path().join("nope");
    let err = flags(Some(missing)).resolve(&own.public).unwrap_err();
    assert!(matches!(err, ClusterError::KeysFile { .. }), "{err}");
    assert!(err.to_string().contains("--cluster-keys"), "{err}");
    // A broken line.
    let broken = write_keys(dir.path(), "relay-a not-a-key\n");
    assert!(matches!(
        flags(Some(broken)).resolve(&own.public),
        Err(ClusterError::KeysFile { .. })
    ));
    // This node not listed.
    let others = write_keys(
        dir.path(),
        &format!("relay-b {}\n", public_line(&other.public, "b")),
    );
    let err = flags(Some(others)).resolve(&own.public).unwrap_err();
    assert!(matches!(err, ClusterError::NodeNotListed { .. }));
    assert!(err.to_string().contains("relay-a"), "{err}");
    // Listed with another key.
    let wrong = write_keys(
        dir.path(),
        &format!("relay-a {}\n", public_line(&other.public, "b")),
    );
    assert!(matches!(
        flags(Some(wrong)).resolve(&own.public),
        Err(ClusterError::KeyMismatch { .. })
    ));
}
