"""A finding's page from a sweep folder (agentrecipe.report.finding, `agentrecipe finding-page`)."""

import csv
import json

import pytest

from agentrecipe.cli import main
from agentrecipe.report import seeds
from agentrecipe.report.finding import level_matrix, read_csv, write_page


def _write_csv(path, rows):
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows(rows)


def _row(levels, seed, a, b, state="success"):
    """An experiment trained on `levels`, RL success `a` on level A and `b` on level B (20 games each)."""
    own, other = (a, b) if levels == "[A]" else (b, a)
    return {"experiment": f"{levels}-{seed}", "state": state, "env.levels": levels, "seed": str(seed),
            "rl.A.success": a, "rl.B.success": b, "rl.in_domain.success": own, "rl.in_domain.n": 20,
            "rl.ood.success": other, "rl.ood.n": 20, "sft.in_domain.success": 0.1, "sft.in_domain.n": 20}


@pytest.fixture
def sweep_folder(tmp_path):
    rows = [_row("[A]", 0, 0.5, 0.2), _row("[A]", 1, 0.6, 0.3), _row("[B]", 0, 0.1, 0.4), _row("[B]", 1, 0.0, 0.0, "failed")]
    folder = tmp_path / "sweep"
    folder.mkdir()
    _write_csv(folder / "results.csv", rows)
    _write_csv(folder / "summary.csv", seeds.summarise(rows, ["env.levels", "seed"]))
    (folder / "run.json").write_text(json.dumps({
        "command": "python -m flows.sweep --preset env_complexity", "revision": "abc1234", "started": "2026-12-01 10:00:00 UTC",
        "wall_s": 3600, "points": 4, "succeeded": 3, "machine": "2 cores"}))
    (folder / "summary.png").write_bytes(b"\x89PNG")
    return folder


def test_level_matrix_is_the_mean_over_seeds_of_each_level(sweep_folder):
    header, rows = level_matrix(read_csv(sweep_folder / "results.csv"), ["env.levels"])
    assert header == ["levels", "A", "B"]
    assert rows == [["[A]", "55.0", "25.0"], ["[B]", "10.0", "40.0"]]  # the failed seed of [B] left out


def test_level_matrix_lists_the_settings_as_the_summary_does():
    """A setting whose first seed failed, and one with no successful seed: the same order as the
    summary table (before, the matrix put the first behind later settings and left the second out)."""
    rows = [_row("[B]", 0, 0.0, 0.0, "failed"), _row("[A]", 0, 0.5, 0.2), _row("[B]", 1, 0.1, 0.4),
            _row("[C]", 0, 0.0, 0.0, "failed")]
    _, matrix = level_matrix(rows, ["env.levels"])
    order = [s["env.levels"] for s in seeds.summarise(rows, ["env.levels", "seed"])]
    assert [r[0] for r in matrix] == order == ["[B]", "[A]", "[C]"]
    assert matrix[2] == ["[C]", "–", "–"]


def test_page_holds_command_tables_plot_and_verdict(sweep_folder, tmp_path):
    out = write_page(sweep_folder, tmp_path / "docs" / "env_complexity.md", "Complexity", "simple transfers.",
                     "It does not reproduce here.")
    page = out.read_text()
    assert page.startswith("# Complexity\n") and "**The papers:** simple transfers." in page
    assert "**Answer at laptop scale:** It does not reproduce here." in page
    assert "    python -m flows.sweep --preset env_complexity" in page and "revision `abc1234`" in page
    assert "wall time 60 min (4 experiments, 3 succeeded; not run or failed: [B]-1)" in page
    # [A]: 0.5 and 0.6 -> mean 55.0, t_{0.975,1} = 12.706: 55.0 +- 63.5 clipped; pooled 22 of 40
    assert "| [A] | 0 1 | 55.0 [0.0, 100.0] | 50 60 | 55.0 [39.8, 69.3] n=40 |" in page
    assert "| [B] | 0 | 10.0 | 10 | 10.0 [2.8, 30.1] n=20 |" in page
    assert "![RL success per setting](env_complexity/summary.png)" in page
    assert sorted(p.name for p in (tmp_path / "docs" / "env_complexity").iterdir()) == [
        "results.csv", "run.json", "summary.csv", "summary.png"]
    # A new verdict for a published page: its own folder is the sweep (nothing to copy onto itself).
    published = tmp_path / "docs" / "env_complexity"
    page = write_page(published, tmp_path / "docs" / "env_complexity.md", "Complexity", "s.", "A new verdict.").read_text()
    assert "**Answer at laptop scale:** A new verdict." in page and "revision `abc1234`" in page
    assert (published / "results.csv").read_bytes() == (sweep_folder / "results.csv").read_bytes()
    # Finished later with --point: both commands, the wall time of both runs.
    first = json.loads((sweep_folder / "run.json").read_text())
    (sweep_folder / "run.json").write_text(json.dumps({
        **first, "command": "python -m flows.sweep --preset env_complexity --point x", "wall_s": 600,
        "started": "2026-12-01 12:00:00 UTC", "earlier": [first]}))
    page = write_page(sweep_folder, tmp_path / "again.md", "C", "c.", "v.").read_text()
    assert "    python -m flows.sweep --preset env_complexity\n    python -m flows.sweep --preset env_complexity --point x" in page
    assert "started 2026-12-01 10:00:00 UTC, wall time 70 min over 2 runs (4 experiments" in page
    (sweep_folder / "summary.png").unlink()  # no plot: no link to one
    assert "summary.png" not in write_page(sweep_folder, tmp_path / "other.md", "C", "c.", "v.").read_text()


