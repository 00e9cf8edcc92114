"""Fault-tolerant mode (`ft.enabled=true`) on torchft: every rank is a replica group of one.

Only the `ft` section and what it refuses before launch live here (`config`: `FTConfig`,
`check_ft`, `quorum_size`, `Replica`), on the floor of the parts that engine/config.py and
engine/plan.py read. What runs inside a replica is in engine/rank/ (`ft_rounds`: the Manager
behind `dist_algos.machinery.ft_round.RoundAverager`, healing, the per-round record;
`ft_transport`: the tensors-only healing transport); what runs in the launching process is in engine/drivers/
(`ft_supervisor`, `ft_nodes`, `ft_over_ssh`, `lighthouse`). torchft is imported only by the two
rank modules, which the trainer imports inside a function when the mode is on.
docs/fault_tolerance.md has the design.
"""
