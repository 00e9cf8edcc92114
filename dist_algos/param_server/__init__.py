"""The parameter-server family (the DGS paper's comparison): its plugins and what they share.

The plugins: `asgd` (dense pushes, the model back), `gradient_dropping`, `dgc` and `dgs` (a
per-layer top-k push, a sparse or dense reply) and `msgd`, the paper's single-node momentum SGD
baseline (no server: a world of one, here so that its results sit in the same tables). What they
share: the wire format and channels (`wire`), the layer shards of several servers (`layout`),
the server's state and serving threads (`server`) and the plugin base with the worker's exchange
(`plugin`). The sparsifying rules with their memory are compression
(`dist_algos.compress.sparse_feedback`). The registry imports every module of this folder.
"""
