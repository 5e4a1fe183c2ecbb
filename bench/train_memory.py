"""Peak memory of one RL minibatch (forward + backward of the clipped policy loss): dense, packed, packed
with gradient checkpointing.

    .venv/bin/python bench/train_memory.py                 # SmolLM2-135M-sized, 4 x 1024 tokens
    .venv/bin/python bench/train_memory.py --layers 2      # quicker, same vocabulary
    python bench/train_memory.py --model qwen2.5-1.5b --tokens 8192 --actions 400 --dtype bfloat16   # gpu_qwen1.5b's (GPU)

The model is built from SmolLM2-135M's config (vocab 49,152, hidden 576, 30 layers) or, with
`--model qwen2.5-1.5b`, Qwen2.5-1.5B-Instruct's (vocab 151,936, hidden 1536, 28 layers): random
weights, nothing downloaded; `--layers` overrides the depth. The minibatch: `--rows` sequences of `--tokens` tokens with
`--actions` action tokens each (a whole episode of turns), constrained decoding with
`--allowed` ids per action token, entropy logged (entropy_coef = 0).

    dense:  the old pass: logits at every position (B, T, V), a (B, T, V) bool allowed mask,
            log-softmax over it, entropy with a graph (`token_logprobs`)
    packed: the trainer's pass now: hidden states gathered before the LM head (N, V), allowed
            sets as index lists, entropy without a graph (`policy_pass`)
    recompute: the packed pass with deepspeed.gradient_checkpointing (each layer's activations
            recomputed in backward: `enable_gradient_checkpointing`)

Each variant runs in its own process; the figure is the growth of the peak resident set over
the model's own footprint (CPU), or the CUDA peak allocated beyond the model's (GPU); a variant that runs out of GPU memory
says so instead of a figure.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("dense", "packed", "recompute")


def model_config(name: str, layers: int | None):
    """The architecture of `name` (random weights), with `layers` layers if given."""
    from transformers import LlamaConfig, Qwen2Config

    if name == "qwen2.5-1.5b":
        return Qwen2Config(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=layers or 28,
                           num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                           rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                           bos_token_id=151643, eos_token_id=151645, pad_token_id=151643)
    return LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers or 30,
                       num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                       rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                       bos_token_id=1, eos_token_id=2, pad_token_id=2)


def make_batch(rows: int, tokens: int, actions: int, allowed: int, vocab: int, seed: int = 0):
    """An RLBatch of `rows` random sequences whose last `actions` positions (in turns of 5) are actions."""
    import random

    import torch

    from agentrecipe.train.rl_batch import RLBatch

    rng = random.Random(seed)
    ids = torch.tensor([[rng.randrange(vocab) for _ in range(tokens)] for _ in range(rows)])
    mask = torch.zeros(rows, tokens)
    allowed_sets = []
    for r in range(rows):
        spots = sorted(rng.sample(range(1, tokens), actions))
        mask[r, spots] = 1.0
        allowed_sets.append({p: sorted({int(ids[r, p])} | {rng.randrange(vocab) for _ in range(allowed - 1)})
                             for p in spots})
    keys = [[("a", r, p) if mask[r, p] else None for p in range(tokens)] for r in range(rows)]
    E = rows
    return RLBatch(
        input_ids=ids, attention_mask=torch.ones_like(ids), action_mask=mask, allowed=allowed_sets,
        vocab_size=vocab, seq_episode=list(range(rows)), seq_keys=keys, share=mask / actions,
        ep_turn_rewards=torch.zeros(E, 1), ep_turn_mask=torch.ones(E, 1),
        ep_turn_ids=torch.zeros(E, actions, dtype=torch.long), ep_action_mask=torch.ones(E, actions),
        group_ids=torch.arange(E), rollout_logprobs=torch.zeros_like(mask), kept=list(range(E)),
        truncated=torch.zeros(E, dtype=torch.bool), next_prompts=[None] * E,
    )


def peak_bytes(device) -> int:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def run_variant(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from agentrecipe.algos.losses import aggregate, policy_loss
    from agentrecipe.train.logprobs import token_logprobs
    from agentrecipe.train.engine import enable_gradient_checkpointing
    from agentrecipe.train.rl import policy_pass

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # weights initialised where they live, in their dtype (a 1.5B model builds in seconds on a GPU; no
    # fp32 copy first, which would raise the CPU's peak before the baseline is read)
    torch.set_default_dtype(getattr(torch, args.dtype))
    with device:
        model = AutoModelForCausalLM.from_config(model_config(args.model, args.layers))
    torch.set_default_dtype(torch.float32)
    model.train()
    if args.variant == "recompute":
        enable_gradient_checkpointing(model)
    batch = make_batch(args.rows, args.tokens, args.actions, args.allowed, model.config.vocab_size)
    for name in ("input_ids", "attention_mask", "action_mask", "share", "rollout_logprobs"):
        setattr(batch, name, getattr(batch, name).to(device))
    sel = list(range(args.rows))
    mask = batch.action_mask
    adv = torch.randn_like(mask) * mask
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    base = peak_bytes(device)
    start = time.time()
    try:
        if args.variant == "dense":
            lp, ent = token_logprobs(model, batch.input_ids, batch.attention_mask, 1.0, batch.allowed_mask(sel),
                                     with_entropy=True)
        else:
            lp, ent, _ = policy_pass(model, batch, sel, 1.0, with_entropy=True, entropy_grad=False)
        loss, _ = policy_loss(lp, lp.detach(), adv, mask, 0.2)
        entropy = aggregate(ent, mask)
        (loss - 0.0 * entropy).backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
    except torch.OutOfMemoryError:
        total = torch.cuda.get_device_properties(device).total_memory
        return {"variant": args.variant, "device": device.type, "peak_growth_mib": None,
                "seconds": time.time() - start, "error": f"out of memory ({total / 2**30:.0f} GiB device)"}
    return {"variant": args.variant, "device": device.type, "peak_growth_mib": (peak_bytes(device) - base) / 2**20,
            "seconds": time.time() - start, "loss": loss.item()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--actions", type=int, default=100, help="action tokens per sequence")
    p.add_argument("--allowed", type=int, default=8, help="allowed ids per action token")
    p.add_argument("--model", default="smollm2-135m", choices=["smollm2-135m", "qwen2.5-1.5b"])
    p.add_argument("--layers", type=int, help="default: the model's own depth (30, 28)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--variant", choices=VARIANTS, help="(internal) run one variant in this process")
    args = p.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args)))
        return
    print(f"one RL minibatch: {args.rows} x {args.tokens} tokens, {args.actions} action tokens per row, "
          f"{args.allowed} allowed ids each; {args.model} config, {args.layers or 'all'} layers, {args.dtype}")
    print(f"{'variant':8} {'device':6} {'peak growth MiB':>16} {'seconds':>8}")
    failed = []
    for variant in VARIANTS:
        cmd = [sys.executable, __file__, "--variant", variant] + [
            f"--{k}={getattr(args, k)}" for k in ("rows", "tokens", "actions", "allowed", "model", "dtype", "threads")
        ] + ([f"--layers={args.layers}"] if args.layers else [])
        done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)  # its errors go to our stderr
        if done.returncode != 0:
            failed.append(variant)
            print(f"{variant:8} failed (exit {done.returncode}; its traceback is above)", flush=True)
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        peak = r.get("error") or f"{r['peak_growth_mib']:.0f}"
        print(f"{r['variant']:8} {r['device']:6} {peak:>16} {r['seconds']:8.1f}", flush=True)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
