//! Where a lock lives in Redis: key names, hash tags and the fence-counter layout.
//!
//! Every key of one lock (its hash, its slot's fence counter, its operation records) carries the
//! same hash tag, so a script only ever touches one cluster slot. The tag is not derived from the
//! lock name directly: the name is hashed to one of [`SLOTS`] buckets and each bucket has a short
//! precomputed tag that Redis Cluster maps to exactly that slot. That bounds the number of fence
//! counters to one per slot, however many lock names come and go.

use std::sync::OnceLock;

use crate::Error;

/// Number of Redis Cluster hash slots, and so the most fence counters one prefix can create.
pub(crate) const SLOTS: usize = 16384;

/// Longest accepted lock name in bytes. Redis keys may be longer, but a name this long is
/// almost certainly a bug (a whole request body used as a key), and every byte is paid for in
/// every script call and in server memory.
pub const MAX_NAME_LEN: usize = 1024;

/// Longest accepted key prefix in bytes.
pub(crate) const MAX_PREFIX_LEN: usize = 256;

/// The keys one lock uses. Built once per [`crate::Lock`] and cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct LockKeys {
    /// The lock hash, which is also the name of the lock's release channel.
    pub(crate) lock: Vec<u8>,
    /// The fence counter shared by every lock name in the same slot bucket.
    pub(crate) fence: Vec<u8>,
    /// Prefix of this slot's operation records; the operation id follows it.
    op_prefix: Vec<u8>,
    /// Length of `prefix{tag}` at the start of `lock`, so the fair-handoff queue key can be
    /// built on demand (the default mode never pays for it).
    base_len: usize,
    /// Which hash this is, a user's lock or an election's, and so which markers its keys use.
    kind: HashKind,
    /// The Redis Cluster hash slot of every key above.
    pub(crate) slot: u16,
}

/// What a lock hash guards. An election's leadership is a lock too (the leader holds it), but
/// under markers of its own, so that no lock name a user picks can reach an election's keys
/// and no election name can reach a user's lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HashKind {
    /// `prefix{tag}lock:NAME`, queue `prefix{tag}queue:NAME`.
    Lock,
    /// `prefix{tag}leader:NAME`, queue `prefix{tag}leader-queue:NAME`.
    Election,
    /// `prefix{tag}job:NAME`, queue `prefix{tag}job-queue:NAME` (never used: a job's
    /// instances skip a busy job instead of waiting); tick record `prefix{tag}job-tick:NAME`.
    Job,
    /// `prefix{tag}idem:NAME`, queue `prefix{tag}idem-queue:NAME` (used by fair-mode clients
    /// that wait for a run's outcome); record `prefix{tag}idem-rec:NAME`, where NAME is
    /// `namespace:key`.
    Idempotency,
    /// `prefix{tag}sem:NAME` (the semaphore hash), lease zset `prefix{tag}sem-leases:NAME`;
    /// fair mode: queue `prefix{tag}sem-queue:NAME` and its entries
    /// `prefix{tag}sem-waiting:NAME`.
    Semaphore,
    /// `prefix{tag}rw:NAME` (a read-write lock's hash), lease zset `prefix{tag}rw-leases:NAME`,
    /// waiting writers `prefix{tag}rw-writers:NAME`; queue `prefix{tag}rw-queue:NAME` (never
    /// used).
    RwLock,
}

impl HashKind {
    fn markers(self) -> (&'static [u8], &'static [u8]) {
        match self {
            HashKind::Lock => (b"lock:", b"queue:"),
            HashKind::Election => (b"leader:", b"leader-queue:"),
            HashKind::Job => (b"job:", b"job-queue:"),
            HashKind::Idempotency => (b"idem:", b"idem-queue:"),
            HashKind::Semaphore => (b"sem:", b"sem-queue:"),
            HashKind::RwLock => (b"rw:", b"rw-queue:"),
        }
    }
}

impl LockKeys {
    /// Lays out the keys for `name` under `prefix`. Both must have been validated.
    pub(crate) fn new(prefix: &[u8], name: &[u8]) -> Self {
        Self::laid_out(prefix, name, HashKind::Lock)
    }

    /// Lays out the keys of the election `name` under `prefix`: the lock its leader holds is
    /// `prefix{tag}leader:NAME`, never equal to any `prefix{tag}lock:...` key; it shares the
    /// slot's fence counter and op records with the locks of that slot, which is safe (tokens
    /// stay strictly increasing per counter; op ids are unique).
    pub(crate) fn election(prefix: &[u8], name: &[u8]) -> Self {
        Self::laid_out(prefix, name, HashKind::Election)
    }

