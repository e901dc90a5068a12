//! The slot -> primary map of a cluster, for the connections of replica acknowledgement only
//! (the cluster client keeps its own and does not expose it).

use parking_lot::Mutex;
use redis::cluster_async::ClusterConnection;
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Value};

use super::ack_pool::Node;
use super::standalone::open_client;
use crate::base::config::ClientConfig;
use crate::base::error::Error;
use crate::protocol::keys;

/// The slot -> primary map of a cluster, for the pool only (the cluster client keeps its own
/// and does not expose it), learnt with `CLUSTER SLOTS` through the client's cluster connection,
/// reloaded after a `MOVED` or a connection error, and corrected by each `MOVED` reply.
pub(crate) struct ClusterRoute {
    conn: ClusterConnection,
    /// The first seed URL's connection settings (credentials, TLS or not), used for every node,
    /// as redis-rs' cluster client does.
    seed: ConnectionInfo,
    config: ClientConfig,
    map: Mutex<SlotMap>,
    /// Refreshes run one at a time; the others see its result.
    refreshing: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct SlotMap {
    /// Bumped by every change, so a stale view asks for one refresh only.
    epoch: u64,
    /// `host:port` of every primary seen.
    nodes: Vec<String>,
    /// Index into `nodes` of each slot's primary ([`SlotMap::UNKNOWN`] when none); empty until
    /// the first refresh.
    owners: Vec<u16>,
}

impl SlotMap {
    const UNKNOWN: u16 = u16::MAX;

    fn owner(&self, slot: u16) -> Option<&str> {
        let index = *self.owners.get(usize::from(slot))?;
        self.nodes.get(usize::from(index)).map(String::as_str)
    }

    fn node_index(&mut self, addr: &str) -> u16 {
        match self.nodes.iter().position(|n| n == addr) {
            // A cluster has far fewer than 65535 primaries.
            Some(index) => index as u16,
            None => {
                self.nodes.push(addr.to_owned());
                (self.nodes.len() - 1) as u16
            }
        }
    }

    fn set(&mut self, slot: u16, addr: &str) {
        if self.owners.is_empty() {
            self.owners = vec![SlotMap::UNKNOWN; keys::SLOTS];
        }
        let index = self.node_index(addr);
        if let Some(owner) = self.owners.get_mut(usize::from(slot)) {
            *owner = index;
        }
        self.epoch += 1;
    }

    fn rebuild(&mut self, ranges: Vec<(u16, u16, String)>) {
        self.nodes.clear();
        self.owners = vec![SlotMap::UNKNOWN; keys::SLOTS];
        for (start, end, addr) in ranges {
            let index = self.node_index(&addr);
            for slot in start..=end.min((keys::SLOTS - 1) as u16) {
                self.owners[usize::from(slot)] = index;
            }
        }
        self.epoch += 1;
    }
}

impl ClusterRoute {
    pub(crate) fn new(
        conn: ClusterConnection,
        seed_url: &str,
        config: &ClientConfig,
    ) -> Result<ClusterRoute, Error> {
        Ok(ClusterRoute {
            conn,
            seed: seed_url.into_connection_info()?,
            config: config.clone(),
            map: Mutex::new(SlotMap::default()),
            refreshing: tokio::sync::Mutex::new(()),
        })
    }

    fn seed_host(&self) -> String {
        match self.seed.addr() {
            ConnectionAddr::Tcp(host, _) | ConnectionAddr::TcpTls { host, .. } => host.clone(),
            _ => "127.0.0.1".to_owned(),
        }
    }

    /// The node at `addr` (`host:port`), reached with the seed's credentials and TLS mode, as
    /// the map of epoch `stamp` names it.
    pub(crate) fn node(&self, addr: String, stamp: u64) -> Result<Node, Error> {
        let (host, port) = addr
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
            .ok_or_else(|| Error::Protocol(format!("unusable cluster node address {addr:?}")))?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let target = match self.seed.addr() {
            ConnectionAddr::TcpTls { insecure, .. } => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: *insecure,
                tls_params: None,
            },
            _ => ConnectionAddr::Tcp(host, port),
        };
        let info = self.seed.clone().set_addr(target);
        Ok(Node {
            client: open_client(info, &self.config)?,
            key: addr,
            stamp,
        })
    }

    /// The primary owning `slot`, stamped with the map epoch it was read at, asking the cluster
    /// when the map does not know it.
    pub(crate) async fn owner(&self, slot: u16) -> Result<Node, Error> {
        for _ in 0..2 {
            let (epoch, owner) = {
                let map = self.map.lock();
                (map.epoch, map.owner(slot).map(str::to_owned))
            };
            if let Some(addr) = owner {
                return self.node(addr, epoch);
            }
            self.refresh(epoch).await?;
        }
        // Transient, like a cluster that is down for this slot: the caller retries.
        Err(Error::Redis(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::NotConnected,
            format!("no primary serves slot {slot}"),
        ))))
    }

    /// Reloads the whole map with `CLUSTER SLOTS`, unless it changed since `seen`.
    pub(crate) async fn refresh(&self, seen: u64) -> Result<(), Error> {
        let _one = self.refreshing.lock().await;
        if self.map.lock().epoch != seen {
            return Ok(());
        }
        let reply: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut self.conn.clone())
            .await?;
        let ranges = parse_cluster_slots(&reply, &self.seed_host());
        tracing::debug!(
            ranges = ranges.len(),
            "replica acknowledgement: slot map refreshed"
        );
        self.map.lock().rebuild(ranges);
        Ok(())
    }

    /// A `MOVED` reply named `addr` as `slot`'s primary.
    pub(crate) fn moved(&self, slot: u16, addr: &str) {
        self.map.lock().set(slot, addr);
    }

    /// Whether `addr` is a primary in the current map.
    pub(crate) fn is_primary(&self, addr: &str) -> bool {
        self.map.lock().nodes.iter().any(|n| n == addr)
    }
}

