"""Multi-turn RL: rollouts, credit assignment, clipped policy-gradient updates.

One step, top to bottom (CleanRL style):
  1. schedules: turn limit (ScalingInter-RL) and curriculum levels for this step
  2. rollouts: `games_per_step` games x `group_size` episodes, in lock-step
  3. batch: training sequences, per-turn rewards (sparse / dense / penalties), the minibatch plan
  4. old log-probs: the rollout's own when the policy sampled them at fp32 (HF backend, ZeRO 0-2),
     else recomputed without gradient (the first minibatch's from its update pass); reference
     log-probs, critic values, bootstrap values of truncated episodes
  5. advantages on each episode's action-token layout (PPO / GRPO / RLOO / REINFORCE++)
  6. `update_epochs` passes over minibatches: clipped surrogate + KL + entropy
     (+ clipped value loss on the critic for PPO)
  7. log metrics (`perf/*`: seconds per phase, positions forwarded per action token; `valid/*`:
     greedy episodes on held-out valid games every `eval_every` steps); checkpoint every
     `checkpoint_every` steps

Every pass runs on packed prefix-tree rows (`RLBatch.packed`): shared prefixes forwarded once,
no padding, logits only where an action token is predicted, softmax over the allowed ids only.

Under a launcher every rank plays its own episodes (different games per rank, `draw_games`)
and DeepSpeed averages the gradients; groups never cross ranks. Every rank runs
the same number of forwards and backwards in every phase (zero-weight dummy passes
pad a rank with fewer sequences, or none), so no collective waits forever.
"""
from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from agentrecipe import dist
from agentrecipe.agent.prompt import PromptEncoder
from agentrecipe.algos.advantages import compute_advantages, join_whitening, step_group_stats, zero_variance_fraction
from agentrecipe.algos.losses import (aggregate, aggregate_weight, explained_variance, kl_penalty, masked_mean, policy_loss,
                                      value_loss)
from agentrecipe.config import AgentConfig, DeepSpeedConfig, RewardConfig, RLConfig, RolloutConfig
from agentrecipe.envs.base import GameSpec
from agentrecipe.models.registry import DTYPES, load_model
from agentrecipe.rollout.engine import RolloutSettings, run_episodes
from agentrecipe.rewards import turn_rewards
from agentrecipe.schedules import curriculum_levels, phase_steps, turn_limit
from agentrecipe.train.checkpoint import (RUN_START, full_state_dict, is_better, latest_checkpoint, load_rl_checkpoint,
                                         read_best, save_best, save_rl_checkpoint, settle_best)
from agentrecipe.train.anchors import anchor_ids
from agentrecipe.train.critic import ValueModel
from agentrecipe.train.dynamic_sampling import dynamic_sampling
from agentrecipe.train.engine import ds_config, make_engine, train_without_dropout, unwrap
from agentrecipe.train.logprobs import constrained_logprobs, lm_logits_at, pack
from agentrecipe.train.rl_batch import RLBatch, build_batch
from agentrecipe.train.validation import is_validation_step, validation_stats


@dataclass
class RLRun:
    """Everything one RL run needs besides the policy."""

    rl: RLConfig
    reward: RewardConfig
    agent: AgentConfig
    rollout: RolloutConfig
    deepspeed: DeepSpeedConfig
    dtype: str
    """model.dtype: the policy's weights (and the DeepSpeed engine's bf16 / fp16 mode)."""
    levels: list[str]
    """Default training levels (env.levels)."""
    n_steps: int
    checkpoint_dir: Path
    fingerprint: str
    """Identifies the config + start model; only matching checkpoints are resumed."""


def backend_logprobs_exact(backend) -> bool:
    """True when `backend` samples with the trained policy's own weights at fp32 (`exact_logprobs`):
    its log-probs are pi_old as sampled, to float rounding, and RL uses them instead of a recomputing pass."""
    return bool(getattr(backend, "exact_logprobs", False))


