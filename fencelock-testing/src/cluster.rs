//! A throwaway Redis Cluster: primaries with optional replicas, each its own
//! [`RedisServer`] in its own directory, joined with `redis-cli --cluster create`; optionally
//! with a [`FaultProxy`] in front of chosen nodes that every client reaches them through.

use std::io;
use std::thread;
use std::time::{Duration, Instant};

use crate::binary::{Feature, ServerBinary};
use crate::{FaultProxy, RedisServer};

/// Node timeout of the test clusters: short enough that an automatic failover completes in a
/// few seconds, long enough that a node busy on a loaded CI machine is not voted out.
const NODE_TIMEOUT_MS: u64 = 3000;

/// How long a cluster may take to be created and agree on its state.
const FORM_TIMEOUT: Duration = Duration::from_secs(60);

/// Configures a [`RedisCluster`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct RedisClusterBuilder {
    primaries: usize,
    replicas_per_primary: usize,
    proxied: Vec<usize>,
}

impl Default for RedisClusterBuilder {
    fn default() -> Self {
        RedisClusterBuilder {
            primaries: 3,
            replicas_per_primary: 1,
            proxied: Vec::new(),
        }
    }
}

impl RedisClusterBuilder {
    /// Number of primaries, which share the 16384 slots evenly (default 3, at least 3:
    /// `redis-cli --cluster create` refuses fewer).
    pub fn primaries(mut self, primaries: usize) -> Self {
        self.primaries = primaries;
        self
    }

    /// Replicas of each primary (default 1).
    pub fn replicas_per_primary(mut self, replicas: usize) -> Self {
        self.replicas_per_primary = replicas;
        self
    }

    /// Puts a [`FaultProxy`] in front of node `index` (start order, see
    /// [`RedisCluster::nodes`]), so that clients reach that node only through the proxy and a
    /// test can lose its replies or cut its connections; may be called for several nodes.
    ///
    /// The node *announces* the proxy's port (`cluster-announce-port`; the cluster bus keeps
    /// the real port through `cluster-announce-bus-port`), so `CLUSTER SLOTS`, `CLUSTER
    /// SHARDS`, `CLUSTER NODES` and `MOVED` replies name the proxy, and every cluster client
    /// learns that address from the slot map, whatever seed it was given. The cluster bus and
    /// the harness' own inspection connections go to the node directly, so faults set on the
    /// proxy never break the cluster itself. Replicas of a proxied primary replicate through
    /// the proxy (they connect to the announced address), so its faults reach them too:
    /// proxy a node without replicas when that matters. With `redis-cli --cluster create`
    /// (with replicas), the first [`primaries`](Self::primaries) nodes in start order become
    /// the primaries.
    ///
    /// ```no_run
    /// use fencelock_testing::RedisCluster;
    ///
    /// let cluster = RedisCluster::builder()
    ///     .replicas_per_primary(0)
    ///     .proxy_node(0)
    ///     .start()?;
    /// let proxy = cluster.proxy(0).expect("node 0 is proxied");
    /// assert_eq!(cluster.announced_port(&cluster.nodes()[0]), proxy.port());
    /// proxy.lose_next_reply(); // the next reply of node 0 to any client is lost
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn proxy_node(mut self, index: usize) -> Self {
        if !self.proxied.contains(&index) {
            self.proxied.push(index);
        }
        self
    }

