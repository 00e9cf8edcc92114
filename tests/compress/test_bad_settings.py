"""Bad compression settings on the command line: one line naming the value and the fix, exit code
2, before any rank is launched (as tests/test_cli.py checks for the other options)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli_runs import error_line, run_cli_here


@pytest.mark.parametrize("args,fragment", [
    (["algo=compressed", "algo.compress=[nosuch]"], "compress stage='nosuch'"),
    (["algo=compressed", "algo.compress=[topk:2]"], "density 2.0 must be in (0, 1]"),
    (["algo=compressed", "algo.compress=[qsgd,fp16]"], "only a sparsifier"),
    (["algo=compressed", "algo.feedback=ef3"], "algo.feedback"),
    (["algo=compressed", "algo.compress=[]"], "use algo=allreduce"),
    (["algo=diloco", "algo.outer_compress=[int8:0]"], "algo.outer_compress"),
    (["algo=diloco", "algo.overlap_steps=20"], "algo.overlap_steps=20 must be below algo.inner_steps=20"),
    (["algo=diloco", "algo.outer_feedback=ef"], "needs a chain in algo.outer_compress"),
    (["algo=local_sgd", "algo.compress=[topk:0.1]", "algo.bn=average"], "algo.bn=local"),
])
def test_bad_compression_is_one_line_before_launch(args: list[str], fragment: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_cli_here([*args, f"hydra.run.dir={run_dir}"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert fragment in error_line(proc)
    assert not (run_dir / "logs").exists(), "no rank may have been launched"
