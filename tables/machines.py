"""Which machine each run ran on, and the paired comparisons whose two sides did not share one.

Why: a run is bit-reproducible only on one machine type (core/machine.py: the CPU model and the
instruction-set flags that choose numeric kernels, the GPU, torch). A comparison paired by seed
takes each seed's two runs as the same experiment but for the method; made on two machine types
they also differ in their arithmetic, from the first step on. That is no reason to unpair them
(their data, initial model and partition are the seed's), but a reader must see it: the
language model's last 21 runs were made on an EPYC without AVX-512 while the allreduce seeds they
are paired with ran on AVX-512 machines, and nothing in its files showed it (issue 88).

So a gather lists the machine types of its runs (table.md's "Machines", runs.csv's `machine`;
`unknown` for a run made before summary.json recorded it, which is never taken for a mismatch) and
flags every paired comparison with a seed whose two runs ran on different types. With
`table.mixed_machines=refuse` such a comparison ends the gather in one line instead, naming the
pair and the seed: a table meant to be exact per machine (a reproduction, a regression check)
cannot pass one by.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Optional

from core.errors import UserError
from tables.runs import UNKNOWN_MACHINE, Summary, machine_type

MIXED_FLAG, MIXED_REFUSE = "flag", "refuse"


def mixed_seeds(runs: dict[str, dict[int, Summary]], a: str, b: str) -> list[tuple[int, str, str]]:
    """(seed, a's type, b's type) for each seed at which `a` and `b` ran on different known types."""
    found = []
    for seed in sorted(set(runs.get(a, {})) & set(runs.get(b, {}))):
        ta, tb = machine_type(runs[a][seed]), machine_type(runs[b][seed])
        if UNKNOWN_MACHINE not in (ta, tb) and ta != tb:
            found.append((seed, ta, tb))
    return found


def mixed_note(runs: dict[str, dict[int, Summary]], a: str, b: str, policy: str = MIXED_FLAG,
               table: str = "") -> str:
    """The one line a paired comparison of `a` with `b` carries when some seed's two runs ran on
    different machine types ("" when none did); refused in one line under `refuse`."""
    found = mixed_seeds(runs, a, b)
    if not found:
        return ""
    seeds = ", ".join(str(s) for s, _, _ in found)
    line = (f"seed{'s' * (len(found) > 1)} {seeds} of {a} and {b} ran on different machine types "
            f"({found[0][1]} against {found[0][2]}{', ...' if len(found) > 1 else ''}): paired, but not bit "
            f"for bit the same arithmetic")
    if policy == MIXED_REFUSE:
        raise UserError(f"table {table}: {line}; table.mixed_machines=refuse refuses a pair across machine types: "
                        f"re-run one side on the other's machine type, or gather with table.mixed_machines=flag")
    return line


def describe(record: Any) -> str:
    """A machine record in words: CPU (its kernel flags), cores, GPU, torch."""
    if not isinstance(record, dict):
        return "not recorded"
    flags = record.get("cpu_flags") or []
    vector = "AVX-512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else ", ".join(flags[-2:]) or "no flags")
    gpu = f", {record.get('gpus')} x {record['gpu']} (driver {record.get('gpu_driver')})" if record.get("gpu") else ""
    return f"{record.get('cpu')} ({vector}), {record.get('cores')} cores{gpu}, torch {record.get('torch')}"


def machine_lines(runs: dict[str, dict[int, Summary]], mixed: list[str],
                  tuning: Optional[dict[str, dict[int, Summary]]] = None) -> list[str]:
    """table.md's "Machines": each machine type with its runs and what it is, the runs without a
    record, the paired comparisons flagged across types, and where the tuning runs ran."""
    counts: Counter[str] = Counter()
    described: dict[str, str] = {}
    for found in (runs, tuning or {}):
        for by_seed in found.values():
            for summary in by_seed.values():
                kind = machine_type(summary)
                if kind != UNKNOWN_MACHINE:
                    described.setdefault(kind, describe(summary.get("machine")))
    for by_seed in runs.values():
        counts.update(machine_type(summary) for summary in by_seed.values())
    tuned = tuning_lines(tuning or {}, described)
    if not counts:
        return ["## Machines", "", *tuned, ""] if tuned else []
    lines = ["## Machines", "",
             "The machine type each reported run ran on (core/machine.py: CPU model and kernel flags, GPU, torch; "
             "runs are bit-reproducible per type), runs.csv's `machine`:", ""]
    for kind, n in counts.most_common():
        what = described.get(kind, "made before runs recorded their machine; not known from the files")
        lines.append(f"- {kind}: {n} run{'s' * (n != 1)}: {what}")
    if mixed:
        lines += ["", f"Paired comparisons with a seed whose two runs ran on different machine types ({len(mixed)}; "
                      f"table.mixed_machines=refuse would refuse them):", "", *(f"- {line}" for line in mixed)]
    elif len(counts) > 1 or UNKNOWN_MACHINE not in counts:
        lines += ["", "No paired comparison has a seed whose two runs ran on different known machine types."]
    if counts.get(UNKNOWN_MACHINE):
        lines += ["", f"{counts[UNKNOWN_MACHINE]} run{'s' * (counts[UNKNOWN_MACHINE] != 1)} carry no machine record: "
                      f"a pair with one of them cannot be checked."]
    return lines + ([""] + tuned if tuned else []) + [""]


def tuning_lines(tuning: dict[str, dict[int, Summary]], described: dict[str, str]) -> list[str]:
    """Where the tuning runs ran, when not all on one type: a long production may move machines
    between sittings, and a row whose grid spans two types compared its settings on validation
    across them (the float order differs as a seed's would; the choice still rests on validation)."""
    counts = Counter(machine_type(s) for by_seed in tuning.values() for s in by_seed.values())
    if len(counts) < 2:
        return []
    spans = [label for label, by_seed in tuning.items() if len({machine_type(s) for s in by_seed.values()}) > 1]
    lines = ["The tuning runs ran on more than one machine type:", "",
             *(f"- {kind}: {n} tuning run{'s' * (n != 1)}: {described.get(kind, 'not recorded')}"
               for kind, n in counts.most_common())]
    if spans:
        shown = ", ".join(spans[:10]) + (f" and {len(spans) - 10} more" if len(spans) > 10 else "")
        lines += ["", f"Rows whose tuning grid ran on more than one type ({len(spans)}; their settings were compared "
                      f"on validation across types): {shown}."]
    return lines
