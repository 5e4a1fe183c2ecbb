"""Stage gen_sft_data: replay the expert on N train games into tokenised chat transcripts.

N = budget.n_demos (the SFT share of the budget; 0 for pure RL writes an empty dataset,
and the sft stage passes the base model through). Writes a HF `datasets`
dataset under <out>/dataset and the raw transcripts under <out>/transcripts.jsonl.
"""

import json
import time
from pathlib import Path

from datasets import Dataset
from agentrecipe.agent.prompt import PromptEncoder
from agentrecipe.agent.replay import replay_games
from agentrecipe.envs.manifest import read_manifest
from agentrecipe.models.tokenizer import load_tokenizer
from agentrecipe.train.sft_data import kept_turns, pick_demo_games, transcript_rows
from stages.common import load_sections, stage_args

FEATURES = ["game", "level", "seed", "input_ids", "action_mask", "turn_ids", "text", "actions"]


def main() -> None:
    args = stage_args(__doc__, lambda p: (
        p.add_argument("--envs", default="data/envs"),
        p.add_argument("--model", default="data/models/base"),
        p.add_argument("--out", default="data/sft"),
    ))
    cfg = load_sections(args.params, ["env", "agent", "budget"])
    env_cfg, agent, budget = cfg["env"], cfg["agent"], cfg["budget"]
    start = time.time()
    games = pick_demo_games(read_manifest(args.envs, split="train"), env_cfg.levels, budget.n_demos)
    encoder = PromptEncoder(load_tokenizer(args.model), agent.show_admissible, agent.history)
    rows = []
    turns = 0
    cut = {"context": 0, "reply": 0}
    for game, observations, actions in replay_games(env_cfg, games):
        rows += transcript_rows(encoder, game, observations, actions, agent)
        kept, cut_by = kept_turns(encoder, observations, [encoder.encode_action(a) for a in actions], agent)
        turns += len(actions)
        if cut_by:
            cut[cut_by] += len(actions) - kept
    if cut["context"]:
        print(f"gen_sft_data: {cut['context']} of {turns} expert turns left out: their prompts outgrow agent.max_context="
              f"{agent.max_context}, where the policy's episodes end (raise it, or shorten agent.history)")
    if cut["reply"]:
        print(f"gen_sft_data: {cut['reply']} of {turns} expert turns left out: from the first expert reply longer than "
              f"agent.max_action_tokens={agent.max_action_tokens} on (eos included), which free decoding cuts off "
              "unfinished (raise it)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # One shard even when empty: datasets saves zero rows as zero shards, which load_from_disk cannot read.
    Dataset.from_dict({k: [r[k] for r in rows] for k in FEATURES}).save_to_disk(str(out / "dataset"),
                                                                                 num_shards=None if rows else 1)
    with open(out / "transcripts.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps({"game": r["game"], "level": r["level"], "actions": r["actions"], "text": r["text"]}) + "\n")
    n_tokens = sum(len(r["input_ids"]) for r in rows)
    n_action = sum(sum(r["action_mask"]) for r in rows)
    print(f"gen_sft_data: {len(games)} demos, {len(rows)} sequences, {n_tokens} tokens ({n_action} action) in {time.time() - start:.1f}s")


if __name__ == "__main__":
    main()
