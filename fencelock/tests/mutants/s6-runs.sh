#!/bin/bash
# The cargo-mutants runs of session 6, as they were run (each in its own worktree at the commit named).
# See tests/RESULTS.md, "Session 6". Not run by CI.

# ---- s6-mut.sh
# Session 6 mutation run: every src/ line changed in session 6 (c4dbd56..88da29a, minus testing), in /work/wt/mut6 (88da29a).
cd /work/wt/mut6
export CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0 RUSTFLAGS="-C link-arg=-fuse-ld=mold"
date; echo "== J session-6 diff"
git diff c4dbd56 88da29a -- src ':!src/testing' > /tmp/s6.diff
cargo mutants --in-place --no-shuffle --in-diff /tmp/s6.diff --features cli --timeout 200 --build-timeout 600 \
  -o /work/mutlogs/s6-diff -- --lib --test security --test fairness --test observability --test cli -- --skip ::cluster
date; echo "== done"

# ---- s6-mutr.sh
# Session 6 mutation run K: src/replication.rs (replica acknowledgement), in a worktree at c5bf2bd,
# two mutants at a time. Test set: the unit tests of replication.rs and every replica-ack test of
# tests/replication.rs and tests/security.rs (libtest filters, OR-ed). tests/cluster.rs (its
# replica-ack tests start a 6-node cluster each, ~40 s per mutant) is not in the set: the
# cluster-path survivors are classified in tests/RESULTS.md.
cd /work/wt/mutr  # at c5bf2bd
export CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0 RUSTFLAGS="-C link-arg=-fuse-ld=mold"
date; echo "== K replication.rs"
cargo mutants --no-shuffle -j 2 -f src/replication.rs --timeout 120 --build-timeout 600 \
  -o /work/mutlogs/s6-replication -- --lib --test replication --test security -- \
  replica acknowledg shortfall unusable replication --skip tls
date; echo "== done"

# ---- s6-mutv.sh
# Session 6 mutation run L: the 42 survivors of run K again, with the cluster and Sentinel
# replica-ack tests added, in /work/wt/mutr (e0c9ba6: with the new replication.rs unit tests).
cd /work/wt/mutr
export CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0 RUSTFLAGS="-C link-arg=-fuse-ld=mold"
args=()
while IFS= read -r re; do args+=(--re "^src/replication.rs:.*: ${re}\$"); done < /tmp/verify-re.txt  # the names in run-s6-K-missed.txt, regex-escaped
date; echo "== L replication.rs survivors, cluster and Sentinel tests added"
cargo mutants --no-shuffle -j 2 -f src/replication.rs "${args[@]}" --timeout 180 --build-timeout 600 \
  -o /work/mutlogs/s6-replication-verify -- --lib --test replication --test cluster --test sentinel -- \
  replica acknowledg shortfall unusable replication failover migration killed_primary
date; echo "== done"
