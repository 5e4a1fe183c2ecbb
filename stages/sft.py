"""Stage sft: fine-tune the base model on the demonstrations (loss on action tokens only).

With zero demonstrations (budget.sft_fraction = 0) the base model passes through unchanged.
"""

import time
from pathlib import Path

from datasets import load_from_disk

from agentrecipe.models.registry import DTYPES, load_model
from agentrecipe.train.checkpoint import copy_model, save_hf
from agentrecipe.train.sft import sft_train
from stages.common import dvclive_logger, is_rank0, live_metrics, load_sections, stage_args, torch_threads


def main() -> None:
    args = stage_args(__doc__, lambda p: (
        p.add_argument("--data", default="data/sft/dataset"),
        p.add_argument("--model", default="data/models/base"),
        p.add_argument("--out", default="data/models/sft"),
        p.add_argument("--metrics", default="data/metrics/sft"),
    ))
    cfg = load_sections(args.params, ["sft", "deepspeed", "model"])
    torch_threads()
    start = time.time()
    rows = load_from_disk(args.data).select_columns(["input_ids", "action_mask"]).to_list()
    with live_metrics(args.metrics) as live:
        if not rows:
            if is_rank0():
                copy_model(args.model, args.out)
                live.log_metric("train/loss", float("nan"))
            print("sft: no demonstrations in the budget; base model passed through")
            return
        model, tokenizer = load_model(args.model, DTYPES[cfg["model"].dtype])

        engine = sft_train(model, tokenizer.pad_token_id, rows, cfg["sft"], cfg["deepspeed"], dvclive_logger(live))
        save_hf(engine, tokenizer, Path(args.out))
    print(f"sft: {len(rows)} sequences, {cfg['sft'].epochs} epochs in {time.time() - start:.1f}s -> {args.out}")


if __name__ == "__main__":
    main()
