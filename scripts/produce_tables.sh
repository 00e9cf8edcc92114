#!/usr/bin/env bash
# Produce the long CPU tables in parts (docs/tables.md, "Carrying a table between machines"): each
# table in turn, from a worktree pinned at one commit, every finished run carried to
# docs/results/<table>/store (table.store), so that a later sitting, on this machine or a fresh
# one, resumes where this one stopped. Commit the stores between sittings: each run's files are
# written once when it finishes (its metrics xz-compressed), so a commit adds small files and
# rewrites none but jobs.jsonl. When a table is final, gather it and seal its store
# (.venv/bin/python -m tables.seal docs/results/<table>/store: two Parquet files in place of the run
# folders, checked to read back exactly first; docs/tables.md), and commit that.
#
#   scripts/produce_tables.sh start [COMMIT]   # in the background; logs in $TABLES_DIR/<table>.log
#   scripts/produce_tables.sh pause            # the running run checkpoints and stops; start resumes it
#   scripts/produce_tables.sh status           # runs made per table, and the latest estimate of what is left
#   scripts/produce_tables.sh digests          # each carried run's ledger digest from its run folder (below)
#
# COMMIT: the code the runs are made with; by default the commit the first table's store was started
# at (its jobs.jsonl), else HEAD, so that a table is not made of several commits by accident; a
# table whose store began at another commit is skipped (the chain log says so), not added to. A
# COMMIT named here is deliberate: stores begun at another commit are continued at it, and each
# table.md lists every commit its runs were made at (tables/provenance.py). Name one only
# after `git diff <store's commit> COMMIT` shows the training path unchanged.
# A run made with report.ledger=true keeps its time ledger in its run folder under $TABLES_DIR, too big
# for git; the store keeps a digest of it (ledger_digest.json: what the projected columns need,
# tables/ledger_digests.py). A chain started at a commit that writes no digest leaves them to
# `digests`, which pause and status also run: run it before the run folders are lost with the machine.
# Environment: TABLES (default below, in order), TABLES_DIR (run folders, logs, the worktree;
# default /tmp/tables). Uses the repository's .venv (scripts/setup_env.sh).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
SELF="$REPO/scripts/$(basename "$0")"
DIR=${TABLES_DIR:-/tmp/tables}
# the tables still to make; a produced one leaves the list, since a start would otherwise re-run its
# pinned gather (the MNIST-1D one failed there, on a NaN the later code handles) before going on
TABLES=${TABLES:-"frontier_mnist1d_cpu frontier_lm_cpu"}  # workers_cpu, head_to_head_mnist1d_cpu, head_to_head_lm_cpu: produced (sealed)
PY="$REPO/.venv/bin/python"
WT="$DIR/worktree"
# this chain's loop, as pgrep sees it: started with its TABLES_DIR, so that pause and start act on
# this chain's loop and no other
LOOP_MATCH="produce_tables.sh loop $DIR\$"

store() { echo "$REPO/docs/results/$1/store"; }

digests() {  # each carried run's ledger digest, written from its run folder where the store lacks it
    local t
    for t in $TABLES; do
        [ -d "$(store "$t")" ] && [ -d "$DIR/$t" ] || continue
        (cd "$REPO" && "$PY" -m tables.ledger_digests "$(store "$t")" "$DIR/$t") || true
    done
}

started_at() {  # the commit a store's first job ran at ("" if none)
    local jobs
    jobs="$(store "$1")/jobs.jsonl"
    [ -s "$jobs" ] && "$PY" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["commit"])' "$jobs" || true
}

