//! The layer against a real axum server on a free loopback port, a real HTTP/1 client, and
//! throwaway redis-server and PostgreSQL processes.

mod processes;
mod readme;
mod semantics;
mod support;
