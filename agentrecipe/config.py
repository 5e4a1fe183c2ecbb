"""Typed configuration: one dataclass per params.yaml section.

`load_config(path, sections)` reads params.yaml, checks every key and type of
the requested sections against these dataclasses and returns them. An unknown
or mistyped key raises `ConfigError` naming the key and the file, before any
work starts. Inter-field checks live in each dataclass's `__post_init__`.

Values live in params/ only: a dataclass states each setting's type, a line of
doc and its checks, and `params_section` takes its defaults from the default
recipe that params/ composes (what `dvc repro` runs), so `RLConfig(lr=1e-3)` is
the default recipe's rl section with one value changed.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
import types
import typing
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

import yaml

from agentrecipe.schedules import unreached_phases

FAMILY_OPTION_BLOCKS = ("alfworld", "swe")
"""Environment families with an options block of their own under env (env.alfworld, env.swe)."""

PARAMS_DIR = Path(__file__).resolve().parents[1] / "params"
"""The Hydra tree of the recipes; its default composition holds every setting's default value."""


class ConfigError(ValueError):
    """A params file has an unknown, missing or mistyped key."""


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {msg}")


# ------------------------------------------------------------------- validation
def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`; return it (ints widen to floats)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        for arm in args:
            try:
                return _coerce(value, arm, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if tp is type(None):
        _check(value is None, key, f"expected null, got {value!r}")
        return None
    if origin is Literal:
        _check(value in args, key, f"must be one of {list(args)}, got {value!r}")
        return value
    if origin is list:
        _check(isinstance(value, list), key, f"expected a list, got {value!r}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)] if args else value
    if origin is dict:
        _check(isinstance(value, dict), key, f"expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        _check(isinstance(value, bool), key, f"expected true/false, got {value!r}")
        return value
    if tp is int:
        _check(isinstance(value, int) and not isinstance(value, bool), key, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        _check(isinstance(value, (int, float)) and not isinstance(value, bool), key, f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        _check(isinstance(value, str), key, f"expected a string, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key)
    raise TypeError(f"unsupported config annotation {tp!r} for {key}")


@functools.cache
def default_params() -> dict[str, Any]:
    """The default recipe: params/ composed with no overrides (what params.yaml holds after `make params`)."""
    from agentrecipe.params import compose

    return compose(PARAMS_DIR)


def params_section(section: str):
    """`@dataclass` for a params section, its field defaults taken from `default_params()[section]`
    (lists and dicts copied per instance). A field without a value there fails at import."""

    def wrap(cls: type) -> type:
        values = default_params()[section]
        hints = typing.get_type_hints(cls)
        for name in cls.__annotations__:
            if name not in values:
                raise TypeError(f"{cls.__name__}.{name}: no default in {PARAMS_DIR} (section {section!r})")
            value = _coerce(values[name], hints[name], f"{section}.{name}")
            if isinstance(value, (list, dict)):
                setattr(cls, name, field(default_factory=functools.partial(copy.deepcopy, value)))
            else:
                setattr(cls, name, value)
        return dataclass(cls)

    return wrap


# --------------------------------------------------------------------------- env
REMOTE_URL = re.compile(r"^https?://[^/\s:]+(:\d+)?/?$")


@params_section("env")
class EnvConfig:
    """Which games the curriculum build makes and how environments are run."""

    name: str
    """Environment family (agentrecipe/envs/registry.py FAMILIES)."""
    levels: list[str]
    """Levels trained on (train, valid and test games are built for each)."""
    ood_levels: list[str]
    """Harder, held-out levels (only test games are built)."""
    n_train: int
    """Train games per level."""
    n_valid: int
    """Validation games per level."""
    n_test: int
    """Test games per level."""
    seed_train: int
    """First seed of the train split (game i of a level uses seed_train + i)."""
    seed_valid: int
    seed_test: int
    test_draw: int
    """Which n_test test games: test game i has seed seed_test + test_draw * n_test + i. Follows the
    run's `seed`, so the seeds of a sweep are tested on distinct games (0: the first n_test)."""
    workers: int
    """Processes that build games / step environments in parallel."""
    step_timeout: float
    """Seconds before a hung environment is killed and its episode failed."""
    alfworld: dict[str, Any]
    """ALFWorld-only options (see params/env/alfworld.yaml)."""
    swe: dict[str, Any]
    """SWE-task-only options (see params/env/swe.yaml and agentrecipe.envs.swe.DEFAULTS)."""
    remote: list[str]
    """Environment servers (`agentrecipe serve-env`) to play through instead of local workers, e.g.
    [http://127.0.0.1:8765]; episodes spread over them. Empty: local worker processes."""

    def split_seeds(self) -> dict[str, range]:
        """The game seeds of each split: seed_S + i, the test split's shifted by test_draw draws of n_test."""
        test = self.seed_test + self.test_draw * self.n_test
        return {"train": range(self.seed_train, self.seed_train + self.n_train),
                "valid": range(self.seed_valid, self.seed_valid + self.n_valid), "test": range(test, test + self.n_test)}

    @property
    def family_options(self) -> dict[str, Any]:
        """Options handed to the environment family (build_games / make_env): its own block, if it has one."""
        return dict(getattr(self, self.name)) if self.name in FAMILY_OPTION_BLOCKS else {}

    def __post_init__(self) -> None:
        _check(len(self.levels) > 0, "env.levels", "needs at least one level")
        for key in ("n_train", "n_valid", "n_test", "seed_train", "seed_valid", "seed_test", "test_draw"):
            _check(getattr(self, key) >= 0, f"env.{key}", f"must be >= 0, got {getattr(self, key)}")
        _check(self.n_test >= 1, "env.n_test", "must be >= 1: evaluation needs test games of every level")
        for family_name in FAMILY_OPTION_BLOCKS:
            _check(self.name == family_name or not getattr(self, family_name), f"env.{family_name}",
                   f"options of the {family_name} family, but env.name is {self.name}: they would be ignored")
        _check(self.workers >= 1, "env.workers", "must be >= 1")
        _check(self.step_timeout > 0, "env.step_timeout", "must be > 0")
        for url in self.remote:
            _check(isinstance(url, str) and bool(REMOTE_URL.match(url)), "env.remote",
                   f"{url!r} is not a server URL; use http://HOST:PORT (what `agentrecipe serve-env` prints)")
        # Levels (and options) are checked by the family itself: one grammar per family.
        from agentrecipe.envs.registry import get_family

        try:
            family = get_family(self.name)
        except ValueError as e:
            raise ConfigError(f"env.name: {e}") from None
        for key in ("levels", "ood_levels"):
            for lvl in getattr(self, key):
                try:
                    family.check_level(lvl)
                except ValueError as e:
                    raise ConfigError(f"env.{key}: {e}") from None
        same = getattr(family, "level_key", str)  # one name per set of games (`simple` = `simple-dense-detailed`)
        for key in ("levels", "ood_levels"):
            keys = [same(lvl) for lvl in getattr(self, key)]
            twice = sorted({lvl for lvl in getattr(self, key) if keys.count(same(lvl)) > 1})
            _check(not twice, f"env.{key}", f"{', '.join(twice)} listed twice (names of the same games): its games "
                   "would be built, trained on and tested twice")
        in_domain = {same(lvl) for lvl in self.levels}
        both = sorted(lvl for lvl in self.ood_levels if same(lvl) in in_domain)
        _check(not both, "env.ood_levels", f"{', '.join(both)} also in env.levels (or the same games under another "
               "name): out-of-domain levels are never trained on, and a level in both would have each test game "
               "played and counted twice")
        if hasattr(family, "options_of"):
            try:
                family.options_of(self.family_options)
            except ValueError as e:
                raise ConfigError(str(e)) from None
        # Seed ranges of the splits must never overlap.
        ranges = sorted((r.start, r.stop, split) for split, r in self.split_seeds().items())
        for (a0, a1, sa), (b0, _, sb) in zip(ranges, ranges[1:]):
            _check(a1 <= b0, f"env.seed_{sb}", f"seed range of {sa} [{a0}, {a1}) overlaps {sb} starting at {b0}" + (
                f" (test seeds start at env.seed_test + env.test_draw x env.n_test = {self.seed_test} + "
                f"{self.test_draw} x {self.n_test}; env.test_draw follows the run's `seed`)" if "test" in (sa, sb) else ""))


# ------------------------------------------------------------------------- model
@params_section("model")
class ModelConfig:
    """The base model: `tiny` (built from these sizes), `smollm2-135m` (bundled), or `hf`."""

    name: Literal["tiny", "smollm2-135m", "hf"]
    path: str
    """For `hf`: a Hugging Face model id or a local folder."""
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    vocab_size: int
    """Tokenizer vocabulary (tiny: byte-level BPE trained on the train games)."""
    max_position: int
    dtype: Literal["float32", "bfloat16", "float16"]
    seed: int

    def __post_init__(self) -> None:
        for key in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "vocab_size", "max_position"):
            _check(getattr(self, key) > 0, f"model.{key}", "must be > 0")
        _check(self.hidden_size % self.num_heads == 0, "model.hidden_size", "must be divisible by model.num_heads")
        _check(self.name != "hf" or bool(self.path), "model.path", "model=hf needs model.path (an HF id or folder)")


# ------------------------------------------------------------------------- agent
@params_section("agent")
class AgentConfig:
    """How the policy sees the game and how its reply becomes an action."""

    show_admissible: bool
    """List the admissible commands in each observation."""
    history: int
    """Past turns kept in the prompt: -1 keeps all turns (one growing sequence)."""
    decoding: Literal["free", "admissible"]
    """`free`: generate until end of turn; `admissible`: constrain to admissible commands."""
    max_action_tokens: int
    """Most tokens one reply may have."""
    max_context: int
    """Most tokens of one prompt + reply; an episode that outgrows it ends (truncated)."""

    def __post_init__(self) -> None:
        _check(self.history == -1 or self.history >= 0, "agent.history", "must be -1 (all) or >= 0")
        _check(self.max_action_tokens > 0, "agent.max_action_tokens", "must be > 0")
        _check(self.max_context > self.max_action_tokens, "agent.max_context", "must exceed agent.max_action_tokens")


# ------------------------------------------------------------------------ budget
@params_section("budget")
class BudgetConfig:
    """Fixed interaction budget split between demonstrations and RL episodes."""

    total_units: int
    """Budget in RL-episode units."""
    demo_cost: int
    """One demonstration costs as many units as this many RL episodes."""
    sft_fraction: float
    """Share of the budget spent on demonstrations (0 = pure RL, 1 = pure SFT)."""

    def __post_init__(self) -> None:
        _check(self.total_units >= 0, "budget.total_units", "must be >= 0")
        _check(self.demo_cost >= 1, "budget.demo_cost", "must be >= 1")
        _check(0.0 <= self.sft_fraction <= 1.0, "budget.sft_fraction", "must be in [0, 1]")

    @property
    def n_demos(self) -> int:
        """Demonstrations bought: floor(total * fraction / demo_cost), in exact arithmetic on the fraction
        as written (in floats 100 * 0.29 = 28.999..., one demonstration short)."""
        return int(Fraction(repr(self.sft_fraction)) * self.total_units // self.demo_cost)

    @property
    def rl_episodes(self) -> int:
        """Episodes left for RL after paying for the demonstrations; none at sft_fraction 1 (pure SFT:
        units too few for one more demonstration stay unspent, not a stray RL step)."""
        return 0 if self.sft_fraction == 1 else self.total_units - self.n_demos * self.demo_cost

    def rl_steps(self, episodes_per_step: int, world_size: int = 1) -> int:
        """RL steps the budget pays for: rl_episodes / (episodes_per_step * ranks), rounded down (every
        rank plays its own rl.games_per_step x rl.group_size episodes a step; the rest stays unspent)."""
        return self.rl_episodes // (episodes_per_step * world_size)

    def no_rl_step(self, episodes_per_step: int, world_size: int = 1) -> str | None:
        """An error (for key budget.sft_fraction) when a split meant to have RL buys no RL step at
        `world_size` ranks; None when it buys one, or is pure SFT."""
        if self.sft_fraction == 1 or self.rl_steps(episodes_per_step, world_size) > 0:
            return None
        return (f"leaves {self.rl_episodes} RL episodes, less than one step of {episodes_per_step} "
                f"(rl.games_per_step x rl.group_size) x {world_size} rank(s): this point would have no RL; "
                "lower it or set 1 (or raise budget.total_units, or use fewer ranks)")


# --------------------------------------------------------------------- deepspeed
@params_section("deepspeed")
class DeepSpeedConfig:
    """Engine settings shared by SFT and RL (the engine's bf16 / fp16 mode follows model.dtype)."""

    zero_stage: int
    offload_optimizer: bool
    torch_adam: bool
    """Use torch's Adam instead of compiling DeepSpeed's fused op."""
    gradient_checkpointing: bool
    """Recompute each layer's activations in the backward pass instead of keeping them (the model's
    own gradient checkpointing, non-reentrant; policy, critic and SFT): activation memory of about
    one layer instead of all of them, for about one more forward per update."""

    def __post_init__(self) -> None:
        _check(self.zero_stage in (0, 1, 2, 3), "deepspeed.zero_stage", "must be 0, 1, 2 or 3")
        _check(not self.offload_optimizer or self.zero_stage >= 1, "deepspeed.offload_optimizer",
               "needs deepspeed.zero_stage >= 1 (ZeRO's optimizer offloads; at stage 0 nothing would be)")


# --------------------------------------------------------------------------- sft
@params_section("sft")
class SFTConfig:
    lr: float
    epochs: int
    batch_size: int
    warmup_steps: int
    weight_decay: float
    max_grad_norm: float
    seed: int

    def __post_init__(self) -> None:
        _check(self.lr > 0, "sft.lr", "must be > 0")
        _check(self.epochs >= 1, "sft.epochs", "must be >= 1")
        _check(self.batch_size >= 1, "sft.batch_size", "must be >= 1")
        _check(self.warmup_steps >= 0, "sft.warmup_steps", "must be >= 0")
        _check(self.weight_decay >= 0, "sft.weight_decay", "must be >= 0")
        _check(self.max_grad_norm >= 0, "sft.max_grad_norm", "must be >= 0 (0: no clipping)")


# ---------------------------------------------------------------------- rollout
@params_section("rollout")
class RolloutConfig:
    backend: Literal["hf", "vllm"]
    temperature: float
    top_p: float
    max_turns: int
    """Turn limit of RL rollouts when no schedule applies, and of RL's validation episodes (`valid/*`,
    keep_best). Evaluation plays eval.max_turns (changing it retrains nothing)."""

    def __post_init__(self) -> None:
        _check(self.temperature >= 0, "rollout.temperature", "must be >= 0")
        _check(0 < self.top_p <= 1, "rollout.top_p", "must be in (0, 1]")
        _check(self.top_p == 1, "rollout.top_p",
               "must be 1 for RL: training log-probs use the whole (admissible-renormalised) distribution, so "
               "nucleus sampling would make every update off-policy; use rollout.temperature to sharpen instead")
        _check(self.max_turns >= 1, "rollout.max_turns", "must be >= 1")


# ------------------------------------------------------------------------ reward
@params_section("reward")
class RewardConfig:
    mode: Literal["sparse", "dense"]
    """sparse: 1 on a won last turn; dense: score change each turn."""
    normalize: bool
    """Dense only: divide score changes by the game's max score."""
    step_penalty: float
    invalid_penalty: float

    def __post_init__(self) -> None:
        _check(self.step_penalty >= 0, "reward.step_penalty", "is a magnitude, must be >= 0")
        _check(self.invalid_penalty >= 0, "reward.invalid_penalty", "is a magnitude, must be >= 0")


# ---------------------------------------------------------------------------- rl
@params_section("rl")
class RLConfig:
    algo: Literal["ppo", "grpo", "rloo", "reinforce_pp", "gigpo"]
    lr: float
    critic_lr: float
    group_size: int
    """Rollouts per game (G) for group baselines."""
    games_per_step: int
    update_epochs: int
    minibatch_size: int
    clip_eps: float
    kl_coef: float
    kl_estimator: Literal["k1", "k3"]
    kl_in_reward: bool
    entropy_coef: float
    gamma: float
    lam: float
    discount: Literal["token", "turn"]
    """Unit that gamma (and PPO's lam) apply once per, for every estimator that discounts: each action token,
    or each turn (grpo/rloo on episode returns do not discount: gamma must be 1 there)."""
    whiten_advantages: bool
    """PPO only: whiten the GAE advantages over the step batch (veRL; CleanRL per minibatch)."""
    bootstrap_truncated: bool
    """PPO: an episode cut by the turn limit bootstraps from V(s_H) (true) or ends with value 0 like
    one the game ended (false, the default: the limit is part of the task; see params/rl/grpo.yaml).
    One cut by the context limit ends at value 0 either way: its next prompt does not fit."""
    vf_coef: float
    value_clip: float
    turn_level_returns: bool
    gigpo_episode_weight: float
    """GiGPO: weight w_E of the episode-level group advantage."""
    gigpo_step_weight: float
    """GiGPO: weight w_S of the step-level (anchor-state group) advantage (the paper's omega)."""
    gigpo_norm: Literal["std", "none"]
    """GiGPO: divide both terms by their group's std ('std') or not ('none', verl-agent mean_norm)."""
    dynamic_sampling: bool
    """DAPO dynamic sampling: drop zero-variance groups and play more games until games_per_step remain."""
    dynamic_sampling_max_games: int
    """Cap on the extra games (each group_size rollouts) one step may play for dynamic sampling."""
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
    max_grad_norm: float
    target_kl: float | None
    """Early stop of a step's updates (CleanRL, Spinning Up): once a minibatch's approx_kl against the
    rollout policy passes this, the step takes no further minibatches (policy and critic). null: off."""
    skip_zero_gradient_steps: bool
    """No policy optimizer step on a minibatch whose loss has no gradient (every advantage 0, no KL or
    entropy term): Adam's momentum would move the weights anyway. false: the step is taken, as before 992e491."""
    turn_schedule: list[int]
    """ScalingInter-RL turn limits, e.g. [6, 10, 14]; empty = rollout.max_turns throughout."""
    turn_schedule_every: int
    """Steps spent at each turn limit before moving up; 0: floor(run steps / limits) each, the last limit the rest."""
    curriculum: list[list[str]]
    """Levels sampled in each curriculum phase; empty = env.levels throughout."""
    curriculum_every: int
    """Steps spent in each curriculum phase; 0: floor(run steps / phases) each, the last phase the rest."""
    checkpoint_every: int
    eval_every: int
    """Greedy episodes on the valid split every this many steps (and after the last): `valid/*` curves. 0: off."""
    keep_best: bool
    """Export the model of the best validation (valid success, then score; the earlier on a tie) instead
    of the last step's."""
    max_failed_share: float
    """The run stops once more than this share of its episodes failed (broken games or environments)."""
    seed: int

    def __post_init__(self) -> None:
        _check(self.lr > 0, "rl.lr", "must be > 0")
        _check(self.group_size >= 1, "rl.group_size", "must be >= 1")
        _check(
            self.algo not in ("grpo", "rloo", "gigpo") or self.group_size >= 2,
            "rl.group_size",
            f"{self.algo} needs a group of at least 2 rollouts per game",
        )
        _check(self.games_per_step >= 1, "rl.games_per_step", "must be >= 1")
        _check(self.minibatch_size >= 1, "rl.minibatch_size", "must be >= 1")
        _check(self.update_epochs >= 1, "rl.update_epochs", "must be >= 1")
        _check(self.clip_eps > 0, "rl.clip_eps", "must be > 0")
        _check(self.target_kl is None or self.target_kl > 0, "rl.target_kl", "must be > 0, or null for no early stop")
        _check(not (self.algo == "ppo" and self.turn_level_returns), "rl.turn_level_returns",
               "is for group methods and REINFORCE++; PPO's GAE already assigns credit per token")
        _check(not (self.algo == "gigpo" and self.turn_level_returns), "rl.turn_level_returns",
               "gigpo's step-level term is per turn already; leave turn_level_returns false")
        _check(not self.whiten_advantages or self.algo == "ppo", "rl.whiten_advantages",
               "is for ppo; grpo/rloo/gigpo normalise per group and reinforce_pp whitens already")
        _check(not self.dynamic_sampling or self.group_size >= 2, "rl.dynamic_sampling",
               "drops groups whose rollouts all score alike: needs rl.group_size >= 2")
        _check(not self.dynamic_sampling or (self.algo in ("grpo", "rloo") and not self.turn_level_returns),
               "rl.dynamic_sampling",
               "is for grpo and rloo on episode returns, where a group whose returns are equal has zero "
               f"advantage; {self.algo}{' with turn_level_returns' if self.turn_level_returns else ''} "
               "learns from such groups too (per-turn or step returns, a critic or a batch baseline), "
               "and dropping them would throw that signal away")
        _check(not (self.dynamic_sampling and self.kl_in_reward and self.kl_coef > 0), "rl.dynamic_sampling",
               "with rl.kl_in_reward (and kl_coef > 0) each episode's advantage carries its own KL penalty, so "
               "a group whose task returns are equal still has a signal, and dropping it would throw that away")
        _check(self.kl_coef >= 0, "rl.kl_coef", "must be >= 0 (a negative coefficient rewards moving away)")
        _check(self.kl_coef == 0 or self.kl_in_reward or self.kl_estimator != "k1", "rl.kl_estimator",
               "k1 (log pi - log pi_ref) in the loss has zero expected gradient on the policy's own samples, "
               "so the penalty would not pull the policy back; use k3 in the loss, or k1 with rl.kl_in_reward")
        _check(self.algo != "ppo" or (self.critic_lr > 0 and self.vf_coef > 0), "rl.critic_lr",
               "ppo trains a critic: rl.critic_lr and rl.vf_coef must be > 0")
        _check(not self.bootstrap_truncated or self.algo == "ppo", "rl.bootstrap_truncated",
               f"bootstraps from the critic's value; {self.algo} has no critic")
        _check(self.gamma == 1 or self.algo not in ("grpo", "rloo") or self.turn_level_returns, "rl.gamma",
               f"{self.algo} compares episode returns R = sum of rewards, which gamma does not touch; "
               "set rl.turn_level_returns=true for discounted per-turn returns, or leave gamma at 1")
        _check(self.dynamic_sampling_max_games >= 0, "rl.dynamic_sampling_max_games", "must be >= 0")
        _check(0 <= self.gamma <= 1 and 0 <= self.lam <= 1, "rl.gamma", "gamma and lam must lie in [0, 1]")
        _check(all(t >= 1 for t in self.turn_schedule), "rl.turn_schedule", "turn limits must be >= 1")
        _check(all(len(phase) > 0 for phase in self.curriculum), "rl.curriculum",
               "a phase needs at least one level (an empty one would sample every level)")
        for key in ("entropy_coef", "vf_coef", "gigpo_episode_weight", "gigpo_step_weight", "max_grad_norm"):
            _check(getattr(self, key) >= 0, f"rl.{key}", "must be >= 0" + (" (0: no clipping)" if key == "max_grad_norm" else ""))
        _check(self.turn_schedule_every >= 0, "rl.turn_schedule_every", "must be >= 0 (0: phases split the run)")
        _check(self.curriculum_every >= 0, "rl.curriculum_every", "must be >= 0 (0: phases split the run)")
        _check(self.checkpoint_every >= 1, "rl.checkpoint_every", "must be >= 1")
        _check(self.eval_every >= 0, "rl.eval_every", "must be >= 0 (0 turns validation off)")
        _check(0 <= self.max_failed_share <= 1, "rl.max_failed_share", "must be in [0, 1]")
        _check(not self.keep_best or self.eval_every > 0, "rl.keep_best",
               "keeps the best validated model: needs rl.eval_every > 0")

    @property
    def episodes_per_step(self) -> int:
        return self.group_size * self.games_per_step


# -------------------------------------------------------------------------- eval
@params_section("eval")
class EvalConfig:
    episodes: int
    """Test games per level evaluated (at most env.n_test)."""
    pass_k: list[int]
    samples: int
    """Sampled episodes per game for pass@k (needs samples >= max(pass_k))."""
    temperature: float
    max_turns: int
    transcripts: int
    """Full transcripts written per policy and level."""
    max_failed_share: float
    """The evaluation fails when more than this share of a policy's episodes failed (broken games)."""
    seed: int

    def __post_init__(self) -> None:
        _check(self.episodes >= 1, "eval.episodes", "must be >= 1")
        _check(0 <= self.max_failed_share <= 1, "eval.max_failed_share", "must be in [0, 1]")
        _check(all(k >= 1 for k in self.pass_k), "eval.pass_k", "k must be >= 1")
        _check(self.samples >= max(self.pass_k, default=1), "eval.samples", "must be >= max(eval.pass_k)")
        _check(self.temperature >= 0, "eval.temperature", "must be >= 0 (0: sampled episodes are not played)")
        _check(self.max_turns >= 1, "eval.max_turns", "must be >= 1")
        _check(self.transcripts >= 0, "eval.transcripts", "must be >= 0")


SECTIONS: dict[str, type] = {
    "env": EnvConfig,
    "model": ModelConfig,
    "agent": AgentConfig,
    "budget": BudgetConfig,
    "deepspeed": DeepSpeedConfig,
    "sft": SFTConfig,
    "rollout": RolloutConfig,
    "reward": RewardConfig,
    "rl": RLConfig,
    "eval": EvalConfig,
}


ROOT_KEYS: dict[str, type] = {"seed": int}
"""Scalars at the top of params.yaml beside the sections: `seed`, which params/ interpolates into
model.seed, sft.seed, rl.seed and eval.seed (stages read those)."""


def from_dict(cls: type, data: Any, prefix: str) -> Any:
    """Build dataclass `cls` from a mapping, refusing unknown or mistyped keys."""
    if data is None:
        data = {}
    _check(isinstance(data, dict), prefix, f"expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if key not in names:
            raise ConfigError(f"{prefix}.{key}: unknown key (known: {', '.join(sorted(names))})")
    kwargs = {k: _coerce(v, hints[k], f"{prefix}.{k}") for k, v in data.items()}
    return cls(**kwargs)


def parse_config(raw: dict[str, Any], sections: list[str] | None = None, source: str = "params") -> dict[str, Any]:
    """Validate a composed params mapping; return {section: dataclass} for `sections` (default all)."""
    try:
        _check(isinstance(raw, dict), source, "must be a mapping of sections")
        known = set(SECTIONS) | set(ROOT_KEYS)
        for key in raw:
            _check(key in known, str(key), f"unknown section (known: {', '.join(sorted(known))})")
        for key, tp in ROOT_KEYS.items():
            if key in raw:
                _coerce(raw[key], tp, key)
        out: dict[str, Any] = {}
        for name in sections if sections is not None else list(SECTIONS):
            out[name] = from_dict(SECTIONS[name], raw.get(name), name)
        if sections is None:
            check_across(out, set(raw))
        return out
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def check_across(cfg: dict[str, Any], present: set[str]) -> None:
    """Checks between sections, run whenever the whole config is validated (before any stage works).

    Each check runs when the params hold all the sections it compares (a composed params.yaml
    holds every section; a partial file written for one stage is checked on its own)."""
    env, budget, rl, rollout = cfg["env"], cfg["budget"], cfg["rl"], cfg["rollout"]
    n_train = env.n_train * len(env.levels)
    _check(not {"env", "budget"} <= present or budget.n_demos <= n_train, "budget.sft_fraction",
           f"buys {budget.n_demos} demonstrations (budget.total_units {budget.total_units} x sft_fraction "
           f"{budget.sft_fraction:g} / demo_cost {budget.demo_cost}) but only {n_train} train games exist "
           "(env.n_train per level of env.levels): raise env.n_train or lower budget.sft_fraction")
    _check(not {"budget", "rl", "rollout"} <= present or budget.rl_episodes < rl.episodes_per_step
           or rollout.temperature > 0, "rollout.temperature",
           "must be > 0 for RL (sampling is how the policy explores; evaluation sets its own, eval.temperature)")
    model, agent = cfg["model"], cfg["agent"]
    _check(not {"model", "agent"} <= present or model.name != "tiny" or agent.max_context <= model.max_position,
           "agent.max_context", f"{agent.max_context} exceeds the tiny model's model.max_position "
           f"{model.max_position} (positions it has no embedding for): lower agent.max_context or raise "
           "model.max_position")
    extra = sorted({lvl for phase in rl.curriculum for lvl in phase} - set(env.levels))
    _check(not {"env", "rl"} <= present or not extra, "rl.curriculum",
           f"level(s) {', '.join(extra)} have no train games: only env.levels get train games "
           "(env.ood_levels get test games only)")
    _check(not {"env", "rl", "budget"} <= present or env.n_valid > 0 or rl.eval_every == 0
           or budget.rl_steps(rl.episodes_per_step) == 0, "env.n_valid",
           f"is 0, but rl.eval_every={rl.eval_every} validates on the valid games"
           f"{' (and rl.keep_best exports the best validated model)' if rl.keep_best else ''}: "
           "raise env.n_valid or set rl.eval_every=0")
    _check(not {"env", "eval"} <= present or cfg["eval"].episodes <= env.n_test, "eval.episodes",
           f"{cfg['eval'].episodes} test games per level, but env.n_test builds {env.n_test}: raise env.n_test")
    if "budget" in present:
        _check(budget.sft_fraction == 0 or budget.n_demos > 0, "budget.sft_fraction",
               f"{budget.sft_fraction:g} of budget.total_units {budget.total_units} buys no demonstration "
               f"(one costs budget.demo_cost={budget.demo_cost}): this point would be pure RL; raise it or set 0")
    if {"budget", "rl"} <= present:
        steps = budget.rl_steps(rl.episodes_per_step)
        error = budget.no_rl_step(rl.episodes_per_step)
        _check(error is None, "budget.sft_fraction", error or "")
        # the last phase of each schedule is reached (with one rank: more ranks only mean fewer steps,
        # which the RL stage checks again)
        for error in (unreached_phases("rl.turn_schedule_every", len(rl.turn_schedule), rl.turn_schedule_every, steps),
                      unreached_phases("rl.curriculum_every", len(rl.curriculum), rl.curriculum_every, steps)):
            if error and steps > 0:
                raise ConfigError(error)


def load_config(path: str | Path = "params.yaml", sections: list[str] | None = None) -> dict[str, Any]:
    """Read and validate a params file (all sections are checked; `sections` are returned)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: params file not found")
    raw = yaml.safe_load(path.read_text()) or {}
    parse_config(raw, None, str(path))  # validate everything, so a typo anywhere fails fast
    return parse_config(raw, sections, str(path))

