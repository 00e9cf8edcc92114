#!/usr/bin/env bash
# The GPU sessions of issues 24 and 36, as run on a lent GPU machine that has torch but no package registry:
# the missing wheels travel in .whl/ (and DALI's, too large for one transfer, as pieces of one tar
# in .dali<k>/), and each step below is one call. Logs go to $OUT (or /tmp/gpu_out).
#
#   bench/gpu_session.sh install        install .whl/ into /tmp/site unless a warm machine has it; versions
#   bench/gpu_session.sh start          install .whl/ into /tmp/site; the whole suite, in the background
#   bench/gpu_session.sh piece          keep this call's piece of DALI's wheels (bench/gpu_wheels.sh --dali cuts them)
#   bench/gpu_session.sh checks         bench/gpu_checks.py (shared GPU, 14 loader workers)
#   bench/gpu_session.sh wait           until the suite ends (at most 540 s); its summary
#   bench/gpu_session.sh measure        bench/throughput.py on CIFAR/ResNet-18, bench/gpu_checks.py wall, compile
#   bench/gpu_session.sh dali           join and install DALI; its tests; bench/throughput.py DALI/ResNet-50 at 224;
#                                       DiLoCo on 4 ranks sharing the GPU through DALI (gpu_checks dali_shared)
#   bench/gpu_session.sh gpu            the GPU tests (pytest -m gpu tests/test_gpu.py), failures named in $OUT/gpu_tests.log
#   bench/gpu_session.sh suite SECONDS [WORKERS]  the whole suite on WORKERS (8) xdist workers (-v; each test
#                                       limited to 300 s), cut at SECONDS; the node ids that failed in $OUT/suite_failed.txt
#   bench/gpu_session.sh open [SECONDS] install; the tests earlier sessions left open (the loader-worker resume on the
#                                       GPU, fault-tolerant QSR against its plain twin), alone, cut at SECONDS (250)
#   bench/gpu_session.sh final SECONDS [WORKERS]  the fifth session's one call (issue 36), cut at SECONDS: install;
#                                       the two open tests alone (cut at 250 s); then, in the time left, the whole
#                                       suite less those two on WORKERS (12) xdist workers; failures in $OUT
#   bench/gpu_session.sh from FILE SECONDS WORKERS [PATH...]  install; the suite's test files from FILE on (in
#                                       pytest's order: tests/compress/ first, then tests/test_*.py by name), and the
#                                       PATHs, on WORKERS xdist workers, cut at SECONDS: where a cut suite left off
#   bench/gpu_session.sh rerun SECONDS  those node ids again, serially, to tell load-caused failures from GPU-caused
#   bench/gpu_session.sh round SECONDS  the third session's one call (issue 36), cut at SECONDS: install; on the
#                                       quiet machine ResNet-18's device pipeline against its ceiling and the GPT's
#                                       runner against a bare loop (bf16, compiled); then the suite without the
#                                       GPU tests on 10 xdist workers in the background while the foreground runs
#                                       DiLoCo's GPT on 8 ranks sharing the GPU and the GPU tests; logs in $OUT
#   bench/gpu_session.sh dali_round SECONDS   the fourth session's main call (issue 36), cut at SECONDS, on a warm
#                                       machine that holds .whl's install and DALI's first pieces: the last piece;
#                                       DALI installed; on the quiet machine ResNet-50 through DALI against its
#                                       ceiling; then the suite without the GPU tests on 10 xdist workers in the
#                                       background while the foreground runs DiLoCo on 4 ranks sharing the GPU
#                                       through DALI and the GPU tests (DALI's decoding included); logs in $OUT
#   bench/gpu_session.sh lm_ab [ROUNDS]  install; the language model's runner against its bare loop (bf16, compiled)
#                                       in the older tree .ab/ and in this one, alternating, ROUNDS (3) times each:
#                                       whether the runner's per-step cost or the host moved the ratio. Made here with
#                                       `mkdir .ab && git archive REV -- . ':!docs/results' | tar -x -C .ab` (and
#                                       /.ab/ in .git/info/exclude), carried with .whl; the ratios in $OUT/lm_ab.log
#   bench/gpu_session.sh shard K N [SECONDS]  shard K of N of the test files, tests/compress/ included (by size,
#                                       round robin), without the GPU tests, on 12 xdist workers, cut at SECONDS (540),
#                                       each test limited to 300 s; names of failures and errors in $OUT/shard_K.log
#
# The last session's lessons: the machine goes back after 30 s idle (a background suite is lost with it),
# and the whole suite serially takes over 20 minutes there. So: `start` only installs when the suite is
# run in shards (one call each, under the 600 s limit), the GPU tests and measurements come first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT" /root/dali
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH  # (torchft_lighthouse: pip --target puts scripts there)
export SYNCOPT_TESTS_WITHOUT_SYSTEM_PACKAGES=1  # no Debian registry there: SLURM, iproute2, ssh tests skip, naming it
SUITE=/root/suite_repo
# the issue's two measurements against the compute ceiling (bench/throughput.py), as every session runs them
CIFAR_CEILING=(--model resnet18 --batch 512 --pipelines device --train-images 50000 --workers 8 --warmup 10 --steps 60
               --log-every 10)