def test_cli_needs_a_finished_sweep_and_reads_the_preset(tmp_path, capsys):
    root = tmp_path / "project"
    (root / "params" / "sweep").mkdir(parents=True)
    (root / "params" / "sweep" / "x.yaml").write_text("description: X\npaper: claim.\nsweeps: [[a=1,2]]\n")
    with pytest.raises(FileNotFoundError, match="run.json: not there"):
        main(["finding-page", "x", "--verdict", "v", "--project", str(root)])
    (root / "params" / "sweep" / "y.yaml").write_text("description: Y\nsweeps: [[a=1,2]]\n")
    assert main(["finding-page", "y", "--verdict", "v", "--project", str(root)]) == 2
    assert "has no `paper`" in capsys.readouterr().err


def test_a_sweep_run_in_parts_is_joined_into_one_page(sweep_folder, tmp_path, capsys):
    """Seed 0 in one clone at one revision, seed 1 in another later: `--sweep A --sweep B` joins
    their rows (a success over a point that did not run there), recomputes the seed summary and
    names each run's revision; a point that succeeded in both is refused."""
    from agentrecipe.report.finding import merge_sweeps

    rows = read_csv(sweep_folder / "results.csv")  # [A]-0, [A]-1, [B]-0 succeeded, [B]-1 failed
    first, second = tmp_path / "first", tmp_path / "second"
    for folder, ok in ((first, {"[A]-0", "[B]-0"}), (second, {"[A]-1", "[B]-1"})):
        folder.mkdir()
        part = [dict(r) if r["experiment"] in ok else {"experiment": r["experiment"], "state": "missing",
                                                        "env.levels": r["env.levels"], "seed": r["seed"]}
                for r in rows]
        for r in part:
            if r["experiment"] == "[B]-1" and folder == second:
                r.update(state="success", **{"rl.A.success": "0.2", "rl.B.success": "0.5", "rl.in_domain.success": "0.5",
                                             "rl.in_domain.n": "20", "rl.ood.success": "0.2", "rl.ood.n": "20"})
        _write_csv(folder / "results.csv", part)
        _write_csv(folder / "summary.csv", seeds.summarise([{**r, "state": "x"} for r in part], ["env.levels", "seed"]))
        revision, started = ("abc1234", "2026-12-01 10:00:00 UTC") if folder == first else ("def5678", "2026-12-02 10:00:00 UTC")
        (folder / "run.json").write_text(json.dumps({
            "command": f"python -m flows.sweep --preset x --point {folder.name}", "revision": revision, "started": started,
            "wall_s": 1800, "points": 4, "succeeded": 2, "machine": f"2 cores {folder.name}"}))

    joined = merge_sweeps([first, second], tmp_path / "joined", "x")
    merged = {r["experiment"]: r["state"] for r in read_csv(joined / "results.csv")}
    assert merged == {"[A]-0": "success", "[A]-1": "success", "[B]-0": "success", "[B]-1": "success"}
    assert (joined / "summary.png").exists()
    run = json.loads((joined / "run.json").read_text())
    assert (run["revision"], run["points"], run["succeeded"], len(run["earlier"])) == ("def5678", 4, 4, 1)

    root = tmp_path / "project"
    (root / "params" / "sweep").mkdir(parents=True)
    (root / "params" / "sweep" / "x.yaml").write_text("description: X\npaper: claim.\nsweeps: [[a=1,2]]\n")
    out = tmp_path / "x.md"
    assert main(["finding-page", "x", "--verdict", "v", "--project", str(root), "--sweep", str(first),
                 "--sweep", str(second), "--out", str(out)]) == 0
    page = out.read_text()
    assert "revisions `abc1234` (run 1); `def5678` (run 2), started 2026-12-01 10:00:00 UTC, wall time 60 min over 2 runs" in page
    assert "- machine: 2 cores first (run 1); 2 cores second (run 2)" in page
    assert "| [A] | 0 1 | 55.0 [0.0, 100.0] | 50 60 | 55.0 [39.8, 69.3] n=40 |" in page  # as if run in one go
    # [B]: seed 0 from the first run (in domain 0.4), seed 1 from the second (0.5), 18 of 40 pooled
    assert "| [B] | 0 1 | 45.0 [0.0, 100.0] | 40 50 | 45.0 [30.7, 60.2] n=40 |" in page
    with pytest.raises(ValueError, match=r"\[A\]-0 succeeded in both"):
        merge_sweeps([first, first], tmp_path / "again", "x")
    # Runs with other overrides are not one sweep. Before, seed 0 at experiment=micro and seed 1 at
    # experiment=findings joined into one mean, on a page saying only the swept keys differ.
    record = json.loads((second / "run.json").read_text())
    (second / "run.json").write_text(json.dumps({**record, "command": record["command"] + " --override experiment=micro"}))
    with pytest.raises(ValueError, match="not runs of one sweep: .*--override experiment=micro"):
        merge_sweeps([first, second], tmp_path / "mixed", "x")


