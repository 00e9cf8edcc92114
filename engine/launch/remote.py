"""What the launching machine does over ssh for a pdsh launch, and what it hands to every node.

Before DeepSpeed's runner starts pdsh, every host of the hostfile is asked, in parallel, over the
same ssh that pdsh will use (BatchMode, `launch.ssh_port`, the user's `PDSH_SSH_ARGS_APPEND`):
is it reachable without a password, does it have this Python (the `.venv` must sit at the same
path everywhere), does it see the run directory (a token this process just wrote there), how
many cores it has (for the OMP thread split), and, on the first host, whether the master port is
free. Each failure is one line naming the host, instead of a pdsh error per rank after launch.

The environment that must reach the ranks (OMP/NCCL/GLOO settings, ...) goes through DeepSpeed's
own mechanism: a `.deepspeed_env` file whose lines become `export` statements in the pdsh
command. We write one into the run directory (merging the user's `~/.deepspeed_env` and
`./.deepspeed_env`, which DeepSpeed would otherwise read) and point DS_ENV_FILE at it.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from core.errors import UserError
from core.rundir import RunDir

SSH_TIMEOUT_S = 30

# Runs on every host with the launching host's Python; prints one JSON line.
_PROBE = r"""
import json, os, socket, sys
record, token, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    with open(record) as fh:
        shared = json.load(fh).get("token") == token
except (OSError, ValueError):
    shared = False
port_free, free = None, None
if port >= 0:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("", port))
        port_free, free = True, s.getsockname()[1]
    except OSError:
        port_free = False
    finally:
        s.close()
print(json.dumps({"hostname": socket.gethostname(), "cpus": len(os.sched_getaffinity(0)),
                  "shared": shared, "port_free": port_free, "free_port": free}))