loop() {
    cd "$WT"
    local head at
    head=$(git rev-parse HEAD)
    for t in $TABLES; do
        # a table is made at one commit: one whose store began at another is left to a start of its own
        at=$(started_at "$t")
        if [ -n "$at" ] && [ "$at" != "$head" ] && [ -z "${CONTINUE_AT_COMMIT:-}" ]; then
            echo "$(date -u +%FT%TZ) skip $t: its store was started at ${at:0:7}, this worktree is at" \
                 "${head:0:7} (TABLES=$t $SELF start)"
            continue
        fi
        echo "$(date -u +%FT%TZ) start $t at ${head:0:7}${at:+ (store begun at ${at:0:7})}"
        rc=0
        "$PY" cli.py "table=$t" "hydra.run.dir=$DIR/$t" "table.store=$(store "$t")" >> "$DIR/$t.log" 2>&1 || rc=$?
        echo "$(date -u +%FT%TZ) end $t rc=$rc"
        [ -f "$DIR/paused" ] && exit 0
    done
}

case "${1:-}" in
start)
    [ -x "$PY" ] || { echo "produce_tables: no $PY; run scripts/setup_env.sh first" >&2; exit 1; }
    first=${TABLES%% *}
    if pgrep -f "$LOOP_MATCH" >/dev/null || pgrep -f "table.store=$(store "$first")" >/dev/null; then
        echo "produce_tables: already running (scripts/produce_tables.sh pause stops it)" >&2; exit 1
    fi
    commit=${2:-$(started_at "$first")}
    commit=${commit:-$(git -C "$REPO" rev-parse HEAD)}
    mkdir -p "$DIR"
    rm -f "$DIR/paused"
    if [ -d "$WT" ]; then
        [ "$(git -C "$WT" rev-parse HEAD)" = "$(git -C "$REPO" rev-parse "$commit")" ] || {
            echo "produce_tables: $WT is at $(git -C "$WT" rev-parse --short HEAD), not $commit; remove it" \
                 "(git worktree remove $WT) or pass its commit" >&2; exit 1; }
    else
        git -C "$REPO" worktree add -q --detach "$WT" "$commit"
    fi
    # a named COMMIT continues stores begun at another one (the tables list both)
    (cd "$DIR" && CONTINUE_AT_COMMIT=${2:+1} setsid nohup "$SELF" loop "$DIR" >> "$DIR/chain.log" 2>&1 < /dev/null &)
    echo "producing $TABLES at $(git -C "$WT" rev-parse --short HEAD); logs in $DIR"
    ;;
loop)
    loop
    ;;
pause)
    touch "$DIR/paused"
    pkill -f "$LOOP_MATCH" || true
    runner=$(pgrep -f "cli.py table=[^ ]* hydra.run.dir=$DIR/" | head -1 || true)
    log=$(ls -t "$DIR"/*.log 2>/dev/null | grep -v chain.log | head -1 || true)
    run=""
    [ -n "$log" ] && run=$(grep -oE ": (running|resuming) \([^)]*\)" "$log" | tail -1 | sed -E 's/.*\((.*)\)/\1/' || true)
    [ -n "$runner" ] && kill -9 "$runner"
    if [ -n "$run" ] && pgrep -f "hydra.run.dir=$run" >/dev/null; then
        echo "asked $run to checkpoint and stop"
        # touched again at each wait: the launch counts only a request newer than its own start, so a
        # single touch in a run's first seconds can land before that stamp and be taken as stale
        for _ in $(seq 1 150); do
            pgrep -f "hydra.run.dir=$run" >/dev/null || { echo "paused"; exit 0; }
            touch "$run/stop_request"
            sleep 2
        done
        echo "produce_tables: $run still running after 300 s" >&2; exit 1
    fi
    echo "paused"
    digests
    ;;
digests)
    digests
    ;;
status)
    digests
    for t in $TABLES; do
        # loose or sealed alike (tables/run_records.py)
        n=$(cd "$REPO" && "$PY" -c 'import sys; from pathlib import Path; from tables.store import store_records
print(len(store_records(Path(sys.argv[1])).runs()))' "$(store "$t")" 2>/dev/null || echo "?")
        echo "$t: $n finished runs in $(store "$t")"
        # the runner's own estimate: the phase it is in, runs left in it and their time at the pace so far
        last=$( (grep -hE "runs left in this phase" "$DIR/$t.log" 2>/dev/null || true) | tail -1)
        [ -n "$last" ] && echo "  last: $last"
    done
    ;;
*)
    sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
