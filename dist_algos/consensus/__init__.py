"""The model every rank evaluates when workers hold different models: the all-rank average
(`average`), its evaluation (`evaluation`) and BatchNorm statistics that fit it (`bn_stats`).
Imports only dist_algos/comm/ and core/ (tests/test_import_graph.py)."""
