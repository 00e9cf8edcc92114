"""How much of the hardware a run uses: images per second per GPU and model FLOPs utilisation.

MFU is the model's training FLOPs per sample (counted once, `models.flops`) times the samples
per second one GPU processed, over that GPU's peak. Peaks come from the small table below, by
the name CUDA reports, for the precision the run computes in: dense bf16/fp16 tensor-core rates
for bf16 and fp16, TF32 rates for fp32 (what cuDNN's convolutions use by default); an unknown
GPU, or the CPU, has no peak here and its MFU is None rather than a guess.
"""
from __future__ import annotations

from typing import Any, Optional

#: (substring of torch.cuda.get_device_name(), dense bf16/fp16 FLOP/s, dense TF32 FLOP/s), most
#: specific first ("H100 PCIe" before "H100", "A100" before "A10", "L40S" before "L4")
PEAKS: tuple[tuple[str, float, float], ...] = (
    ("H100 PCIe", 756e12, 378e12),
    ("H100 NVL", 835e12, 418e12),
    ("H100", 989e12, 495e12),  # SXM (the name reports the memory, e.g. "H100 80GB HBM3")
    ("H200", 989e12, 495e12),
    ("GH200", 989e12, 495e12),
    ("A100", 312e12, 156e12),
    ("L40S", 362e12, 183e12),
    ("L4", 121e12, 60e12),
    ("A10", 125e12, 62.5e12),
    ("V100", 125e12, 15.7e12),  # no TF32: fp32 is its CUDA-core rate
)


def peak_flops(device_name: Optional[str], precision: str) -> Optional[float]:
    """The device's peak FLOP/s at `precision` (fp32, bf16, fp16); None when unknown (the CPU)."""
    if not device_name:
        return None
    for key, half, tf32 in PEAKS:
        if key in device_name:
            return half if precision in ("bf16", "fp16") else tf32
    return None


def utilisation(samples_per_s: float, num_gpus: int, flops_per_sample: Optional[float],
                peak: Optional[float]) -> dict[str, Any]:
    """{samples_per_s_per_gpu, mfu}: None where there is no GPU, or no FLOP count or peak."""
    if num_gpus < 1:
        return {"samples_per_s_per_gpu": None, "mfu": None}
    per_gpu = samples_per_s / num_gpus
    mfu = per_gpu * flops_per_sample / peak if flops_per_sample and peak else None
    return {"samples_per_s_per_gpu": per_gpu, "mfu": mfu}
