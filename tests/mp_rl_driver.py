"""Driver for tests/test_multiprocess.py: RL steps under torchrun, then every rank writes its weights.

    torchrun --nproc_per_node 2 tests/mp_rl_driver.py --policy DIR --out OUT --train 0 none 2 --train 3 1e-6 3

Rank 0 plays one-turn games, rank 1 four-turn games cut at three turns (so the ranks hold
different numbers of training sequences), and at step 2 every reset on rank 1 fails (it has no
batch at all that step). PPO with a critic, a reference model (KL loss), advantages whitened over
both ranks' batches (params/rl/ppo.yaml; the rank without a batch joins the whitening's
collectives) and two or more update epochs, so every kind of pass runs; a TARGET_KL adds the early stop, which every rank must take
at the same minibatch. Each `--train ZERO_STAGE TARGET_KL UPDATE_EPOCHS` (TARGET_KL `none`: off) trains
from the same policy, one after the other in the same processes (one launch, one import of
torch and DeepSpeed); each rank saves run i's gathered actor weights, failed-episode counts
and early stops as OUT/run{i}/rank{R}.pt.
"""

from __future__ import annotations

import argparse
import gc
import os
from pathlib import Path

import torch

from agentrecipe.config import AgentConfig, DeepSpeedConfig, RewardConfig, RLConfig, RolloutConfig
from agentrecipe.envs import registry
from agentrecipe.envs.pool import EnvPool
from agentrecipe.rollout.hf_backend import HFBackend
from agentrecipe.train.checkpoint import full_state_dict
from agentrecipe.train.rl import RLRun, rl_train
from stages.rl import failure_guard
from tests import walk_env


class FailingResets:
    """A pool whose resets all fail on call number `fail_call` (0-based)."""

    def __init__(self, pool, fail_call: int | None):
        self.pool, self.fail_call, self.calls = pool, fail_call, 0
        self.last_errors: dict = {}

    def reset(self, games):
        call, self.calls = self.calls, self.calls + 1
        if call == self.fail_call:
            self.last_errors = {i: "injected failure" for i in range(len(games))}
            return [None] * len(games)
        return self.pool.reset(games)

    def __getattr__(self, name):
        return getattr(self.pool, name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--policy", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--train", nargs=3, action="append", required=True, metavar=("ZERO_STAGE", "TARGET_KL", "UPDATE_EPOCHS"),
                   help="one training run; TARGET_KL is rl.target_kl or none (with it the ranks stop at different minibatches)")
    args = p.parse_args()
    torch.set_num_threads(1)
    registry.FAMILIES["walk"] = "tests.walk_env"
    for i, (zero_stage, target_kl, update_epochs) in enumerate(args.train):
        out = Path(args.out) / f"run{i}"
        out.mkdir(parents=True, exist_ok=True)
        train(args.policy, out, int(zero_stage), None if target_kl == "none" else float(target_kl), int(update_epochs))


def train(policy: str, out: Path, zero_stage: int, target_kl: float | None, update_epochs: int) -> None:
    rank = int(os.environ.get("RANK", "0"))
    seeds = [0, 4, 8, 12] if rank == 0 else [3, 7, 11, 15]  # 1 turn to win / 4 turns (truncated at 3)
    games = walk_env.build_games("walk", "train", seeds, "", {})
    rl = RLConfig(algo="ppo", lr=1e-2, critic_lr=1e-2, group_size=1, games_per_step=2, minibatch_size=2,
                  update_epochs=update_epochs, kl_coef=0.05, checkpoint_every=1000, seed=0, target_kl=target_kl,
                  whiten_advantages=True)
    run = RLRun(rl=rl, reward=RewardConfig(step_penalty=0.1), agent=AgentConfig(history=2, max_action_tokens=6),
                rollout=RolloutConfig(max_turns=3), deepspeed=DeepSpeedConfig(zero_stage=zero_stage), dtype="float32",
                levels=["walk"], n_steps=3, checkpoint_dir=out / f"ckpt{rank}", fingerprint="mp")
    log = []
    # the stage's failure guard at 0.3: rank 1 alone failed 2 of its 4 episodes by step 2 (0.5), the
    # run 2 of 8 (0.25), so the run goes on (a rank that decided alone exited and hung its peer)
    guarded = failure_guard(lambda step, stats: log.append(stats), 0.3)
    with EnvPool("walk", {}, n_workers=0) as pool:
        actor, _, _ = rl_train(policy, games, run, FailingResets(pool, 1 if rank == 1 else None),
                               lambda m, t: HFBackend(m, t.pad_token_id, t.eos_token_id), log=guarded, progress=False)
    state = full_state_dict(actor)  # every rank takes part (ZeRO-3 gathers)
    torch.save({"actor": state, "failed": [s["rollout/failed_episodes"] for s in log],
                "early_stopped": [s["losses/early_stopped"] for s in log]}, out / f"rank{rank}.pt")
    print(f"rank {rank}: zero {zero_stage}, target_kl {target_kl}, failed episodes per step {[s['rollout/failed_episodes'] for s in log]}, "
          f"approx_kl {[s.get('losses/approx_kl') for s in log]}, early stopped {[s['losses/early_stopped'] for s in log]}",
          flush=True)


if __name__ == "__main__":
    gc.freeze()  # the imports: out of every collection, at exit too (as in stages/__init__.py)
    main()