    /// Lays out the keys of the scheduled job `name` under `prefix`: the lock its runner holds
    /// is `prefix{tag}job:NAME` (see [`LockKeys::job_record`] for its tick record). Like an
    /// election's, it shares the slot's fence counter and op records with the locks there.
    pub(crate) fn job(prefix: &[u8], name: &[u8]) -> Self {
        Self::laid_out(prefix, name, HashKind::Job)
    }

    /// Lays out the keys of the idempotency key `name` (`namespace:key`) under `prefix`: the
    /// lock its runner holds is `prefix{tag}idem:NAME` (see [`LockKeys::idem_record`] for its
    /// record). It shares the slot's fence counter and op records with the locks there.
    pub(crate) fn idempotency(prefix: &[u8], name: &[u8]) -> Self {
        Self::laid_out(prefix, name, HashKind::Idempotency)
    }

    /// Lays out the keys of the semaphore `name` under `prefix`: its hash
    /// `prefix{tag}sem:NAME` (see [`LockKeys::sem_leases`] for its lease zset). It shares the
    /// slot's fence counter and op records with the locks there.
    pub(crate) fn semaphore(prefix: &[u8], name: &[u8]) -> Self {
        Self::laid_out(prefix, name, HashKind::Semaphore)
    }

    /// Lays out the keys of the read-write lock `name` under `prefix`: its hash
    /// `prefix{tag}rw:NAME`, lease zset [`LockKeys::sem_leases`] and waiting writers
    /// [`LockKeys::rw_writers`]. It shares the slot's fence counter and op records.
    pub(crate) fn rwlock(prefix: &[u8], name: &[u8]) -> Self {
        Self::laid_out(prefix, name, HashKind::RwLock)
    }

    /// Whether these are the keys of holds with leases of their own (a semaphore's or a
    /// read-write lock's), which the semaphore scripts renew, release and undo (a lock's, an
    /// election's or a job's use the lock scripts).
    pub(crate) fn has_hold_leases(&self) -> bool {
        matches!(self.kind, HashKind::Semaphore | HashKind::RwLock)
    }

    /// The lease zset of a semaphore or read-write lock (`prefix{tag}sem-leases:NAME`,
    /// `prefix{tag}rw-leases:NAME`, in its hash's slot): holder id -> deadline in server
    /// milliseconds. Built on each call.
    pub(crate) fn sem_leases(&self) -> Vec<u8> {
        self.beside(match self.kind {
            HashKind::RwLock => b"rw-leases:",
            _ => b"sem-leases:",
        })
    }

    /// The entries of a semaphore's fair queue (`prefix{tag}sem-waiting:NAME`, a hash of holder
    /// id -> `<permits>:<deadline ms>`; the queue's order is [`LockKeys::queue`]). Built on each
    /// call.
    pub(crate) fn sem_waiting(&self) -> Vec<u8> {
        self.beside(b"sem-waiting:")
    }

    /// The waiting writers of a read-write lock (`prefix{tag}rw-writers:NAME`, a zset that is
    /// also their channel); `None` for every other kind.
    pub(crate) fn rw_writers(&self) -> Option<Vec<u8>> {
        (self.kind == HashKind::RwLock).then(|| self.beside(b"rw-writers:"))
    }

    /// The key `prefix{tag}MARKER NAME` of these keys' name, in the lock's slot.
    fn beside(&self, marker: &[u8]) -> Vec<u8> {
        let (hash_marker, _) = self.kind.markers();
        let name = &self.lock[self.base_len + hash_marker.len()..];
        [&self.lock[..self.base_len], marker, name].concat()
    }

    fn laid_out(prefix: &[u8], name: &[u8], kind: HashKind) -> Self {
        let base = slot_base(prefix, name);
        let (hash_marker, _) = kind.markers();
        LockKeys {
            slot: name_slot(name),
            lock: [&base[..], hash_marker, name].concat(),
            fence: [&base[..], b"fence"].concat(),
            op_prefix: [&base[..], b"op:"].concat(),
            base_len: base.len(),
            kind,
        }
    }

    /// The fair-handoff queue of this lock (`prefix{tag}queue:NAME`, a sorted set of client
    /// ids; `prefix{tag}leader-queue:NAME` for an election), in the lock's slot. Built on each
    /// call: only fair-mode clients use it.
    pub(crate) fn queue(&self) -> Vec<u8> {
        self.beside(self.kind.markers().1)
    }

    /// The tick record of a job's lock (`prefix{tag}job-tick:NAME`, in the lock's slot): the
    /// newest tick begun, who runs or ran it, with which token. Built on each call.
    pub(crate) fn job_record(&self) -> Vec<u8> {
        self.beside(b"job-tick:")
    }

    /// The record of an idempotency key's lock (`prefix{tag}idem-rec:NAME`, in the lock's
    /// slot): the newest run, its runner, token, fingerprint and stored result. Built on each
    /// call.
    pub(crate) fn idem_record(&self) -> Vec<u8> {
        self.beside(b"idem-rec:")
    }

