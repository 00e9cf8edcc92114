"""The checkpoint directory format: manifests, integrity, pruning, resolving paths."""
from __future__ import annotations

from pathlib import Path

from engine.checkpoint import files as ckpt


def make(run: Path, step: int, files: dict[str, bytes], fixed: dict | None = None, manifest: bool = True) -> Path:
    path = ckpt.step_dir(run, step)
    digests = {name: ckpt.write_rank_file(path / name, data) for name, data in files.items()}
    if manifest:
        ckpt.write_manifest(path, step, 0, len(files), "allreduce", fixed or {"world_size": len(files)}, digests, {})
    return path


def test_only_directories_with_a_manifest_are_complete(tmp_path: Path) -> None:
    make(tmp_path, 10, {"rank_0.pt": b"a"})
    make(tmp_path, 20, {"rank_0.pt": b"b"}, manifest=False)  # crashed before the manifest
    assert [m.step for m in ckpt.complete_checkpoints(tmp_path)] == [10]


def test_verify_detects_a_changed_file(tmp_path: Path) -> None:
    path = make(tmp_path, 5, {"rank_0.pt": b"abc", "rank_1.pt": b"def"})
    m = ckpt.Manifest.read(path)
    assert m.verify_rank(0) and m.verify_rank(1)
    (path / "rank_1.pt").write_bytes(b"deF")
    assert not m.verify_rank(1) and not m.verify_rank(2)


def test_prune_keeps_last_n_and_best_and_newer_partials(tmp_path: Path) -> None:
    """A partial directory older than the newest complete checkpoint is a failed save (a full
    disk, a killed job): it goes. A newer one may be a save in progress: it stays."""
    for s in (1, 3, 4):
        make(tmp_path, s, {"rank_0.pt": bytes([s])})
    make(tmp_path, 2, {"rank_0.pt": b"x"}, manifest=False)  # a save that failed
    make(tmp_path, 5, {"rank_0.pt": b"x"}, manifest=False)  # being written right now
    ckpt.mark_best(tmp_path, 1, "test_acc", 0.9)
    removed = ckpt.prune(tmp_path, keep_last=2, keep_best=True)
    left = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert left == ["step_00000001", "step_00000003", "step_00000004", "step_00000005"]
    assert sorted(p.name for p in removed) == ["step_00000002"]


def test_compatibility_names_the_mismatch(tmp_path: Path) -> None:
    path = make(tmp_path, 3, {"rank_0.pt": b"a"}, fixed={"world_size": 4, "model": {"name": "small_cnn"}})
    m = ckpt.Manifest.read(path)
    assert ckpt.compatibility_problem(m, {"world_size": 4, "model": {"name": "small_cnn"}}) is None
    problem = ckpt.compatibility_problem(m, {"world_size": 2, "model": {"name": "small_cnn"}})
    assert "world_size=4" in problem and "world_size=2" in problem


def test_resolve_accepts_step_dir_run_dir_and_manifest(tmp_path: Path) -> None:
    make(tmp_path, 7, {"rank_0.pt": b"a"})
    make(tmp_path, 9, {"rank_0.pt": b"b"})
    assert ckpt.resolve_checkpoint(tmp_path).step == 9
    assert ckpt.resolve_checkpoint(ckpt.step_dir(tmp_path, 7)).step == 7
    assert ckpt.resolve_checkpoint(ckpt.step_dir(tmp_path, 7) / "manifest.json").step == 7
    assert ckpt.resolve_checkpoint(tmp_path / "nothing") is None
