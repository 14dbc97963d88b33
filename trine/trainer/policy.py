"""Making the policy trainable at scale: LoRA, gradient checkpointing, FSDP2, the reference model.

:func:`prepare_policy` applies the ``trainer:`` settings to a loaded Hugging Face model, in the order
they compose: LoRA adapters first (``peft`` injects them into the model's linear layers), then
gradient checkpointing, then FSDP2 (``fully_shard`` on every decoder layer and on the root, so a
layer's parameters are gathered only while it runs). :func:`reference_model` gives the frozen
reference the KL / DPO losses score against: the policy with its adapters switched off under LoRA (no
second copy of the weights), else a frozen copy, optionally kept in CPU memory between uses.

Mixed precision is not a model transformation: the trainer runs its forwards under
``torch.autocast(bfloat16)`` (:meth:`trine.trainer.Trainer.autocast`) with float32 weights.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn


def prepare_policy(
    model: nn.Module,
    *,
    lora: dict[str, Any] | None = None,
    gradient_checkpointing: bool = False,
    fsdp: bool = False,
    adapter_dir: str | None = None,
    seed: int = 0,
) -> nn.Module:
    """The model the trainer optimises. ``lora``: the ``trainer.lora`` settings (rank, alpha, dropout,
    target_modules), new adapters initialised from ``seed`` (the global RNG is left as it was);
    ``adapter_dir``: resume the adapter saved there instead of starting a new one."""
    if lora is not None:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = _with_lora(model, lora, adapter_dir)
    if gradient_checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", True):
            raise ValueError(
                f"trainer.gradient_checkpointing: {type(model).__name__} does not support gradient "
                "checkpointing; set it to false"
            )
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if lora is not None:
            model.enable_input_require_grads()  # frozen embeddings: checkpointed layers still need grads
    if fsdp and not any(hasattr(p, "full_tensor") for p in model.parameters()):  # not sharded yet
        shard(model)
    return model


def _with_lora(model: nn.Module, settings: dict[str, Any], adapter_dir: str | None) -> nn.Module:
    try:
        import peft
    except ImportError as err:
        raise ImportError(
            'trainer.lora needs the peft package: pip install -e ".[lora]" (or remove trainer.lora)'
        ) from err
    earlier = getattr(model, "trine_peft", None)
    if earlier is not None:  # an earlier stage of the run put adapters on this model: train them on
        return earlier
    if adapter_dir is not None:
        wrapped = peft.PeftModel.from_pretrained(model, adapter_dir, is_trainable=True)
        _remember(model, wrapped)
        return wrapped
    config = peft.LoraConfig(
        task_type="CAUSAL_LM",
        r=settings["rank"],
        lora_alpha=settings["alpha"],
        lora_dropout=settings["dropout"],
        target_modules=settings["target_modules"],
    )
    wrapped = peft.get_peft_model(model, config)
    _remember(model, wrapped)
    return wrapped


def _remember(model: nn.Module, wrapped: nn.Module) -> None:
    """Keep the ``PeftModel`` on the base model for a later stage (a plain attribute: registering it as a
    submodule would make the module tree a cycle)."""
    model.__dict__["trine_peft"] = wrapped


def shard(model: nn.Module) -> None:
    """FSDP2: ``fully_shard`` each decoder layer, then the root, over a 1-D mesh of the process group
    (started here as a one-process group when none exists)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = next(model.parameters()).device
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    layers = _decoder_layers(model)
    if not layers:
        raise ValueError(
            f"trainer.fsdp: found no decoder layers in {type(model).__name__} (looked for a ModuleList of "
            "layers, e.g. model.layers); set trainer.fsdp: false"
        )
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks: the longest ``nn.ModuleList`` in the model (``model.layers`` in HF
    decoder-only models)."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AdapterDisabled(nn.Module):
    """The reference model of a LoRA policy: the same module with its adapters switched off, so the
    base weights score the batch (nothing is copied)."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self._policy = [policy]  # a list: not a registered submodule (its parameters are not ours)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        policy = self._policy[0]
        with torch.no_grad(), policy.disable_adapter():
            return policy(*args, **kwargs)

    def get_base_model(self) -> nn.Module:
        """The Hugging Face model under the adapters (its config and forward's keywords), like PEFT's."""
        return self._policy[0].get_base_model()

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:  # type: ignore[override]
        return self._policy[0].parameters(recurse)


class Offloaded(nn.Module):
    """A frozen model kept on the CPU, moved to ``device`` while it runs (:meth:`on_device`) — the
    reference model of ``trainer.ref_offload``. The trainer moves it once per step, not per batch."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        super().__init__()
        self.model = model.to("cpu")
        self.device = torch.device(device)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.on_device():
            return self.model(*args, **kwargs)

    def get_base_model(self) -> nn.Module:
        """The wrapped Hugging Face model (its config and forward's keywords), like PEFT's."""
        return self.model

    @contextlib.contextmanager
    def on_device(self) -> Iterator[None]:
        """Inside the block the model is on the trainer's device (re-entrant: nested blocks move once)."""
        if next(self.model.parameters()).device == self.device:
            yield
            return
        self.model.to(self.device)
        try:
            yield
        finally:
            self.model.to("cpu")

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:  # type: ignore[override]
        # callers read the device the inputs go to from the first parameter: the trainer's device
        for p in self.model.parameters(recurse):
            yield p.to(self.device) if p.device != self.device else p


def reference_model(
    policy: nn.Module, frozen_copy: Callable[[nn.Module], nn.Module], *, lora: bool, offload: bool
) -> nn.Module:
    """The frozen reference: the policy with adapters disabled (LoRA), else ``frozen_copy(policy)``,
    kept on the CPU between uses when ``offload``."""
    if lora:
        return AdapterDisabled(policy)
    ref = frozen_copy(policy)
    if offload:
        return Offloaded(ref, next(policy.parameters()).device)
    return ref


def own_weights(ref: nn.Module | None) -> nn.Module | None:
    """The module holding a reference model's own weights (checkpointed and restored with the run):
    the wrapped model of :class:`Offloaded`, None for :class:`AdapterDisabled` (its weights are the
    policy's base, saved with the policy), the model itself otherwise."""
    if ref is None or isinstance(ref, AdapterDisabled):
        return None
    return ref.model if isinstance(ref, Offloaded) else ref
