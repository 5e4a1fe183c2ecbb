"""Supervised fine-tuning on demonstrations: next-token loss on action tokens only.

    loss = - sum_t mask_t * log p(x_t | x_<t) / sum_t mask_t

Under a launcher each rank trains on its own shard of every batch; DeepSpeed
averages the gradients.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import torch
from tqdm import tqdm

from agentrecipe import dist
from agentrecipe.config import DeepSpeedConfig, SFTConfig
from agentrecipe.train.engine import ds_config, make_engine
from agentrecipe.train.logprobs import constrained_logprobs, lm_logits_at, pack, pad_batch


def collate(rows: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    return {
        "input_ids": pad_batch([r["input_ids"] for r in rows], pad_id),
        "attention_mask": pad_batch([[1] * len(r["input_ids"]) for r in rows], 0),
        "action_mask": pad_batch([r["action_mask"] for r in rows], 0, dtype=torch.float32),
    }


def action_nll(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean negative log-likelihood of the action tokens of a batch.

    One packed forward (`logprobs.pack`): rows that share a prefix (the turns of one
    demonstration with a history window) forward it once, padding is not forwarded, and the LM
    head runs only where an action token is predicted."""
    ids, mask = batch["input_ids"], batch["action_mask"]
    lengths = batch["attention_mask"].sum(-1).tolist()
    packed = pack([ids[b, :n].tolist() for b, n in enumerate(lengths)], None, ids.shape[1])
    packed.input_ids, packed.position_ids = packed.input_ids.to(ids.device), packed.position_ids.to(ids.device)
    rows, cols = mask.nonzero(as_tuple=True)
    at = packed.at(rows.tolist(), (cols - 1).tolist())  # the token before each action token predicts it
    logp, _ = constrained_logprobs(lm_logits_at(model, packed, at), ids[rows, cols])
    return -logp.sum() / max(len(logp), 1)


def sft_train(
    model,
    pad_id: int,
    rows: list[dict],
    cfg: SFTConfig,
    ds: DeepSpeedConfig,
    log: Callable[[int, dict], None] | None = None,
):
    """Fine-tune `model` on `rows` (input_ids, action_mask); return the DeepSpeed engine."""
    rank, world = dist.rank(), dist.world_size()
    # -- derived sizes
    steps_per_epoch = max(1, -(-len(rows) // cfg.batch_size))
    total_steps = steps_per_epoch * cfg.epochs
    engine = make_engine(
        model, ds_config(ds, next(model.parameters()).dtype, cfg.lr, max(1, cfg.batch_size // world), cfg.max_grad_norm, cfg.weight_decay),
        warmup_steps=cfg.warmup_steps, total_steps=total_steps, gradient_checkpointing=ds.gradient_checkpointing,
    )
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    engine.train()
    step, start, tokens = 0, time.time(), 0
    bar = tqdm(total=total_steps, desc="sft", disable=rank != 0)
    for epoch in range(cfg.epochs):
        order = list(range(len(rows)))
        rng.shuffle(order)
        for b in range(0, len(order), cfg.batch_size):
            shard = order[b : b + cfg.batch_size][rank::world]
            # a rank without rows in this batch still runs a pass (its peers' gradient all-reduce
            # waits for it) on the batch's first row, weighted 0
            batch = {k: v.to(engine.device) for k, v in collate([rows[i] for i in shard or order[b : b + 1]],
                                                                   pad_id).items()}
            loss = action_nll(engine, batch)
            lr = engine.get_lr()[0]  # the rate this step applies (step() moves the schedule on)
            # one token-mean over the whole batch, across ranks (see dist.global_mean_scale)
            engine.backward(loss * dist.global_mean_scale(float(batch["action_mask"].sum()) if shard else 0.0))
            engine.step()
            step += 1
            tokens += int(batch["attention_mask"].sum())
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
            if log is not None:
                log(step, {"train/loss": loss.item(), "train/lr": lr, "train/epoch": epoch,
                           "perf/tokens_per_s": tokens / max(time.time() - start, 1e-9)})
    bar.close()
    return engine