    /// Starts every node, creates the cluster and waits until every node reports
    /// `cluster_state:ok`, knows every other node, and every replica is in sync with its
    /// primary.
    ///
    /// # Errors
    ///
    /// Fails if a node does not start, or the cluster does not form within a minute.
    pub fn start(&self) -> io::Result<RedisCluster> {
        if self.primaries < 3 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a Redis Cluster needs at least 3 primaries",
            ));
        }
        let total = self.primaries * (1 + self.replicas_per_primary);
        if let Some(index) = self.proxied.iter().find(|&&i| i >= total) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot proxy node {index}: the cluster has {total} nodes"),
            ));
        }
        let binary = ServerBinary::current()?;
        if !self.proxied.is_empty() {
            if let Some(missing) = binary.lacks(Feature::Redis7Commands) {
                // Before 7.0 the peers keep learning the node's real port from the bus, so
                // clients would bypass the proxy.
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("proxy_node needs a node that announces another port: {missing}"),
                ));
            }
        }
        // Before 7.0 the bus listens on port + 10000 and cannot be moved; from 7.0 on it gets a
        // free port of its own (port + 10000 may be taken or out of range).
        let own_bus_port = binary.lacks(Feature::Redis7Commands).is_none();
        let mut nodes = Vec::with_capacity(total);
        for _ in 0..total {
            let mut builder = RedisServer::builder()
                .config("cluster-enabled", "yes")
                .config("cluster-config-file", "nodes.conf")
                .config("cluster-node-timeout", NODE_TIMEOUT_MS.to_string())
                // Replicas of a failed primary take over without waiting for data-age checks.
                .config("cluster-replica-validity-factor", "0")
                .config("cluster-require-full-coverage", "yes")
                .config("repl-diskless-sync", "yes")
                .config("repl-diskless-sync-delay", "0");
            if own_bus_port {
                builder = builder
                    .cluster_bus()
                    .config("cluster-allow-pubsubshard-when-down", "yes");
            }
            nodes.push(builder.start()?);
        }
        let bus_port = |index: usize| -> u16 {
            let node = &nodes[index];
            node.cluster_bus_port()
                .unwrap_or_else(|| node.port().wrapping_add(10_000))
        };
        // Announced before the cluster is created, so no peer and no client ever learns the
        // node's real client port; the bus port is announced as it is, since the proxy only
        // forwards client connections.
        let mut proxies: Vec<Option<FaultProxy>> = (0..total).map(|_| None).collect();
        for &index in &self.proxied {
            let node = &nodes[index];
            let proxy = FaultProxy::start(node.addr())?;
            let mut con = node.client().get_connection().map_err(io::Error::other)?;
            // One parameter per CONFIG SET: several at once is 7.0+.
            for (parameter, port) in [
                ("cluster-announce-port", proxy.port()),
                ("cluster-announce-bus-port", bus_port(index)),
            ] {
                redis::cmd("CONFIG")
                    .arg("SET")
                    .arg(parameter)
                    .arg(port)
                    .query::<()>(&mut con)
                    .map_err(io::Error::other)?;
            }
            proxies[index] = Some(proxy);
        }
        let bus: Vec<u16> = (0..total).map(bus_port).collect();
        create(&nodes, &bus, self.primaries)?;
        let cluster = RedisCluster { nodes, proxies };
        cluster.wait_until_formed(self.primaries, FORM_TIMEOUT)?;
        Ok(cluster)
    }
}

/// A Redis Cluster of throwaway [`RedisServer`] nodes on free loopback ports (cluster bus
/// ports included), stopped when dropped.
///
/// ```no_run
/// use fencelock_testing::RedisCluster;
///
/// let cluster = RedisCluster::start()?; // 3 primaries, 1 replica each
/// let client = redis::cluster::ClusterClient::new(cluster.urls())?;
/// let mut con = client.get_connection()?;
/// redis::cmd("SET").arg("k").arg("v").query::<()>(&mut con)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Per node (start order), the proxy it announces, if any; stopped on drop.
    proxies: Vec<Option<FaultProxy>>,
}

impl std::fmt::Debug for RedisCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCluster")
            .field(
                "ports",
                &self.nodes.iter().map(RedisServer::port).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// One node as `CLUSTER NODES` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// The node id.
    pub id: String,
    /// The client port the node announces (a proxy's port for a node behind one, see
    /// [`RedisCluster::announced_port`]); [`RedisCluster::node`] finds the node by it.
    pub port: u16,
    /// Whether the node is a primary (else a replica).
    pub primary: bool,
    /// For a replica, the id of its primary.
    pub primary_id: Option<String>,
    /// Whether the node is flagged as failing.
    pub failed: bool,
}

impl RedisCluster {
    /// Starts 3 primaries with one replica each; see [`RedisClusterBuilder::start`].
    ///
    /// # Errors
    ///
    /// See [`RedisClusterBuilder::start`].
    pub fn start() -> io::Result<Self> {
        Self::builder().start()
    }

    /// A builder for other shapes.
    pub fn builder() -> RedisClusterBuilder {
        RedisClusterBuilder::default()
    }

    /// Every node, primaries and replicas, in start order (which is not role order: roles
    /// change with failovers; ask [`RedisCluster::topology`]).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The URL of every node, for a cluster client's seed list.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The node listening on `port`, or announcing it (the port of its proxy, see
    /// [`RedisClusterBuilder::proxy_node`]).
    pub fn node(&self, port: u16) -> Option<&RedisServer> {
        self.nodes
            .iter()
            .zip(&self.proxies)
            .find(|(n, p)| n.port() == port || p.as_ref().is_some_and(|p| p.port() == port))
            .map(|(n, _)| n)
    }