DALI_CEILING=(--data imagenet --pipelines dali --model resnet50 --batch 256 --train-images 12800 --workers 14
              --warmup 10 --steps 30 --log-every 5)
# the language model's runner against its bare loop (bench/task_throughput.py), one round, bf16 and compiled
LM_AGAINST_BARE=(--tasks lm --device cuda --lm-recipe lm/shakespeare_gpu --compile --rounds 1 --warmup 20 --steps 100
                 --log-every 20)

# the tests earlier sessions left open: the loader-worker resume on the GPU, fault-tolerant QSR against its plain twin
OPEN_TESTS=(tests/test_gpu.py::test_resume_with_loader_workers_on_the_gpu_is_identical
            tests/test_ft.py::test_without_failures_fault_tolerant_qsr_equals_the_plain_run)

piece() {
  for d in .dali*/; do [[ -d $d ]] && cp -n "$d"* /root/dali/ 2>/dev/null; done
  ls -la /root/dali
}

install_site() {
  if [[ ! -d /tmp/site/hydra ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || return 1
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, hydra, deepspeed, wandb, torchft; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
}

install_dali() {
  # the pieces are one xz tar of DALI installed for Python 3.12 (bench/gpu_wheels.sh --dali); tarfile with
  # the 'data' filter: nothing in it is written outside /tmp/site
  [[ -d /tmp/site/nvidia/dali ]] && return 0
  cat /root/dali/part_* > /root/dali.tar.xz || return 1
  python3 -c "import tarfile, sys; tarfile.open(sys.argv[1]).extractall('/tmp/site', filter='data')" /root/dali.tar.xz \
    || return 1
  python3 -c "import nvidia.dali as d; print('dali', d.__version__)"
}

# seconds left of a round's `limit` (from its start, t0), less a margin
left() { echo $(( limit - (SECONDS - t0) - ${1:-0} )); }

# A round's second half: the suite without the GPU tests on 10 xdist workers in the background,
# while the foreground runs gpu_checks.py's check $1 and then the GPU tests; the suite's outcome,
# its failures named in $OUT/suite_failed.txt (and /root, for `rerun`). Each part ends before the
# round's limit.
suite_beside() {
  (timeout --signal=INT "$(left 12)" python3 -m pytest -p no:cacheprovider -v -rfEs -n 10 --timeout 240 \
     -m "not gpu" tests > "$OUT/suite.log" 2>&1 &)
  timeout "$(left 30)" python3 bench/gpu_checks.py --only "$1" 2>&1 | tee "$OUT/$1.log" | tail -2
  timeout --signal=INT "$(left 20)" python3 -m pytest -p no:cacheprovider -v -rfEs -n 3 --timeout 400 -m gpu \
    tests/test_gpu.py tests/test_prefetch.py > "$OUT/gpu_tests.log" 2>&1
  grep -E "(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" "$OUT/gpu_tests.log" | tail -25
  while pgrep -f "pytest.*not gpu" >/dev/null && (( $(left 8) > 0 )); do sleep 2; done; sleep 3
  suite_summary
}

# $OUT/suite.log's outcome: its counts, and the node ids that failed or errored in $OUT/suite_failed.txt (and
# /root, for `rerun`)
suite_summary() {
  grep -E "(passed|failed).* in [0-9.]+s" "$OUT/suite.log" | tail -1
  echo "suite: $(grep -c " PASSED" "$OUT/suite.log") passed, $(grep -c " SKIPPED" "$OUT/suite.log") skipped"
  grep -oE "(FAILED|ERROR) tests/[^ ]+" "$OUT/suite.log" | awk '{print $2}' | sort -u > "$OUT/suite_failed.txt"
  head -60 "$OUT/suite_failed.txt"
  cp "$OUT/suite_failed.txt" /root/; echo "failed or errored: $(wc -l < "$OUT/suite_failed.txt")"
}

# the suite's test files in the order `from` and `upto` cut it: tests/compress first, then tests/
test_files() {
  find tests/compress -name 'test_*.py' | sort
  find tests -maxdepth 1 -name 'test_*.py' | sort
}

# The whole suite (GPU tests included) on $2 xdist workers, cut at $1 seconds, each test limited to 300 s; -v: each
# outcome is printed as it ends, so a cut run still names its failures. Further arguments (the paths among
# them) go to pytest.
run_suite() {
  local cut=$1 workers=$2; shift 2
  timeout --signal=INT "$cut" python3 -m pytest -p no:cacheprovider -v -rfEs -n "$workers" --timeout 300 "$@" \
    > "$OUT/suite.log" 2>&1
  suite_summary
}

# the tests earlier sessions left open, alone, cut at $1 seconds: each passes, or its failure carries the ranks' stacks
open_tests() {
  timeout --signal=INT "$1" python3 -m pytest -p no:cacheprovider -v -rfEs -n 2 --timeout 240 \
    "${OPEN_TESTS[@]}" > "$OUT/open_tests.log" 2>&1
  grep -E "(PASSED|FAILED|ERROR)|passed|failed" "$OUT/open_tests.log" | tail -8
}

case "${1:-}" in
  install) install_site ;;
  suite) run_suite "${2:?seconds}" "${3:-8}" tests ;;
  from)
    first=${2:?first test file}; install_site || exit 1
    mapfile -t files < <(test_files | awk -v f="$first" '$0 == f {on = 1} on')
    (( ${#files[@]} )) || { echo "no test file $first"; exit 2; }
    echo "${#files[@]} files, $first to ${files[-1]}"
    run_suite "${3:?seconds}" "${4:?workers}" "${@:5}" "${files[@]}" ;;
  upto)
    # the files before $2 (those `from $2` leaves out), with the same arguments
    last=${2:?first test file not to run}; install_site || exit 1
    mapfile -t files < <(test_files | awk -v f="$last" '$0 == f {exit} {print}')
    (( ${#files[@]} )) || { echo "no test file before $last"; exit 2; }
    echo "${#files[@]} files, ${files[0]} to ${files[-1]}"
    run_suite "${3:?seconds}" "${4:?workers}" "${@:5}" "${files[@]}" ;;
  rerun)
    limit=${2:?seconds}
    [[ -s $OUT/suite_failed.txt ]] || cp /root/suite_failed.txt "$OUT/" 2>/dev/null
    mapfile -t ids < "$OUT/suite_failed.txt"
    timeout --signal=INT "$limit" python3 -m pytest -p no:cacheprovider -q -rfEs --timeout 300 "${ids[@]}" 2>&1 \
      | tee "$OUT/rerun.log" | tail -30 ;;
  start)
    install_site || exit 1
    piece
    git rev-parse HEAD 2>/dev/null || true
    rm -rf "$SUITE" && cp -r . "$SUITE"
    (cd "$SUITE" && setsid nohup bash -c 'python3 -m pytest -p no:cacheprovider -q -rfEs --durations=15 \
        >/root/suite.log 2>&1; echo $? >/root/suite.rc' >/dev/null 2>&1 &)
    sleep 20; tail -3 /root/suite.log ;;
  round)
    limit=${2:?seconds}; t0=$SECONDS
    install_site || exit 1
    timeout 150 python3 bench/throughput.py "${CIFAR_CEILING[@]}" 2>&1 | tee "$OUT/throughput_cifar.log" | tail -4
    timeout 170 python3 bench/task_throughput.py "${LM_AGAINST_BARE[@]}" 2>&1 | tee "$OUT/lm_throughput.log" | tail -5
    echo "measured by $((SECONDS - t0)) s"
    suite_beside lm_shared ;;
  piece) piece ;;
  open) install_site && open_tests "${2:-250}" ;;
  final)
    limit=${2:?seconds}; t0=$SECONDS
    install_site || exit 1
    open_tests 250
    echo "open tests done by $((SECONDS - t0)) s"
    desel=(); for t in "${OPEN_TESTS[@]}"; do desel+=(--deselect "$t"); done
    run_suite "$(left 8)" "${3:-12}" "${desel[@]}" tests
    echo "ended at $((SECONDS - t0)) s" ;;
  dali_round)
    limit=${2:?seconds}; t0=$SECONDS
    [[ -d /tmp/site/hydra ]] || { echo "a cold machine: .whl's install is gone (run install and piece first)"; exit 1; }
    piece >/dev/null; install_dali || exit 1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    timeout 150 python3 bench/throughput.py "${DALI_CEILING[@]}" 2>&1 | tee "$OUT/throughput_dali.log" | tail -5
    echo "measured by $((SECONDS - t0)) s"
    suite_beside dali_shared ;;
  checks)
    piece
    python3 bench/gpu_checks.py --only shared,workers 2>&1 | tee "$OUT/checks.log"
    tail -2 /root/suite.log ;;
  wait)
    piece
    for _ in $(seq 108); do [[ -f /root/suite.rc ]] && break; sleep 5; done
    cp /root/suite.log "$OUT/suite.log"; echo "suite rc: $(cat /root/suite.rc 2>/dev/null || echo running)"
    grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" /root/suite.log | tail -60 ;;
  measure)
    piece
    python3 bench/throughput.py "${CIFAR_CEILING[@]}" 2>&1 | tee "$OUT/throughput_cifar.log" | tail -6
    python3 bench/gpu_checks.py --only wall,compile 2>&1 | tee "$OUT/gpu_checks_wall_compile.log" ;;
  dali)
    piece
    install_dali || exit 1
    python3 -m pytest -p no:cacheprovider -q -rfEs -k "dali" tests 2>&1 | tee "$OUT/dali_tests.log" | tail -15
    python3 bench/throughput.py "${DALI_CEILING[@]}" 2>&1 | tee "$OUT/throughput_dali.log" | tail -6
    python3 bench/gpu_checks.py --only dali_shared 2>&1 | tee "$OUT/dali_shared.log" | tail -2 ;;
  lm_ab)
    [[ -f .ab/bench/task_throughput.py ]] || { echo "no older tree in .ab/ (see the usage above)"; exit 2; }
    install_site || exit 1
    for i in $(seq "${2:-3}"); do
      for tree in .ab .; do
        ratio=$(cd "$tree" && timeout 150 python3 bench/task_throughput.py "${LM_AGAINST_BARE[@]}" 2>&1 | tail -1)
        echo "round $i, tree $tree: $ratio" | tee -a "$OUT/lm_ab.log"
      done
    done ;;
  gpu)
    python3 -m pytest -p no:cacheprovider -q -rfEs -m gpu --timeout 400 tests/test_gpu.py 2>&1 \
      | tee "$OUT/gpu_tests.log" | tail -20 ;;
  shard)
    k=${2:?shard index}; n=${3:?shard count}
    # every test file, tests/compress/ included, largest first, dealt round robin
    mapfile -t files < <(find tests -name 'test_*.py' -printf '%s %p\n' | sort -rn | awk '{print $2}' \
      | awk -v k="$k" -v n="$n" '(NR - 1) % n == k')
    # -v: each outcome is printed as it ends, so a shard cut at SECONDS still names what it ran
    timeout --signal=INT "${4:-540}" python3 -m pytest -p no:cacheprovider -v -rfEs -n 12 --timeout 300 -m "not gpu" \
      "${files[@]}" > "$OUT/shard_$k.log" 2>&1
    grep -E "(passed|failed).* in [0-9.]+s" "$OUT/shard_$k.log" | tail -1
    echo "shard $k: $(grep -c " PASSED" "$OUT/shard_$k.log") passed, $(grep -c " SKIPPED" "$OUT/shard_$k.log") skipped"
    grep -oE "(FAILED|ERROR) tests/[^ ]+" "$OUT/shard_$k.log" | awk '{print $2}' | sort -u | tee "$OUT/shard_${k}_failed.txt" ;;
  *) sed -n "2,/^set -uo/{/^#/p}" "$0"; exit 2 ;;
esac
