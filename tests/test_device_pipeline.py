"""The device pipeline (`data.pipeline=device`): the same samples, shards and order as the
torchvision pipeline, padded crops and flips drawn per sample from (seed, epoch, index) and
batched on the device, exact resume, and the trainer on it (here on the CPU device; the GPU
run is among the `gpu` tests)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from data import DATASETS, DataRequest, build_data
from data.device_augment import DeviceAugment, crop_offsets, draw, mix64
from data.sampler import sample_seed, sample_seeds
from tests.support.datagen import cifar_label, read_identity, write_cifar
from tests.support.harness import compose, run_ranks
from tests.test_data_pipelines import _is_padded_crop

N_TRAIN, N_TEST, SHARDS, BATCH = 96, 24, 2, 8


def cfg_for(name: str, pipeline: str, root: str, *more: str) -> Any:
    return compose([f"data={name}", f"data.pipeline={pipeline}", f"paths.data_root={root}", "data.num_workers=0",
                    *more]).data


def streams(name: str, pipeline: str, root: str, shard: int, *more: str) -> Any:
    return build_data(cfg_for(name, pipeline, root, *more),
                      DataRequest(BATCH, 10, seed=5, shard=shard, num_shards=SHARDS, eval_shard=shard,
                                  eval_num_shards=SHARDS))


def collect(batches: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    xs, ys = [], []
    for x, y in batches:
        xs.append(x.clone())
        ys.append(y.clone())
    return xs, ys


@pytest.fixture(scope="module")
def cifar_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("data")
    write_cifar(root / "cifar10", "cifar10", N_TRAIN, N_TEST)
    return str(root)


def test_mixing_matches_uint64_splitmix() -> None:
    """The int64 arithmetic is splitmix64's finaliser on unsigned words, bit for bit."""
    words = [0, 1, 2**62 + 12345, 2**63 - 1, 987654321987654321]
    want = []
    for z in words:
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
        want.append(z ^ (z >> 31))
    got = mix64(torch.tensor(words, dtype=torch.int64)).tolist()
    assert [g % 2**64 for g in got] == want


def test_sample_seeds_are_sample_seed() -> None:
    idx = torch.tensor([0, 1, 17, 49_999])
    for seed, epoch in ((0, 0), (5, 3), (2**40, 7)):
        assert sample_seeds(seed, epoch, idx).tolist() == [sample_seed(seed, epoch, int(i)) for i in idx]


def test_crops_are_shifted_copies_and_flips_exact_mirrors() -> None:
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (512, 32, 32, 3), dtype=torch.uint8, generator=gen)
    seeds = sample_seeds(1, 0, torch.arange(512))
    out = DeviceAugment(size=32, pad=4, flip=True)(images, seeds)  # no normalisation: pixels as stored
    rows, cols, flips = crop_offsets(seeds, 32, 32, 4, True)
    padded = torch.nn.functional.pad(images, (0, 0, 4, 4, 4, 4))
    for i in range(512):
        window = padded[i, rows[i]:rows[i] + 32, cols[i]:cols[i] + 32]
        want = window.flip(1) if flips[i] else window
        assert torch.equal(out[i].permute(1, 2, 0), want), i
    assert set(rows.tolist()) == set(range(9)) == set(cols.tolist())  # every offset occurs
    assert abs(rows.float().mean().item() - 4) < 0.4 and abs(cols.float().mean().item() - 4) < 0.4
    assert 0.43 < flips.float().mean().item() < 0.57
    assert abs(torch.corrcoef(torch.stack([rows.float(), cols.float(), flips.float()]))).triu(1).max() < 0.15
    assert torch.equal(draw(seeds, 7, 9), draw(seeds.clone(), 7, 9))  # a pure function of the seed


