"""What the launching process pays before the ranks start (bench/startup.py measures it).

preflight's model check (`models.check_buildable`) ran every model on the meta device, where the
first convolution's shape check imports torch's symbolic shapes (SymPy) and BatchNorm's
decomposition imports torch._dynamo: seconds of the default job's start, serial before the
launch, for an 8x8 CNN a real CPU pass checks in milliseconds. And the model registry imports
models/flops.py, whose FLOP counter brought Triton into every process, for an MFU only GPU runs
report. A fresh interpreter checks the default model and must have imported none of them."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.support.harness import REPO

_CHILD = """
import json, sys
import torch
from core.spec import ImageSpec
from models import check_buildable, MODELS
MODELS.get("small_cnn")  # the registry imports every model module, models/flops.py included
before = torch.get_rng_state()
check_buildable({"name": "small_cnn"}, ImageSpec(in_channels=1, image_size=8, num_classes=10))
heavy = [m for m in ("torch._dynamo", "sympy", "triton", "torch.utils.flop_counter") if m in sys.modules]
print(json.dumps({"heavy": heavy, "rng_kept": bool(torch.equal(before, torch.get_rng_state()))}))
"""


def test_the_default_model_is_checked_without_torch_compilers_or_the_flop_counter() -> None:
    proc = subprocess.run([sys.executable, "-c", _CHILD], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got == {"heavy": [], "rng_kept": True}, got
