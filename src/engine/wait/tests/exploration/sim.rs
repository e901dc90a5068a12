//! The simulated side of the exploration: one lock on a modelled server, and each client's
//! link to it. Every request is a round trip the explorer schedules in two steps (it reaches
//! the server; its reply reaches the client), so any other event can land in between.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::base::error::Error;
use crate::engine::acquisition::{acquire_loop, Attempt, Attempts, Waiting};
use crate::engine::handoff::{Grant, HandoffTerms};
use crate::engine::wait::{self, FairExit, TestFuture, TestLink, Waiters};
use crate::protocol::LockKeys;

/// Every lease of the simulation: far beyond any case, so a fallback timer set to it never
/// legitimately fires.
pub(super) const LEASE: Duration = Duration::from_secs(3600);
/// A reservation's lease (fair mode), as long: a reservation that nobody claims is stranded
/// for the whole case, not healed by its expiry.
pub(super) const GRACE: Duration = Duration::from_secs(3600);

/// A small seeded generator (splitmix64): a case is a function of its seed.
#[derive(Debug, Clone)]
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub(super) fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

/// Who holds the lock on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Owner {
    /// An acquisition of a simulated client: (client, holder id).
    Task(usize, u64),
    /// Someone else (another process without waiters here).
    Outsider,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Request {
    Acquire {
        holder: u64,
        waiting: bool,
    },
    /// `release.lua`, or with a `candidate` (a waiter of the same client) `handoff.lua`.
    Release {
        holder: u64,
        requeue: bool,
        candidate: Option<u64>,
    },
    Cancel {
        holder: u64,
    },
    Subscribe,
    Unsubscribe,
    LeaveFair,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reply {
    Won,
    Busy(Duration),
    Done,
    /// `handoff.lua` granted the lock to the candidate.
    HandedOff,
    /// The connection dropped under a SUBSCRIBE or UNSUBSCRIBE (not re-sent by anyone).
    ConnectionLost,
}

/// Something on its way to a client: a reply or a push.
#[derive(Debug)]
pub(super) enum Incoming {
    Reply(Request, Reply, oneshot::Sender<Reply>),
    /// A release message on the lock's channel.
    Message,
    /// The server dropped this client's subscription by itself (on a cluster: the slot moved,
    /// or the confirmation of our own unsubscribe).
    SubscriptionLost,
}

struct Sent {
    id: u64,
    request: Request,
    reply: oneshot::Sender<Reply>,
    /// Sent while the connection was up: it reaches the server even if its caller gives up.
    on_wire: bool,
}

/// One client's connection: what it sent that the server has not run yet, and what is on
/// its way back, both in order (one connection carries requests, replies and pushes).
#[derive(Default)]
pub(super) struct Link {
    pub(super) up: bool,
    outbox: VecDeque<Sent>,
    inbox: VecDeque<Incoming>,
    /// The transport's record of the subscription, from the confirmations it read: what it
    /// subscribes again after a reconnect.
    tracked: bool,
}

/// The lock on the server, with fair handoff's queue and reservation (DESIGN.md 7.1).
#[derive(Debug, Default)]
pub(super) struct Server {
    pub(super) holder: Option<Owner>,
    /// The client the lock is reserved for (fair mode).
    pub(super) reserved: Option<usize>,
    /// Fair mode's queue of client ids, oldest first.
    pub(super) queue: Vec<usize>,
    /// The clients subscribed to the lock's channel, server side.
    pub(super) subscribed: Vec<bool>,
    pub(super) fair: bool,
    /// Counts what the server ran and published, to order the two below.
    pub(super) ran: u64,
    /// When the server last published on the channel (by `ran`).
    pub(super) last_publish: u64,
    /// When an attempt of each client last reached the server (by `ran`).
    pub(super) last_attempt: Vec<u64>,
    /// Acquisitions `cancel.lua` marked cancelled (client, holder id): never granted after.
    pub(super) cancelled: Vec<(usize, u64)>,
    /// Releases that handed the lock on (`handoff.lua`).
    pub(super) handoffs: u64,
}

/// The simulated world: the server, the clients' links, and the log of what happened.
pub(super) struct World {
    pub(super) server: Server,
    pub(super) links: Vec<Link>,
    /// The cluster flavour: our own unsubscribe is confirmed by the push that also reports a
    /// moved slot.
    pub(super) cluster: bool,
    /// The waiters' randomness (the herd jitter, re-send pauses).
    random: Rng,
    next_id: u64,
    started: Instant,
    pub(super) log: Vec<String>,
}

pub(super) type Shared = Arc<Mutex<World>>;

impl World {
    pub(super) fn new(clients: usize, fair: bool, cluster: bool, seed: u64) -> Shared {
        let server = Server {
            subscribed: vec![false; clients],
            last_attempt: vec![0; clients],
            fair,
            ..Server::default()
        };
        let links = (0..clients)
            .map(|_| Link {
                up: true,
                ..Link::default()
            })
            .collect();
        Arc::new(Mutex::new(World {
            server,
            links,
            cluster,
            // A stream of its own, not the explorer's.
            random: Rng::new(!seed),
            next_id: 1,
            started: wait::now(),
            log: Vec::new(),
        }))
    }

    /// Logs `line` with the virtual time since the case began.
    pub(super) fn note(&mut self, line: String) {
        let at = wait::now().saturating_duration_since(self.started);
        self.log
            .push(format!("{:>6.1}ms {line}", at.as_secs_f64() * 1e3));
    }

    pub(super) fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub(super) fn can_exec(&self, client: usize) -> bool {
        self.links[client].up && !self.links[client].outbox.is_empty()
    }

    pub(super) fn can_deliver(&self, client: usize) -> bool {
        self.links[client].up && !self.links[client].inbox.is_empty()
    }

    pub(super) fn is_free(&self) -> bool {
        self.server.holder.is_none() && self.server.reserved.is_none()
    }

    fn send(&mut self, client: usize, request: Request, reply: oneshot::Sender<Reply>) -> u64 {
        let id = self.next_id();
        let on_wire = self.links[client].up;
        self.links[client].outbox.push_back(Sent {
            id,
            request,
            reply,
            on_wire,
        });
        id
    }

    /// A caller gave up on request `id`: unless it is on the wire, it is never sent.
    fn withdraw(&mut self, client: usize, id: u64) {
        self.links[client]
            .outbox
            .retain(|sent| sent.id != id || sent.on_wire);
    }

    /// Runs the oldest request of `client` on the server.
    pub(super) fn exec(&mut self, client: usize) {
        let Some(sent) = self.links[client].outbox.pop_front() else {
            return;
        };
        let reply = self.run(client, sent.request);
        self.note(format!(
            "  server runs c{client} {:?} -> {reply:?}",
            sent.request
        ));
        self.links[client]
            .inbox
            .push_back(Incoming::Reply(sent.request, reply, sent.reply));
        if self.cluster && matches!(sent.request, Request::Unsubscribe) {
            self.links[client]
                .inbox
                .push_back(Incoming::SubscriptionLost);
        }
    }

    /// The next thing on its way to `client`, for the explorer to hand over.
    pub(super) fn take_incoming(&mut self, client: usize) -> Option<Incoming> {
        self.links[client].inbox.pop_front()
    }

    fn run(&mut self, client: usize, request: Request) -> Reply {
        let server = &mut self.server;
        server.ran += 1;
        match request {
            Request::Acquire { holder, waiting } => {
                server.last_attempt[client] = server.ran;
                if server.holder == Some(Owner::Task(client, holder)) {
                    // A replay: a release of this client granted it the lock (acquire.lua).
                    return Reply::Won;
                }
                let claim = server.fair && server.reserved == Some(client);
                if claim {
                    server.reserved = None;
                    server.holder = Some(Owner::Task(client, holder));
                    return Reply::Won;
                }
                if server.holder.is_some() || server.reserved.is_some() {
                    if server.fair && waiting && !server.queue.contains(&client) {
                        server.queue.push(client);
                    }
                    let left = if server.holder.is_some() {
                        LEASE
                    } else {
                        GRACE
                    };
                    return Reply::Busy(left);
                }
                server.queue.retain(|c| *c != client);
                server.holder = Some(Owner::Task(client, holder));
                Reply::Won
            }
            Request::Release {
                holder,
                requeue,
                candidate,
            } => {
                if server.holder != Some(Owner::Task(client, holder)) {
                    return Reply::Done;
                }
                // handoff.lua: granted while no other client is subscribed, unless cancelled.
                let alone = (0..server.subscribed.len())
                    .all(|other| other == client || !server.subscribed[other]);
                if let Some(candidate) = candidate {
                    if !server.fair && alone && !server.cancelled.contains(&(client, candidate)) {
                        server.holder = Some(Owner::Task(client, candidate));
                        server.handoffs += 1;
                        return Reply::HandedOff;
                    }
                }
                self.free(Some(client).filter(|_| requeue));
                Reply::Done
            }
            Request::Cancel { holder } => {
                // cancel.lua: the undone acquisition frees the lock and publishes; a
                // reservation is not passed on.
                server.cancelled.push((client, holder));
                if server.holder == Some(Owner::Task(client, holder)) {
                    server.holder = None;
                    self.publish();
                }
                Reply::Done
            }
            Request::Subscribe => {
                server.subscribed[client] = true;
                Reply::Done
            }
            Request::Unsubscribe => {
                server.subscribed[client] = false;
                Reply::Done
            }
            Request::LeaveFair => {
                server.queue.retain(|c| *c != client);
                if server.reserved == Some(client) {
                    server.reserved = (!server.queue.is_empty()).then(|| server.queue.remove(0));
                    self.publish();
                }
                Reply::Done
            }
        }
    }

    /// The release that frees the lock (release.lua, or release_fair.lua: the first queued
    /// client gets a reservation, and `requeue` goes to the back of the queue unless the
    /// reservation is its own).
    pub(super) fn free(&mut self, requeue: Option<usize>) {
        let server = &mut self.server;
        server.holder = None;
        if server.fair {
            let first = (!server.queue.is_empty()).then(|| server.queue.remove(0));
            server.reserved = first;
            if let Some(again) = requeue {
                if first != Some(again) && !server.queue.contains(&again) {
                    server.queue.push(again);
                }
            }
        }
        self.publish();
    }

    /// `PUBLISH`: a message to every client subscribed and connected at this moment.
    fn publish(&mut self) {
        self.server.ran += 1;
        self.server.last_publish = self.server.ran;
        for (client, link) in self.links.iter_mut().enumerate() {
            if self.server.subscribed[client] && link.up {
                link.inbox.push_back(Incoming::Message);
            }
        }
    }

    /// The connection of `client` drops: the messages on their way are lost for good, and so
    /// are the subscriptions the old connection had. A SUBSCRIBE or UNSUBSCRIBE on the wire
    /// fails (its confirmation is never read); the other requests are re-sent after the
    /// reconnect with their operation ids, which the server answers as it did, so they are
    /// kept.
    pub(super) fn disconnect(&mut self, client: usize) {
        self.server.subscribed[client] = false;
        let link = &mut self.links[client];
        link.up = false;
        let mut failed = Vec::new();
        let pending = std::mem::take(&mut link.inbox);
        for incoming in pending {
            match incoming {
                Incoming::Reply(request @ (Request::Subscribe | Request::Unsubscribe), _, to) => {
                    failed.push((request, to));
                }
                Incoming::Reply(..) => link.inbox.push_back(incoming),
                Incoming::Message | Incoming::SubscriptionLost => {}
            }
        }
        let sent = std::mem::take(&mut link.outbox);
        for sent in sent {
            match sent.request {
                Request::Subscribe | Request::Unsubscribe => {
                    failed.push((sent.request, sent.reply));
                }
                _ => link.outbox.push_back(sent),
            }
        }
        for (request, to) in failed {
            self.note(format!("  c{client} {request:?} fails: connection lost"));
            let _ = to.send(Reply::ConnectionLost);
        }
    }

    /// The connection is back, and the transport subscribed again to what it had recorded.
    pub(super) fn reconnect(&mut self, client: usize) {
        let link = &mut self.links[client];
        link.up = true;
        for sent in &mut link.outbox {
            sent.on_wire = true;
        }
        self.server.subscribed[client] = link.tracked;
    }

    /// The client read a confirmation: the transport's record follows it.
    pub(super) fn track(&mut self, client: usize, incoming: &Incoming) {
        match incoming {
            Incoming::Reply(Request::Subscribe, Reply::Done, _) => {
                self.links[client].tracked = true;
            }
            Incoming::Reply(Request::Unsubscribe, Reply::Done, _) | Incoming::SubscriptionLost => {
                self.links[client].tracked = false;
            }
            _ => {}
        }
    }

    /// The server drops the subscription of `client` by itself (a moved slot).
    pub(super) fn lose_subscription(&mut self, client: usize) {
        self.server.subscribed[client] = false;
        self.links[client]
            .inbox
            .push_back(Incoming::SubscriptionLost);
    }
}

/// What a transport error looks like to the waiters: a lost connection.
fn connection_lost() -> Error {
    let io = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
    Error::from(redis::RedisError::from(io))
}

fn confirmed(reply: Reply) -> Result<(), Error> {
    match reply {
        Reply::ConnectionLost => Err(connection_lost()),
        _ => Ok(()),
    }
}

/// One round trip from `client`; a caller that gives up before the request is on the wire
/// withdraws it.
pub(super) async fn round_trip(world: &Shared, client: usize, request: Request) -> Reply {
    struct Withdraw<'a> {
        world: &'a Shared,
        client: usize,
        id: Option<u64>,
    }
    impl Drop for Withdraw<'_> {
        fn drop(&mut self) {
            if let Some(id) = self.id {
                self.world.lock().withdraw(self.client, id);
            }
        }
    }
    let (tx, rx) = oneshot::channel();
    let id = world.lock().send(client, request, tx);
    let mut withdraw = Withdraw {
        world,
        client,
        id: Some(id),
    };
    let reply = rx.await.expect("the simulation drops no request");
    withdraw.id = None;
    reply
}

