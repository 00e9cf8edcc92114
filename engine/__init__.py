"""The runner, on floors of its own (docs/architecture.md): the parts and their config sections
(checkpoint/, report/, train/, what the plan reads of launch/, ft/config, usage), the run's config,
the plan, and on top two sides that never import each other: what runs inside a rank (rank/,
ft/rank/) and what runs in the launching process (launch/, ft/launch/). It knows nothing of
tables (tables/, above it)."""
