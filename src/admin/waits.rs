//! Who waits for what: the wait records of acquisitions waiting at the head of their client's
//! queue (`wait_record.lua`), and the cycles among them that are possible deadlocks.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use super::doctor::{Check, Status};
use super::{display_bytes, format_duration, item, Admin};
use crate::protocol::keys::{after_tag, waiter_of, WAIT_MARKER};
use crate::Error;

/// One acquisition waiting at the head of its client's queue, as [`Admin::waits`] reads it.
///
/// Displayed as one line (as `fencelock waits` prints it), each key named as the commands
/// name it: a lock by its name, as `list` shows it, a semaphore or read-write lock by its kind
/// and name:
///
/// ```text
/// checkout-7f9c (5f0c2e9a:12) waits for account:b since 12.340s  label order-8812  holding account:a, semaphore pool
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WaitInfo {
    /// The Redis key of the wait record.
    pub key: Vec<u8>,
    /// The holder id the waiting acquisition will have if it wins (`<client id>:<sequence>`).
    pub waiter: String,
    /// The name its client registered
    /// ([`LockClientBuilder::client_name`](crate::LockClientBuilder::client_name)).
    pub client_name: Option<String>,
    /// The key it waits for: a lock's hash (`prefix{tag}lock:NAME`), a semaphore's or a
    /// read-write lock's.
    pub waits_for: Vec<u8>,
    /// The acquisition's label ([`Lock::with_label`](crate::Lock::with_label)).
    pub label: Option<String>,
    /// How long it has been waiting, by the server's clock (since its first record).
    pub waited_for: Duration,
    /// The keys of the locks and holds that the waiting task holds (acquired in that task;
    /// a guard moved to another task since is still listed).
    pub holds: Vec<Vec<u8>>,
}

impl WaitInfo {
    /// The awaited key without its prefix and slot tag: `lock:NAME`, `sem:NAME`,
    /// `rw-writers:NAME`... (`--json`'s `waits_for`; the text names a lock by its name alone,
    /// the others by kind and name: `account:42`, `semaphore pool`).
    pub fn display_waits_for(&self) -> String {
        display_key(&self.waits_for)
    }

    /// Who waits, for display: the client's name when it registered one, else the holder id.
    fn who(&self) -> String {
        match &self.client_name {
            Some(name) => format!("{name} ({})", self.waiter),
            None => self.waiter.clone(),
        }
    }

    /// `WHO waits for WHAT`, as a wait's line and a deadlock's steps begin.
    fn who_waits(&self) -> String {
        format!("{} waits for {}", self.who(), named(&self.waits_for))
    }
}

/// A key for display: what follows the slot tag (`lock:account:42`).
fn display_key(key: &[u8]) -> String {
    display_bytes(after_tag(key).unwrap_or(key))
}

/// What a key a task waits for or holds is, named as the commands name it: a lock by its name
/// alone (`account:42`, as `list` shows it), the rest by their kind and name (`semaphore pool`,
/// `read-write lock config`, `election scheduler`, `job report`, `idempotency key
/// orders:8812`); a key of no kind known here as what follows its slot tag.
fn named(key: &[u8]) -> String {
    const KINDS: [(&[u8], &str); 7] = [
        (b"lock:", ""),
        (b"sem:", "semaphore "),
        (b"rw:", "read-write lock "),
        (b"rw-writers:", "read-write lock "),
        (b"leader:", "election "),
        (b"job:", "job "),
        (b"idem:", "idempotency key "),
    ];
    let Some(tagged) = after_tag(key) else {
        return display_key(key);
    };
    KINDS
        .iter()
        .find_map(|(marker, kind)| {
            let name = tagged.strip_prefix(*marker)?;
            Some(format!("{kind}{}", display_bytes(name)))
        })
        .unwrap_or_else(|| display_key(key))
}

impl fmt::Display for WaitInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let since = format_duration(self.waited_for);
        write!(f, "{} since {since}", self.who_waits())?;
        item(f, "label", self.label.as_ref(), "")?;
        if !self.holds.is_empty() {
            let holds: Vec<String> = self.holds.iter().map(|k| named(k)).collect();
            write!(f, "  holding {}", holds.join(", "))?;
        }
        Ok(())
    }
}

