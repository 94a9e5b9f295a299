"""The "custom sync hook" on the DDP side, and a meter of tokens and losses read from forward calls.

* :func:`install_gradient_hook` registers a DDP communication hook on the
  wrapped model. For single-rank workers it is a no-op: every rank keeps its
  own gradient and **no byte leaves the process** in backward. For worker
  groups (docs/algorithm.md#worker-groups) it averages the bucket inside the worker's group only.
  Each hook call is counted in :class:`GradientTraffic`, so a test (or a
  user) can check that per-step gradient traffic is zero.
* :class:`BatchMeter` puts a forward pre-hook and a forward hook on the
  unwrapped model: it counts non-padding input tokens (``attention_mask``
  sum, else every ``input_ids`` position, docs/algorithm.md#token-mapper) and reads ``outputs.loss``
  of every training forward, without a special collator. Values stay on the
  device until the engine needs them (at the end of an interval), so the meter
  adds no host synchronization per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from autoloco_hf.algorithm.token_mapper import count_non_padding_tokens

IGNORE_INDEX = -100  # the label value transformers' losses ignore


@dataclass
class GradientTraffic:
    """What the DDP communication hook did."""

    buckets: int = 0  # hook calls (one per DDP bucket per synchronized backward)
    local_bytes: int = 0  # bucket bytes kept local (no communication)
    group_bytes: int = 0  # bucket bytes averaged inside a worker group
    group: Any = field(default=None, repr=False)
    group_size: int = 1


# no return annotation: DDP checks it literally
def _keep_local_gradients(state: GradientTraffic, bucket):
    """DDP comm hook: do not communicate; the bucket keeps this rank's own gradient."""
    buffer = bucket.buffer()
    state.buckets += 1
    state.local_bytes += buffer.numel() * buffer.element_size()
    future = torch.futures.Future()
    future.set_result(buffer)
    return future


