"""Multi-turn RL: rollouts, credit assignment, clipped policy-gradient updates.

One step, top to bottom (CleanRL style):
  1. schedules: turn limit (ScalingInter-RL) and curriculum levels for this step
  2. rollouts: `games_per_step` games x `group_size` episodes, in lock-step
  3. batch: training sequences, per-turn rewards (sparse / dense / penalties)
  4. old log-probs (and reference log-probs, critic values) without gradient
  5. advantages on each episode's action-token layout (PPO / GRPO / RLOO / REINFORCE++)
  6. `update_epochs` passes over minibatches: clipped surrogate + KL + entropy
     (+ clipped value loss on the critic for PPO)
  7. log metrics; checkpoint every `checkpoint_every` steps

Under a launcher every rank plays its own episodes (different games per rank)
and DeepSpeed averages the gradients; groups never cross ranks.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from agentrecipe.agent.prompt import PromptEncoder
from agentrecipe.algos.advantages import compute_advantages
from agentrecipe.algos.losses import aggregate, explained_variance, kl_penalty, masked_mean, policy_loss, value_loss
from agentrecipe.config import AgentConfig, DeepSpeedConfig, RewardConfig, RLConfig, RolloutConfig
from agentrecipe.envs.base import GameSpec
from agentrecipe.models.registry import load_model
from agentrecipe.rollout.engine import RolloutSettings, run_episodes
from agentrecipe.rewards import turn_rewards
from agentrecipe.schedules import curriculum_levels, turn_limit
from agentrecipe.train.checkpoint import latest_checkpoint, load_rl_checkpoint, save_rl_checkpoint
from agentrecipe.train.critic import ValueModel
from agentrecipe.train.engine import ds_config, make_engine, unwrap
from agentrecipe.train.logprobs import token_logprobs
from agentrecipe.train.rl_batch import RLBatch, build_batch


PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class RLRun:
    """Everything one RL run needs besides the policy."""

    rl: RLConfig
    reward: RewardConfig
    agent: AgentConfig
    rollout: RolloutConfig
    deepspeed: DeepSpeedConfig
    levels: list[str]
    """Default training levels (env.levels)."""
    n_steps: int
    checkpoint_dir: Path
    fingerprint: str
    """Identifies the config + start model; only matching checkpoints are resumed."""


def num_steps(rl_episodes: int, rl: RLConfig, world_size: int = 1) -> int:
    """RL steps the budget pays for: episodes / (games_per_step * group_size * ranks), rounded down.

    Every rank plays its own games_per_step x group_size episodes per step."""
    return rl_episodes // (rl.episodes_per_step * world_size)


def _forward_no_grad(model, batch: RLBatch, idx: list[int], temperature: float, mb: int, value: bool = False):
    out = []
    with torch.no_grad():
        for i in range(0, len(idx), mb):
            sel = idx[i : i + mb]
            if value:
                out.append(model(batch.input_ids[sel], batch.attention_mask[sel]).float())
            else:
                allowed = batch.allowed_mask(sel)
                lp, _ = token_logprobs(model, batch.input_ids[sel], batch.attention_mask[sel], temperature, allowed)
                out.append(lp)
    return torch.cat(out)


def _minibatches(n: int, size: int, rng: random.Random, device) -> list[list[int]]:
    """Shuffled minibatches; the same count on every rank (ranks hold different numbers of sequences)."""
    count = math.ceil(n / size)
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        t = torch.tensor([count], device=device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        count = int(t)
    order = list(range(n))
    rng.shuffle(order)
    return [order[i::count] or order[:1] for i in range(count)]


def rl_train(
    policy_dir: str | Path,
    train_games: list[GameSpec],
    run: RLRun,
    pool,
    make_backend: Callable,
    log: Callable[[int, dict], None] | None = None,
    progress: bool = True,
):
    """Train the policy in `policy_dir`; return (actor engine, tokenizer, first step run)."""
    rl, rank = run.rl, int(os.environ.get("RANK", "0"))
    model, tokenizer = load_model(policy_dir, PRECISION_DTYPES[run.deepspeed.precision])
    encoder = PromptEncoder(tokenizer, run.agent.show_admissible, run.agent.history)
    vocab = unwrap(model).get_output_embeddings().weight.shape[0]
    mb = rl.minibatch_size
    actor = make_engine(model, ds_config(run.deepspeed, rl.lr, mb, rl.max_grad_norm))
    critic = None
    if rl.algo == "ppo":
        critic = make_engine(ValueModel.from_pretrained(policy_dir), ds_config(run.deepspeed, rl.critic_lr, mb, rl.max_grad_norm))
    ref = None
    if rl.kl_coef > 0:
        ref, _ = load_model(policy_dir, PRECISION_DTYPES[run.deepspeed.precision])
        ref.to(actor.device).eval().requires_grad_(False)
    start_step = 0
    ckpt = latest_checkpoint(run.checkpoint_dir, run.fingerprint)
    if ckpt is not None:
        start_step = load_rl_checkpoint(ckpt, actor, critic)
        print(f"rl: resumed from {ckpt} (after step {start_step})")
    backend = make_backend(unwrap(actor), tokenizer)
    temperature = run.rollout.temperature if run.rollout.temperature > 0 else 1.0
    constrained = run.agent.decoding == "admissible"

    bar = tqdm(total=run.n_steps, initial=start_step, desc="rl", disable=not progress or rank != 0)
    for step in range(start_step, run.n_steps):
        t0 = time.time()
        # 1. schedules
        max_turns = turn_limit(step, rl.turn_schedule, rl.turn_schedule_every, run.rollout.max_turns)
        levels = curriculum_levels(step, rl.curriculum, rl.curriculum_every, run.levels)
        # 2. rollouts: each rank its own games, seeded by (seed, step, rank) so a resumed run replays the same draws
        rng = random.Random(f"{rl.seed}-{step}-{rank}")
        candidates = [g for g in train_games if g.level in levels] or train_games
        games = rng.sample(candidates, rl.games_per_step) if len(candidates) >= rl.games_per_step else rng.choices(candidates, k=rl.games_per_step)
        group_of = [g for g in range(len(games)) for _ in range(rl.group_size)]
        settings = RolloutSettings.from_agent(run.agent, max_turns, temperature, run.rollout.top_p,
                                              seed=rl.seed * 1_000_003 + step * 101 + rank)
        episodes = run_episodes([games[g] for g in group_of], backend, encoder, pool, settings)
        t_gen = time.time() - t0
        gen_tokens = sum(len(a) for ep in episodes for a in ep.actions)
        # 3. batch
        rewards = [turn_rewards(ep.score_deltas, ep.won, ep.invalid, ep.game.max_score, run.reward) for ep in episodes]
        batch = build_batch(episodes, rewards, group_of, encoder, vocab, constrained, actor.device)
        stats: dict[str, float] = {}
        if batch is not None:
            S = batch.input_ids.shape[0]
            idx = list(range(S))
            mask = batch.action_mask
            # 4. old / reference log-probs, values
            old_lp = _forward_no_grad(unwrap(actor), batch, idx, temperature, mb) * mask
            stats["rollout/logprob_mismatch"] = float(masked_mean((old_lp - batch.rollout_logprobs).abs(), mask))
            ref_lp = _forward_no_grad(ref, batch, idx, temperature, mb) * mask if ref is not None else None
            kl = kl_penalty(old_lp, ref_lp, rl.kl_estimator) * mask if ref_lp is not None else None
            old_values = _forward_no_grad(unwrap(critic), batch, idx, temperature, mb, value=True) * mask if critic else None
            # 5. advantages on the episodes' action layout, back onto sequence tokens
            adv_l, ret_l = compute_advantages(
                rl.algo,
                turn_rewards=batch.ep_turn_rewards,
                turn_mask=batch.ep_turn_mask,
                action_mask=batch.ep_action_mask,
                turn_ids=batch.ep_turn_ids,
                group_ids=batch.group_ids,
                cfg=rl,
                values=batch.to_layout(old_values) if old_values is not None else None,
                kl=batch.to_layout(kl) if (kl is not None and rl.kl_in_reward) else None,
            )
            advantages = batch.from_layout(adv_l)
            returns = batch.from_layout(ret_l) if ret_l is not None else None
            # 6. updates
            sums: dict[str, list[float]] = {}
            for _ in range(rl.update_epochs):
                for sel in _minibatches(S, mb, rng, actor.device):
                    m = mask[sel]
                    allowed = batch.allowed_mask(sel)
                    new_lp, entropy = token_logprobs(actor, batch.input_ids[sel], batch.attention_mask[sel], temperature,
                                                     allowed, with_entropy=True)
                    pg_loss, pg_stats = policy_loss(new_lp, old_lp[sel], advantages[sel], m, rl.clip_eps, rl.loss_agg)
                    entropy_loss = aggregate(entropy, m, rl.loss_agg)
                    kl_loss = torch.zeros(())
                    if ref_lp is not None and not rl.kl_in_reward:
                        kl_loss = aggregate(kl_penalty(new_lp, ref_lp[sel], rl.kl_estimator), m, rl.loss_agg)
                    loss = pg_loss + rl.kl_coef * kl_loss - rl.entropy_coef * entropy_loss
                    actor.backward(loss)
                    actor.step()
                    mb_stats = {"losses/policy": pg_loss.item(), "losses/entropy": entropy_loss.item(),
                                "losses/kl": kl_loss.item(), **{f"losses/{k}": float(v) for k, v in pg_stats.items()}}
                    if critic is not None:
                        new_values = critic(batch.input_ids[sel], batch.attention_mask[sel])
                        v_loss, v_stats = value_loss(new_values, old_values[sel], returns[sel], m, rl.value_clip, rl.loss_agg)
                        critic.backward(rl.vf_coef * v_loss)
                        critic.step()
                        mb_stats["losses/value"] = v_loss.item()
                        mb_stats.update({f"losses/{k}": float(v) for k, v in v_stats.items()})
                    for k, v in mb_stats.items():
                        sums.setdefault(k, []).append(v)
            stats.update({k: sum(v) / len(v) for k, v in sums.items()})
            if old_values is not None and returns is not None:
                stats["losses/explained_variance"] = float(explained_variance(old_values, returns, mask))
            stats["perf/train_tokens_per_s"] = float(batch.attention_mask.sum()) * rl.update_epochs / max(time.time() - t0 - t_gen, 1e-9)
        # 7. log and checkpoint
        played = [i for i, ep in enumerate(episodes) if not ep.failed]
        returns = [sum(rewards[i]) for i in played]
        played = [episodes[i] for i in played]
        n = max(len(played), 1)
        stats.update({
            "rollout/success": sum(ep.won for ep in played) / n,
            "rollout/return": sum(returns) / n,
            "rollout/score": sum(ep.score / max(ep.game.max_score, 1e-9) for ep in played) / n,
            "rollout/turns": sum(ep.turns for ep in played) / n,
            "rollout/invalid_rate": sum(sum(ep.invalid) for ep in played) / max(sum(ep.turns for ep in played), 1),
            "rollout/truncated": sum(ep.truncated for ep in played) / n,
            "rollout/failed_episodes": float(len(episodes) - len(played)),
            "schedule/max_turns": float(max_turns),
            "perf/gen_tokens_per_s": gen_tokens / max(t_gen, 1e-9),
            "perf/step_seconds": time.time() - t0,
        })
        backend.update_weights(actor)  # the next rollouts sample from the updated policy (all ranks: ZeRO-3 gathers)
        if log is not None:
            log(step + 1, stats)
        bar.update(1)
        bar.set_postfix(success=f"{stats['rollout/success']:.2f}", turns=max_turns)
        if (step + 1) % rl.checkpoint_every == 0 or step + 1 == run.n_steps:
            save_rl_checkpoint(run.checkpoint_dir, step + 1, actor, critic, tokenizer, run.fingerprint)
    bar.close()
    return actor, tokenizer, start_step

