"""How plugins communicate, none of it a plugin (the registry never looks in here): exact
accounting of the collective used (`accounting`: bytes, rounds, seconds), persistent flat buffers
and their bucketed average (`flat`), gradient averaging overlapped with backward in DDP's buckets
(`grad_buckets`), point-to-point calls that work on every process group (`p2p`: host-staged on
gloo) and a round that may fail, the plugin's side of fault-tolerant mode (`round_averager`).

The lowest floor of dist_algos/: these modules import only each other and core/
(tests/test_import_graph.py).
"""
