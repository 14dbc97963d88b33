"""The update step (micro-batching, accumulation, optimizer) and checkpoints."""

from trine.models.batching import MicroBatch, collate, forward_logprobs, plan_micro_batches
from trine.trainer.checkpoint import list_checkpoints, load_states, save_checkpoint
from trine.trainer.trainer import Trainer, lr_lambda

__all__ = [
    "MicroBatch",
    "Trainer",
    "collate",
    "forward_logprobs",
    "list_checkpoints",
    "load_states",
    "lr_lambda",
    "plan_micro_batches",
    "save_checkpoint",
]