/// A cycle of waits, as [`Admin::possible_deadlocks`] finds it: each waiting task holds a key
/// that the one before it waits for, so none can go on unless a lease ends or a holder gives
/// up. Listed in cycle order.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PossibleDeadlock {
    /// The waits of the cycle: `waits[i]` waits for a key that `waits[i + 1]` holds (the last
    /// for one the first holds); one wait alone waits for a key its own task holds.
    pub waits: Vec<WaitInfo>,
}

impl fmt::Display for PossibleDeadlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "possible deadlock:")?;
        for (i, wait) in self.waits.iter().enumerate() {
            let next = &self.waits[(i + 1) % self.waits.len()];
            let step = if i == 0 { "" } else { ";" };
            write!(f, "{step} {} held by {}", wait.who_waits(), next.who())?;
            if let Some(label) = &wait.label {
                write!(f, " (label {label})")?;
            }
        }
        Ok(())
    }
}

/// The cycles of the wait-for graph among `waits` (an edge from a wait to every wait whose
/// task holds the key it waits for), each in cycle order: the strongly connected components
/// with more than one wait, and a wait for a key its own task holds. By hand: the graph is
/// small (one node per waiting head) and a graph crate for it is not worth a dependency.
fn cycles(waits: &[WaitInfo]) -> Vec<Vec<usize>> {
    let edges: Vec<Vec<usize>> = waits
        .iter()
        .map(|wait| {
            (0..waits.len())
                .filter(|j| waits[*j].holds.contains(&wait.waits_for))
                .collect()
        })
        .collect();
    let mut found = Vec::new();
    for component in strongly_connected(&edges) {
        if component.len() > 1 || edges[component[0]].contains(&component[0]) {
            found.push(cycle_order(&component, &edges));
        }
    }
    found
}

/// The strongly connected components of a graph given as adjacency lists, each in index order,
/// in the order Tarjan's algorithm finds them. Every component is the nodes that reach one
/// node and are reached by it. In one depth-first search from every node not reached yet, in
/// index order, a component's first member reached is an ancestor of the others, so it finishes
/// last; Tarjan's algorithm lists each component as that member finishes.
fn strongly_connected(edges: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = edges.len();
    // What each node reaches, itself included.
    let reach: Vec<Vec<bool>> = (0..n)
        .map(|v| {
            let mut seen = vec![false; n];
            depth_first(v, edges, &mut seen, &mut Vec::new());
            seen
        })
        .collect();
    let (mut seen, mut finished) = (vec![false; n], Vec::new());
    for v in 0..n {
        if !seen[v] {
            depth_first(v, edges, &mut seen, &mut finished);
        }
    }
    // Latest finished first: each component is met first at the member it is listed by.
    let mut components: Vec<Vec<usize>> = Vec::new();
    for &v in finished.iter().rev() {
        if !components.iter().any(|component| component.contains(&v)) {
            components.push((0..n).filter(|&u| reach[v][u] && reach[u][v]).collect());
        }
    }
    components.reverse();
    components
}

/// Visits `v` and every node it reaches that is not `seen` yet, depth first along the edges in
/// their order, adding each to `finished` once all it reaches is visited.
fn depth_first(v: usize, edges: &[Vec<usize>], seen: &mut [bool], finished: &mut Vec<usize>) {
    seen[v] = true;
    for &w in &edges[v] {
        if !seen[w] {
            depth_first(w, edges, seen, finished);
        }
    }
    finished.push(v);
}

/// The members of a strongly connected component in an order that follows its edges from its
/// first member (every member is reached: the component is strongly connected).
fn cycle_order(component: &[usize], edges: &[Vec<usize>]) -> Vec<usize> {
    let mut order = vec![component[0]];
    while order.len() < component.len() {
        let last = *order.last().unwrap_or(&component[0]);
        let next = edges[last]
            .iter()
            .copied()
            .find(|w| component.contains(w) && !order.contains(w))
            // Not a single path through the component (several cycles share it): list the
            // rest in key order.
            .or_else(|| component.iter().copied().find(|w| !order.contains(w)));
        match next {
            Some(next) => order.push(next),
            None => break,
        }
    }
    order
}

