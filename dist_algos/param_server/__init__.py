"""Asynchronous parameter-server machinery shared by the asgd, gradient_dropping, dgc and dgs
plugins: the wire format and channels (`wire`), the layer shards of several servers (`layout`),
the server's state and serving threads (`server`) and the plugin base with the worker's exchange
(`plugin`). The per-algorithm rules live in `dist_algos.compressors` and the plugin modules."""
