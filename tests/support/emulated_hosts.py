"""Emulated hosts for the multi-node tests: Linux network namespaces joined by a veth pair.

Each host is a network namespace with its own address on an interface named `synet0` (the same
name on every host, so one GLOO_SOCKET_IFNAME fits all), plus its own loopback. The hosts share
this machine's filesystem (the "shared storage" of docs/multinode.md), its process table and its
hostname: gloo would resolve that hostname to 127.0.0.1, hence GLOO_SOCKET_IFNAME. Traffic stays
inside the namespaces. `start_sshd` runs an sshd inside a host with throw-away keys, and
`ssh_env` gives the client side to pdsh (PDSH_SSH_ARGS_APPEND) and to syncopt's checks.

Everything made here is removed by `close()`, which the fixtures call even when a test fails.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

IFNAME = "synet0"


def namespaces_usable() -> Optional[str]:
    """None when network namespaces can be made here, else the reason (for pytest.skip)."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces (ip netns add)"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` (scripts/setup_env.sh --test installs it)"
    name = f"syncopt-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode:
        return f"this machine forbids network namespaces ({made.stderr.strip()})"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


class EmulatedHosts:
    """Two hosts, `addresses[0]` and `addresses[1]`, in namespaces `names[0]` and `names[1]`."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        tag = f"{os.getpid() % 100000}"
        self.names = [f"syncopt-{tag}-a", f"syncopt-{tag}-b"]
        subnet = f"10.{random.randint(200, 250)}.{random.randint(0, 255)}"
        self.addresses = [f"{subnet}.1", f"{subnet}.2"]
        self.procs: list[subprocess.Popen] = []
        self.ssh_dir: Optional[Path] = None
        try:
            self._make(tag)
        except BaseException:
            self.close()
            raise

    def _make(self, tag: str) -> None:
        veth = [f"syv{tag}a", f"syv{tag}b"]
        for name in self.names:
            _run("ip", "netns", "add", name)
        _run("ip", "link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
        for name, dev, addr in zip(self.names, veth, self.addresses):
            _run("ip", "link", "set", dev, "netns", name)
            _run("ip", "-n", name, "link", "set", dev, "name", IFNAME)
            _run("ip", "-n", name, "addr", "add", f"{addr}/24", "dev", IFNAME)
            _run("ip", "-n", name, "link", "set", IFNAME, "up")
            _run("ip", "-n", name, "link", "set", "lo", "up")

    def prefix(self, host: int) -> list[str]:
        """The command prefix that runs a program on `host`."""
        return ["ip", "netns", "exec", self.names[host]]

    def popen(self, host: int, cmd: list[str], **kwargs: object) -> subprocess.Popen:
        proc = subprocess.Popen(self.prefix(host) + cmd, start_new_session=True, **kwargs)  # type: ignore[call-overload]
        self.procs.append(proc)
        return proc

    # ---- ssh ----------------------------------------------------------------------------------
    def start_sshd(self) -> dict[str, str]:
        """An sshd on port 22 of every host, keys in tmp; returns the client environment."""
        d = self.tmp / "ssh"
        d.mkdir(exist_ok=True)
        self.ssh_dir = d
        for key in ("host_key", "client_key"):
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key))
        shutil.copy(d / "client_key.pub", d / "authorized_keys")
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
        for host, addr in enumerate(self.addresses):
            conf = d / f"sshd_{host}.conf"
            conf.write_text(f"Port 22\nListenAddress {addr}\nHostKey {d / 'host_key'}\n"
                            f"PidFile {d / f'sshd_{host}.pid'}\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
                            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                            "LogLevel ERROR\n")
            self.popen(host, ["/usr/sbin/sshd", "-D", "-e", "-f", str(conf)],
                       stdout=subprocess.DEVNULL, stderr=open(d / f"sshd_{host}.log", "w"))
        client = d / "ssh_config"
        client.write_text(f"Host *\n  IdentityFile {d / 'client_key'}\n  IdentitiesOnly yes\n"
                          f"  StrictHostKeyChecking no\n  UserKnownHostsFile {d / 'known_hosts'}\n"
                          "  LogLevel ERROR\n")
        env = {"PDSH_SSH_ARGS_APPEND": f"-F {client}"}
        self._wait_for_ssh(env)
        return env

    def _wait_for_ssh(self, env: dict[str, str], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        for addr in self.addresses:
            while True:
                ok = subprocess.run(self.prefix(0) + ["ssh", "-F", env["PDSH_SSH_ARGS_APPEND"].split()[1],
                                                      "-o", "BatchMode=yes", addr, "true"],
                                    capture_output=True, timeout=30)
                if ok.returncode == 0:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd on {addr} did not come up: {ok.stderr.decode().strip()}")
                time.sleep(0.3)

    # ---- teardown -----------------------------------------------------------------------------
    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=10)
        for name in self.names:
            # anything still running in the namespace (ranks started over ssh, sshd's children)
            pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