    /// The proxy in front of node `index` (start order), if the builder put one there
    /// ([`RedisClusterBuilder::proxy_node`]).
    ///
    /// ```no_run
    /// use fencelock_testing::RedisCluster;
    ///
    /// let cluster = RedisCluster::builder().replicas_per_primary(0).proxy_node(1).start()?;
    /// assert!(cluster.proxy(0).is_none());
    /// assert!(cluster.proxy(1).is_some());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn proxy(&self, index: usize) -> Option<&FaultProxy> {
        self.proxies.get(index).and_then(Option::as_ref)
    }

    /// The client port `node` tells the cluster and its clients about: its proxy's port if it
    /// has one, else its own. [`ClusterNode::port`] is this port.
    ///
    /// ```no_run
    /// use fencelock_testing::RedisCluster;
    ///
    /// let cluster = RedisCluster::start()?;
    /// let first = &cluster.nodes()[0];
    /// assert_eq!(cluster.announced_port(first), first.port());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn announced_port(&self, node: &RedisServer) -> u16 {
        self.nodes
            .iter()
            .zip(&self.proxies)
            .find(|(n, _)| n.port() == node.port())
            .and_then(|(_, p)| p.as_ref())
            .map_or(node.port(), FaultProxy::port)
    }

    /// Every node as the first running node sees it (`CLUSTER NODES`).
    ///
    /// # Errors
    ///
    /// Fails if no node answers.
    pub fn topology(&self) -> io::Result<Vec<ClusterNode>> {
        let mut last = None;
        for node in self
            .nodes
            .iter()
            .filter(|n| n.is_running() && !n.is_paused())
        {
            match cluster_nodes(node) {
                Ok(nodes) => return Ok(nodes),
                Err(err) => last = Some(err),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no running cluster node")))
    }

    /// The primary that serves `slot`, as the node on `asked` (any running node) sees it.
    ///
    /// # Errors
    ///
    /// Fails if the node cannot be asked or no primary serves the slot.
    pub fn primary_for_slot(&self, slot: u16) -> io::Result<&RedisServer> {
        let mut last = None;
        for node in self
            .nodes
            .iter()
            .filter(|n| n.is_running() && !n.is_paused())
        {
            match slot_owner(node, slot) {
                Ok(port) => {
                    return self
                        .node(port)
                        .ok_or_else(|| io::Error::other(format!("unknown node port {port}")))
                }
                Err(err) => last = Some(err),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no running cluster node")))
    }

    /// The primaries right now.
    ///
    /// # Errors
    ///
    /// Fails if no node answers.
    pub fn primaries(&self) -> io::Result<Vec<&RedisServer>> {
        Ok(self
            .topology()?
            .into_iter()
            .filter(|n| n.primary && !n.failed)
            .filter_map(|n| self.node(n.port))
            .collect())
    }

    /// The replicas of `primary` right now.
    ///
    /// # Errors
    ///
    /// Fails if no node answers.
    pub fn replicas_of(&self, primary: &RedisServer) -> io::Result<Vec<&RedisServer>> {
        let topology = self.topology()?;
        let announced = self.announced_port(primary);
        let Some(id) = topology
            .iter()
            .find(|n| n.port == announced)
            .map(|n| n.id.clone())
        else {
            return Ok(Vec::new());
        };
        Ok(topology
            .iter()
            .filter(|n| n.primary_id.as_deref() == Some(id.as_str()) && !n.failed)
            .filter_map(|n| self.node(n.port))
            .collect())
    }

    /// Waits until every running node reports `cluster_state:ok`, sees `primaries` healthy
    /// primaries, and every running replica's link to its primary is up.
    ///
    /// # Errors
    ///
    /// Fails with [`io::ErrorKind::TimedOut`] and the last observation otherwise.
    pub fn wait_until_formed(&self, primaries: usize, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let problem = self.formation_problem(primaries);
            match problem {
                None => return Ok(()),
                Some(problem) if Instant::now() >= deadline => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the cluster did not form within {timeout:?}: {problem}"),
                    ))
                }
                Some(_) => thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    fn formation_problem(&self, primaries: usize) -> Option<String> {
        let running: Vec<_> = self
            .nodes
            .iter()
            .filter(|n| n.is_running() && !n.is_paused())
            .collect();
        for node in &running {
            let cluster_info = match cluster_info(node) {
                Ok(info) => info,
                Err(err) => return Some(err.to_string()),
            };
            if !cluster_info.contains("cluster_state:ok") {
                return Some(format!("node {} is not ok yet", node.port()));
            }
            let nodes = match cluster_nodes(node) {
                Ok(nodes) => nodes,
                Err(err) => return Some(err.to_string()),
            };
            let healthy = nodes.iter().filter(|n| n.primary && !n.failed).count();
            if healthy != primaries || nodes.len() != self.nodes.len() {
                return Some(format!(
                    "node {} sees {healthy} primaries among {} nodes",
                    node.port(),
                    nodes.len()
                ));
            }
            let announced = self.announced_port(node);
            let me = nodes.iter().find(|n| n.port == announced);
            if me.is_some_and(|n| !n.primary) {
                let replication = info(node, "replication").unwrap_or_default();
                if !replication.contains("master_link_status:up") {
                    return Some(format!("replica {} is not in sync", node.port()));
                }
            }
        }
        None
    }
}

fn info(node: &RedisServer, section: &str) -> io::Result<String> {
    let mut con = node.client().get_connection().map_err(io::Error::other)?;
    redis::cmd("INFO")
        .arg(section)
        .query(&mut con)
        .map_err(io::Error::other)
}

fn cluster_info(node: &RedisServer) -> io::Result<String> {
    let mut con = node.client().get_connection().map_err(io::Error::other)?;
    redis::cmd("CLUSTER")
        .arg("INFO")
        .query(&mut con)
        .map_err(io::Error::other)
}

fn cluster_nodes(node: &RedisServer) -> io::Result<Vec<ClusterNode>> {
    let mut con = node.client().get_connection().map_err(io::Error::other)?;
    let text: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query(&mut con)
        .map_err(io::Error::other)?;
    Ok(parse_cluster_nodes(&text))
}

/// Parses `CLUSTER NODES`: `id ip:port@cport[,hostname] flags primary-id ...`.
fn parse_cluster_nodes(text: &str) -> Vec<ClusterNode> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let id = fields.next()?.to_owned();
            let addr = fields.next()?;
            let flags = fields.next()?;
            let primary_id = fields.next()?;
            let port = addr.split('@').next()?.rsplit(':').next()?.parse().ok()?;
            Some(ClusterNode {
                id,
                port,
                primary: flags.split(',').any(|f| f == "master"),
                primary_id: (primary_id != "-").then(|| primary_id.to_owned()),
                failed: flags.split(',').any(|f| f == "fail" || f == "fail?"),
            })
        })
        .collect()
}

