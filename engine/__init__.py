"""The runner's machinery: configuration, launching, the trainer loop, checkpoints, logging."""
