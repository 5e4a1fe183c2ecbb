"""SFT under `torchrun --nproc_per_node 2` on CPU (gloo): both ranks end with the same, changed weights.

Each rank trains on its shard of every batch and DeepSpeed averages the
gradients, so after every step the replicas (ZeRO-1/2) or the gathered
partitions (ZeRO-3) must agree exactly. The RL trainer uses the same pattern
(each rank its own rollouts), so this also guards its gradient path.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "tests" / "mp_sft_driver.py"


def fake_rows(n: int, seed: int = 0) -> list[dict]:
    """Token sequences of the driver's 64-token vocabulary; the last few tokens are the 'action'."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        length = rng.randint(10, 20)
        ids = [rng.randint(2, 63) for _ in range(length - 1)] + [1]
        n_act = rng.randint(2, 5)
        rows.append({"input_ids": ids, "action_mask": [0] * (length - n_act) + [1] * n_act})
    return rows


def torchrun(args: list[str], cwd: Path, timeout: int = 600, nproc: int = 2) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AGENTRECIPE_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):  # the launcher sets them
        env.pop(key, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), *args]
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"torchrun failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}"
    return res


@pytest.mark.slow
def test_sft_on_two_ranks_identical_weights_and_the_one_rank_step(tmp_path):
    """ZeRO stages 0 to 3, one after the other in one 2-rank launch (each launch spends most of its time
    importing torch and DeepSpeed on both ranks), on uneven shards: batch 3 -> shards of 2 and 1 rows,
    and the last batch's 1 row leaves one rank without any. Every stage ends with the same, changed
    weights on both ranks; and stage 0's update is one rank's: one token-mean over the whole batch,
    whichever rank holds the tokens. Before, each rank's loss was its own token-mean and DeepSpeed
    averaged them, so tokens on the rank with fewer weighed more (the update differed from one rank's
    by 26% on such rows), and a rank with no row in a batch passed a copy of the first row at full weight."""
    rows = tmp_path / "rows.jsonl"
    # 13 rows, batch 3: 5 steps. DeepSpeed's WarmupLR runs the first two steps at lr 0 (warmup_num_steps
    # is clamped to >= 2 and the ramp starts at warmup_min_lr = 0), so 3 steps move the weights.
    rows.write_text("\n".join(json.dumps(r) for r in fake_rows(13)))
    stages = (0, 1, 2, 3)
    for nproc in (1, 2):
        (tmp_path / f"ranks{nproc}").mkdir()
    torchrun([str(DRIVER), "--rows", str(rows), "--out", str(tmp_path / "ranks1"), "--batch-size", "3"], ROOT, nproc=1)
    torchrun([str(DRIVER), "--rows", str(rows), "--out", str(tmp_path / "ranks2"), "--batch-size", "3",
              "--zero-stage", *map(str, stages)], ROOT)
    init = torch.load(tmp_path / "ranks2" / "init.pt")
    for zero_stage in stages:
        r0, r1 = (torch.load(tmp_path / "ranks2" / f"zero{zero_stage}" / f"rank{r}.pt") for r in (0, 1))
        assert r0.keys() == r1.keys() == init.keys(), zero_stage
        for k in r0:
            assert torch.equal(r0[k], r1[k]), f"zero {zero_stage}: rank weights differ at {k}"
        changed = [k for k in r0 if not torch.equal(r0[k], init[k])]
        assert len(changed) == len(r0), f"zero {zero_stage}: unchanged after training: {sorted(set(r0) - set(changed))}"
    updates = {}
    for nproc in (1, 2):
        out = tmp_path / f"ranks{nproc}"
        one_init, trained = torch.load(out / "init.pt"), torch.load(out / "zero0" / "rank0.pt")
        updates[nproc] = torch.cat([(trained[k] - one_init[k]).flatten() for k in one_init])
    assert updates[1].norm() > 0
    assert float((updates[2] - updates[1]).norm() / updates[1].norm()) < 1e-4


