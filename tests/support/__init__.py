"""What the tests are built from (none of it a test): multi-process harnesses, one-process
reference simulations, the registry-wide declarations, generated data, emulated hosts and a
SLURM cluster."""
