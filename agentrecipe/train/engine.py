"""DeepSpeed engines for SFT and RL, the same code on a laptop CPU and on GPUs.

A single process without a launcher gets RANK=0 / WORLD_SIZE=1 and a free
MASTER_PORT, so DeepSpeed picks its CPU accelerator and the gloo backend. Under
`deepspeed` / `torchrun` the launcher's variables are kept.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import time
from pathlib import Path

import torch

from agentrecipe import dist
from agentrecipe.config import ConfigError, DeepSpeedConfig


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


STALE_LOCK_SECONDS = 900
"""A torch extension build lock older than this was left by a killed build (one takes about a minute)."""


def extensions_dir() -> Path:
    """Where torch builds and caches C++ extensions (DeepSpeed's CPU shm op among them)."""
    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")


def clear_stale_build_locks(root: Path | None = None, max_age: float = STALE_LOCK_SECONDS) -> list[Path]:
    """Remove extension build locks older than `max_age` seconds. A build killed midway leaves its
    `lock` file behind, and every later DeepSpeed start then waits on it forever."""
    removed = []
    for lock in (root or extensions_dir()).glob("*/*/lock"):
        try:
            if time.time() - lock.stat().st_mtime > max_age:
                lock.unlink()
                removed.append(lock)
                print(f"removed a stale torch extension build lock (left by a killed build): {lock}")
        except OSError:
            continue
    return removed


def init_distributed() -> None:
    """Set up torch.distributed once (single process unless a launcher says otherwise)."""
    import deepspeed

    clear_stale_build_locks()

    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ["MASTER_PORT"] = str(_free_port())
    if not torch.distributed.is_initialized():
        # DeepSpeed's communication backend compiles its shared-memory all-reduce kernel (on CPU, 117 s measured
        # on 2 shared cores, once per machine) for inference_all_reduce, tensor-parallel inference, which
        # training never calls; its ops table is one cached dict, so marking the op incompatible skips the build.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl", verbose=False)
        # Destroyed before the interpreter exits: left to the C++ destructors, a 2-rank ZeRO-3 run
        # sometimes aborted after finishing ("terminate called without an active exception").
        atexit.register(_destroy_process_group)


EXIT_BARRIER_S = 120


def _destroy_process_group() -> None:
    """Every rank waits for the others before tearing its group down: with the destroy alone, a rank
    that finished first closed its gloo connections while a slower one still held its own, and the
    slower one sometimes aborted at exit after finishing its work (CI, twice, a 2-rank ZeRO-3 test:
    "terminate called without an active exception"). A peer that is gone (it crashed: the launcher
    stops the others anyway) costs at most EXIT_BARRIER_S here, not gloo's 30-minute default; a rank
    dying of an uncaught exception skips the wait."""
    if not torch.distributed.is_initialized():
        return
    dying = hasattr(sys, "last_value")  # an uncaught exception: the others are not coming, exit at once
    if torch.distributed.get_world_size() > 1 and not dying:
        from datetime import timedelta

        try:
            if torch.distributed.get_backend() == "gloo":
                torch.distributed.monitored_barrier(timeout=timedelta(seconds=EXIT_BARRIER_S))
            else:
                torch.distributed.barrier()
        except RuntimeError as e:  # a peer that never arrives: tear down anyway, and say so
            print(f"exit barrier: {e}", flush=True)
    torch.distributed.destroy_process_group()


def ds_config(ds: DeepSpeedConfig, dtype: torch.dtype, lr: float, micro_batch: int, max_grad_norm: float,
              weight_decay: float = 0.0) -> dict:
    """The DeepSpeed JSON config for our settings (AdamW; the schedule is `warmup_linear_decay`);
    `dtype` is the weights' dtype (model.dtype, the one name for it): bfloat16 / float16 switch on
    the engine's bf16 / fp16 mode."""
    world = dist.world_size()
    cfg: dict = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "train_batch_size": micro_batch * world,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": max_grad_norm,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": lr, "weight_decay": weight_decay, "betas": [0.9, 0.95], "torch_adam": ds.torch_adam},
        },
        "zero_optimization": {"stage": ds.zero_stage},
        "bf16": {"enabled": dtype == torch.bfloat16},
        "fp16": {"enabled": dtype == torch.float16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if ds.offload_optimizer:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    return cfg


def warmup_linear_decay(warmup_steps: int, total_steps: int):
    """LR multiplier: (s + 1) / warmup during warmup (never 0), then linear decay to 0 at total_steps
    (constant after warmup when total_steps is 0)."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if total_steps <= warmup_steps:
            return 1.0
        return max(0.0, (total_steps - step) / (total_steps - warmup_steps))

    return factor


def make_engine(model: torch.nn.Module, config: dict, warmup_steps: int = 0, total_steps: int = 0,
                gradient_checkpointing: bool = False):
    """Wrap `model` in a DeepSpeed engine built from `config` (see ds_config), with a warmup/decay schedule;
    gradient_checkpointing: see `enable_gradient_checkpointing` (deepspeed.gradient_checkpointing)."""
    import deepspeed

    if gradient_checkpointing:
        enable_gradient_checkpointing(model)
    init_distributed()
    params = [p for p in model.parameters() if p.requires_grad]
    factor = warmup_linear_decay(warmup_steps, total_steps)
    schedule = (lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, factor)) if warmup_steps or total_steps else None
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=config, lr_scheduler=schedule)
    return engine


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Switch on the gradient checkpointing of the transformer in `model` (the causal LM itself, or the
    critic's body): each layer's activations are recomputed in the backward pass instead of kept.
    Non-reentrant (torch.utils.checkpoint with use_reentrant=False): correct under no_grad passes,
    with inputs that need no gradient, and with RNG state restored for the recompute. Only a module
    in training mode recomputes (the RL trainer, whose passes otherwise run in eval mode, switches
    to `train_without_dropout`); generation runs in eval mode with its KV cache as before."""
    from transformers import PreTrainedModel

    body = next((m for m in model.modules() if isinstance(m, PreTrainedModel)), None)
    if body is None or not body.supports_gradient_checkpointing:
        raise ConfigError(f"deepspeed.gradient_checkpointing: {type(body or model).__name__} does not support "
                          "gradient checkpointing")
    body.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def train_without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """Training mode with every dropout at 0: HF's gradient checkpointing recomputes only in training
    mode, and the RL trainer's passes must compute what they compute in eval mode (the rollouts'
    log-probs, the old ones and the update's agree). Zeroes every nn.Dropout and every float
    `*dropout` attribute (the rate an attention module applies in training mode)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name in [n for n, v in vars(module).items() if n.endswith("dropout") and isinstance(v, float)]:
            setattr(module, name, 0.0)
    return model.train()


def unwrap(engine) -> torch.nn.Module:
    return getattr(engine, "module", engine)