def policy_pass(model, batch: RLBatch, sel: list[int], temperature: float, with_entropy: bool = False,
                entropy_grad: bool = True) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """Log-probs (and entropy) of sequences `sel` at their action tokens: (len(sel), T) each, 0
    elsewhere, and the positions forwarded. One packed forward; logits only where an action token
    is predicted, softmax over the allowed ids only (constrained decoding)."""
    p = batch.packed(sel)
    logits = lm_logits_at(model, p.packed, p.at)  # (N, V)
    lp, ent = constrained_logprobs(logits, p.targets, p.allowed, temperature, with_entropy, entropy_grad)
    T = batch.input_ids.shape[1]
    return p.scatter(lp, len(sel), T), p.scatter(ent, len(sel), T), p.packed.tokens


def value_pass(critic, batch: RLBatch, sel: list[int]) -> tuple[torch.Tensor, int]:
    """Critic values before each action token of sequences `sel`: (len(sel), T), and the positions forwarded."""
    p = batch.packed(sel)
    dtype = next(unwrap(critic).parameters()).dtype
    v = critic(p.packed.input_ids, p.packed.model_mask(dtype).to(p.packed.input_ids.device),
               p.packed.position_ids, at=p.at.to(p.packed.input_ids.device))
    return p.scatter(v, len(sel), batch.input_ids.shape[1]), p.packed.tokens


def bootstrap_pass(critic, batch: RLBatch) -> torch.Tensor:
    """(E,) V(s_H) of the state after each truncated episode's last action (its next prompt), 0
    for episodes the game ended: a time limit the state does not show must bootstrap (Pardo et al.
    2018, "Time Limits in Reinforcement Learning"). One critic forward."""
    eps = [e for e, p in enumerate(batch.next_prompts) if p is not None]
    out = torch.zeros(len(batch.next_prompts))
    if eps:
        packed, at = batch.packed_next(eps)
        dtype = next(unwrap(critic).parameters()).dtype
        v = critic(packed.input_ids, packed.model_mask(dtype).to(packed.input_ids.device), packed.position_ids,
                   at=at.to(packed.input_ids.device))
        out[eps] = v.detach().float().cpu()
    else:
        _dummy_value_loss(critic)  # the same number of critic forwards on every rank
    return out


def truncation_values(critic, batch: RLBatch | None, bootstrap: bool) -> torch.Tensor | None:
    """The values GAE continues from after each episode's last action: `bootstrap_pass` when
    `rl.bootstrap_truncated`, else None (every episode ends with value 0, as if the game had
    ended it). A rank without a batch runs the dummy forward its peers' pass needs; the flag is
    the same on every rank, so either all ranks forward or none."""
    if not bootstrap:
        return None
    if batch is None:
        _dummy_value_loss(critic)
        return None
    return bootstrap_pass(critic, batch)


def _one_token(model):
    """A packed row of one token on the model's device, and the node to read at."""
    packed = pack([[0]])
    dev = next(unwrap(model).parameters()).device
    packed.input_ids, packed.position_ids = packed.input_ids.to(dev), packed.position_ids.to(dev)
    return packed, torch.zeros((1, 2), dtype=torch.long, device=dev)


def _dummy_policy_loss(actor) -> torch.Tensor:
    """A policy forward on one token, times 0: a zero-weight minibatch that joins the collectives of
    its forward (ZeRO-3 gathers) and, through backward, of the gradient all-reduce."""
    packed, at = _one_token(actor)
    return lm_logits_at(actor, packed, at).float().sum() * 0.0


def _dummy_value_loss(critic) -> torch.Tensor:
    """The same for the critic (value head)."""
    packed, at = _one_token(critic)
    dtype = next(unwrap(critic).parameters()).dtype
    mask = packed.model_mask(dtype).to(packed.input_ids.device)
    return critic(packed.input_ids, mask, packed.position_ids, at=at).float().sum() * 0.0


