"""Fault-tolerant mode in the launching process, its policy on the launching side's own supervision
loop (engine/launch/supervision.py): the supervisor (`supervisor`), this node's replica processes,
each restarted alone (`replicas`), a quorum that can no longer form and the outrun rule
(`quorum`), the job's end and summary (`ending`), its nodes over several machines (`nodes`), every
node's supervisor started through pdsh (`over_ssh`), torchft's lighthouse (`lighthouse`) and the
record of every process the job started (`job_processes`). Never imports engine/ft/rank/, nor the
other way round: the two sides meet in the run directory's files (core/run_files.py)."""
