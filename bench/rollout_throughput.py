"""Generated tokens/s of the rollout engine vs raw batched `generate` vs a naive re-templating loop.

    python bench/rollout_throughput.py                          # B=16, turns 4 8 16, admissible
    python bench/rollout_throughput.py --batch 4 --turns 2 4 --decoding free --threads 2
    python bench/rollout_throughput.py --overlap --workers 2 --step-ms 8   # + ping-pong rows, CPU-bound envs

The model is the tiny Llama (ModelConfig sizes: hidden 128, 2 layers; only
max_position is raised so a 16-turn full-history episode fits), freshly
initialised, with a byte-level BPE trained on the benchmark game's text. The
game (bench/fixed_turn_env.py) lasts exactly T turns whatever the agent does,
with observations of about 80-100 words and 10 admissible commands.

`--size smollm2-135m` gives the model SmolLM2-135M's sizes (hidden 576, 30
layers, 9 heads, all of them key/value heads; the benchmark's own vocabulary),
and `--device cuda --dtype bfloat16` runs it on a GPU (scripts/gpu_check.sh).

For each turn count T, all methods play B episodes of T turns, sampling at
temperature 1 (seeded) on the CPU (or --device):

- engine h=-1 / h=2: `run_episodes` with the HF backend, full history (one
  growing sequence) and a 2-turn window; each episode's KV cache is kept across
  turns, so only the tokens after its longest cached prefix are prefilled.
- engine pp h=-1 / h=2 (with --overlap): the same with `overlap_env`: two
  half-batches in ping-pong, one half's env step overlapping the other's generation.
- generate xT: raw `model.generate` (transformers, its own KV cache), T calls
  on the engine's last-turn prompts (B prompts of the final context length),
  call t forced to make exactly round(engine tokens of turn t / B) tokens per
  row, so the total matches the engine's; no env, no prompt building.
- generate 1x: one `generate` call on the same prompts making all those
  tokens per row at once (one prefill, then pure KV-cached decoding).
- naive loop: each turn re-renders every conversation with
  `apply_chat_template(messages)` and tokenises it from scratch, then one
  batched `generate` (admissible decoding via prefix_allowed_tokens_fn over the
  same command trie), parses, steps the env, appends the messages.

Columns: gen tok = generated tokens (eos included, padding not); prompt tok =
prompt tokens fed to prefill, summed over calls and rows (no padding; the engine
counts only what it prefilled, not what came from kept caches); tokenised
= tokens produced by the tokenizer (engine: new observations and commands only);
ctx = longest last-turn prompt; gen s = seconds inside generation; tok/s = gen
tok / total s; cpu s = CPU seconds of this process (with one torch thread and
in-process envs, the work done: less sensitive to a busy machine than wall
time; env worker processes are not counted); tok/cpu-s = gen tok / cpu s.
Every method runs once untimed at 2 turns first (warm-up).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from transformers import GenerationConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))  # env workers import fixed_turn_env by name

import fixed_turn_env  # noqa: E402

from agentrecipe.agent.decoding import TokenTrie  # noqa: E402
from agentrecipe.agent.prompt import INVALID_REPLY, SYSTEM_PROMPT, PromptEncoder, parse_reply, user_text  # noqa: E402
from agentrecipe.config import ModelConfig  # noqa: E402
from agentrecipe.envs import registry  # noqa: E402
from agentrecipe.envs.pool import EnvPool  # noqa: E402
from agentrecipe.models.registry import build_tiny  # noqa: E402
from agentrecipe.models.tokenizer import train_tokenizer  # noqa: E402
from agentrecipe.rollout.engine import RolloutSettings, run_episodes  # noqa: E402
from agentrecipe.rollout.hf_backend import HFBackend  # noqa: E402

registry.FAMILIES["fixed"] = "fixed_turn_env"
MAX_CONTEXT = 4096
"""Model positions and engine context: 16 full-history turns are about 2,700 tokens."""
SIZES = {"tiny": {}, "smollm2-135m": {"hidden_size": 576, "num_layers": 30, "num_heads": 9, "intermediate_size": 1536}}
"""--size: ModelConfig fields over the recipe's tiny model (whose sizes are ModelConfig's defaults)."""


class CountingEncoder(PromptEncoder):
    """PromptEncoder that counts the tokens it tokenises."""

    tokenised = 0

    def encode_text(self, text: str) -> list[int]:
        ids = super().encode_text(text)
        self.tokenised += len(ids)
        return ids


class TimedBackend:
    """Wraps a backend: times each generate call and records prompt and generated token counts."""

    def __init__(self, backend: HFBackend):
        self.backend = backend
        self.seconds, self.prompt_tokens, self.per_turn_gen, self.last_prompts = 0.0, 0, [], []

    def generate(self, prompts, params, tries=None, keys=None):
        t0, before = time.perf_counter(), self.backend.stats["prefilled_tokens"]
        gens = self.backend.generate(prompts, params, tries, keys)
        self.seconds += time.perf_counter() - t0
        self.prompt_tokens += self.backend.stats["prefilled_tokens"] - before
        self.per_turn_gen.append(sum(len(g.ids) for g in gens))
        self.last_prompts = [list(p) for p in prompts]
        return gens

    def release(self, keys=None):
        self.backend.release(keys)


def row(turns, method, gen, prompt, tokenised, ctx, gen_s, total_s, cpu_s) -> dict:
    return {"turns": turns, "method": method, "gen_tok": gen, "prompt_tok": prompt, "tokenised": tokenised,
            "ctx": ctx, "gen_s": round(gen_s, 3), "total_s": round(total_s, 3), "tok_per_s": round(gen / total_s, 1),
            "cpu_s": round(cpu_s, 3), "tok_per_cpu_s": round(gen / cpu_s, 1)}


def hf_generate(model, tok, prompts, new_tokens: int, exact: bool, allowed_fn=None) -> list[list[int]]:
    """Batched HF generate (left padding); each row's new ids up to and including its first eos."""
    L = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), L), tok.pad_token_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, L - len(p):], attn[i, L - len(p):] = torch.tensor(p), 1
    ids, attn = ids.to(model.device), attn.to(model.device)
    cfg = GenerationConfig(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens if exact else 0, pad_token_id=tok.pad_token_id,
                           eos_token_id=tok.eos_token_id)
    out = model.generate(input_ids=ids, attention_mask=attn, generation_config=cfg, prefix_allowed_tokens_fn=allowed_fn)
    rows = []
    for r in out[:, L:].tolist():
        rows.append(r[: r.index(tok.eos_token_id) + 1] if tok.eos_token_id in r else r)
    return rows