def _no_grad_chunks(fn, idx: list[int], mb: int, device, dummy) -> list:
    """fn(chunk) on chunks of `mb` sequences without gradient, then `dummy()` forwards up to the
    largest chunk count of any rank."""
    chunks = [idx[i : i + mb] for i in range(0, len(idx), mb)]
    out = []
    with torch.no_grad():
        for k in range(dist.all_max(len(chunks), device)):
            if k < len(chunks):
                out.append(fn(chunks[k]))
            else:
                dummy()
    return out


def has_gradient(advantages: torch.Tensor, mask: torch.Tensor, rl: RLConfig, with_ref: bool) -> bool:
    """Whether a minibatch's policy loss has a gradient: an action token with a nonzero advantage,
    or an entropy or KL-to-reference term in the loss. Without one the gradient is exactly zero and
    the step is skipped (`rl.skip_zero_gradient_steps`: why, in params/rl/grpo.yaml)."""
    if rl.entropy_coef != 0 or (with_ref and rl.kl_coef != 0 and not rl.kl_in_reward):
        return True
    return bool(((advantages != 0) & (mask != 0)).any())


def _minibatches(n: int, size: int, rng: random.Random, device) -> list[list[int]]:
    """Shuffled minibatches; the same count on every rank (ranks hold different numbers of sequences).
    A rank with fewer sequences than that count gets empty minibatches (run as zero-weight dummies)."""
    count = dist.all_max(math.ceil(n / size), device)
    order = list(range(n))
    rng.shuffle(order)
    return [order[i::count] for i in range(count)]


class _TimedPool:
    """The environment pool, timing its reset and step calls (environment time of a rollout)."""

    def __init__(self, pool):
        self.pool, self.seconds = pool, 0.0

    def _timed(self, fn, *args):
        t = time.time()
        try:
            return fn(*args)
        finally:
            self.seconds += time.time() - t

    def reset(self, games):
        return self._timed(self.pool.reset, games)

    def step(self, actions):
        return self._timed(self.pool.step, actions)

    def __getattr__(self, name):
        return getattr(self.pool, name)


def draw_games(candidates: list[GameSpec], per_rank: int, seed: int, step: int, rank: int,
               world: int) -> tuple[list[GameSpec], random.Random]:
    """A rank's games of one step, and the random generator its further draws of the step use.

    One draw of per_rank x world distinct games, rank r playing the r-th share, so no two ranks
    play the same game in a step (before, each rank drew on its own: with 8 ranks of 4 games out
    of 60, a step played 24-26 distinct games of 32). Fewer candidates than that: each rank its
    own draw (with repeats only when fewer than per_rank). One rank draws as before."""
    draw = random.Random(f"{seed}-{step}-0")
    own = draw if rank == 0 else random.Random(f"{seed}-{step}-{rank}")
    if len(candidates) >= per_rank * world:
        return draw.sample(candidates, per_rank * world)[rank * per_rank:(rank + 1) * per_rank], own
    games = own.sample(candidates, per_rank) if len(candidates) >= per_rank else own.choices(candidates, k=per_rank)
    return games, own


def rollout_stats(episodes: list, rewards: list[list[float]], group_of: list[int], group_size: int) -> dict[str, float]:
    """`rollout/*` metrics of one step's episodes, all it played (failed ones only counted): success, return, score,
    turns, invalid-action rate, truncation, and the share of groups whose rollouts all earned the
    same return (no group signal; group methods only)."""
    ok = [i for i, ep in enumerate(episodes) if not ep.failed]
    played = [episodes[i] for i in ok]
    episode_returns = [sum(rewards[i]) for i in ok]
    n = max(len(played), 1)
    stats = {
        "rollout/success": sum(ep.won for ep in played) / n,
        "rollout/return": sum(episode_returns) / n,
        "rollout/score": sum(ep.score / max(ep.game.max_score, 1e-9) for ep in played) / n,
        "rollout/turns": sum(ep.turns for ep in played) / n,
        "rollout/invalid_rate": sum(sum(ep.invalid) for ep in played) / max(sum(ep.turns for ep in played), 1),
        "rollout/truncated": sum(ep.truncated for ep in played) / n,
        "rollout/context_cut": sum(ep.context_cut for ep in played) / n,
        "rollout/failed_episodes": float(len(episodes) - len(played)),
        "rollout/episodes": float(len(episodes)),
    }
    if group_size >= 2 and ok:
        stats["rollout/zero_variance_groups"] = zero_variance_fraction(
            torch.tensor(episode_returns), torch.tensor([group_of[i] for i in ok]))
    return stats


