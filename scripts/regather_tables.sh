#!/usr/bin/env bash
# Re-gather every published table in docs/results from what git carries, in seconds each and without
# training: a table with a store (table.store) is gathered from it; one without, re-rendered from its
# runs.csv (table.runs_csv); head_to_head_quick is head_to_head_cpu's quick form. Run it on a clean
# checkout of a committed revision (table.md says which tree it was gathered on), then compare and copy:
#
#   scripts/regather_tables.sh [OUT]       # OUT: where the new files go (default runs/regather)
#   for t in OUT/*/; do t=$(basename $t); cp OUT/$t/{table.md,table.csv,runs.csv} OUT/$t/*.png docs/results/$t/; done
#
# faults_cpu, head_to_head_cpu and mnist1d_paper have neither a store nor runs.csv: their READMEs say
# they predate the rules a re-gather applies.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/regather}
PY=.venv/bin/python
STORED="head_to_head_lm_cpu head_to_head_mnist1d_cpu workers_cpu"
RENDERED="comm_cpu dgs_bandwidth_cpu dgs_cpu head_to_head_mnist1d_iid_pair head_to_head_mnist1d_subset lsgd_cpu
          pilot_lm_cpu pilot_mnist1d_cpu qsr_bandwidth_cpu qsr_cpu wagma_bandwidth_cpu wagma_cpu workers_cpu_subset"
mkdir -p "$OUT"
failed=0
run() {  # table name, then the overrides
    local t=$1 s; shift
    s=$(date +%s)
    if "$PY" cli.py "$@" "hydra.run.dir=$OUT/$t" > "$OUT/$t.log" 2>&1; then
        echo "$t: $(( $(date +%s) - s )) s"
    else
        echo "$t: FAILED ($OUT/$t.log)"; failed=1
    fi
}
for t in $STORED; do
    run "$t" "table=$t" "table.store=docs/results/$t/store" table.gather_only=true
done
for t in $RENDERED; do
    run "$t" "table=$t" "table.runs_csv=docs/results/$t/runs.csv"
done
run head_to_head_quick table=head_to_head_cpu table.quick=true table.runs_csv=docs/results/head_to_head_quick/runs.csv
exit $failed
