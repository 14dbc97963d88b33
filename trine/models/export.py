"""What a trained policy hands to the rest of the world: plain Hugging Face weights.

The trainer's model may be wrapped for training — LoRA adapters injected by ``peft``, parameters
sharded by FSDP2 into ``DTensor`` shards — but every consumer of its weights (a rollout engine's
``load_weights``, the published checkpoint directory, the collective broadcast, ``trine serve``, vLLM)
expects the base architecture's own parameter names and full tensors.
:func:`rollout_state_dict` is the one conversion: LoRA merged (``W + (α / r) B A``, computed, not
merged in place, so the adapter's training is undisturbed), shards gathered, adapter tensors dropped.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from torch import Tensor, nn


def has_lora(model: nn.Module) -> bool:
    """Whether ``model`` (a ``PeftModel`` or the base model it injected adapters into) has LoRA layers."""
    return any(hasattr(m, "lora_A") and hasattr(m, "base_layer") for m in model.modules())


def base_model(model: nn.Module) -> nn.Module:
    """The architecture's own module: ``PeftModel.get_base_model()``, else ``model`` itself."""
    getter = getattr(model, "get_base_model", None)
    return getter() if callable(getter) else model


def full_tensor(value: Tensor) -> Tensor:
    """A whole tensor from a ``DTensor`` shard (FSDP2), anything else unchanged."""
    gather = getattr(value, "full_tensor", None)
    return gather() if callable(gather) else value


def rollout_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The weights a rollout engine loads, under the base architecture's parameter names: LoRA merged,
    FSDP2 shards gathered, detached (they share storage with the model where nothing was computed)."""
    base = base_model(model)
    adapters = {
        name: m for name, m in base.named_modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")
    }
    out: dict[str, Tensor] = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key or ".lora_magnitude" in key:
            continue
        value = full_tensor(value).detach()
        if ".base_layer." in key:
            owner, _, name = key.rpartition(".base_layer.")
            key = f"{owner}.{name}"
            layer = adapters.get(owner)
            if name == "weight" and layer is not None and not getattr(layer, "disable_adapters", False):
                for adapter in layer.active_adapters:
                    if adapter in layer.lora_A:
                        value = value + full_tensor(layer.get_delta_weight(adapter)).detach().to(value.dtype)
        out[key] = value
    return out


def plain_copy(model: nn.Module) -> nn.Module:
    """A frozen copy of the policy in its base architecture (LoRA merged, shards gathered): what a
    rollout engine that samples a snapshot holds, so later :func:`rollout_state_dict` pushes fit it."""
    if not has_lora(model) and not any(hasattr(p, "full_tensor") for p in model.parameters()):
        copied = copy.deepcopy(model)
    else:
        base = base_model(model)
        state = rollout_state_dict(model)
        copied = type(base)(base.config)
        copied.load_state_dict(state)
        copied.to(next(iter(state.values())).device)
    copied.eval()
    copied.requires_grad_(False)
    return copied


def save_model(model: nn.Module, directory: str | Path) -> None:
    """Save the policy as a plain Hugging Face model directory (merged weights); a LoRA policy also
    saves its adapter in ``peft`` format under ``<directory>/adapter`` (the base is ``model.path``)."""
    directory = Path(directory)
    base = base_model(model)
    if not has_lora(model) and not any(hasattr(p, "full_tensor") for p in model.parameters()):
        base.save_pretrained(directory)
        return
    plain = rollout_state_dict(model)
    _plain_save(base, directory, plain)
    if has_lora(model) and hasattr(model, "peft_config"):
        model.save_pretrained(directory / "adapter")


def _plain_save(base: nn.Module, directory: Path, state: dict[str, Tensor]) -> None:
    """``save_pretrained`` of the base architecture with ``state`` as its weights."""
    holder: Any = type(base)(base.config)
    holder.load_state_dict({k: v.cpu() for k, v in state.items()})
    holder.save_pretrained(directory)