    /// The record key of one operation on this lock.
    pub(crate) fn op(&self, op_id: &str) -> Vec<u8> {
        [&self.op_prefix[..], op_id.as_bytes()].concat()
    }
}

/// The keys of one fenced resource: its data and its high-water mark, in one slot.
#[derive(Clone, Debug)]
pub(crate) struct ResourceKeys {
    pub(crate) data: Vec<u8>,
    /// The exclusive mark: the highest token that wrote or claimed.
    pub(crate) mark: Vec<u8>,
    /// The shared mark: the highest token of a shared read.
    pub(crate) shared: Vec<u8>,
    op_prefix: Vec<u8>,
}

impl ResourceKeys {
    /// Lays out the keys for resource `name` under `prefix`. Both must have been validated.
    pub(crate) fn new(prefix: &[u8], name: &[u8]) -> Self {
        let base = slot_base(prefix, name);
        ResourceKeys {
            data: [&base[..], b"data:", name].concat(),
            mark: [&base[..], b"mark:", name].concat(),
            shared: [&base[..], b"shared:", name].concat(),
            op_prefix: [&base[..], b"op:"].concat(),
        }
    }

    pub(crate) fn op(&self, op_id: &str) -> Vec<u8> {
        [&self.op_prefix[..], op_id.as_bytes()].concat()
    }
}

/// `prefix{tag}`: the start of every key of `name`. The tag never contains '}', so the first
/// '}' after the prefix ends it and everything after the marker that follows is the name
/// verbatim: distinct names give distinct keys, whatever bytes (braces included) they hold.
fn slot_base(prefix: &[u8], name: &[u8]) -> Vec<u8> {
    let tag = slot_tag(usize::from(name_slot(name)));
    [prefix, b"{", tag.as_bytes(), b"}"].concat()
}

/// Where a client's name is registered: `prefix{tag}client:<client id>`, tagged by the id.
pub(crate) fn client_key(prefix: &[u8], client_id: &str) -> Vec<u8> {
    let id = client_id.as_bytes();
    [&slot_base(prefix, id)[..], b"client:", id].concat()
}

/// Where the waiting acquisition `holder` records its wait for `awaited` (a lock's,
/// semaphore's or read-write lock's hash, `prefix{tag}...`): `prefix{tag}wait:<holder id>`, in
/// the awaited key's slot. `None` for a key without a tag (never one of ours).
pub(crate) fn wait_key(awaited: &[u8], holder: &str) -> Option<Vec<u8>> {
    let end = awaited.iter().position(|b| *b == b'}')?;
    Some([&awaited[..=end], WAIT_MARKER, holder.as_bytes()].concat())
}

/// What follows the slot tag in the key of a wait record, before the holder id.
pub(crate) const WAIT_MARKER: &[u8] = b"wait:";

/// The holder whose wait record `key` is ([`wait_key`] read backwards); `None` for any other
/// key.
pub(crate) fn waiter_of(key: &[u8]) -> Option<&[u8]> {
    after_tag(key)?.strip_prefix(WAIT_MARKER)
}

/// What follows the slot tag of `key` (`lock:NAME`, `wait:HOLDER`): everything after its first
/// '}', since no tag and no prefix holds one. `None` for a key without a tag.
pub(crate) fn after_tag(key: &[u8]) -> Option<&[u8]> {
    let end = key.iter().position(|b| *b == b'}')?;
    Some(&key[end + 1..])
}

/// One kind of key an operator lists: `prefix{tag}MARKER NAME`, the tag that of the name's
/// slot. The marker is spelled out, so a listing finds its keys without laying out a name (the
/// slot tags are computed on first use); the admin tests check it against the layout.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Listing {
    /// What follows the slot tag, before the name.
    pub(crate) marker: &'static [u8],
    /// The key of a name under a prefix.
    layout: fn(&[u8], &[u8]) -> Vec<u8>,
}

impl Listing {
    /// Lock hashes: [`LockKeys::new`].
    pub(crate) const LOCKS: Listing = Listing::of(b"lock:", |p, n| LockKeys::new(p, n).lock);
    /// Election hashes: [`LockKeys::election`].
    pub(crate) const ELECTIONS: Listing =
        Listing::of(b"leader:", |p, n| LockKeys::election(p, n).lock);
    /// Job tick records: [`LockKeys::job_record`].
    pub(crate) const JOB_TICKS: Listing =
        Listing::of(b"job-tick:", |p, n| LockKeys::job(p, n).job_record());
    /// Idempotency records: [`LockKeys::idem_record`].
    pub(crate) const IDEMPOTENCY_RECORDS: Listing = Listing::of(b"idem-rec:", |p, n| {
        LockKeys::idempotency(p, n).idem_record()
    });
    /// Semaphore hashes: [`LockKeys::semaphore`].
    pub(crate) const SEMAPHORES: Listing =
        Listing::of(b"sem:", |p, n| LockKeys::semaphore(p, n).lock);
    /// Read-write lock hashes: [`LockKeys::rwlock`].
    pub(crate) const RWLOCKS: Listing = Listing::of(b"rw:", |p, n| LockKeys::rwlock(p, n).lock);

