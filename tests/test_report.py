"""Report: tables from a metrics file, DVCLive curves, figures, and the stage on fake inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentrecipe.report.plots import find_curves, plot_curves, plot_success_by_level, read_tsv
from agentrecipe.report.tables import render_report, results_table, success_table

ROOT = Path(__file__).resolve().parents[1]


def _cell(success, n=20, low=None, high=None):
    return {"success": success, "success_ci_low": low if low is not None else max(0.0, success - 0.2),
            "success_ci_high": high if high is not None else min(1.0, success + 0.2), "score": success,
            "turns_won": 5.5 if success else None, "invalid_rate": 0.1, "pass@1": success,
            "pass@4": min(1.0, 2 * success), "n": n, "failed": 0}


METRICS = {
    "base": {"w2-o3-q4": _cell(0.0), "w4-o6-q8": _cell(0.0)},
    "rl": {"w2-o3-q4": _cell(0.45, low=0.258, high=0.658), "w4-o6-q8": _cell(0.1)},
    "expert": {"w2-o3-q4": _cell(1.0), "w4-o6-q8": _cell(1.0)},
}


def _write_tsv(path: Path, name: str, rows: list[tuple]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"step\t{name}\n" + "".join(f"{s}\t{v}\n" for s, v in rows))


def test_tables():
    table = success_table(METRICS)
    assert table.splitlines()[0] == "| policy | w2-o3-q4 | w4-o6-q8 |"
    assert "| rl | 45.0 [25.8, 65.8] | 10.0 [0.0, 30.0] |" in table
    long = results_table(METRICS)
    header = long.splitlines()[0]
    assert "pass@1 %" in header and "pass@4 %" in header and header.index("pass@1") < header.index("pass@4")
    assert "| w2-o3-q4 | rl | 45.0 [25.8, 65.8] | 0.45 | 5.5 | 10.0 | 45.0 | 90.0 | 20 | 0 |" in long
    assert "| w2-o3-q4 | base | 0.0 [0.0, 20.0] | 0.00 | – |" in long  # no won episode: no turns
    assert len(long.splitlines()) == 2 + 6


def test_read_tsv_takes_step_and_the_value_column(tmp_path):
    _write_tsv(tmp_path / "a.tsv", "loss", [(0, 1.0), (1, "nan"), (2, 0.5), ("x", 3)])
    assert read_tsv(tmp_path / "a.tsv") == ([0.0, 2.0], [1.0, 0.5])
    (tmp_path / "b.tsv").write_text("timestamp\tstep\tvalue\n1700\t3\t0.25\n")
    assert read_tsv(tmp_path / "b.tsv") == ([3.0], [0.25])
    (tmp_path / "c.tsv").write_text("")
    assert read_tsv(tmp_path / "c.tsv") == ([], [])


def test_curves_and_bar_chart(tmp_path):
    run = tmp_path / "rl"
    _write_tsv(run / "plots/metrics/rollout/success.tsv", "success", [(i, i / 10) for i in range(5)])
    _write_tsv(run / "plots/metrics/losses/pg_loss.tsv", "pg_loss", [(i, 1 / (i + 1)) for i in range(5)])
    curves = find_curves(run)
    assert sorted(curves) == ["losses/pg_loss", "rollout/success"]
    png = plot_curves(curves, tmp_path / "out/rl.png", "RL")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert find_curves(tmp_path / "absent") == {}
    assert plot_curves({}, tmp_path / "none.png", "none") is None and not (tmp_path / "none.png").exists()
    bars = plot_success_by_level(METRICS, tmp_path / "bars.png")
    assert bars.stat().st_size > 1000


def test_render_report_says_when_a_figure_is_missing():
    page = render_report(METRICS, {"Success by level": Path("s.png"), "SFT learning curves": None},
                         {"SFT learning curves": "No learning curves found under `x`."})
    assert "![Success by level](s.png)" in page and "No learning curves found under `x`." in page
    assert "## All metrics" in page


def test_render_report_says_when_no_episode_was_sampled():
    """At eval.temperature 0 a model's pass@k is its greedy episode's win: the page said "from
    sampled episodes" all the same."""
    assert "from sampled episodes" in render_report(METRICS, {})
    page = render_report(METRICS, {}, sampled=False)
    assert "from sampled episodes" not in page and "a model's pass@k is its greedy episode's win" in page