def rl_train(
    policy_dir: str | Path,
    train_games: list[GameSpec],
    run: RLRun,
    pool,
    make_backend: Callable,
    log: Callable[[int, dict], None] | None = None,
    progress: bool = True,
    valid_games: list[GameSpec] | None = None,
):
    """Train the policy in `policy_dir`; return (actor engine, tokenizer, first step run).

    With `valid_games`, greedy episodes on them every `rl.eval_every` steps log `valid/*`."""
    rl, rank = run.rl, dist.rank()
    model, tokenizer = load_model(policy_dir, DTYPES[run.dtype])
    encoder = PromptEncoder(tokenizer, run.agent.show_admissible, run.agent.history)
    vocab = unwrap(model).get_output_embeddings().weight.shape[0]
    mb = rl.minibatch_size
    recompute = run.deepspeed.gradient_checkpointing
    actor = make_engine(model, ds_config(run.deepspeed, DTYPES[run.dtype], rl.lr, mb, rl.max_grad_norm),
                        gradient_checkpointing=recompute)
    critic = None
    if rl.algo == "ppo":
        critic = make_engine(ValueModel.from_pretrained(policy_dir), ds_config(run.deepspeed, DTYPES[run.dtype], rl.critic_lr, mb, rl.max_grad_norm),
                             gradient_checkpointing=recompute)
    if recompute:  # checkpointing recomputes only in training mode; eval mode otherwise (as from_pretrained leaves it)
        for engine in (actor, critic) if critic is not None else (actor,):
            train_without_dropout(engine)
    ref = None
    if rl.kl_coef > 0:
        ref, _ = load_model(policy_dir, DTYPES[run.dtype])
        ref.to(actor.device).eval().requires_grad_(False)
    start_step = 0
    # episodes played and failed so far (all ranks) and seconds trained: a resumed run goes on counting
    # where it left off (restarted at 0, a few failures just after the resume point stopped a run that
    # uninterrupted finished, and the stage's wall time left out the runs before the resume)
    counts = dict(RUN_START)
    # the passed-over checkpoints reported once, not once a rank
    ckpt = latest_checkpoint(run.checkpoint_dir, run.fingerprint, print if rank == 0 else None)
    if ckpt is not None:
        start_step, counts = load_rl_checkpoint(ckpt, actor, critic)
        print(f"rl: resumed from {ckpt} (after step {start_step})")
    # rl.keep_best: the best validated model as of the resumed checkpoint (a pending one of a later
    # step is from steps that are now replayed, so it no longer stands)
    best = None
    if rl.keep_best:
        if rank == 0:
            settle_best(run.checkpoint_dir, ckpt)
        dist.barrier()
        best = read_best(run.checkpoint_dir)
    # Under ZeRO-3 the HF backend generates with a gathered copy of the policy: rollouts then run
    # no collectives, so ranks whose episodes take different numbers of turns and tokens never wait
    # on each other (one gather per step, on every rank, instead of one per generated token).
    generator = None
    if run.deepspeed.zero_stage == 3 and run.rollout.backend == "hf":
        generator, _ = load_model(policy_dir, DTYPES[run.dtype])
        generator.to(actor.device).eval().requires_grad_(False)
        generator.load_state_dict(full_state_dict(actor))
    backend = make_backend(generator if generator is not None else unwrap(actor), tokenizer)
    timed_pool = _TimedPool(pool)
    temperature = run.rollout.temperature if run.rollout.temperature > 0 else 1.0
    constrained = run.agent.decoding == "admissible"
    from_rollout = backend_logprobs_exact(backend) and run.deepspeed.zero_stage < 3  # pi_old: see phase 4

    def rewards_of(ep) -> list[float]:
        return turn_rewards(ep.score_deltas, ep.won, ep.invalid, ep.game.max_score, run.reward)

    turn_every = phase_steps(rl.turn_schedule_every, len(rl.turn_schedule), run.n_steps)
    curriculum_every = phase_steps(rl.curriculum_every, len(rl.curriculum), run.n_steps)

    bar = tqdm(total=run.n_steps, initial=start_step, desc="rl", disable=not progress or rank != 0)
    for step in range(start_step, run.n_steps):
        t0 = time.time()
        # 1. schedules
        max_turns = turn_limit(step, rl.turn_schedule, turn_every, run.rollout.max_turns)
        levels = curriculum_levels(step, rl.curriculum, curriculum_every, run.levels)
        # 2. rollouts: each rank its own games, seeded by (seed, step) so a resumed run replays the same draws
        candidates = [g for g in train_games if g.level in levels] or train_games
        games, rng = draw_games(candidates, rl.games_per_step, rl.seed, step, rank, dist.world_size())
        group_of = [g for g in range(len(games)) for _ in range(rl.group_size)]
        settings = RolloutSettings.from_agent(run.agent, max_turns, temperature, run.rollout.top_p,
                                              seed=rl.seed * 1_000_003 + step * 101 + rank)
        timed_pool.seconds = 0.0
        dapo_stats: dict[str, float] = {}
        if rl.dynamic_sampling:  # DAPO: replace groups whose rollouts all score alike (round r reseeds sampling)
            sample = dynamic_sampling(
                lambda gs, r: run_episodes(gs, backend, encoder, timed_pool, replace(settings, seed=settings.seed + 7919 * r)),
                games, lambda k: rng.choices(candidates, k=k), rl.group_size, rl.dynamic_sampling_max_games,
                lambda ep: sum(rewards_of(ep)))
            episodes, group_of, dapo_stats = sample.episodes, sample.group_of, sample.stats
            played, played_group_of = sample.played, sample.played_group_of
        else:
            episodes = run_episodes([games[g] for g in group_of], backend, encoder, timed_pool, settings)
            played, played_group_of = episodes, group_of
        t_rollout, t_env = time.time() - t0, timed_pool.seconds
        gen_tokens = sum(len(a) for ep in played for a in ep.action_ids)  # every round DAPO played, as timed
        # 3. batch
        t1 = time.time()
        rewards = [rewards_of(ep) for ep in episodes]
        batch = build_batch(episodes, rewards, group_of, encoder, vocab, constrained, actor.device)
        S = 0 if batch is None else batch.input_ids.shape[0]
        # every epoch's minibatches, drawn now (the same draws as one epoch at a time); a rank without
        # a batch still joins every collective with zero-weight dummy passes
        plan = [_minibatches(S, mb, rng, actor.device) for _ in range(rl.update_epochs)]
        stats: dict[str, float] = {}
        forwarded = {"policy": 0, "ref": 0, "critic": 0}
        t2 = time.time()
        # 4. old / reference log-probs, values. When the backend sampled with the policy's own fp32
        # weights (HF), the rollout's log-probs are pi_old as sampled and no pass recomputes them.
        # Otherwise they are recomputed: vLLM, bf16, and ZeRO-3 (without this pass 2 of 5 runs of the
        # 2-rank ZeRO-3 test aborted at exit; cause not found). The first minibatch's then come from its
        # own update pass (the weights have not changed yet, so pi_old = pi_theta there exactly and its
        # ratio is 1); only the KL-in-reward path needs them all before the advantages.
        idx = list(range(S))
        first = plan[0][0] if plan[0] else []
        reuse = set(first) if not from_rollout and not (ref is not None and rl.kl_in_reward) else set()
        rest = [] if from_rollout else [i for i in idx if i not in reuse]
        old_lp = ref_lp = old_values = kl = None
        checked = (None, [])  # (trainer log-probs at the rollout's weights, row j for sequence j of the list)
        policy = lambda m: lambda sel: policy_pass(m, batch, sel, temperature)  # noqa: E731
        chunks = _no_grad_chunks(policy(unwrap(actor)), rest, mb, actor.device, lambda: _dummy_policy_loss(unwrap(actor)))
        if batch is not None:
            mask = batch.action_mask
            old_lp = batch.rollout_logprobs.clone() if from_rollout else torch.zeros_like(mask)
            for k, (lp, _, fwd) in enumerate(chunks):
                old_lp[rest[k * mb : (k + 1) * mb]] = lp
                forwarded["policy"] += fwd
            if not from_rollout:
                checked = (old_lp, idx)
        if ref is not None:
            ref_chunks = _no_grad_chunks(policy(ref), idx, mb, actor.device, lambda: _dummy_policy_loss(ref))
            if batch is not None:
                ref_lp = torch.cat([lp for lp, _, _ in ref_chunks]) * mask
                forwarded["ref"] += sum(fwd for _, _, fwd in ref_chunks)
                if rl.kl_in_reward:
                    kl = kl_penalty(old_lp, ref_lp, rl.kl_estimator) * mask
        bootstrap = None
        if critic is not None:
            value_chunks = _no_grad_chunks(lambda sel: value_pass(unwrap(critic), batch, sel), idx, mb, actor.device,
                                           lambda: _dummy_value_loss(unwrap(critic)))
            with torch.no_grad():
                bootstrap = truncation_values(unwrap(critic), batch, rl.bootstrap_truncated)
            if batch is not None:
                old_values = torch.cat([v for v, _ in value_chunks]) * mask
                forwarded["critic"] += sum(fwd for _, fwd in value_chunks)
        t3 = time.time()
        # the batch whitening (reinforce_pp, ppo's rl.whiten_advantages) runs over every rank's batch
        reduce = dist.all_reduce_tensor if dist.world_size() > 1 else None
        if batch is None and reduce is not None:
            join_whitening(rl.algo, rl, reduce)
        if batch is not None:
            # 5. advantages on the episodes' action layout, back onto sequence tokens
            anchors = anchor_ids([episodes[i] for i in batch.kept], batch.ep_turn_mask.shape[1]) if rl.algo == "gigpo" else None
            if anchors is not None:
                stats.update(step_group_stats(batch.group_ids, anchors, batch.ep_turn_mask))
            adv_l, ret_l = compute_advantages(
                rl.algo,
                turn_rewards=batch.ep_turn_rewards,
                turn_mask=batch.ep_turn_mask,
                action_mask=batch.ep_action_mask,
                turn_ids=batch.ep_turn_ids,
                group_ids=batch.group_ids,
                cfg=rl,
                values=batch.to_layout(old_values) if old_values is not None else None,
                kl=batch.to_layout(kl) if kl is not None else None,
                bootstrap_values=bootstrap,
                anchor_ids=anchors,
                reduce=reduce,
            )
            advantages = batch.from_layout(adv_l)
            value_targets = batch.from_layout(ret_l) if ret_l is not None else None
        t4 = time.time()
        # 6. updates
        sums: dict[str, list[float]] = {}
        skipped = taken = 0
        kl_passed = False  # this rank's last minibatch measured approx_kl > rl.target_kl
        minibatches = [(epoch, k, sel) for epoch in range(rl.update_epochs) for k, sel in enumerate(plan[epoch])]
        for epoch, k, sel in minibatches:
            # the early stop is every rank's (one more collective a minibatch), decided before any
            # forward so that each rank runs the same forwards and backwards
            if rl.target_kl is not None and taken > 0 and dist.all_max(int(kl_passed), actor.device):
                break
            taken += 1
            # the policy steps unless no rank's minibatch has a gradient (then no rank steps: the
            # same collectives everywhere); the critic's value loss always has one
            local = bool(sel) and has_gradient(advantages[sel], mask[sel], rl, ref_lp is not None)
            update = not rl.skip_zero_gradient_steps or bool(dist.all_max(int(local), actor.device))
            skipped += not update
            # every rank's losses are means over its own tokens (or episodes): weighted into one mean
            # over all ranks' (DeepSpeed averages the gradients; see dist.global_mean_scale)
            scale = dist.global_mean_scale(aggregate_weight(mask[sel], rl.loss_agg, batch.share[sel]) if sel else 0.0)
            if not sel:  # zero-weight dummy: this rank has fewer sequences than the minibatch count
                if update:
                    actor.backward(_dummy_policy_loss(actor))
                    actor.step()
                else:
                    with torch.no_grad():
                        _dummy_policy_loss(actor)  # the forward its peers' forwards gather with
                if critic is not None:
                    critic.backward(_dummy_value_loss(critic))
                    critic.step()
                continue
            m, share = mask[sel], batch.share[sel]
            with torch.set_grad_enabled(update):
                new_lp, entropy, fwd = policy_pass(actor, batch, sel, temperature, with_entropy=True,
                                                   entropy_grad=rl.entropy_coef != 0)
            forwarded["policy"] += fwd
            if epoch == 0 and k == 0 and reuse:
                old_lp[sel] = new_lp.detach()
            if epoch == 0 and k == 0 and from_rollout:
                checked = (new_lp.detach(), sel)
            pg_loss, pg_stats = policy_loss(new_lp, old_lp[sel], advantages[sel], m, rl.clip_eps, rl.loss_agg, share)
            kl_passed = rl.target_kl is not None and float(pg_stats["approx_kl"]) > rl.target_kl
            entropy_loss = aggregate(entropy, m, rl.loss_agg, share)
            kl_loss = torch.zeros(())
            if ref_lp is not None and not rl.kl_in_reward:
                kl_loss = aggregate(kl_penalty(new_lp, ref_lp[sel], rl.kl_estimator), m, rl.loss_agg, share)
            loss = pg_loss + rl.kl_coef * kl_loss - rl.entropy_coef * entropy_loss
            if update:
                actor.backward(loss * scale)
                actor.step()
            mb_stats = {"losses/policy": pg_loss.item(), "losses/entropy": entropy_loss.item(),
                        "losses/kl": kl_loss.item(), **{f"losses/{k}": float(v) for k, v in pg_stats.items()}}
            if critic is not None:
                new_values, fwd = value_pass(critic, batch, sel)
                forwarded["critic"] += fwd
                v_loss, v_stats = value_loss(new_values, old_values[sel], value_targets[sel], m, rl.value_clip,
                                             rl.loss_agg, share)
                critic.backward(rl.vf_coef * v_loss * scale)
                critic.step()
                mb_stats["losses/value"] = v_loss.item()
                mb_stats.update({f"losses/{k}": float(v) for k, v in v_stats.items()})
            for key, v in mb_stats.items():
                sums.setdefault(key, []).append(v)
        t5 = time.time()
        stats.update({k: sum(v) / len(v) for k, v in sums.items()})
        stats["losses/skipped_steps"] = skipped / max(1, len(minibatches))
        stats["losses/early_stopped"] = 1.0 - taken / max(1, len(minibatches))
        if batch is not None:
            if checked[1]:  # every sequence when recomputed, else the first minibatch (its update pass)
                trainer_lp, seqs = checked  # row j of trainer_lp is sequence seqs[j]
                stats["rollout/logprob_mismatch"] = float(masked_mean(
                    (trainer_lp - batch.rollout_logprobs[seqs]).abs(), mask[seqs]))
            if old_values is not None and value_targets is not None:
                stats["losses/explained_variance"] = float(explained_variance(old_values, value_targets, mask))
            actions = float(mask.sum())
            plain = batch.input_ids.numel()  # what one pass over the padded per-sequence batch forwards
            stats.update({
                "perf/train_tokens_per_s": float(batch.attention_mask.sum()) * rl.update_epochs / max(t5 - t4, 1e-9),
                "perf/forwarded_per_action_token": sum(forwarded.values()) / actions,
                "perf/policy_forwarded_per_action_token": forwarded["policy"] / actions,
                "perf/policy_forwarded_per_action_token_unpacked": plain * (1 + rl.update_epochs) / actions,
            })
        # 7. log and checkpoint
        played_rewards = rewards if played is episodes else [rewards_of(ep) for ep in played]
        stats.update(rollout_stats(played, played_rewards, played_group_of, rl.group_size))
        stats.update(dapo_stats)
        counts["played"] += int(dist.all_sum(stats["rollout/episodes"]))
        counts["failed"] += int(dist.all_sum(stats["rollout/failed_episodes"]))
        stats.update({"rollout/episodes_total": float(counts["played"]), "rollout/failed_total": float(counts["failed"])})
        stats.update({
            "schedule/max_turns": float(max_turns),
            "perf/gen_tokens_per_s": gen_tokens / max(t_rollout - t_env, 1e-9),
            "perf/rollout_seconds": t_rollout,
            "perf/generation_seconds": t_rollout - t_env,
            "perf/env_seconds": t_env,
            "perf/batch_seconds": t2 - t1,
            "perf/logprob_seconds": t3 - t2,
            "perf/advantage_seconds": t4 - t3,
            "perf/update_seconds": t5 - t4,
        })
        # the next rollouts sample from the updated policy (all ranks: ZeRO-3 gathers)
        if generator is not None:
            generator.load_state_dict(full_state_dict(actor))
            backend.update_weights(generator)
        else:
            backend.update_weights(actor)
        stats["perf/step_seconds"] = time.time() - t0
        if valid_games and is_validation_step(step + 1, rl.eval_every, run.n_steps):
            t6 = time.time()
            valid = validation_stats(valid_games, backend, encoder, timed_pool, run.agent, run.rollout.max_turns)
            # every rank plays the valid games; their mean, so that all ranks take the same keep_best
            # decision (save_best is collective under ZeRO-3: ranks that disagreed waited for good)
            stats.update({k: dist.all_sum(v) / dist.world_size() for k, v in valid.items()})
            stats["perf/validation_seconds"] = time.time() - t6
            if rl.keep_best:
                if is_better(stats, best):
                    save_best(run.checkpoint_dir, step + 1, actor, tokenizer, stats)
                    best = {"step": step + 1, "valid/success": stats["valid/success"], "valid/score": stats["valid/score"]}
                stats["valid/best_step"] = float(best["step"])
        counts["seconds"] += time.time() - t0  # the step, validation included
        stats["perf/total_seconds"] = counts["seconds"]  # the run's training time so far, across resumes
        if log is not None:
            log(step + 1, stats)
        bar.update(1)
        bar.set_postfix(success=f"{stats['rollout/success']:.2f}", turns=max_turns)
        if (step + 1) % rl.checkpoint_every == 0 or step + 1 == run.n_steps:
            t_save = time.time()
            save_rl_checkpoint(run.checkpoint_dir, step + 1, actor, critic, tokenizer, run.fingerprint, counts)
            counts["seconds"] += time.time() - t_save  # in the next checkpoint's tally
    bar.close()
    return actor, tokenizer, start_step
