"""Running cli.py from a test: as a new process (`run_cli`, what a user's shell does) or inside
the test's own interpreter (`run_cli_here`), for input that must be refused before anything is
launched.

A refusal is decided by the composition, the schema checks and the plan, all in cli.py's own
process; starting a new interpreter for each of the hundred-odd refusals the suite checks costs
3 s of imports apiece (5 on CI's machine) and tests nothing more. `run_cli_here` executes cli.py
as `__main__` (runpy: its `if __name__ == "__main__"` block included, so the one-line reporting
of Hydra's and OmegaConf's errors is the one a user gets) with the arguments in sys.argv, and
returns what `subprocess.run` would: the exit code, stdout and stderr. The tests that check a
real process's exit code and output stay on `run_cli`.
"""
from __future__ import annotations

import contextlib
import io
import os
import runpy
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.support.processes import wait_for

REPO = Path(__file__).resolve().parents[2]
CLI = str(REPO / "cli.py")


def run_cli(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    """cli.py as a new process, as a user runs it."""
    return subprocess.run([sys.executable, CLI, *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=REPO)


def start_cli(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    """cli.py as a new process left running (pipes for its output), for a test that signals,
    kills or watches it."""
    return subprocess.Popen([sys.executable, CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=REPO)


def signal_cli_when(args: list[str], env: dict[str, str], ready: Callable[[], object], what: str, sig: int,
                    timeout: float = 240) -> tuple[int, str]:
    """Start cli.py, send it `sig` once `ready()` holds (`what`, named if it never does), and
    return its exit code and stderr once it ends; it is killed if the test fails first. A cli.py
    that ends before `ready()` ends the wait at once, so the caller's assertions show its stderr."""
    proc = start_cli(args, env)
    try:
        wait_for(lambda: ready() or proc.poll() is not None, timeout, what)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return proc.returncode, stderr


def run_cli_here(args: list[str]) -> subprocess.CompletedProcess:
    """cli.py run in this interpreter, for a command that must end before launching anything.
    Hydra's full errors are on, as cli.py sets them when a user runs it; a command that (wrongly)
    launches would still run to its end here, and its exit code would fail the test."""
    out, err = io.StringIO(), io.StringIO()
    saved_argv, saved_full = sys.argv, os.environ.get("HYDRA_FULL_ERROR")
    os.environ.pop("HYDRA_FULL_ERROR", None)  # cli.py sets it for itself, as in a user's shell
    sys.argv = [CLI, *args]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(CLI, run_name="__main__")
    except SystemExit as ended:
        code = ended.code if isinstance(ended.code, int) else (0 if ended.code is None else 1)
    finally:
        sys.argv = saved_argv
        if saved_full is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = saved_full
    return subprocess.CompletedProcess([CLI, *args], code, out.getvalue(), err.getvalue())


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one `syncopt: error:` line of a refused command (and no traceback)."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("syncopt: error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]
