"""Driver for tests/test_multiprocess.py: SFT steps under torchrun, then every rank writes its weights.

    torchrun --nproc_per_node 2 tests/mp_sft_driver.py --rows rows.jsonl --out OUT --zero-stage 1 2 3

For each ZeRO stage given (one after the other in the same processes: one launch, one
import of torch and DeepSpeed), each rank builds the same tiny model (fixed seed), trains
with `sft_train` on its shard of every batch, gathers the full state dict (a collective
under ZeRO-3) and saves it as OUT/zero{S}/rank{R}.pt next to OUT/init.pt (the weights
before training).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agentrecipe.config import DeepSpeedConfig, SFTConfig
from agentrecipe.train.checkpoint import full_state_dict
from agentrecipe.train.sft import sft_train

VOCAB, PAD = 64, 0


def tiny_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                         tie_word_embeddings=True, pad_token_id=PAD, eos_token_id=1, bos_token_id=None)
    return LlamaForCausalLM(config)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", required=True, help="jsonl of {input_ids, action_mask}")
    p.add_argument("--out", required=True)
    p.add_argument("--zero-stage", type=int, nargs="+", default=[0], help="one run per stage, in this order")
    p.add_argument("--batch-size", type=int, default=4)
    args = p.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    out = Path(args.out)
    rows = [json.loads(line) for line in Path(args.rows).read_text().splitlines()]
    if rank == 0:
        torch.save({k: v.clone() for k, v in tiny_model().state_dict().items()}, out / "init.pt")
    cfg = SFTConfig(lr=1e-2, epochs=1, batch_size=args.batch_size, warmup_steps=0)
    for zero_stage in args.zero_stage:
        engine = sft_train(tiny_model(), PAD, rows, cfg, DeepSpeedConfig(zero_stage=zero_stage))
        state = full_state_dict(engine)  # every rank takes part (ZeRO-3 gathers)
        (out / f"zero{zero_stage}").mkdir(exist_ok=True)
        torch.save(state, out / f"zero{zero_stage}" / f"rank{rank}.pt")
        print(f"rank {rank}/{os.environ.get('WORLD_SIZE')}: zero {zero_stage}, {len(rows)} rows, done", flush=True)


if __name__ == "__main__":
    gc.freeze()  # the imports: out of every collection, at exit too (as in stages/__init__.py)
    main()