impl Admin {
    /// Every acquisition waiting at the head of its client's queue under the prefix for a
    /// second or more (shorter waits are not recorded), longest waiting first: the key it waits for, its label, how long, and what its task holds. Uses
    /// `SCAN` (never `KEYS`) for the keys `{*}wait:*`, then one `MULTI HGETALL TIME EXEC` per
    /// record. A waiter behind another of its own client's waiters for the same key is not
    /// listed (it waits for that one first); a wait on a multi-lock is not recorded.
    ///
    /// ```no_run
    /// # async fn demo(admin: fencelock::admin::Admin) -> Result<(), fencelock::Error> {
    /// for wait in admin.waits().await? {
    ///     println!("{wait}");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Redis`] when the connection fails.
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn waits(&self) -> Result<Vec<WaitInfo>, Error> {
        let mut waits = Vec::new();
        for key in self.scan(WAIT_MARKER, Some("hash"), usize::MAX).await? {
            let Some(waiter) = waiter_of(&key).map(|w| String::from_utf8_lossy(w).into_owned())
            else {
                continue;
            };
            type Fields = HashMap<Vec<u8>, Vec<u8>>;
            let (fields, (secs, micros)): (Fields, (u64, u64)) = redis::pipe()
                .atomic()
                .cmd("HGETALL")
                .arg(&key)
                .cmd("TIME")
                .query_async(&mut self.conn.clone())
                .await
                .map_err(Error::from_reply)?;
            let field = |name: &str| fields.get(name.as_bytes());
            let text = |name: &str| field(name).map(|v| String::from_utf8_lossy(v).into_owned());
            let (Some(waits_for), Some(since)) = (field("waits_for"), text("since")) else {
                continue; // expired since the scan, or not a record of ours
            };
            let now_ms = secs * 1000 + micros / 1000;
            let held: usize = text("holds").and_then(|n| n.parse().ok()).unwrap_or(0);
            waits.push(WaitInfo {
                waits_for: waits_for.clone(),
                label: text("label").filter(|label| !label.is_empty()),
                waited_for: Duration::from_millis(
                    now_ms.saturating_sub(since.parse().unwrap_or(now_ms)),
                ),
                holds: (1..=held)
                    .filter_map(|i| field(&format!("hold:{i}")).cloned())
                    .collect(),
                client_name: None,
                waiter,
                key,
            });
        }
        self.name_rows(&mut waits, |w| {
            (Some(w.waiter.as_str()), &mut w.client_name)
        })
        .await?;
        waits.sort_by_key(|wait| std::cmp::Reverse(wait.waited_for));
        Ok(waits)
    }

    /// The cycles among [`Admin::waits`] in which every wait has lasted `min_wait` or longer:
    /// task X holds A and waits for B while task Y holds B and waits for A (or longer cycles,
    /// or a task waiting for a lock it holds itself). Each is a *possible* deadlock: it ends
    /// only when a lease runs out, and the watchdog keeps renewing the holds of live tasks.
    /// Edges are drawn between waiting tasks by what each task holds, so two tasks of one
    /// client never make a cycle by being one client. See DESIGN.md section 11 for when a
    /// report can still be wrong.
    ///
    /// # Errors
    /// As [`Admin::waits`].
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn possible_deadlocks(
        &self,
        min_wait: Duration,
    ) -> Result<Vec<PossibleDeadlock>, Error> {
        let mut waits = self.waits().await?;
        waits.retain(|wait| wait.waited_for >= min_wait);
        let mut found = Vec::new();
        for cycle in cycles(&waits) {
            let waits = cycle.into_iter().map(|i| waits[i].clone()).collect();
            found.push(PossibleDeadlock { waits });
        }
        Ok(found)
    }