def bench_engine(model, tok, args, pool: EnvPool, turns: int, history: int,
                 overlap: bool = False) -> tuple[dict, TimedBackend]:
    encoder = CountingEncoder(tok, show_admissible=True, history=history)
    backend = TimedBackend(HFBackend(model, tok.pad_token_id, tok.eos_token_id))
    settings = RolloutSettings(max_turns=turns, decoding=args.decoding, max_context=MAX_CONTEXT,
                               max_action_tokens=args.action_tokens, temperature=1.0, seed=0, overlap_env=overlap)
    games = fixed_turn_env.build_games(f"t{turns}", "train", list(range(args.batch)), None, {})
    t0, c0 = time.perf_counter(), time.process_time()
    episodes = run_episodes(games, backend, encoder, pool, settings)
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert all(ep.turns == turns and not ep.failed for ep in episodes), [ep.summary() for ep in episodes]
    gen = sum(len(a) for ep in episodes for a in ep.action_ids)
    ctx = max(len(p) for p in backend.last_prompts)
    name = f"engine{' pp' if overlap else ''} h={history}"
    return row(turns, name, gen, backend.prompt_tokens, encoder.tokenised, ctx,
               backend.seconds, total, cpu), backend


def bench_raw(model, tok, turns: int, engine: TimedBackend, with_xt: bool = True) -> list[dict]:
    """T forced-length generate calls, then one call of all the tokens, on the engine's last-turn prompts."""
    prompts = engine.last_prompts
    B, ctx = len(prompts), max(len(p) for p in prompts)
    per_turn = [max(1, round(n / B)) for n in engine.per_turn_gen]
    rows = []
    if with_xt:
        t0, c0, gen = time.perf_counter(), time.process_time(), 0
        for k in per_turn:
            gen += sum(len(r) for r in hf_generate(model, tok, prompts, k, exact=True))
        total, cpu = time.perf_counter() - t0, time.process_time() - c0
        rows.append(row(turns, "generate xT", gen, turns * sum(map(len, prompts)), 0, ctx, total, total, cpu))
    t0, c0 = time.perf_counter(), time.process_time()
    gen = sum(len(r) for r in hf_generate(model, tok, prompts, sum(per_turn), exact=True))
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    rows.append(row(turns, "generate 1x", gen, sum(map(len, prompts)), 0, ctx, total, total, cpu))
    return rows


