"""Generated tokens/s of the rollout backends (hf, vllm) on the same batch.

    python bench/backend_throughput.py --model data/models/base --batch 8 --new-tokens 32
    python bench/backend_throughput.py                     # a random tiny Llama, no files needed

Each backend gets the same prompts (random token ids of --prompt-len), one
warm-up call, then --repeats timed calls of free decoding at temperature 1
(a row that samples eos stops early; the count is of tokens actually made),
and the same for admissible-constrained decoding over random 'commands'.
The warm-up fills vLLM's prefix cache as an episode's earlier turns would;
the HF backend re-prefills every prompt, as it does in a live episode.
Prints one line per backend and mode, and a JSON summary on the last line.
Run it under `if __name__ == "__main__"` (vLLM's engine process re-imports it).
"""

from __future__ import annotations

import argparse
import json
import time
from types import SimpleNamespace

import torch

from agentrecipe.agent.decoding import TokenTrie
from agentrecipe.rollout import make_backend
from agentrecipe.rollout.backend import SamplingParams


def load(args):
    if args.model:
        from agentrecipe.models.registry import DTYPES, load_model

        return load_model(args.model, DTYPES[args.dtype])
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=2048,
                         tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    return LlamaForCausalLM(config).eval(), SimpleNamespace(eos_token_id=1, pad_token_id=0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="", help="HF model folder (default: a random tiny Llama)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--backends", default="hf,vllm")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="torch threads for HF (0 = leave as is)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load(args)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    vocab = model.get_output_embeddings().weight.shape[0]
    eos = tokenizer.eos_token_id
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, vocab, (args.prompt_len,), generator=g).tolist() for _ in range(args.batch)]
    prompts = [[t if t != eos else 2 for t in pr] for pr in prompts]
    # Commands of 3-8 tokens sharing a few first tokens, as admissible commands do.
    tries = []
    for _ in range(args.batch):
        heads = torch.randint(2, vocab, (3,), generator=g).tolist()
        tries.append(TokenTrie([[heads[k % 3]] + torch.randint(2, vocab, (2 + k % 6,), generator=g).tolist() + [eos]
                                for k in range(12)]))
    results = {}
    for name in args.backends.split(","):
        t0 = time.time()
        if name == "hf":
            from agentrecipe.rollout.hf_backend import HFBackend

            backend = HFBackend(model.to(device), tokenizer.pad_token_id, eos)
        else:
            backend = make_backend(name, model, tokenizer)
        startup = time.time() - t0
        for mode, tr in (("free", None), ("admissible", tries)):
            # Rows that sample eos early count fewer tokens (rare with a random model; real models stop at eos).
            params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=0)
            backend.generate(prompts, params, tr)  # warm-up (and prefix cache fill, as in a live episode)
            calls = getattr(backend, "stats", {}).get("engine_calls", 0)
            n_tok, t = 0, time.time()
            for r in range(args.repeats):
                params.seed = r + 1
                n_tok += sum(len(gen.ids) for gen in backend.generate(prompts, params, tr))
            dt = time.time() - t
            # vLLM: engine calls per `generate` (one turn of a batch of episodes)
            per_turn = (getattr(backend, "stats", {}).get("engine_calls", 0) - calls) / args.repeats
            results[f"{name}/{mode}"] = round(n_tok / dt, 1)
            if name != "hf":
                results[f"{name}/{mode}/engine_calls_per_turn"] = per_turn
            print(f"{name:5s} {mode:10s} batch {args.batch} x {args.prompt_len} prompt: "
                  f"{n_tok / dt:8.1f} generated tokens/s ({n_tok} tokens in {dt:.2f}s; startup {startup:.1f}s"
                  + (f"; {per_turn:.1f} engine calls per turn" if name != "hf" else "") + ")", flush=True)
        if hasattr(backend, "close"):
            backend.close()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