def test_same_shards_order_and_labels_as_torchvision(cifar_root: str) -> None:
    mean, std = DATASETS.get("cifar10").mean, DATASETS.get("cifar10").std
    for shard in range(SHARDS):
        mine, ref = streams("cifar10", "device", cifar_root, shard), streams("cifar10", "torchvision", cifar_root, shard)
        assert mine[0].steps_per_epoch == ref[0].steps_per_epoch
        for epoch in (0, 1):
            (xs, ys), (rxs, rys) = collect(mine[0].batches(epoch)), collect(ref[0].batches(epoch))
            ids = [i for x in xs for i in read_identity(x, mean, std)]
            assert ids == [i for x in rxs for i in read_identity(x, mean, std)], (shard, epoch)
            assert torch.equal(torch.cat(ys), torch.cat(rys))
            assert [cifar_label(i, 10) for i in ids] == torch.cat(ys).tolist()
            assert all(_is_padded_crop(img, i, mean, std) for x in xs for img, i in zip(x, read_identity(x, mean, std)))
        (ex, ey), (rex, rey) = collect(mine[1].batches()), collect(ref[1].batches())
        assert all(torch.equal(a, b) for a, b in zip(ex, rex)) and torch.equal(torch.cat(ey), torch.cat(rey))


def test_unaugmented_cifar_and_digits_equal_torchvision_bit_for_bit(cifar_root: str) -> None:
    for name, more in (("cifar10", ["data.augment=false"]), ("digits", [])):
        mine, ref = streams(name, "device", cifar_root, 1, *more), streams(name, "torchvision", cifar_root, 1, *more)
        for part in ((lambda s: s[0].batches(1)), (lambda s: s[0].batches(1, 2)), (lambda s: s[1].batches())):
            (xs, ys), (rxs, rys) = collect(part(mine)), collect(part(ref))
            assert len(xs) == len(rxs) > 0
            assert all(torch.equal(a, b) for a, b in zip(xs, rxs)), name
            assert all(a.stride() == b.stride() for a, b in zip(xs, rxs)), name  # the usual layout too
            assert all(torch.equal(a, b) for a, b in zip(ys, rys)), name


def test_resume_is_exact_and_the_global_rng_untouched(cifar_root: str) -> None:
    train, _ = streams("cifar10", "device", cifar_root, 0)
    before = torch.get_rng_state()
    whole = collect(train.batches(3))[0]
    assert all(torch.equal(a, b) for a, b in zip(collect(train.batches(3, 4))[0], whole[4:]))
    assert not torch.equal(whole[0], collect(train.batches(4))[0][0])  # the next epoch differs
    assert torch.equal(torch.get_rng_state(), before)


def test_a_set_read_from_files_is_refused_in_one_line(tmp_path: Path) -> None:
    from core.errors import UserError

    with pytest.raises(UserError, match="data.pipeline=device .* data.name=imagenet .* use one of torchvision"):
        cfg_for("imagenet", "device", str(tmp_path))


def _trainer_runs(rank: int, world: int, root: str, tmp: str) -> dict[str, Any]:
    from tests.support.harness import train_in_rank
    from tests.test_resume_registry import algo_overrides, diff, resume_scenario

    final = f"checkpoints/step_{8:08d}/rank_{rank}.pt"
    digits = ["train.max_steps=8", "model.width=8", "train.eval_every_steps=4", "resume=null"]
    for p in ("torchvision", "device"):
        train_in_rank(rank, world, [f"data.pipeline={p}", *digits], f"{tmp}/digits_{p}")
    same = diff(torch.load(Path(tmp, "digits_torchvision", final), weights_only=True),
                torch.load(Path(tmp, "digits_device", final), weights_only=True))
    cifar = ["data=cifar10", "data.pipeline=device", f"paths.data_root={root}", "train.batch_size=4",
             "data.eval_batch_size=12", "model=resnet20", "model.width=4"]
    return {"digits": same, "resume": resume_scenario(rank, world, algo_overrides("allreduce") + cifar, f"{tmp}/c")}


def test_trainer_on_the_device_pipeline(cifar_root: str, tmp_path: Path) -> None:
    """digits: the torchvision run's model bit for bit; CIFAR with augmentation, stopped mid-epoch
    and resumed: the uninterrupted run's every checkpoint tensor."""
    for rank, res in enumerate(run_ranks(_trainer_runs, 2, cifar_root, str(tmp_path), timeout=400)):
        assert not res["digits"], f"rank {rank}: {res['digits'][:5]}"
        assert not res["resume"], f"rank {rank}: {res['resume'][:5]}"