/// A simulated client's side of the waiters' seam: its subscriptions and its leave_fair go to
/// the world, and its randomness comes from the case's seed.
pub(super) struct SimLink {
    pub(super) world: Shared,
    pub(super) client: usize,
}

impl TestLink for SimLink {
    fn subscribe(&self, _channel: &[u8]) -> TestFuture<Result<(), Error>> {
        let (world, client) = (self.world.clone(), self.client);
        Box::pin(async move { confirmed(round_trip(&world, client, Request::Subscribe).await) })
    }

    fn unsubscribe(&self, _channel: &[u8]) -> TestFuture<Result<(), Error>> {
        let (world, client) = (self.world.clone(), self.client);
        Box::pin(async move { confirmed(round_trip(&world, client, Request::Unsubscribe).await) })
    }

    fn leave_fair(&self, _fair: &FairExit) -> TestFuture<()> {
        let (world, client) = (self.world.clone(), self.client);
        Box::pin(async move {
            round_trip(&world, client, Request::LeaveFair).await;
        })
    }

    fn random(&self) -> u64 {
        self.world.lock().random.next()
    }
}

/// The attempts of one simulated acquisition: one holder id; an attempt dropped in flight
/// sends its undo (`cancel.lua`), as the real pending operation does.
pub(super) struct SimAttempts {
    pub(super) world: Shared,
    pub(super) client: usize,
    pub(super) holder: u64,
    /// The holder id as a client would name it, for the loop's trace event.
    pub(super) name: String,
    /// Whether a busy attempt queues a fair client (false for `try_acquire`).
    pub(super) waiting: bool,
    /// Whether it takes the lock from a release of its client (not in fair handoff).
    pub(super) handoff: bool,
}

