//! The bottom layer: what every other layer speaks in. The error and its one classification,
//! the fencing token, a client's settings and the checks on them, the replica-acknowledgement
//! policy, the one retry policy, and the metrics. It imports nothing of the crate.

pub(crate) mod config;
pub(crate) mod durations;
pub(crate) mod error;
pub(crate) mod metrics;
pub(crate) mod replica_ack;
pub(crate) mod retry;
pub(crate) mod token;