@pytest.mark.slow
def test_sft_stage_runs_under_torchrun(tmp_path):
    """stages/sft.py unchanged under torchrun: rank 0 writes the model folder, the weights moved."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from agentrecipe.models.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(["go north", "take key", "open door with key"] * 20, 300)
    model = _tiny(len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)
    base = tmp_path / "base"
    model.save_pretrained(base, safe_serialization=True)
    tokenizer.save_pretrained(base)
    rows = [{**r, "input_ids": [t % len(tokenizer) for t in r["input_ids"]]} for r in fake_rows(12, seed=1)]
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "dataset"))
    params = tmp_path / "params.yaml"
    params.write_text("sft: {lr: 0.01, epochs: 1, batch_size: 4, warmup_steps: 0}\n"
                      "deepspeed: {zero_stage: 2}\nmodel: {dtype: float32}\n")
    torchrun(["-m", "stages.sft", "--params", str(params), "--data", str(tmp_path / "dataset"), "--model", str(base),
              "--out", str(tmp_path / "sft"), "--metrics", str(tmp_path / "metrics")], ROOT)
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "sft")
    before, after = model.state_dict(), trained.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert (tmp_path / "metrics").exists()


def _tiny(vocab: int, pad: int, eos: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                                        tie_word_embeddings=True, pad_token_id=pad, eos_token_id=eos, bos_token_id=None))


RL_DRIVER = ROOT / "tests" / "mp_rl_driver.py"


# (ZeRO stage, rl.target_kl, update epochs) of the multi-rank RL runs: 3 epochs with the early stop, so
# rank 0 (one minibatch an epoch) has minibatches left to skip
RL_RUNS = [(0, None, 2), (3, None, 2), (3, 1e-6, 3)]


@pytest.mark.slow
def test_rl_two_ranks_uneven_batches_and_a_failed_step(tmp_path):
    """Ranks with different sequence counts, one of them without any batch in step 2: no rank
    waits forever on a collective (the runs end within the timeout) and both end identical. With
    rl.target_kl each rank measures its own minibatches' approx_kl and all stop together. The runs
    of RL_RUNS go one after the other in one launch."""
    from agentrecipe.agent.prompt import user_text
    from agentrecipe.config import ModelConfig
    from agentrecipe.models.registry import build_tiny
    from agentrecipe.models.tokenizer import train_tokenizer
    from tests import walk_env

    env = walk_env.make_env({})
    texts = list(walk_env.COMMANDS)
    for g in walk_env.build_games("walk", "train", list(range(8)), "", {}):
        o = env.reset(g)
        texts += [user_text(o, True, True), user_text(o, True, False)]
    tokenizer = train_tokenizer(texts * 3, 300)
    model = build_tiny(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0), tokenizer)
    policy = tmp_path / "policy"
    model.save_pretrained(policy)
    tokenizer.save_pretrained(policy)
    runs = [a for zero_stage, target_kl, epochs in RL_RUNS for a in ("--train", str(zero_stage), str(target_kl).lower(), str(epochs))]
    res = torchrun([str(RL_DRIVER), "--policy", str(policy), "--out", str(tmp_path), *runs], ROOT, timeout=600)
    init = model.state_dict()
    for i, (zero_stage, target_kl, _) in enumerate(RL_RUNS):
        run = f"zero {zero_stage}, target_kl {target_kl}"
        r0, r1 = (torch.load(tmp_path / f"run{i}" / f"rank{r}.pt") for r in (0, 1))
        assert r1["failed"] == [0.0, 2.0, 0.0] and r0["failed"] == [0.0, 0.0, 0.0], (run, res.stdout)
        assert r0["early_stopped"] == r1["early_stopped"], (run, res.stdout)  # the same minibatches on both ranks
        assert (max(r0["early_stopped"]) > 0) == (target_kl is not None), (run, res.stdout)
        for k in r0["actor"]:
            assert torch.equal(r0["actor"][k], r1["actor"][k]), f"{run}: rank weights differ at {k}"
        assert any(not torch.equal(r0["actor"][k], init[k]) for k in init), f"{run}: the policy did not move"