struct Undo<'a> {
    world: &'a Shared,
    client: usize,
    holder: u64,
    armed: bool,
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        if self.armed {
            let (tx, _rx) = oneshot::channel();
            let request = Request::Cancel {
                holder: self.holder,
            };
            let mut world = self.world.lock();
            world.note(format!("  c{} undoes {}", self.client, self.holder));
            world.send(self.client, request, tx);
        }
    }
}

impl Attempts for SimAttempts {
    type Held = u64;

    fn holder(&self) -> &str {
        &self.name
    }

    fn handoff_terms(&self) -> Option<HandoffTerms> {
        if !self.handoff {
            return None;
        }
        let (world, client, holder) = (self.world.clone(), self.client, self.holder);
        Some(HandoffTerms {
            holder: self.name.clone(),
            lease: LEASE,
            label: None,
            permits: 1,
            undo: Box::new(move || {
                let _ = Undo {
                    world: &world,
                    client,
                    holder,
                    armed: true,
                };
            }),
        })
    }

    fn handed_off(&mut self, _grant: Grant) -> Option<u64> {
        Some(self.holder)
    }

    async fn attempt(&mut self, _window: Duration) -> Result<Attempt<u64>, Error> {
        let mut undo = Undo {
            world: &self.world,
            client: self.client,
            holder: self.holder,
            armed: true,
        };
        let request = Request::Acquire {
            holder: self.holder,
            waiting: self.waiting,
        };
        let reply = round_trip(&self.world, self.client, request).await;
        undo.armed = false;
        match reply {
            Reply::Won => Ok(Attempt::Won {
                held: self.holder,
                hand_on: false,
            }),
            Reply::Busy(left) => Ok(Attempt::Busy(Some(left))),
            other => Err(Error::Protocol(format!("an acquire answered {other:?}"))),
        }
    }
}

