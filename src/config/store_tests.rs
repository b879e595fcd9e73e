//! `[store]` targets: one server, a Cluster or Sentinel, and the mistakes around them.

use std::path::Path;

use super::super::{Backend, Config, RedisTarget};

const ROUTE: &str = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nrespond = { status = 200 }\n";

fn compile(store: &str) -> Result<Config, Vec<String>> {
    let text = format!("{ROUTE}\n[store]\nbackend = \"redis\"\n{store}\n");
    Config::parse(Path::new("gateway.toml"), &text)
        .map_err(|err| err.errors().map(|d| d.to_string()).collect())
}

fn target(store: &str) -> RedisTarget {
    match compile(store).map(|config| config.store.backend) {
        Ok(Backend::Redis { target, .. }) => target,
        other => panic!("{store}: {other:?}"),
    }
}

fn errors(store: &str) -> Vec<String> {
    compile(store).err().unwrap_or_default()
}

#[test]
fn cluster_seed_nodes_and_a_sentinel_master_are_targets() {
    assert_eq!(
        target("cluster = [\"redis://10.0.0.1:7000\", \"rediss://10.0.0.2:7000\"]"),
        RedisTarget::Cluster(vec![
            "redis://10.0.0.1:7000".to_string(),
            "rediss://10.0.0.2:7000".to_string()
        ])
    );
    assert_eq!(
        target("sentinel = { master = \"mymaster\", nodes = [\"redis://10.0.0.1:26379\"] }"),
        RedisTarget::Sentinel {
            master: "mymaster".to_string(),
            nodes: vec!["redis://10.0.0.1:26379".to_string()],
        }
    );
    assert_eq!(
        target("url = \"redis://127.0.0.1:6379/0\""),
        RedisTarget::Server("redis://127.0.0.1:6379/0".to_string())
    );
}

#[test]
fn exactly_one_of_url_cluster_and_sentinel_with_file_line_key_and_reason() {
    let errs = errors(
        "url = \"redis://127.0.0.1:6379/0\"\ncluster = [\"redis://127.0.0.1:7000\"]\n\
         sentinel = { master = \"m\", nodes = [\"redis://127.0.0.1:26379\"] }",
    );
    assert_eq!(errs.len(), 2, "{errs:#?}");
    assert!(
        errs[0].contains("gateway.toml:9")
            && errs[0].contains("store.cluster: give exactly one of url, cluster and sentinel"),
        "{errs:#?}"
    );
    assert!(errs[1].contains("gateway.toml:10") && errs[1].contains("store.sentinel"));
    let none = errors("on_error = \"deny\"");
    assert!(
        none.iter()
            .any(|e| e.contains("store.url: the redis backend needs url")),
        "{none:#?}"
    );
}

#[test]
fn bad_cluster_and_sentinel_entries_are_errors() {
    for (store, key, why) in [
        (
            "cluster = []",
            "store.cluster",
            "needs at least one redis:// URL",
        ),
        (
            "cluster = [\"redis://127.0.0.1:7000\", \"http://127.0.0.1:7001\"]",
            "store.cluster",
            "\"http://127.0.0.1:7001\" is not a redis:// URL",
        ),
        (
            "sentinel = { master = \"\", nodes = [\"redis://127.0.0.1:26379\"] }",
            "store.sentinel.master",
            "must name the master",
        ),
        (
            "sentinel = { master = \"m\", nodes = [] }",
            "store.sentinel.nodes",
            "needs at least one",
        ),
        (
            "sentinel = { master = \"m\" }",
            "store.sentinel.nodes",
            "must list the sentinels",
        ),
        (
            "sentinel = { nodes = [\"redis://127.0.0.1:26379\"] }",
            "store.sentinel.master",
            "must name the master",
        ),
        (
            "url = \"redis://127.0.0.1:6380/0\"\nwait_replicas = 17",
            "store.wait_replicas",
            "must be between 0 and 16, got 17",
        ),
        (
            "url = \"rediss://127.0.0.1:6380/0\"\nca_file = \"no-such-ca.pem\"",
            "store.ca_file",
            "no-such-ca.pem",
        ),
    ] {
        let errs = errors(store);
        assert!(
            errs.iter().any(|e| e.contains(key) && e.contains(why)),
            "{store}: {errs:#?}"
        );
    }
}
