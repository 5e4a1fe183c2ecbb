"""Where this process stands under a launcher (torchrun / deepspeed): read once, here.

Launchers set RANK and WORLD_SIZE; a plain `python -m stages.X` is rank 0 of 1.
"""

from __future__ import annotations

import os


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_rank0() -> bool:
    return rank() == 0


def barrier() -> None:
    """Wait for every rank (nothing without a process group)."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def all_reduce_tensor(t, op: str, device=None):
    """The tensor `t` reduced elementwise over all ranks with `op` ("sum" or "max"); `t` itself without
    a process group. Every rank must call it (a tensor of the same shape and dtype). On `device`, else
    the backend's (NCCL reduces CUDA tensors only); the result comes back on `t`'s device."""
    import torch

    if not (torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1):
        return t
    if device is None:
        device = (torch.device("cuda", torch.cuda.current_device()) if torch.distributed.get_backend() == "nccl"
                  else torch.device("cpu"))
    reduced = t.detach().to(device).clone()
    torch.distributed.all_reduce(reduced, op=getattr(torch.distributed.ReduceOp, op.upper()))
    return reduced.to(t.device)


def _all_reduce(x: int | float, op: str, device=None) -> int | float:
    """`x` reduced over all ranks with `op` ("sum" or "max"); `x` itself without a process group.
    Every rank must call it."""
    import torch

    t = torch.tensor([x], dtype=torch.float64 if isinstance(x, float) else torch.int64)
    return all_reduce_tensor(t, op, device).item()


def all_sum(x: float) -> float:
    """`x` summed over all ranks: every rank must call it."""
    return float(_all_reduce(float(x), "sum"))


def all_max(n: int, device=None) -> int:
    """The largest `n` over all ranks: every rank must call it (e.g. so that every rank runs as many
    forwards and backwards: DeepSpeed all-reduces gradients in each, ZeRO-3 all-gathers in each forward)."""
    return int(_all_reduce(int(n), "max", device))


def global_mean_scale(local_weight: float) -> float:
    """Factor that turns this rank's mean loss into its part of ONE mean over all ranks' tokens.

    DeepSpeed averages gradients over the ranks, so each rank's mean (its sum / its weight) would
    count alike however many tokens it holds, and a rank passing a zero-weight dummy would halve
    its peers' gradient. Scaled by world * local_weight / total_weight, the average of the ranks'
    gradients is the gradient of sum of all losses / total weight. Every rank must call it."""
    total = all_sum(local_weight)
    return world_size() * local_weight / total if total > 0 else 0.0
