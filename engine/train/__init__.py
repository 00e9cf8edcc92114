"""One rank's training: the trainer (`trainer`) and the components it calls at fixed points:
the local step (`step`), the evaluator (`evaluation`), the checkpointer (`checkpointer`), the
stop agreement (`stop`), the imbalance injector (`imbalance`), and the state they all read
(`state`); `config` and `optim` hold the `train`, `optim` and `sched` sections."""
