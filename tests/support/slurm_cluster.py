"""A throw-away single-node SLURM cluster on this machine, for the SLURM tests.

Debian's slurm-wlm and munge, started by hand (there is no service manager here): munged with its
own key and socket, `slurmctld -i`, `slurmd`, all in the foreground as this process's children,
with a slurm.conf that needs nothing from /etc: proctrack/linuxproc, task/none, no accounting,
free private ports, state and logs under a temporary directory. A requeued job normally waits
about two minutes before it may run again; `cred_expire=10` and a 2 s scheduling interval bring
that down to about 15 s. `close()` cancels the jobs and stops the daemons and every process they
started, even after a failed test.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

import psutil

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol")


def slurm_usable() -> Optional[str]:
    """None when a cluster can be started here, else why not (for pytest.skip / fail)."""
    if os.geteuid() != 0:
        return "needs root to start munged, slurmctld and slurmd"
    missing = [d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]
    if missing:
        return f"{', '.join(missing)} not installed (scripts/setup_env.sh --test installs slurm-wlm and munge)"
    return None


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SlurmCluster:
    def __init__(self, tmp: Path) -> None:
        self.dir = tmp
        self.node = socket.gethostname()
        self.procs: list[subprocess.Popen] = []
        self.env = {**os.environ, "SLURM_CONF": str(tmp / "slurm.conf")}
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _write_conf(self) -> None:
        d = self.dir
        ctld_port, slurmd_port = _free_ports(2)
        (d / "plugstack.conf").write_text("")
        (d / "slurm.conf").write_text(f"""\
ClusterName=syncopttest
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d / 'munge.sock'},cred_expire=10
StateSaveLocation={d / 'state'}
SlurmdSpoolDir={d / 'spool'}
SlurmctldPidFile={d / 'slurmctld.pid'}
SlurmdPidFile={d / 'slurmd.pid'}
SlurmctldLogFile={d / 'slurmctld.log'}
SlurmdLogFile={d / 'slurmd.log'}
PlugStackConfig={d / 'plugstack.conf'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
KillWait=10
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=1 State=UNKNOWN
PartitionName=test Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")

    def _daemon(self, cmd: list[str], log: str) -> None:
        self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=open(self.dir / log, "w"),
                                           stderr=subprocess.STDOUT, start_new_session=True))

    def _start(self) -> None:
        d = self.dir
        d.chmod(0o700)  # munged refuses keys and sockets in loosely protected directories
        for sub in ("state", "spool"):
            (d / sub).mkdir()
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self._write_conf()
        self._daemon(["munged", "-F", "--force", f"--socket={d / 'munge.sock'}", f"--key-file={key}",
                      f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}",
                      f"--seed-file={d / 'munged.seed'}"], "munged.out")
        self._wait(lambda: (d / "munge.sock").exists(), "munged did not create its socket", "munged.log")
        self._daemon(["slurmctld", "-D", "-i"], "slurmctld.out")
        self._daemon(["slurmd", "-D"], "slurmd.out")
        self._wait(self._node_idle, "the node did not become idle", "slurmctld.log")

    def _node_idle(self) -> bool:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=self.env, capture_output=True, text=True)
        return out.returncode == 0 and out.stdout.strip() == "idle"

    def _wait(self, ready, what: str, log: str, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                tail = (self.dir / log).read_text()[-2000:] if (self.dir / log).exists() else ""
                raise RuntimeError(f"SLURM test cluster: {what}; {log}: {tail}")
            time.sleep(0.3)

    # ---- jobs ---------------------------------------------------------------------------------
    def run(self, *cmd: str, env: Optional[dict[str, str]] = None, **kw: object) -> subprocess.CompletedProcess:
        return subprocess.run(list(cmd), env={**self.env, **(env or {})}, capture_output=True, text=True,
                              timeout=60, **kw)  # type: ignore[call-overload]

    def job_field(self, job_id: str, field: str) -> Optional[str]:
        out = self.run("scontrol", "show", "job", "-o", job_id)
        for item in out.stdout.split():
            if item.startswith(field + "="):
                return item.split("=", 1)[1]
        return None

    def wait_job(self, job_id: str, timeout: float) -> str:
        """Wait until the job has ended; its final state (COMPLETED, FAILED, ...)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.job_field(job_id, "JobState")
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", None):
                return state or "GONE"
            time.sleep(1)
        raise TimeoutError(f"job {job_id} did not end within {timeout:.0f} s "
                           f"(state {self.job_field(job_id, 'JobState')})")

    # ---- teardown -----------------------------------------------------------------------------
    def close(self) -> None:
        if any(p.poll() is None for p in self.procs):
            subprocess.run(["scancel", "--full", "--user=root"], env=self.env, capture_output=True, timeout=30)
        # The daemons and every process of the jobs carry this cluster's SLURM_CONF (sbatch passes
        # the environment on); slurmstepd blanks its environment but keeps a file here open.
        doomed: list[psutil.Process] = []
        for p in psutil.process_iter(["environ", "name"]):
            try:
                if p.pid != os.getpid() and ((p.info["environ"] or {}).get("SLURM_CONF") == self.env["SLURM_CONF"]
                                             or self._uses_dir(p)):
                    doomed.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        for p in doomed:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(doomed, timeout=10)
        for proc in self.procs:
            proc.wait(timeout=10)

    def _uses_dir(self, p: psutil.Process) -> bool:
        if p.name() != "slurmstepd":
            return False
        here = str(self.dir)
        paths = [f.path for f in p.open_files()] + [str(c.laddr) for c in p.net_connections(kind="unix")]
        return any(path.startswith(here) for path in paths)
