#!/bin/bash
# The cargo-mutants runs of session 5, as they were run (each in its own worktree at the commit named).
# See tests/RESULTS.md, "Session 5". Not run by CI.

# ---- s5-run.sh
# Session 5 mutation runs, sequential, in /work/wt/mut (commit 0a069f7).
cd /work/wt/mut
export CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0 RUSTFLAGS="-C link-arg=-fuse-ld=mold"
RE_A='has_waiters|== with != in Waiters::enter|on_reconnect|on_lost_subscription|replace \+ with - in Waiters::leave|match guard was_head|replace && with \|\| in Waiters::leave|replace != with == in Waiters::leave|unsubscribe_later|observed_lease with \(\)|replace \+ with - in WaitEntry::observed_lease|WaitEntry::acquired|WaitEntry::hand_on|SIGNAL_RECONNECTED|replace \+ with - in WaitEntry::wait|replace \+ with - in WaitEntry::jittered|d <= at with false|herd_jitter -> Duration'
date; echo "== A"
cargo mutants --in-place --no-shuffle -f src/wait.rs --re "$RE_A" --timeout 150 --build-timeout 600 \
  -o /work/mutlogs/s5-wait -- --lib --test liveness --test reconnect -- --skip ::cluster
date; echo "== B"
cargo mutants --in-place --no-shuffle -f src/wait.rs --re 'resubscribe_all|leave_fair_queue' --timeout 200 --build-timeout 600 \
  -o /work/mutlogs/s5-wait-b -- --lib --test sentinel --test fairness -- --skip ::cluster
date; echo "== done"

# ---- s5-run3.sh
# Session 5 mutation run, part 3: multi.rs, in /work/wt/mut2 (0a069f7), in parallel with parts 1-2.
cd /work/wt/mut2
export CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0 RUSTFLAGS="-C link-arg=-fuse-ld=mold"
date; echo "== D multi.rs"
cargo mutants --in-place --no-shuffle -f src/multi.rs --timeout 200 --build-timeout 600 \
  -o /work/mutlogs/s5-multi -- --lib --test multi_lock -- --skip ::cluster
date; echo "== done"

# ---- s5-run4.sh
# Session 5, part 4: the fair-handoff diff (src of 6f9a9f7..0a069f7 minus wait/sql/tests), in /work/wt/mut (7ab278d).
cd /work/wt/mut
export CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0 RUSTFLAGS="-C link-arg=-fuse-ld=mold"
# The fair-handoff diff: every src/ line the fair merge changed (wait.rs has runs A/B).
git diff 6f9a9f7 7ab278d -- src ':!src/wait.rs' ':!src/sql.rs' ':!src/protocol/tests.rs' \
  ':!src/testing' ':!src/bin' > /tmp/s5-fair.diff
date; echo "== C fair diff"
cargo mutants --in-place --no-shuffle --in-diff /tmp/s5-fair.diff --features cli --timeout 200 --build-timeout 600 \
  -o /work/mutlogs/s5-fair -- --lib --test fairness --test core --test cli -- --skip ::cluster
date; echo "== done"

# ---- s5-run5.sh
# Session 5, part 5: verification of the multi.rs and wait.rs survivors, in /work/wt/mut2 (7ab278d).
cd /work/wt/mut2
export CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0 RUSTFLAGS="-C link-arg=-fuse-ld=mold"
RE='delete ! in MultiLock::traced|busy == index|in MultiLock::attempt$|replace \+ with \* in MultiLock::attempt_ordered|Some\(mut session\), Some\(ack\)|Debug for MultiGuard|into_guards|MultiGuard::replicated|resubscribe_all'
date; echo "== E verify"
cargo mutants --in-place --no-shuffle -f src/multi.rs -f src/wait.rs --re "$RE" --timeout 300 --build-timeout 600 \
  -o /work/mutlogs/s5-verify -- --lib --test multi_lock --test observability --test faults --test replication --test sentinel -- --skip ::cluster
date; echo "== done"

# ---- s5-run6.sh
# Session 5, part 6: client.rs retries, transient errors, push routing, ids; in /work/wt/mut2 (e3be842).
cd /work/wt/mut2
export CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0 RUSTFLAGS="-C link-arg=-fuse-ld=mold"
RE='retrying|is_transient|push_handler|next_id|connect_with'
date; echo "== G client.rs"
cargo mutants --in-place --no-shuffle -f src/client.rs --re "$RE" --timeout 300 --build-timeout 600 \
  -o /work/mutlogs/s5-client -- --lib --test faults --test liveness --test reconnect --test core --test cluster -- --skip ::cluster
date; echo "== done"

# ---- s5-run7.sh
# Session 5, part 7: verification of the survivors killed after the runs, in /work/wt/mut (e3be842).
cd /work/wt/mut
git checkout -q -B mut e3be842
export CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0 RUSTFLAGS="-C link-arg=-fuse-ld=mold"
RE='get_field -> |items -> |is_stale -> bool with true|in read_lock|Some\(mut session\), Some\(ack\)|MultiGuard::replicated'
date; echo "== H verify"
cargo mutants --in-place --no-shuffle -f src/resource.rs -f src/sql.rs -f src/admin.rs -f src/multi.rs --re "$RE" \
  --timeout 300 --build-timeout 600 -o /work/mutlogs/s5-verify2 \
  -- --lib --test fencing --test fairness --test replication -- --skip ::cluster
date; echo "== done"

# ---- s5-run8.sh
# Session 5, part 8: admin read_lock with the CLI tests, and the client.rs survivors again, in /work/wt/mut2 (3fb257c).
cd /work/wt/mut2
git checkout -q -B mut2 3fb257c
export CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0 RUSTFLAGS="-C link-arg=-fuse-ld=mold"
date; echo "== I admin read_lock + client survivors"
cargo mutants --in-place --no-shuffle -f src/admin.rs -f src/client.rs \
  --re 'in read_lock|replace \* with / in LockClient::retrying|PushKind::Disconnection' \
  --features cli --timeout 300 --build-timeout 600 -o /work/mutlogs/s5-verify3 \
  -- --lib --test cli --test fairness --test faults --test reconnect -- --skip ::cluster
date; echo "== done"
