"""Saving models as plain HF folders, atomically: a folder is either complete or absent."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch


def full_state_dict(engine_or_model) -> dict[str, torch.Tensor]:
    """The model's full state dict on CPU (gathers ZeRO-3 partitions)."""
    module = getattr(engine_or_model, "module", engine_or_model)
    if getattr(engine_or_model, "zero_optimization_partition_weights", lambda: False)():
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
    return {k: v.detach().cpu() for k, v in module.state_dict().items()}


def save_hf(engine_or_model, tokenizer, out_dir: str | Path) -> Path:
    """Write model + tokenizer to out_dir via a temporary folder and a rename (rank 0 only)."""
    out_dir = Path(out_dir)
    state = full_state_dict(engine_or_model)
    if int(os.environ.get("RANK", "0")) != 0:
        return out_dir
    module = getattr(engine_or_model, "module", engine_or_model)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    module.save_pretrained(tmp, state_dict=state, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def copy_model(src: str | Path, dst: str | Path) -> Path:
    """Pass a model folder through unchanged (e.g. SFT with zero demonstrations)."""
    dst = Path(dst)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------- RL checkpoints
# A checkpoint is a folder step_NNNNNN/ holding model/ (plain HF folder),
# actor_state/ and critic_state/ (DeepSpeed: optimizer, scheduler) and
# trainer_state.pt (step, RNG states, config fingerprint). It is written as
# step_NNNNNN.tmp and renamed when complete, so a kill never leaves a
# half-written checkpoint that looks finished.
STATE_FILE = "trainer_state.pt"


def save_rl_checkpoint(root: str | Path, step: int, actor, critic, tokenizer, fingerprint: str, keep: int = 2) -> Path:
    import random

    root = Path(root)
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp"
    rank0 = int(os.environ.get("RANK", "0")) == 0
    if rank0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    actor.save_checkpoint(str(tmp / "actor_state"), tag="state")
    if critic is not None:
        critic.save_checkpoint(str(tmp / "critic_state"), tag="state")
    save_hf(actor, tokenizer, tmp / "model")
    if rank0:
        state = {"step": step, "fingerprint": fingerprint, "python_rng": random.getstate(), "torch_rng": torch.get_rng_state()}
        torch.save(state, tmp / STATE_FILE)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in sorted(p for p in root.glob("step_*") if not p.name.endswith(".tmp"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def latest_checkpoint(root: str | Path, fingerprint: str) -> Path | None:
    """The newest complete checkpoint written by a run with this fingerprint (else None)."""
    root = Path(root)
    for path in sorted(root.glob("step_*"), reverse=True):
        if path.name.endswith(".tmp") or not (path / STATE_FILE).exists():
            continue
        try:
            state = torch.load(path / STATE_FILE, weights_only=False)
        except Exception:  # noqa: BLE001 - a corrupt checkpoint is skipped, an older one is used
            continue
        if state.get("fingerprint") == fingerprint:
            return path
    return None


def load_rl_checkpoint(path: str | Path, actor, critic) -> int:
    """Restore engines and RNG states from a checkpoint; return the step it was taken after."""
    import random

    path = Path(path)
    actor.load_checkpoint(str(path / "actor_state"), tag="state")
    if critic is not None:
        critic.load_checkpoint(str(path / "critic_state"), tag="state")
    state = torch.load(path / STATE_FILE, weights_only=False)
    random.setstate(state["python_rng"])
    torch.set_rng_state(state["torch_rng"])
    return int(state["step"])


def _barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