def bench_naive(model, tok, args, pool: EnvPool, turns: int) -> dict:
    """Re-apply the chat template to the whole history every turn, then HF generate."""
    counter = CountingEncoder(tok)  # only for command tries, counted like the engine's
    eos = tok.eos_token_id
    games = fixed_turn_env.build_games(f"t{turns}", "train", list(range(args.batch)), None, {})
    torch.manual_seed(0)
    t0, c0, gen_s, gen, prompt_tok, tokenised = time.perf_counter(), time.process_time(), 0.0, 0, 0, 0
    obs = pool.reset(games)
    messages = [[{"role": "system", "content": SYSTEM_PROMPT},
                 {"role": "user", "content": user_text(o, True, with_goal=True)}] for o in obs]
    for _ in range(turns):
        prompts = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False)
                   for m in messages]
        tokenised += sum(map(len, prompts))
        prompt_tok += sum(map(len, prompts))
        allowed_fn = None
        if args.decoding == "admissible":
            tries = [TokenTrie([counter.encode_action(c) for c in o.admissible_commands]) for o in obs]
            L = max(map(len, prompts))

            def allowed_fn(b, sent, tries=tries, L=L):
                return tries[b].allowed(sent[L:].tolist()) or [eos]  # finished row: pads, any id will do

        g0 = time.perf_counter()
        outs = hf_generate(model, tok, prompts, args.action_tokens, exact=False, allowed_fn=allowed_fn)
        gen_s += time.perf_counter() - g0
        gen += sum(map(len, outs))
        texts = [tok.decode([t for t in o if t != eos], skip_special_tokens=True) for o in outs]
        actions = [parse_reply(t) if eos in o else None for t, o in zip(texts, outs)]
        results = pool.step(actions)
        for i, (text, action) in enumerate(zip(texts, actions)):
            messages[i].append({"role": "assistant", "content": text})
            if action is not None:
                obs[i] = results[i].obs
            reply = user_text(obs[i], True, with_goal=False) if action is not None else INVALID_REPLY
            messages[i].append({"role": "user", "content": reply})
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    return row(turns, "naive loop", gen, prompt_tok, tokenised + counter.tokenised, max(map(len, prompts)),
               gen_s, total, cpu)


def run_all(model, tok, args, pool: EnvPool, turns: int) -> list[dict]:
    full, engine = bench_engine(model, tok, args, pool, turns, history=-1)
    window, _ = bench_engine(model, tok, args, pool, turns, history=2)
    pp = [bench_engine(model, tok, args, pool, turns, h, overlap=True)[0] for h in (-1, 2)] if args.overlap else []
    raw = bench_raw(model, tok, turns, engine, with_xt=not args.no_xt)
    return [full, window, *pp, *raw, bench_naive(model, tok, args, pool, turns)]


