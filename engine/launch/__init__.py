"""Launching a job, from cli.py's hand-off to the ranks' exit.

What the plan reads (on the engine's lowest floor): the `launch` section (`config`), DeepSpeed
hostfiles (`hostfile`), the emulated cluster of `launch.network` (`network`, with the per-node
launches of `node_group`), process facts (`procs`), pre-launch checks over ssh (`remote`) and the
launch commands (`commands`: ports, thread settings, command lines).

What runs in the launching process (the engine's top floor, never importing engine/rank/): the
hand-off from cli.py (`job`), restart-all (`restart`), the loop that starts and supervises one
attempt (`loop`) on the supervision loop it shares with the fault-tolerant supervisor
(`supervision`), the five launch plans (`plans`), the ranks forked from this process (`fork`),
the watch over the ranks' files (`rank_watch`) and the run directory's lock (`run_lock`).
"""
