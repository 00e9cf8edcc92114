"""Fault-tolerant mode in the launching process: the supervisor that runs one process per replica
and restarts it alone (`supervisor`), its nodes over several machines (`nodes`), every node's
supervisor started through pdsh (`over_ssh`), torchft's lighthouse (`lighthouse`) and the record of
every process the job started (`job_processes`). Never imports engine/ft/rank/, nor the other way
round: the two sides meet in the run directory's files (core/run_files.py)."""
