#!/usr/bin/env bash
# What travels to a lent GPU machine: the repository's tracked and untracked-not-ignored files, 64 MiB
# a call with the carried wheels. The tables' stores (docs/results/*/store: every run's record
# and curves, sealed: 15 MiB on 2026-12-07, 31 MiB loose before) are not needed there and leave too little room for
# .whl (31 MiB) and DALI's pieces. `leave` takes them out of git's index and ignores them, for the
# calls; their files stay untouched where they are. `restore` puts them back. Commit nothing between
# the two: a commit made then would delete the stores from the history's next state.
#
#   bench/gpu_travel.sh leave     # then the device calls
#   bench/gpu_travel.sh restore   # straight after the last one
#   bench/gpu_travel.sh size      # MiB of the repository that would travel now (carried folders apart)
set -euo pipefail
cd "$(dirname "$0")/.."
EXCLUDE=.git/info/exclude
stores() { git ls-files -- 'docs/results/*/store/*' | cut -d/ -f1-4 | sort -u; }
case "${1:-}" in
  leave)
    mapfile -t dirs < <(stores)
    (( ${#dirs[@]} )) || { echo "no store is in the index (left already?)"; exit 0; }
    git rm -r -q --cached -- "${dirs[@]}"
    { echo "# gpu_travel begin"; printf '/%s/\n' "${dirs[@]}"; echo "# gpu_travel end"; } >> "$EXCLUDE"
    printf 'left behind: %s\n' "${dirs[@]}" ;;
  restore)
    mapfile -t dirs < <(sed -n '/^# gpu_travel begin$/,/^# gpu_travel end$/{s|^/\(.*\)/$|\1|p}' "$EXCLUDE")
    sed -i '/^# gpu_travel begin$/,/^# gpu_travel end$/d' "$EXCLUDE"
    (( ${#dirs[@]} )) && git reset -q -- "${dirs[@]}"
    printf 'restored: %s\n' "${dirs[@]}" ;;
  size)
    { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 stat -c %s 2>/dev/null \
      | awk '{s += $1} END {printf "%.1f MiB\n", s / 1048576}' ;;
  *) sed -n 2,11p "$0"; exit 2 ;;
esac
