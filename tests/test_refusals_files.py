"""What a user names on disk is checked before anything is launched or written, and the files a
resume reads back cannot crash it (issue 87): a folder that cannot be made (the run directory, a
table's store), and a checkpoint manifest, fault log, metrics log, stopped or best mark that is
cut short or edited by hand, each give one line naming the file or value and what is wrong."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.errors import UserError
from core.run_files import FaultLog, stopped_message
from core.rundir import RunDir
from dist_algos import get_algorithm
from engine.checkpoint import files
from engine.checkpoint.resume import init_source, resume_candidates
from engine.plan import resume_keys
from engine.report.metrics import MetricsLog
from tests.support.cli_runs import error_line, run_cli_here
from tests.support.datagen import write_cifar, write_imagefolder
from tests.support.harness import compose

#: a world of two CPU ranks, whatever the machine (the keys a checkpoint below is written with)
SMALL = ["launch.nproc=2", "dist.device=cpu"]


def refused(args: list[str]) -> str:
    """cli.py's one line for a command refused before anything starts (exit code 2)."""
    proc = run_cli_here(args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    return error_line(proc)


# ---- folders that cannot be made ------------------------------------------------------------------

@pytest.mark.parametrize("where", ["/proc/1/nonexistent/run", "FILE/run"])
def test_a_run_directory_that_cannot_be_made_is_one_line(where: str, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("a file, not a folder\n")
    run_dir = where.replace("FILE", str(tmp_path / "file"))
    line = refused([f"hydra.run.dir={run_dir}", "train.max_steps=1"])
    assert f"hydra.run.dir={run_dir}" in line and "give hydra.run.dir=PATH" in line, line
    assert not Path(run_dir).exists()


def test_a_table_store_that_cannot_be_made_is_one_line_and_nothing_is_written(tmp_path: Path) -> None:
    """The issue's `table.store=/proc/1/nonexistent/store` ended in a 53-line traceback."""
    out = tmp_path / "out"
    for store in ("/proc/1/nonexistent/store", str(tmp_path / "file" / "store")):
        (tmp_path / "file").write_text("a file, not a folder\n")
        line = refused(["table=head_to_head_cpu", f"table.store={store}", f"hydra.run.dir={out}"])
        assert f"table.store={store}" in line and "a folder this user can write" in line, line
        assert not out.exists() or not any(out.iterdir()), "nothing may be written in the table's folder"


# ---- the checkpoint a resume reads ----------------------------------------------------------------

def checkpoint(run_dir: Path, step: int, keys: dict) -> Path:
    """A sound manifest for `step` with the settings `keys` (no rank files: the plan does not read them)."""
    step_dir = files.step_dir(run_dir, step)
    step_dir.mkdir(parents=True)
    files.write_manifest(step_dir, step, 1, keys["world_size"], "allreduce", keys, {"rank_0.pt": "0" * 64}, {})
    return step_dir / "manifest.json"


def keys_of(overrides: list[str]) -> dict:
    config = compose(overrides)
    return resume_keys(config, config.launch.nproc, get_algorithm(config.algo.name))


def edit(manifest: Path, change: dict) -> None:
    raw = json.loads(manifest.read_text())
    raw.update(change)
    manifest.write_text(json.dumps(raw))


@pytest.mark.parametrize("damage, words", [
    (lambda m: m.write_text(m.read_text()[:40]), ["is not valid JSON", "cut short or edited"]),
    (lambda m: m.write_text("[1, 2]"), ["holds a JSON list"]),
    (lambda m: edit(m, {"step": "ten"}), ['step="ten" is not an integer']),
    (lambda m: edit(m, {"step": 4}), ["says step 4, but lies in step_00000005"]),
    (lambda m: edit(m, {"files": ["rank_0.pt"]}), ["files=", "is not a JSON object"]),
    (lambda m: edit(m, {"fixed": {"world_size": 8}}), ["edited by hand"]),
])
def test_a_damaged_manifest_is_named_with_what_is_wrong(damage, words: list[str], tmp_path: Path) -> None:
    """Such a manifest was once passed over in silence (resume=auto then took an older checkpoint,
    or none), or crashed the readers that trusted its fields."""
    run_dir = RunDir(tmp_path / "run")
    keys = {"world_size": 2, "model": {"name": "small_cnn"}}
    checkpoint(run_dir.root, 3, keys)
    manifest = checkpoint(run_dir.root, 5, keys)
    damage(manifest)
    for resume in ("auto", str(manifest.parent), str(run_dir.root)):
        with pytest.raises(UserError) as err:
            resume_candidates(resume, run_dir, keys)
        line = str(err.value)
        assert str(manifest) in line and all(w in line for w in words) and "\n" not in line, line
    with pytest.raises(UserError, match="init_from="):
        init_source(str(manifest.parent))
    assert [m.step for m in files.complete_checkpoints(run_dir)] == [3], "a damaged checkpoint is not complete"
    assert [m.step for m in resume_candidates(str(files.step_dir(run_dir, 3)), run_dir, keys)] == [3], \
        "an older checkpoint given by path does not care about a newer one"


def test_a_truncated_manifest_in_the_run_directory_refuses_the_resume_before_launch(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    manifest = checkpoint(run_dir, 5, keys_of(SMALL))
    manifest.write_text(manifest.read_text()[:40])
    line = refused([*SMALL, f"hydra.run.dir={run_dir}"])
    assert f"resume=auto: {manifest} is not valid JSON" in line, line
    assert not (run_dir / "logs").exists(), "no rank may have been launched"


# ---- the fault log, metrics, stopped and best marks -----------------------------------------------

def test_a_hand_edited_fault_log_is_one_line_naming_the_line_before_a_resume_launches(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    checkpoint(run_dir, 5, keys_of(SMALL))
    log = FaultLog(run_dir)
    log.append({"event": "attempt", "attempt": 0, "restart": False})
    with open(log.path, "a") as fh:
        fh.write('{"event": "kill", "rank": 1, "st')  # cut short by a kill: no event, no error
        fh.write('\n{"event": "failure", "attempt": "first", "time": 1.0}\n')  # edited by hand
    line = refused([*SMALL, f"hydra.run.dir={run_dir}"])
    assert f"{log.path}, line 3: attempt=\"first\" is not a whole number" in line, line
    assert not (run_dir / "logs" / "rank_0.pid").exists(), "no rank may have been launched"


@pytest.mark.parametrize("line, words", [("[1, 2]", "a JSON list"), ('{"attempt": 0, "time": 1}', "no event name"),
                                         ('{"event": "kill", "time": "noon"}', 'time="noon" is not a number')])
def test_a_fault_log_line_that_is_no_event_is_named(line: str, words: str, tmp_path: Path) -> None:
    log = FaultLog(tmp_path)
    log.path.parent.mkdir(parents=True)
    log.path.write_text('{"event": "attempt", "attempt": 0, "time": 1.0}\n' + line + "\n")
    with pytest.raises(UserError, match="line 2: " + words.replace("[", r"\[")):
        log.events()


def test_a_metrics_log_cut_short_resumes_without_its_broken_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind": "train", "step": 4}\n[1, 2]\n{"kind": "train", "step": "x"}\n{"kind": "train", "step": 6}\n'
                    '{"kind": "train", "st')
    MetricsLog(path, resume_step=5).close()
    assert path.read_text() == '{"kind": "train", "step": 4}\n'


def test_unreadable_stopped_and_best_marks_are_no_crash(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    run_dir.stopped.write_text('{"reason": "sig')
    assert "unreadable" in (stopped_message(run_dir) or "")
    run_dir.checkpoints.mkdir()
    run_dir.best.write_text("[3]")
    assert files.best_step(run_dir) is None


# ---- a set's declared sizes -----------------------------------------------------------------------

def test_classes_per_worker_is_refused_in_the_plan_from_a_sets_declared_classes(tmp_path: Path) -> None:
    """CIFAR's labels are read only by the ranks (150 MB): its declared class sizes decide the plan;
    an ImageFolder set declares its classes only (ImageNet's 1,000)."""
    write_cifar(tmp_path / "cifar")
    write_imagefolder(tmp_path / "imagenet")
    for data, classes in ((["data=cifar10", f"data.root={tmp_path / 'cifar'}"], 10),
                          (["data=imagenet", f"data.root={tmp_path / 'imagenet'}", "model=resnet18"], 1000)):
        line = refused([*data, "data.partition=classes", f"data.classes_per_worker={classes + 1}", *SMALL,
                        f"hydra.run.dir={tmp_path / 'run'}"])
        assert f"data.classes_per_worker={classes + 1} is more than the {classes} classes" in line, line