def test_runs_of_one_sweep_differ_only_in_which_points_run_and_how():
    from agentrecipe.report.finding import sweep_identity

    base = "python -m flows.sweep --preset x --override experiment=findings"
    assert sweep_identity(base + " --point a --point b --stop-after-s 60 --jobs 2") == sweep_identity(base)
    assert sweep_identity(base + " --stop-after-s=60") == sweep_identity(base)
    assert sweep_identity(base + " --target validate") != sweep_identity(base)
    assert sweep_identity(base.replace("findings", "micro")) != sweep_identity(base)


def test_the_page_shows_the_sampled_episodes_recomputed_from_the_rows(sweep_folder, tmp_path):
    """pass@1 of the sampled test episodes beside greedy success (a greedy policy can loop where a
    sampled one wins), summed up across seeds as success is; the CLI recomputes the summary of a
    sweep whose summary.csv was written without these columns."""
    rows = read_csv(sweep_folder / "results.csv")
    for r, p in zip(rows, ("0.6", "0.7", "0.2", "")):
        r["rl.in_domain.pass@1"] = p
    _write_csv(sweep_folder / "results.csv", rows)
    (summary,) = [s for s in seeds.summarise([{**r, "rl.in_domain.pass@1": float(r["rl.in_domain.pass@1"]),
                                               "rl.in_domain.n": 20} for r in rows[:2]], ["env.levels", "seed"])]
    assert summary["rl in-domain sampled mean"] == pytest.approx(0.65) and summary["rl in-domain sampled episodes"] == 40
    assert seeds.pooled_text(summary, "rl in-domain sampled") == "65.0 [49.5, 77.9] n=40"
    old = read_csv(sweep_folder / "summary.csv")  # as an older sweep flow wrote it: greedy columns only
    _write_csv(sweep_folder / "summary.csv", [{k: v for k, v in s.items() if "sampled" not in k} for s in old])
    root = tmp_path / "project"
    (root / "params" / "sweep").mkdir(parents=True)
    (root / "params" / "sweep" / "x.yaml").write_text("description: X\npaper: claim.\nsweeps: [[a=1,2]]\n")
    out = tmp_path / "x.md"
    assert main(["finding-page", "x", "--verdict", "v", "--project", str(root), "--sweep", str(sweep_folder),
                 "--out", str(out)]) == 0
    page = out.read_text()
    assert "## Sampled episodes (pass@1, %)" in page
    assert "| [A] | 0 1 | 65.0 [1.5, 100.0] | 60 70 | 65.0 [49.5, 77.9] n=40 |" in page
    assert "| [B] | 0 | 20.0 | 20 | 20.0 [8.1, 41.6] n=20 |" in page


@pytest.mark.parametrize(("temperature", "table"), [("0.0", False), ("0.7", True), ("", True)])
def test_a_sweep_that_sampled_no_episodes_says_so_instead_of_a_sampled_table(sweep_folder, tmp_path, temperature,
                                                                              table):
    """At eval.temperature 0 a model's pass@1 is its greedy episode's win: before, the page showed it
    under "Sampled episodes". The sweep's rows carry the temperature (flows/sweep.py); rows of an
    older sweep flow ("") keep the table."""
    rows = read_csv(sweep_folder / "results.csv")
    for r in rows:
        r.update({"rl.in_domain.pass@1": r["rl.in_domain.success"], "eval.temperature": temperature})
    _write_csv(sweep_folder / "results.csv", rows)
    summary = seeds.summarise([{**r, "rl.in_domain.pass@1": float(r["rl.in_domain.success"]), "rl.in_domain.n": 20}
                               for r in rows], ["env.levels", "seed"])
    _write_csv(sweep_folder / "summary.csv", summary)
    page = write_page(sweep_folder, tmp_path / "x.md", "X", "claim", "verdict").read_text()
    assert ("## Sampled episodes (pass@1, %)" in page) is table
    assert ("None: every point was evaluated at eval.temperature 0" in page) is not table


def test_sweep_rows_keep_the_temperature_each_point_ran_with(tmp_path):
    from flows.sweep import _result_row

    rec = {"state": "failed", "metrics": {}, "log": None, "params": {"eval.temperature": 0.0}}
    assert _result_row("p", [], rec, [], tmp_path, None)["eval.temperature"] == 0.0
    swept = _result_row("p", ["eval.temperature=0"], rec, ["eval.temperature"], tmp_path, None)
    assert swept["eval.temperature"] == "0"  # a swept key stays the point's value
    assert _result_row("q", [], None, [], tmp_path, None)["eval.temperature"] == ""  # missing: no params