/// What an acquisition came to.
#[derive(Debug)]
pub(super) enum Outcome {
    Won(u64),
    Busy,
    TimedOut,
    Failed(String),
}

/// The production acquire loop, with a simulated attempt.
pub(super) async fn acquire(
    waiters: &Arc<Waiters>,
    keys: &Arc<LockKeys>,
    shape: super::Shape,
    deadline: Option<Instant>,
    attempts: SimAttempts,
) -> Outcome {
    let client = attempts.client;
    let how = Waiting {
        name: &keys.lock,
        waiters,
        channel: &keys.lock,
        fair: shape.fair.then(|| FairExit {
            keys: keys.clone(),
            client: format!("c{client}"),
            grace: GRACE,
        }),
        retry_window: Duration::from_secs(1),
        winner_lease: shape.holds_next.then_some(LEASE),
        contended: None,
        report: None,
    };
    match acquire_loop(how, deadline, attempts).await {
        Ok(holder) => Outcome::Won(holder),
        Err(err) if err.is_timeout() => Outcome::TimedOut,
        Err(err) => Outcome::Failed(err.to_string()),
    }
}

/// `try_acquire`: one attempt that never queues.
pub(super) async fn try_once(mut attempts: SimAttempts) -> Outcome {
    match attempts.attempt(Duration::from_secs(1)).await {
        Ok(Attempt::Won { held, .. }) => Outcome::Won(held),
        Ok(Attempt::Busy(_)) => Outcome::Busy,
        Err(err) => Outcome::Failed(err.to_string()),
    }
}