    /// The listing of the keys `layout` lays out, `marker` after their tag.
    const fn of(marker: &'static [u8], layout: fn(&[u8], &[u8]) -> Vec<u8>) -> Listing {
        Listing { marker, layout }
    }

    /// The key of `name` under `prefix`.
    pub(crate) fn key(self, prefix: &[u8], name: &[u8]) -> Vec<u8> {
        (self.layout)(prefix, name)
    }

    /// The name whose key is `key` under `prefix`, if `key` is one of these: laid out again,
    /// the name must give `key` back (its tag included), so a foreign key that merely looks
    /// alike is not taken for one.
    pub(crate) fn name_of(self, prefix: &[u8], key: &[u8]) -> Option<Vec<u8>> {
        let tagged = key.strip_prefix(prefix)?.strip_prefix(b"{")?;
        let name = after_tag(tagged)?.strip_prefix(self.marker)?;
        (validate_name(name).is_ok() && self.key(prefix, name) == key).then(|| name.to_vec())
    }
}

/// The cluster slot every key of `name` lands in (the tag of that slot is in its keys).
fn name_slot(name: &[u8]) -> u16 {
    // SLOTS is 2^14, so the slot always fits.
    crc16(name) % SLOTS as u16
}

/// Checks a lock name: not empty, at most [`MAX_NAME_LEN`] bytes. Any bytes are allowed.
pub(crate) fn validate_name(name: &[u8]) -> Result<(), Error> {
    if name.is_empty() {
        return Err(Error::InvalidName {
            reason: "a lock name must not be empty".into(),
        });
    }
    if name.len() > MAX_NAME_LEN {
        return Err(Error::InvalidName {
            reason: format!(
                "a lock name is at most {MAX_NAME_LEN} bytes, this one has {}",
                name.len()
            ),
        });
    }
    Ok(())
}

/// Checks a key prefix: at most [`MAX_PREFIX_LEN`] bytes and no braces, because a brace in the
/// prefix would become the hash tag and put every lock into one cluster slot (or split a lock's
/// keys over several).
pub(crate) fn validate_prefix(prefix: &[u8]) -> Result<(), Error> {
    if prefix.len() > MAX_PREFIX_LEN {
        return Err(Error::InvalidConfig {
            reason: format!("the key prefix is at most {MAX_PREFIX_LEN} bytes"),
        });
    }
    if prefix.iter().any(|b| *b == b'{' || *b == b'}') {
        return Err(Error::InvalidConfig {
            reason: "the key prefix must not contain '{' or '}': fencelock places its own hash tag"
                .into(),
        });
    }
    Ok(())
}

/// The shortest tag (ASCII alphanumerics) that Redis Cluster hashes to `slot`.
fn slot_tag(slot: usize) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    &TAGS.get_or_init(build_slot_tags)[slot]
}

/// Finds one tag per slot by enumerating short strings in length order; strings of at most
/// three characters cover every slot, so this takes about 240k CRC computations, once.
fn build_slot_tags() -> Vec<String> {
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut tags: Vec<Option<String>> = vec![None; SLOTS];
    let mut missing = SLOTS;
    let mut candidates: Vec<Vec<u8>> = vec![Vec::new()];
    while missing > 0 {
        let mut next = Vec::with_capacity(candidates.len() * ALPHABET.len());
        for stem in &candidates {
            for &c in ALPHABET {
                let mut tag = stem.clone();
                tag.push(c);
                let slot = usize::from(crc16(&tag)) % SLOTS;
                if tags[slot].is_none() {
                    tags[slot] = Some(String::from_utf8(tag.clone()).expect("ascii alphabet"));
                    missing -= 1;
                }
                next.push(tag);
            }
        }
        candidates = next;
    }
    tags.into_iter()
        .map(|t| t.expect("every slot covered"))
        .collect()
}

/// CRC16-CCITT (XMODEM), the hash Redis Cluster uses for key slots.
pub(crate) fn crc16(bytes: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(bytes)
}

/// The cluster slot Redis computes for a full key, honouring `{hash tags}`.
#[cfg(test)]
pub(crate) fn redis_key_slot(key: &[u8]) -> usize {
    let hashed = key
        .iter()
        .position(|b| *b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|b| *b == b'}')
                .filter(|close| *close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    usize::from(crc16(hashed)) % SLOTS
}

#[cfg(test)]
#[path = "keys_tests.rs"]
mod tests;