    /// The doctor's `deadlock` check: FAIL naming every [possible
    /// deadlock](Admin::possible_deadlocks) whose waits all lasted `min_wait` or longer, OK
    /// otherwise. For `fencelock doctor` (`--deadlock-after`).
    ///
    /// # Errors
    /// As [`Admin::waits`].
    ///
    /// # Cancel safety
    /// Cancel safe: reads only.
    pub async fn check_deadlocks(&self, min_wait: Duration) -> Result<Check, Error> {
        let found = self.possible_deadlocks(min_wait).await?;
        let shown: Vec<String> = found.iter().map(ToString::to_string).collect();
        let finding = match shown.len() {
            0 => format!(
                "no wait-for cycle of waits older than {}",
                format_duration(min_wait)
            ),
            _ => shown.join(" | "),
        };
        Ok(Check::new(
            "deadlock",
            Status::Fail.when(!shown.is_empty()).found(
                finding,
                "tasks that nest locks must take them in one order (a multi-lock takes a set in \
                 the global order); end one of the waiting tasks (its client's process) or evict \
                 one of the holds with fencelock release NAME --force",
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(waits_for: &str, holds: &[&str]) -> WaitInfo {
        WaitInfo {
            key: Vec::new(),
            waiter: format!("c:{waits_for}"),
            client_name: None,
            waits_for: waits_for.as_bytes().to_vec(),
            label: None,
            waited_for: Duration::ZERO,
            holds: holds.iter().map(|k| k.as_bytes().to_vec()).collect(),
        }
    }

    #[test]
    fn keys_are_named_as_their_commands_name_them() {
        use crate::protocol::keys::LockKeys;
        let name = b"account:b}x";
        assert_eq!(named(&LockKeys::new(b"p:", name).lock), "account:b}x");
        let semaphore = LockKeys::semaphore(b"p:", b"pool").lock;
        assert_eq!(named(&semaphore), "semaphore pool");
        let rwlock = LockKeys::rwlock(b"p:", b"config");
        assert_eq!(named(&rwlock.lock), "read-write lock config");
        let writers = rwlock.rw_writers().unwrap();
        assert_eq!(named(&writers), "read-write lock config");
        let election = LockKeys::election(b"p:", b"scheduler").lock;
        assert_eq!(named(&election), "election scheduler");
        assert_eq!(named(&LockKeys::job(b"p:", b"report").lock), "job report");
        let key = LockKeys::idempotency(b"p:", b"orders:8812").lock;
        assert_eq!(named(&key), "idempotency key orders:8812");
        assert_eq!(named(b"p:{ab}other:x"), "other:x");
        assert_eq!(named(b"untagged"), "untagged");
        assert_eq!(named(&LockKeys::new(b"p:", b"\xff").lock), "\\xff");
    }

    #[test]
    fn a_cycle_is_found_in_order_and_chains_or_shared_waits_are_not_cycles() {
        // 0 waits for B (held by 1), 1 waits for A (held by 0): one cycle.
        let waits = [wait("B", &["A"]), wait("A", &["B"]), wait("C", &["D"])];
        assert_eq!(cycles(&waits), [vec![0, 1]]);
        // A chain: 0 waits for B held by 1, which waits for C nobody waiting holds.
        let chain = [wait("B", &["A"]), wait("C", &["B"])];
        assert!(cycles(&chain).is_empty());
        // Two waiters for one key, each holding something else: no cycle.
        let shared = [wait("X", &["A"]), wait("X", &["B"])];
        assert!(cycles(&shared).is_empty());
        // A task waiting for a lock it holds itself.
        assert_eq!(cycles(&[wait("A", &["A"])]), [vec![0]]);
        // Three in a ring, found in ring order from the smallest index.
        let ring = [wait("B", &["A"]), wait("A", &["C"]), wait("C", &["B"])];
        let found = cycles(&ring);
        assert_eq!(found.len(), 1);
        let cycle = &found[0];
        assert_eq!(cycle.len(), 3);
        for (i, at) in cycle.iter().enumerate() {
            let next = cycle[(i + 1) % cycle.len()];
            assert!(ring[next].holds.contains(&ring[*at].waits_for), "{cycle:?}");
        }
    }
}
