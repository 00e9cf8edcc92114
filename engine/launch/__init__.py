"""What launching needs, shared by the plan and the drivers: the `launch` section (`config`),
DeepSpeed hostfiles (`hostfile`), the emulated cluster of `launch.network` (`network`, with the
per-node launches of `node_group`), process facts (`procs`), pre-launch checks over ssh
(`remote`) and the launch commands (`commands`: ports, thread settings, command lines). The
process loop that runs them is in engine/drivers/."""
