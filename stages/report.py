"""Stage report: the results table, learning curves and success by level, as a markdown page.

    python -m stages.report --eval data/eval --metrics-dir data/metrics --out data/report

Learning curves are every DVCLive TSV under <metrics-dir>/sft and <metrics-dir>/rl; a run
that logged none gets a line saying so instead of a figure.
"""

from __future__ import annotations

import json
from pathlib import Path

from agentrecipe.report.plots import find_curves, plot_curves, plot_success_by_level
from agentrecipe.report.tables import render_report
from stages.common import stage_args

CURVES = {"SFT learning curves": ("sft", "sft_curves.png"), "RL learning curves": ("rl", "rl_curves.png")}


def main() -> None:
    args = stage_args(__doc__.splitlines()[0], lambda p: (
        p.add_argument("--eval", default="data/eval"),
        p.add_argument("--metrics-dir", default="data/metrics"),
        p.add_argument("--out", default="data/report"),
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
    for name, (run, png) in CURVES.items():
        run_dir = Path(args.metrics_dir) / run
        figures[name] = plot_curves(find_curves(run_dir), out / png, name)
        notes[name] = f"No learning curves found under `{run_dir}` (no DVCLive *.tsv files)."
    figures = {name: p.relative_to(out) if p is not None else None for name, p in figures.items()}
    (out / "report.md").write_text(render_report(metrics, figures, notes))
    drawn = [str(p) for p in figures.values() if p is not None]
    print(f"report: {out / 'report.md'} with {', '.join(drawn)}")


if __name__ == "__main__":
    main()