/// `(first slot, last slot, "host:port" of the primary)` of every range in a `CLUSTER SLOTS`
/// reply. An empty host means the answering node's own, which we cannot tell through the
/// cluster client; the seed's host stands in for it. `?` (unknown) is skipped.
fn parse_cluster_slots(reply: &Value, fallback_host: &str) -> Vec<(u16, u16, String)> {
    let Value::Array(ranges) = reply else {
        return Vec::new();
    };
    ranges
        .iter()
        .filter_map(|range| {
            let Value::Array(items) = range else {
                return None;
            };
            let (Value::Int(start), Value::Int(end), Value::Array(primary)) =
                (items.first()?, items.get(1)?, items.get(2)?)
            else {
                return None;
            };
            let host = match primary.first()? {
                Value::BulkString(host) => String::from_utf8_lossy(host).into_owned(),
                Value::SimpleString(host) => host.clone(),
                Value::Nil => String::new(),
                _ => return None,
            };
            let host = match host.as_str() {
                "?" => return None,
                "" => fallback_host.to_owned(),
                _ => host,
            };
            let Value::Int(port) = primary.get(1)? else {
                return None;
            };
            let host = if host.contains(':') {
                format!("[{host}]")
            } else {
                host
            };
            Some((
                u16::try_from(*start).ok()?,
                u16::try_from(*end).ok()?,
                format!("{host}:{port}"),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::keys;

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    #[test]
    fn cluster_slots_replies_become_primary_ranges() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("127.0.0.1", 7000),
                node("127.0.0.1", 7003),
            ]),
            Value::Array(vec![Value::Int(5461), Value::Int(10922), node("", 7001)]),
            Value::Array(vec![Value::Int(10923), Value::Int(16383), node("?", 7002)]),
            Value::Array(vec![Value::Int(1), Value::Int(2), node("::1", 7004)]),
        ]);
        let ranges = parse_cluster_slots(&reply, "seed.host");
        assert_eq!(
            ranges,
            vec![
                (0, 5460, "127.0.0.1:7000".to_owned()),
                (5461, 10922, "seed.host:7001".to_owned()),
                (1, 2, "[::1]:7004".to_owned()),
            ]
        );
        let mut map = SlotMap::default();
        map.rebuild(ranges);
        assert_eq!(map.owner(0), Some("127.0.0.1:7000"));
        assert_eq!(map.owner(2), Some("[::1]:7004"));
        assert_eq!(map.owner(16383), None);
        let epoch = map.epoch;
        map.set(16383, "127.0.0.1:7000");
        assert_eq!(map.owner(16383), Some("127.0.0.1:7000"));
        assert!(map.epoch > epoch);
        assert_eq!(map.nodes.len(), 3);
    }

    /// Hosts come as bulk strings, as simple strings (RESP3 servers may answer either) or as
    /// nil/empty (the node's own address is unknown to it: the seed's host is used).
    #[test]
    fn every_host_encoding_of_cluster_slots_is_read() {
        let with_host = |host: Value, port: i64| Value::Array(vec![host, Value::Int(port)]);
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(9),
                with_host(Value::SimpleString("10.0.0.1".into()), 7000),
            ]),
            Value::Array(vec![
                Value::Int(10),
                Value::Int(19),
                with_host(Value::Nil, 7001),
            ]),
            Value::Array(vec![
                Value::Int(20),
                Value::Int(29),
                with_host(Value::Int(1), 7002),
            ]),
        ]);
        assert_eq!(
            parse_cluster_slots(&reply, "seed.host"),
            vec![
                (0, 9, "10.0.0.1:7000".to_owned()),
                (10, 19, "seed.host:7001".to_owned()),
            ]
        );
    }

    /// A rebuild replaces the whole map and counts as a change (a stale view asks for one
    /// refresh only); a range reaching past the last slot is clipped, not a panic.
    #[test]
    fn a_rebuild_replaces_the_map_bumps_the_epoch_and_clips_ranges() {
        let mut map = SlotMap::default();
        map.rebuild(vec![(0, 16383, "a:1".to_owned())]);
        let epoch = map.epoch;
        assert!(epoch > 0);
        map.rebuild(vec![
            (0, 99, "b:2".to_owned()),
            (16000, u16::MAX, "c:3".to_owned()),
        ]);
        assert!(map.epoch > epoch);
        assert_eq!(map.nodes, ["b:2", "c:3"]);
        assert_eq!(map.owner(99), Some("b:2"));
        assert_eq!(map.owner(100), None);
        assert_eq!(map.owner(16383), Some("c:3"));
        assert_eq!(map.owners.len(), keys::SLOTS);
    }
}
