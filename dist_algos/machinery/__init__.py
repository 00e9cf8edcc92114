"""What the plugins are built from, none of it a plugin: the registry never looks in here.

- `comm`: communication accounting (exact bytes of the collective used, rounds, seconds);
- `flat`: persistent flat buffers (tensors as views of one buffer) and their bucketed average;
- `grad_buckets`: gradient averaging overlapped with backward, DDP's buckets;
- `p2p`: point-to-point calls that work on every process group (host-staged on gloo);
- `ft_round`: a round that may fail, the plugin side of fault-tolerant mode;
- `consensus`, `consensus_eval`, `bn_stats`: the model every rank evaluates when workers differ,
  and BatchNorm statistics that fit it;
- `sync_schedule`, `group_schedule`, `leader_select`, `wait_avoiding`: when and with whom local,
  group and gossip methods average.

The lowest floor of dist_algos/: these modules import only each other and core/
(tests/test_import_graph.py).
"""