"""


def ssh_command(host: str, ssh_port: Optional[int] = None) -> list[str]:
    """ssh to `host` as pdsh will: no password prompt, the given port, PDSH_SSH_ARGS_APPEND."""
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
    if ssh_port is not None:
        cmd += ["-p", str(ssh_port)]
    cmd += shlex.split(os.environ.get("PDSH_SSH_ARGS_APPEND", ""))
    return cmd + [host]


@dataclass
class HostReport:
    host: str  # as in the hostfile
    hostname: str  # what the host calls itself
    cpus: int
    shared: bool  # sees the run directory this process sees
    port_free: Optional[bool]  # the master port (first host only)
    free_port: Optional[int]


def _probe_one(host: str, python: str, run_dir: RunDir, token: str, port: int,
               ssh_port: Optional[int]) -> HostReport | str:
    """The host's report, or one line saying what is wrong with it."""
    remote = shlex.join([python, "-c", _PROBE, str(run_dir.launch_record), token, str(port)])
    try:
        out = subprocess.run(ssh_command(host, ssh_port) + [remote], capture_output=True, text=True,
                             timeout=SSH_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"host {host} did not answer over ssh within {SSH_TIMEOUT_S} s"
    err = (out.stderr.strip().splitlines() or [""])[-1]
    if out.returncode == 255:
        return (f"host {host} is not reachable over passwordless ssh ({err or 'ssh failed'}); "
                f"check `ssh {host} hostname`, or start every node yourself with launch.no_ssh=true")
    if out.returncode == 127 or "No such file" in err:
        return (f"host {host} has no {python}: the .venv must be at the same path on every node "
                "(shared storage, or the same install)")
    try:
        raw = json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return f"host {host}: the pre-launch check failed (exit {out.returncode}): {err}"
    return HostReport(host, raw["hostname"], int(raw["cpus"]), bool(raw["shared"]),
                      raw["port_free"], raw["free_port"])


def probe_hosts(hosts: list[str], python: str, run_dir: RunDir | Path, token: str, master_port: Optional[int],
                ssh_port: Optional[int] = None) -> list[HostReport]:
    """Check every host before launching (see the module doc); `UserError` for the first problem.

    The first host runs rank 0 and so the master's TCP store: it is asked whether `master_port`
    is free, or (None) for a free port.
    """
    run_dir = RunDir.of(run_dir)
    client = ssh_command(hosts[0], ssh_port)[0]
    if shutil.which(client) is None:  # (found on a GPU machine without one: a traceback per host, exit 1)
        raise UserError(f"launch.hostfile needs an ssh client ({client}) on PATH to reach the other nodes: "
                        "install one (apt-get install openssh-client), or start every node yourself with "
                        "launch.no_ssh=true")
    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        futures = [pool.submit(_probe_one, h, python, run_dir, token,
                               (master_port or 0) if i == 0 else -1, ssh_port)
                   for i, h in enumerate(hosts)]
        reports = [f.result() for f in futures]
    for report in reports:
        if isinstance(report, str):
            raise UserError(report)
    for report in reports:
        if not report.shared:
            raise UserError(f"host {report.host} does not see the run directory {run_dir.root} as this machine "
                            "does: it must be on storage every node shares (NFS, Lustre, ...); see docs/multinode.md")
    first = reports[0]
    if master_port is not None and first.port_free is False:
        raise UserError(f"launch.master_port={master_port} is in use on host {first.host} (rank 0's node); "
                        "pick another port or leave it null")
    return reports


def catches(pid: int, sig: int) -> Optional[bool]:
    """Whether process `pid` has a handler for `sig` (None: it is gone). A rank installs its stop
    handler only once set up; the default action of SIGUSR1 would kill it before that."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            line = next(ln for ln in fh if ln.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return None
    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)


# Runs on another host: signal each pid once it catches the signal (or is gone); gives up after 10 min.
_SIGNAL_WHEN_READY = r"""
import os, signal, sys, time
sig, pids = getattr(signal, "SIG" + sys.argv[1]), [int(p) for p in sys.argv[2:]]
def catches(pid):
    try:
        with open("/proc/%d/status" % pid) as fh:
            line = next(ln for ln in fh if ln.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return None
    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
deadline = time.time() + 600
for pid in pids:
    while catches(pid) is False and time.time() < deadline:
        time.sleep(0.2)
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
"""


def signal_remote(host: str, python: str, pids: list[int], signame: str, ssh_port: Optional[int]) -> None:
    """Signal processes on another host once they catch the signal; does not wait for ssh."""
    if pids:
        remote = shlex.join([python, "-c", _SIGNAL_WHEN_READY, signame, *map(str, pids)])
        subprocess.Popen(ssh_command(host, ssh_port) + [remote], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


# ---- the environment every node gets --------------------------------------------------------

_SAFE = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-")


def _quote_for_deepspeed(value: str) -> str:
    """DeepSpeed wraps a value with other characters in double quotes without escaping; escape
    what double quotes would still interpret, so the remote shell sees the value literally."""
    if set(value) <= _SAFE:
        return value
    return "".join("\\" + c if c in '\\"$`' else c for c in value)


def _read_env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return values
    for line in lines:
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    return values


def exported_env(env: dict[str, str], names: list[str]) -> dict[str, str]:
    """The variables of `env` whose name is in `names`, or starts with one ending in '_'."""
    def wanted(var: str) -> bool:
        return any(var == n or (n.endswith("_") and var.startswith(n)) for n in names)

    return {k: v for k, v in env.items() if wanted(k) and "\n" not in v}


def write_deepspeed_env(path: Path, env: dict[str, str], names: list[str]) -> dict[str, str]:
    """Write the DS_ENV_FILE for a pdsh launch; returns what it exports.

    The user's `~/.deepspeed_env` and `./.deepspeed_env` (what DeepSpeed reads when DS_ENV_FILE
    is unset) come last and win: they are deliberate cluster settings.
    """
    values = {k: _quote_for_deepspeed(v) for k, v in exported_env(env, names).items()}
    for user_file in (Path.home() / ".deepspeed_env", Path.cwd() / ".deepspeed_env"):
        values.update(_read_env_file(user_file))
    path.parent.mkdir(parents=True, exist_ok=True)
    # DeepSpeed splits every line at '=': no blank or comment lines.
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return values
