"""The ground floor: what every other package of syncopt imports, importing none of them.

- `core.errors`: the one-line `UserError` and its exit code;
- `core.distenv`: who this process is in the job, and torch.distributed set-up;
- `core.schema`: typed config sections (dataclasses with declared ranges and choices), merged
  from Hydra's nodes and frozen once a run is planned;
- `core.rundir`: every path inside a run directory;
- `core.run_files`: the files the launching process and the ranks exchange there (heartbeat
  steps, the fault log and attempt number, the launch record, the start gate) and their formats;
- `core.registry`: name -> entry registries (models, data sets, algorithms) built by decorators.

A test (tests/test_import_graph.py) keeps this floor free of imports from data/, models/,
dist_algos/, engine/, cli.py and bench/.
"""
