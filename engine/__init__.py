"""The runner, on floors of its own (docs/architecture.md): the parts and their config sections
(checkpoint/, report/, train/, launch/, ft/, tables/, usage), the run's config, the plan, and on
top two sides that never import each other: what runs inside a rank (rank/) and what runs in the
launching process (drivers/)."""
