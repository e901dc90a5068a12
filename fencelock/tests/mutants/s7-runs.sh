#!/bin/bash
# The cargo-mutants run of session 7, as it was run (in its own worktree at the commit named).
# See tests/RESULTS.md, "Session 7". Not run by CI.

# ---- s7-mut.sh
# Session 7 mutation run M: the replication.rs survivors of run K that run L did not reach, at 5d673f6
# (with the new unit tests of redirect and primary_may_have_moved).
cd /work/wt/mutr2
export CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0 RUSTFLAGS="-C link-arg=-fuse-ld=mold"
date; echo "== M replication.rs: the 10 survivors run L did not reach, unit tests only"
cargo mutants --no-shuffle -j 2 -f src/replication.rs \
  --re 'in redirect$' --re 'redirect -> ' --re 'primary_may_have_moved' --re 'replace > with >= in AckSession<.*>::run$' \
  --timeout 120 --build-timeout 600 -o /work/mutlogs/s7-replication -- --lib -- replication::tests
date; echo "== done"

# ---- s7-mut2.sh
# Session 7 mutation run N: the shared connection_lost check and the classifiers that call it, at b970d59.
cd /work/wt/mutr2   # at b970d59
export CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0 RUSTFLAGS="-C link-arg=-fuse-ld=mold"
date; echo "== N the shared connection_lost check and its callers' guards, unit tests only"
cargo mutants --no-shuffle -j 2 -f src/replication.rs -f src/error.rs \
  --re 'primary_may_have_moved' --re 'outcome_unknown' --re 'connection_lost' --re 'in Error::is_connection$' --re 'Error::is_connection -> ' \
  --timeout 120 --build-timeout 600 -o /work/mutlogs/s7-connection-lost -- --lib -- replication::tests error::tests
date; echo "== done"
