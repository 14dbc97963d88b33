"""What ``model.device: auto`` and ``model.dtype: auto`` become on this machine: the one statement of the
two rules, read by the config's checks (``trainer.precision: bf16`` needs float32 weights) and by
:mod:`trine.models.loading`, which turns the names into torch objects.

torch is imported inside the functions, and only for ``auto``: ``trine validate`` on a config that
names its device and dtype imports nothing heavy.
"""

from __future__ import annotations


def resolve_device(device: str = "cpu") -> str:
    """``"auto"`` becomes ``"cuda"`` when a GPU is visible, else ``"cpu"``; anything else is kept."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def auto_dtype(device: str | None = None) -> str:
    """The dtype name ``"auto"`` stands for: ``"bfloat16"`` on a CUDA device that supports it, else
    ``"float32"`` (CPU). ``device=None`` asks whether CUDA is available at all."""
    import torch

    on_cuda = torch.cuda.is_available() and (device is None or str(device).startswith("cuda"))
    return "bfloat16" if on_cuda and torch.cuda.is_bf16_supported() else "float32"


def loaded_dtype(dtype: str, device: str) -> str:
    """The dtype name the weights of ``model.dtype`` = ``dtype`` load as on ``model.device`` = ``device``."""
    return auto_dtype(resolve_device(device)) if dtype == "auto" else dtype