fn slot_owner(node: &RedisServer, slot: u16) -> io::Result<u16> {
    let mut con = node.client().get_connection().map_err(io::Error::other)?;
    let ranges: Vec<redis::Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut con)
        .map_err(io::Error::other)?;
    for range in ranges {
        let redis::Value::Array(parts) = range else {
            continue;
        };
        let int = |v: Option<&redis::Value>| match v {
            Some(redis::Value::Int(i)) => Some(*i),
            _ => None,
        };
        let (Some(start), Some(end)) = (int(parts.first()), int(parts.get(1))) else {
            continue;
        };
        if (start..=end).contains(&i64::from(slot)) {
            if let Some(redis::Value::Array(primary)) = parts.get(2) {
                if let Some(port) = int(primary.get(1)) {
                    return u16::try_from(port).map_err(io::Error::other);
                }
            }
        }
    }
    Err(io::Error::other(format!("no node serves slot {slot}")))
}

/// Joins `nodes` into one cluster, as `redis-cli --cluster create` does, with the commands every
/// release since Redis 5 knows (so no `redis-cli` of the server's own version is needed): a
/// distinct config epoch per node, the slots split evenly over the first `primaries` nodes,
/// every node met through the first, then each remaining node made a replica of a primary in
/// turn. [`RedisCluster::wait_until_formed`] waits for the result.
fn create(nodes: &[RedisServer], bus_ports: &[u16], primaries: usize) -> io::Result<()> {
    let connect = |node: &RedisServer| node.client().get_connection().map_err(io::Error::other);
    let mut cons = nodes.iter().map(connect).collect::<io::Result<Vec<_>>>()?;
    let slots_per_primary = 16_384 / primaries;
    for (index, con) in cons.iter_mut().enumerate() {
        redis::cmd("CLUSTER")
            .arg("SET-CONFIG-EPOCH")
            .arg(index + 1)
            .query::<()>(con)
            .map_err(io::Error::other)?;
        if index < primaries {
            let first = index * slots_per_primary;
            let last = if index + 1 == primaries {
                16_383
            } else {
                first + slots_per_primary - 1
            };
            redis::cmd("CLUSTER")
                .arg("ADDSLOTS")
                .arg((first..=last).collect::<Vec<usize>>())
                .query::<()>(con)
                .map_err(io::Error::other)?;
        }
    }
    for (node, bus) in nodes.iter().zip(bus_ports).skip(1) {
        redis::cmd("CLUSTER")
            .arg("MEET")
            .arg("127.0.0.1")
            .arg(node.port())
            .arg(*bus)
            .query::<()>(&mut cons[0])
            .map_err(io::Error::other)?;
    }
    if nodes.len() == primaries {
        return Ok(());
    }
    let ids = cons
        .iter_mut()
        .map(|con| {
            redis::cmd("CLUSTER")
                .arg("MYID")
                .query::<String>(con)
                .map_err(io::Error::other)
        })
        .collect::<io::Result<Vec<_>>>()?;
    // A replica can follow its primary once it has learnt of it through the gossip.
    let deadline = Instant::now() + FORM_TIMEOUT;
    for (index, con) in cons.iter_mut().enumerate().skip(primaries) {
        let primary = &ids[(index - primaries) % primaries];
        loop {
            match redis::cmd("CLUSTER")
                .arg("REPLICATE")
                .arg(primary)
                .query::<()>(con)
            {
                Ok(()) => break,
                Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
                Err(err) => {
                    return Err(io::Error::other(format!(
                        "node {} could not become a replica of {primary}: {err}",
                        nodes[index].port()
                    )))
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lines_are_parsed() {
        let text = "a1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460\n\
                    b2 127.0.0.1:30002@40002 slave,fail a1 0 0 1 connected\n";
        let nodes = parse_cluster_nodes(text);
        assert_eq!(nodes.len(), 2);
        assert!(nodes[0].primary && !nodes[0].failed && nodes[0].port == 30001);
        assert_eq!(nodes[1].primary_id.as_deref(), Some("a1"));
        assert!(nodes[1].failed && !nodes[1].primary);
    }

    #[test]
    fn a_proxied_node_is_reached_through_its_proxy_by_cluster_clients() {
        if let Some(missing) = ServerBinary::current()
            .unwrap()
            .lacks(Feature::Redis7Commands)
        {
            eprintln!("SKIPPED: proxied cluster nodes: {missing}");
            return;
        }
        let cluster = RedisCluster::builder()
            .replicas_per_primary(0)
            .proxy_node(0)
            .start()
            .unwrap();
        let node = &cluster.nodes()[0];
        let proxy = cluster.proxy(0).expect("a proxy in front of node 0");
        assert!(cluster.proxy(1).is_none());
        assert_eq!(cluster.announced_port(node), proxy.port());
        assert_eq!(cluster.node(proxy.port()).unwrap().port(), node.port());
        // Every node names the proxy for node 0, none its real port.
        for other in cluster.nodes() {
            let ports: Vec<u16> = cluster_nodes(other)
                .unwrap()
                .into_iter()
                .map(|n| n.port)
                .collect();
            assert!(ports.contains(&proxy.port()) && !ports.contains(&node.port()));
        }
        // A key that node 0 serves, written through a cluster client seeded with real
        // addresses only.
        let mut direct = redis::Client::open(format!("redis://127.0.0.1:{}/", node.port()))
            .unwrap()
            .get_connection()
            .unwrap();
        let key = (0..)
            .map(|i| format!("k{i}"))
            .find(|k| {
                let slot: u16 = redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(k)
                    .query(&mut direct)
                    .unwrap();
                cluster.primary_for_slot(slot).unwrap().port() == node.port()
            })
            .unwrap();
        let before = proxy.stats().upstream.bytes_forwarded;
        let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
        let mut con = client.get_connection().unwrap();
        redis::cmd("SET")
            .arg(&key)
            .arg("v")
            .query::<()>(&mut con)
            .unwrap();
        assert!(proxy.stats().upstream.bytes_forwarded > before);
        let mut direct = node.client().get_connection().unwrap();
        let value: String = redis::cmd("GET").arg(&key).query(&mut direct).unwrap();
        assert_eq!(value, "v");
        // An index beyond the cluster is refused.
        let err = RedisCluster::builder()
            .proxy_node(3)
            .replicas_per_primary(0)
            .start();
        assert_eq!(err.unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn a_cluster_forms_and_serves_every_slot() {
        let started = Instant::now();
        let cluster = RedisCluster::start().unwrap();
        eprintln!("3x2 cluster formed in {:?}", started.elapsed());
        let primaries = cluster.primaries().unwrap();
        assert_eq!(primaries.len(), 3);
        for primary in primaries {
            assert_eq!(cluster.replicas_of(primary).unwrap().len(), 1);
        }
        let owners: std::collections::HashSet<u16> = [0, 8000, 16383]
            .into_iter()
            .map(|slot| cluster.primary_for_slot(slot).unwrap().port())
            .collect();
        assert_eq!(owners.len(), 3);
    }
}
