"""Fault-tolerant mode (`ft.enabled=true`) on torchft: every rank is a replica group of one.

`config` (the `ft` section and the checks before launch), `lighthouse` (torchft's lighthouse,
started by cli.py on node 0), `transport` (the healing transport: tensors only, loaded with
weights_only=True), `rounds` (the Manager behind `dist_algos.machinery.ft_round.RoundAverager`, healing,
the per-round record) and `supervisor` (one process per replica, restarted alone when it dies).
torchft is imported only inside these modules' functions. docs/fault_tolerance.md has the design.
"""