def median_run(same_method: list[dict]) -> dict:
    """Of one method's repeated runs, the run of median total time."""
    return sorted(same_method, key=lambda r: r["total_s"])[len(same_method) // 2]


def ratios_line(turns: int, tok_per_s: dict[str, float]) -> str:
    """The engine's tok/s as a multiple of the decode ceiling (`generate 1x`) and of the naive loop."""
    parts = [f"{m} {tok_per_s[m] / tok_per_s['generate 1x']:.2f}x ceiling, {tok_per_s[m] / tok_per_s['naive loop']:.2f}x naive"
             for m in tok_per_s if m.startswith("engine")]
    return f"{turns:>5} " + "; ".join(parts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=16, help="episodes played at once (B)")
    p.add_argument("--turns", type=int, nargs="+", default=[4, 8, 16], help="episode lengths to measure")
    p.add_argument("--decoding", default="admissible", choices=["admissible", "free"])
    p.add_argument("--threads", type=int, default=1, help="torch threads (the machine is shared)")
    p.add_argument("--action-tokens", type=int, default=24, help="max new tokens per turn (free decoding makes ~all)")
    p.add_argument("--workers", type=int, default=0, help="env worker processes (0: envs in this process)")
    p.add_argument("--step-ms", type=float, default=0.0, help="CPU ms each env step burns (TextWorld: 4-14)")
    p.add_argument("--no-xt", action="store_true", help="skip `generate xT` (the slowest row)")
    p.add_argument("--overlap", action="store_true", help="also the engine in ping-pong (RolloutSettings.overlap_env)")
    p.add_argument("--repeats", type=int, default=3, help="runs per turn count; each row is the median-time run")
    p.add_argument("--size", default="tiny", choices=sorted(SIZES), help="model sizes (random weights either way)")
    p.add_argument("--device", default="cpu", help="torch device of the model (cpu, cuda)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = p.parse_args()
    if args.batch < 1 or min(args.turns) < 1 or args.threads < 1 or args.repeats < 1:
        p.error("--batch, --turns, --threads and --repeats must be >= 1")
    torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    tok = train_tokenizer(fixed_turn_env.corpus() + [SYSTEM_PROMPT, INVALID_REPLY], ModelConfig().vocab_size)
    model = build_tiny(ModelConfig(max_position=MAX_CONTEXT, **SIZES[args.size]), tok).eval()
    model = model.to(device=args.device, dtype=getattr(torch, args.dtype))
    print(f"{args.size} model {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, vocab {len(tok)}, "
          f"{args.device} {args.dtype}, "
          f"batch {args.batch}, decoding {args.decoding}, {args.threads} thread(s), {args.workers} env workers, "
          f"{args.step_ms:g} ms/step; "
          f"setup {time.perf_counter() - t0:.1f}s")
    rows = []
    head = f"{'turns':>5} {'method':<15} {'gen tok':>8} {'prompt tok':>10} {'tokenised':>9} {'ctx':>5} " \
           f"{'gen s':>7} {'total s':>7} {'tok/s':>8} {'cpu s':>7} {'tok/cpu-s':>9}"
    # one pool (and worker start) for every run
    with EnvPool("fixed", {"step_ms": args.step_ms}, n_workers=args.workers) as pool:
        run_all(model, tok, args, pool, 2)  # warm-up, untimed (also starts the env workers)
        print(head + "\n" + "-" * len(head))
        for turns in args.turns:
            runs = [run_all(model, tok, args, pool, turns) for _ in range(args.repeats)]
            medians = [median_run(list(same)) for same in zip(*runs)]
            for r in medians:
                print(f"{r['turns']:>5} {r['method']:<15} {r['gen_tok']:>8} {r['prompt_tok']:>10} "
                      f"{r['tokenised']:>9} {r['ctx']:>5} {r['gen_s']:>7.2f} {r['total_s']:>7.2f} "
                      f"{r['tok_per_s']:>8.1f} {r['cpu_s']:>7.2f} {r['tok_per_cpu_s']:>9.1f}", flush=True)
            print(ratios_line(turns, {r["method"]: r["tok_per_s"] for r in medians}), flush=True)
            rows += medians
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
