"""The trainer's components, each called at a fixed point of its loop (engine/rank/trainer.py):
the local step (`step`), how the model computes (`compute`), the evaluator (`evaluation`), the
checkpointer (`checkpointer`), the stop agreement (`stop`), the training clock (`clock`), the
imbalance and fault injectors (`imbalance`, `faults`), the heartbeat writer (`heartbeat`), the
RNG (`rng`), the state they all read (`state`) and the declaration of everything a checkpoint
keeps (`stateful`); `config` and `optim` hold the `train`, `optim` and `sched` sections."""
