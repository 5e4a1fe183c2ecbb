"""Stage report: the results table, learning curves and success by level, as a markdown page.

    python -m stages.report --eval data/eval --metrics-dir data/metrics --out data/report

Learning curves are every DVCLive TSV under <metrics-dir>/sft and <metrics-dir>/rl (RL in a
main figure and a diagnostics figure); a run that logged none gets a line saying so instead of a
figure. A "What ran" section gives the git revision, the params that differ from the defaults of
params/, seeds, budget, games per level and each stage's wall time (data/timings/).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from agentrecipe.config import BudgetConfig, ConfigError, EvalConfig, RLConfig, from_dict
from agentrecipe.envs.manifest import MANIFEST_NAME, read_manifest
from agentrecipe.params import compose
from agentrecipe.report.plots import find_curves, plot_curves, plot_success_by_level, split_rl_curves
from agentrecipe.report.provenance import git_revision, params_diff, provenance_section
from agentrecipe.report.tables import render_report
from stages.common import TIMINGS_DIR, stage_args

STAGE_ORDER = ("build_envs", "prepare_model", "gen_sft_data", "sft", "rl", "evaluate")


def _section(cls, params: dict, name: str):
    """The params section `name` as `cls`, or None when it is missing or invalid (the page still renders)."""
    try:
        return from_dict(cls, params.get(name, {}), name)
    except ConfigError:
        return None


def what_ran(params: dict, envs: Path, timings_dir: Path) -> str:
    """The provenance section of the report (params.yaml, read as `params`, against the composed
    defaults of params/)."""
    defaults = compose("params") if Path("params/config.yaml").exists() else {}
    budget_cfg, rl = _section(BudgetConfig, params, "budget"), _section(RLConfig, params, "rl")
    budget = {} if budget_cfg is None else {"demonstrations": budget_cfg.n_demos, "RL episodes": budget_cfg.rl_episodes}
    if budget_cfg is not None and rl is not None:
        steps = budget_cfg.rl_steps(rl.episodes_per_step)
        # whole steps only: what a single-rank run played (with W ranks, W times fewer steps)
        budget["RL episodes played (1 rank)"] = f"{steps * rl.episodes_per_step} ({steps} steps of {rl.episodes_per_step})"
    games: dict[str, dict[str, int]] = {}
    if (envs / MANIFEST_NAME).exists():
        for g in read_manifest(envs):
            games.setdefault(g.level, {}).setdefault(g.split, 0)
            games[g.level][g.split] += 1
    timings, resumed = {}, {}
    for stage in STAGE_ORDER:
        f = timings_dir / f"{stage}.json"
        if f.exists():
            record = json.loads(f.read_text())
            timings[stage] = float(record["seconds"])
            if "resumed" in record:
                resumed[stage] = record["resumed"]
    return provenance_section(git_revision(), params_diff(params, defaults), params, budget, games, timings, resumed)


def main() -> None:
    args = stage_args(__doc__.splitlines()[0], lambda p: (
        p.add_argument("--eval", default="data/eval"),
        p.add_argument("--metrics-dir", default="data/metrics"),
        p.add_argument("--out", default="data/report"),
        p.add_argument("--envs", default="data/envs", help="games manifest folder (games per level)"),
        p.add_argument("--timings", default=str(TIMINGS_DIR), help="stage wall times (<stage>.json)"),
    ))
    metrics_path = Path(args.eval) / "metrics.json"
    if not metrics_path.exists():
        raise SystemExit(f"error: {metrics_path} not found; run the evaluate stage first")
    metrics = json.loads(metrics_path.read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.png"):  # a figure that cannot be drawn this time must not linger
        stale.unlink()

    figures: dict[str, Path | None] = {"Success by level": plot_success_by_level(metrics, out / "success_by_level.png")}
    notes = {}
    sft_dir, rl_dir = Path(args.metrics_dir) / "sft", Path(args.metrics_dir) / "rl"
    rl_main, rl_diag = split_rl_curves(find_curves(rl_dir))
    for name, curves, png, smoothing, run_dir in (
        ("RL learning curves", rl_main, "rl_curves.png", 0.6, rl_dir),
        ("RL diagnostics", rl_diag, "rl_diagnostics.png", 0.0, rl_dir),
        ("SFT learning curves", find_curves(sft_dir), "sft_curves.png", 0.0, sft_dir),
    ):
        figures[name] = plot_curves(curves, out / png, name, smoothing=smoothing)
        notes[name] = f"No learning curves found under `{run_dir}` (no DVCLive *.tsv files)."
    figures = {name: p.relative_to(out) if p is not None else None for name, p in figures.items()}
    params = yaml.safe_load(Path(args.params).read_text()) if Path(args.params).exists() else {}
    eval_cfg = _section(EvalConfig, params, "eval")
    page = render_report(metrics, figures, notes, sampled=eval_cfg is None or eval_cfg.temperature > 0)
    page += "\n" + what_ran(params, Path(args.envs), Path(args.timings))
    (out / "report.md").write_text(page)
    drawn = [str(p) for p in figures.values() if p is not None]
    print(f"report: {out / 'report.md'} with {', '.join(drawn)}")


if __name__ == "__main__":
    main()
