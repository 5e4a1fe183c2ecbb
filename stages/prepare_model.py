"""Stage prepare_model: write the base model as a local HF folder (weights, tokenizer, chat template).

The tiny model's tokenizer is trained on the text of the train games (their
expert walkthroughs: observations, objectives, admissible commands, actions).
"""

import time

from agentrecipe.agent.replay import corpus_texts, replay_games
from agentrecipe.envs.manifest import read_manifest
from agentrecipe.models.registry import prepare_base_model
from stages.common import load_sections, stage_args, torch_threads


def main() -> None:
    args = stage_args(__doc__, lambda p: (p.add_argument("--envs", default="data/envs"), p.add_argument("--out", default="data/models/base")))
    cfg = load_sections(args.params, ["model", "env"])
    torch_threads()
    start = time.time()
    corpus = None
    if cfg["model"].name == "tiny":
        games = read_manifest(args.envs, split="train")
        corpus = []
        for _, observations, actions in replay_games(cfg["env"], games, "tokenizer corpus"):
            corpus += corpus_texts(observations, actions)
    out = prepare_base_model(cfg["model"], corpus, args.out)
    print(f"prepare_model: {cfg['model'].name} -> {out} in {time.time() - start:.1f}s")


if __name__ == "__main__":
    main()
