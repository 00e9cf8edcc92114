"""When and with whom local, group and gossip methods average: the synchronisation period and its
rules (`sync`), WAGMA's groups (`groups`), LSGD's leader (`leader`) and the wait-avoiding group
exchange (`wait_avoiding`). Imports only dist_algos/comm/ and core/ (tests/test_import_graph.py)."""