def test_report_stage(tmp_path):
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval/metrics.json").write_text(json.dumps(METRICS))
    _write_tsv(tmp_path / "metrics/sft/plots/metrics/train/loss.tsv", "loss", [(i, 2 - i / 10) for i in range(10)])
    out = tmp_path / "report"
    out.mkdir()
    (out / "rl_curves.png").write_bytes(b"stale")  # from an earlier run that had RL curves
    run = subprocess.run(
        [sys.executable, "-m", "stages.report", "--eval", str(tmp_path / "eval"), "--metrics-dir",
         str(tmp_path / "metrics"), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    page = (out / "report.md").read_text()
    assert "![Success by level](success_by_level.png)" in page
    assert "![SFT learning curves](sft_curves.png)" in page
    assert f"No learning curves found under `{tmp_path / 'metrics' / 'rl'}`" in page
    assert "| rl | 45.0 [25.8, 65.8] |" in page
    assert sorted(p.name for p in out.glob("*.png")) == ["sft_curves.png", "success_by_level.png"]
    assert "## What ran" in page and "git revision" in page and "rl.seed=" in page
    assert "from sampled episodes" in page  # the default recipe samples at eval.temperature 1

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["eval"]["temperature"] = 0.0
    (tmp_path / "greedy.yaml").write_text(yaml.safe_dump(params))
    run = subprocess.run(
        [sys.executable, "-m", "stages.report", "--params", str(tmp_path / "greedy.yaml"), "--eval", str(tmp_path / "eval"),
         "--metrics-dir", str(tmp_path / "metrics"), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "a model's pass@k is its greedy episode's win" in (out / "report.md").read_text()


def test_show_results(tmp_path, capsys):
    from agentrecipe.cli import main

    (tmp_path / "metrics.json").write_text(json.dumps(METRICS))
    assert main(["show-results", "--metrics", str(tmp_path / "metrics.json")]) == 0
    assert "| w4-o6-q8 | expert | 100.0 [80.0, 100.0] |" in capsys.readouterr().out
    assert main(["show-results", "--metrics", str(tmp_path / "absent.json")]) == 1


def test_rl_curves_split_into_a_main_figure_and_diagnostics(tmp_path):
    from agentrecipe.report.plots import smooth, split_rl_curves

    names = ["losses/kl", "rollout/return", "perf/step_seconds", "rollout/success", "valid/success"]
    main, diag = split_rl_curves({n: tmp_path / f"{i}.tsv" for i, n in enumerate(names)})
    assert list(main) == ["rollout/success", "valid/success", "rollout/return"]
    assert sorted(diag) == ["losses/kl", "perf/step_seconds"]
    # debiased EMA, w = 0.5: s1 = 0.5*1/(1-0.5) = 1; s2 = (0.25 + 0.5*3)/(1-0.25) = 7/3
    assert smooth([1.0, 3.0], 0.5) == pytest.approx([1.0, 7 / 3])
    assert smooth([1.0, 3.0], 0.0) == [1.0, 3.0]


def test_provenance_lists_changed_params_seeds_budget_games_and_stage_times():
    from agentrecipe.report.provenance import params_diff, provenance_section

    defaults = {"rl": {"algo": "grpo", "seed": 0, "turn_schedule": []}, "model": {"seed": 0}}
    params = {"rl": {"algo": "ppo", "seed": 3, "turn_schedule": [6, 10]}, "model": {"seed": 0}}
    diff = params_diff(params, defaults)
    assert diff == {"rl.algo": ("grpo", "ppo"), "rl.seed": (0, 3), "rl.turn_schedule": ([], [6, 10])}
    page = provenance_section("abc123", diff, params, {"demonstrations": 10, "RL episodes": 400},
                              {"w2-o3-q4": {"train": 50, "test": 20}}, {"sft": 12.34, "rl": 100.0},
                              {"rl": "resumed after step 2: 60.0 s of it trained the steps before"})
    assert "`abc123`" in page and "| `rl.algo` | `grpo` | `ppo` |" in page
    assert "rl.seed=3" in page and "model.seed=0" in page and "demonstrations 10, RL episodes 400" in page
    assert "| w2-o3-q4 | 50 | 20 |" in page and "| sft | 12.3 |" in page
    assert "| rl | 100.0 (resumed after step 2: 60.0 s of it trained the steps before) |" in page


def test_show_transcript_prints_an_episode_readably(tmp_path, capsys):
    from agentrecipe.cli import main

    rec = {"policy": "rl", "level": "w1", "game": "g.z8", "mode": "greedy", "won": True, "score": 1.0,
           "transcript": [{"role": "user", "text": "You are in a kitchen.", "admissible": ["go east", "look"]},
                          {"role": "assistant", "text": "go west", "invalid": True},
                          {"role": "user", "text": "You can't go that way.", "admissible": ["go east"]},
                          {"role": "assistant", "text": "go east", "invalid": False},
                          {"role": "user", "text": "You win!", "admissible": []}]}
    path = tmp_path / "transcripts.jsonl"
    path.write_text(json.dumps({**rec, "policy": "sft", "won": False}) + "\n" + json.dumps(rec) + "\n")
    assert main(["show-transcript", "--transcripts", str(path), "--policy", "rl"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("rl on w1 (greedy): won, score 1.0")
    assert "--- turn 0\n  You are in a kitchen.\n  admissible: go east, look\n! go west\n--- turn 1" in out
    assert "> go east" in out
    assert main(["show-transcript", "--transcripts", str(path), "--policy", "base"]) == 1


def test_compare_folds_params_that_do_not_fit_into_what_differs_from_the_common_value():
    from agentrecipe.report.compare import changes_rows, format_table, short_names

    assert short_names(["rollout.max_turns", "eval.max_turns", "rl.algo", "env.levels", "env.ood_levels"]) == {
        "rollout.max_turns": "rollout.max_turns", "eval.max_turns": "eval.max_turns", "rl.algo": "algo",
        "env.levels": "levels", "env.ood_levels": "ood_levels"}
    cells = {"rl in-domain": "50.0 [9.4, 90.5]", "rl ood": "0.0 [0.0, 65.8]"}
    table = [{"experiment": "main", "state": "baseline", "env.levels": '["a"]', "rl.algo": "grpo", **cells},
             {"experiment": "abl-b", "state": "success", "env.levels": '["b"]', "rl.algo": "grpo", **cells},
             {"experiment": "abl-ppo", "state": "success", "env.levels": '["b"]', "rl.algo": "ppo", **cells}]
    folded = changes_rows(table, ["env.levels", "rl.algo"])
    assert list(folded[0]) == ["experiment", "state", "rl in-domain", "rl ood", "differs from the most common value"]
    assert [r["differs from the most common value"] for r in folded] == ['levels=["a"]', "", "algo=ppo"]
    # a tie goes to the earliest row (the baseline): only the others show their value
    tie = changes_rows(table[:2], ["env.levels"])
    assert [r["differs from the most common value"] for r in tie] == ["", 'levels=["b"]']
    # cutting spares the `keep` columns while the others can give way
    text = format_table(folded, width=70, keep=("experiment", "rl in-domain", "rl ood"))
    assert all(len(line) <= 70 for line in text.splitlines())
    assert "50.0 [9.4, 90.5]" in text and "abl-ppo " in text and "differs from…" in text
    # when even that is not enough, the kept columns are cut too: the line still fits
    assert all(len(line) <= 50 for line in format_table(folded, width=50, keep=("experiment",)).splitlines())


def test_compare_without_experiments_says_so_even_with_params_asked_for(monkeypatch):
    from agentrecipe.report import compare as cmp

    monkeypatch.setattr(cmp, "exp_show", lambda project: [])
    assert cmp.compare(".", params=["rl.algo"]) == "(no experiments)"