def _average_in_worker_group(state: GradientTraffic, bucket):
    """DDP comm hook: average the bucket inside this rank's worker group (inner DDP of
    docs/algorithm.md#worker-groups)."""
    import torch.distributed as dist

    buffer = bucket.buffer()
    state.buckets += 1
    state.group_bytes += buffer.numel() * buffer.element_size()
    buffer.div_(state.group_size)
    work = dist.all_reduce(buffer, group=state.group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def find_ddp(model: Any) -> torch.nn.parallel.DistributedDataParallel | None:
    """The ``DistributedDataParallel`` module in ``model``
    (itself, or under ``torch.compile``'s ``_orig_mod``)."""
    DDP = torch.nn.parallel.DistributedDataParallel
    seen = 0
    while model is not None and seen < 4:
        if isinstance(model, DDP):
            return model
        model = getattr(model, "_orig_mod", None)
        seen += 1
    return None


def install_gradient_hook(
    ddp_model: torch.nn.parallel.DistributedDataParallel,
    inner_group: Any = None,
    group_size: int = 1,
) -> GradientTraffic:
    """Replace DDP's per-step gradient all-reduce (world) by
    nothing, or by a worker-group average."""
    existing = getattr(ddp_model, "_autoloco_gradient_traffic", None)
    # a second train() on the same wrapped model: the hook is already there
    if existing is not None:
        return existing
    traffic = GradientTraffic(group=inner_group, group_size=group_size)
    hook = (
        _keep_local_gradients
        if inner_group is None or group_size == 1
        else _average_in_worker_group
    )
    try:
        ddp_model.register_comm_hook(traffic, hook)
    except RuntimeError as err:  # DDP allows one hook, registered before the first backward
        raise RuntimeError(
            "AutoLoCo could not register its DDP communication hook (another hook is registered, "
            "e.g. accelerate's DDPCommunicationHookType / ddp_comm_hook, or training "
            f"already ran a backward): {err}"
        ) from err
    # A buffer broadcast at every forward would be per-step traffic; buffers are not trained.
    ddp_model.forward_sync_buffers = False
    ddp_model._autoloco_gradient_traffic = traffic
    return traffic


def _output_loss(output: Any) -> torch.Tensor | None:
    loss = None
    if isinstance(output, dict) or hasattr(output, "get"):
        try:
            loss = output.get("loss")
        except Exception:  # noqa: BLE001 - any mapping-like output without get semantics
            loss = None
    elif (
        isinstance(output, (tuple, list))
        and output
        and isinstance(output[0], torch.Tensor)
        and output[0].dim() == 0
    ):
        loss = output[0]
    return loss.detach() if isinstance(loss, torch.Tensor) else None


class BatchMeter:
    """Tokens and loss of the training forwards between two
    optimizer steps, read by hooks on ``model``.

    Per optimizer step the loss is the sum of the micro-batch losses when the
    model received ``num_items_in_batch`` (the Trainer's token-normalized loss
    under gradient accumulation), else their mean. Evaluation forwards
    (``model.eval()`` or no grad) are not counted. A forward whose ``labels``
    are all ``-100`` counts as loss 0 (transformers returns 0/0 = NaN for it,
    with a zero gradient); its tokens still count (``attention_mask``).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._handles = [
            model.register_forward_pre_hook(self._pre_hook, with_kwargs=True),
            model.register_forward_hook(self._post_hook, with_kwargs=True),
        ]
        self.forwards = 0  # counted training forwards (micro-batches) since the start
        self.loss_seen = False
        self._reset_step()
        self.interval_tokens: Any = 0
        self.interval_loss: Any = 0.0

    # ------------------------------------------------------------ hooks
    def _training(self) -> bool:
        return self.model.training and torch.is_grad_enabled()

    def _pre_hook(self, module, args, kwargs):
        if self._training():
            tokens = count_non_padding_tokens(kwargs, args)
            if tokens is not None:
                self.step_tokens = self.step_tokens + tokens
            self.forwards += 1
        return None

    def _post_hook(self, module, args, kwargs, output):
        if self._training():
            loss = _output_loss(output)
            if loss is not None:
                self.loss_seen = True
                labels = kwargs.get("labels")
                if isinstance(labels, torch.Tensor) and not labels.is_floating_point():
                    # A batch whose labels are all ignored (all padding, or
                    # prompt-only) has a 0/0 = NaN loss in transformers but a zero
                    # gradient: it carries no loss, not a divergence (stays on device).
                    loss = torch.where((labels != IGNORE_INDEX).any(), loss, torch.zeros_like(loss))
                if kwargs.get("num_items_in_batch") is not None:
                    self.step_scaled_loss = self.step_scaled_loss + loss.detach().float()
                else:
                    self.step_plain_loss = self.step_plain_loss + loss.detach().float()
                    self.step_plain_count += 1
        return None

    # ------------------------------------------------------------ steps
    def _reset_step(self) -> None:
        self.step_tokens: Any = 0
        self.step_scaled_loss: Any = 0.0
        self.step_plain_loss: Any = 0.0
        self.step_plain_count = 0

    def end_step(self) -> None:
        """Fold the micro-batches of one optimizer step into the interval sums."""
        loss = self.step_scaled_loss
        if self.step_plain_count:
            loss = loss + self.step_plain_loss / self.step_plain_count
        self.interval_tokens = self.interval_tokens + self.step_tokens
        self.interval_loss = self.interval_loss + loss
        self._reset_step()

    def flush(self) -> tuple[int, float]:
        """The interval's tokens and loss sum as Python numbers (one host sync); resets them."""
        tokens, loss = int(self.interval_tokens), float(self.interval_loss)
        self.interval_tokens, self.interval_loss = 0, 0.0
        return tokens, loss

    def add_external(self, tokens: int = 0, loss: float = 0.0) -> None:
        """Tokens/loss of a step reported by the caller
        (manual ``step()``), instead of the hooks."""
        self.step_tokens = self.step_tokens + int(tokens)
        self.step_scaled_loss = self.step_scaled_loss + float(loss)

    def state_dict(self) -> dict[str, Any]:
        return {
            "interval_tokens": int(self.interval_tokens),
            "interval_loss": float(self.interval_loss),
            "forwards": self.forwards,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.interval_tokens = int(state["interval_tokens"])
        self.interval_loss = float(state["interval_loss"])
        self.forwards = int(state.get("forwards", 0))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
