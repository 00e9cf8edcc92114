"""Fault-tolerant mode (`ft.enabled=true`) on torchft, in one home: every rank is a replica group
of one.

- `config`: the `ft` section and what it refuses before launch (`FTConfig`, `check_ft`,
  `quorum_size`, `Replica`), on the floor of the parts that engine/config.py and engine/plan.py read;
- `rank/`: what runs inside a replica (torchft's Manager behind the plugins' `RoundAverager`,
  healing, the tensors-only transport);
- `launch/`: what runs in the launching process (the supervisor, its nodes, its launch over ssh,
  the lighthouse).

The plugin's side, a round that may fail, is `dist_algos.comm.round_averager` (a plugin cannot
import the engine). torchft is imported only by the rank side, inside a function when the mode is
on. docs/fault_tolerance.md has the design.
"""
