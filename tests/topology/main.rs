//! Deployments other than one standalone server: replica acknowledgement, Cluster (and re-sends
//! across it), Sentinel failover, and access control and TLS.
//!
//! One test binary, one module per part; `tests/common` is shared by every binary.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod cluster;
mod cluster_resend;
mod replication;
mod security;
mod sentinel;
