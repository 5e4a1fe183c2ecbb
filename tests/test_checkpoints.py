"""Checkpoints and model folders (issue 13): files verified against what was recorded when written,
a corrupt checkpoint skipped for the next older one (reported), pruning within one config, atomic
replaces, the stage's fingerprint, and the DVCLive history cut back to a checkpoint's step."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from agentrecipe.train import checkpoint as ck
from stages.common import copy_live, stage_fingerprint

torch.set_num_threads(1)


class FakeModule(torch.nn.Module):
    """Enough of a HF model for save_hf: weights and save_pretrained."""

    def __init__(self, value: float):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((4,), float(value)))

    def save_pretrained(self, path, state_dict, safe_serialization=True):
        Path(path).mkdir(parents=True, exist_ok=True)
        torch.save(state_dict, Path(path) / "model.pt")


class FakeTokenizer:
    def save_pretrained(self, path):
        (Path(path) / "tokenizer.json").write_text("{}")


class FakeEngine:
    """Enough of a DeepSpeed engine: a module and an optimizer state file."""

    def __init__(self, value: float = 1.0):
        self.module = FakeModule(value)

    def save_checkpoint(self, folder, tag):
        (Path(folder) / tag).mkdir(parents=True, exist_ok=True)
        torch.save({"adam": torch.arange(1000.0)}, Path(folder) / tag / "mp_rank_00_model_states.pt")


def save(root: Path, step: int, fingerprint: str = "aaaa", keep: int = 2) -> Path:
    return ck.save_rl_checkpoint(root, step, FakeEngine(step), None, FakeTokenizer(), fingerprint, keep=keep)


def test_checkpoint_records_sizes_and_hashes_of_its_files(tmp_path):
    path = save(tmp_path, 3)
    manifest = json.loads((path / ck.MANIFEST).read_text())
    assert manifest["step"] == 3 and manifest["fingerprint"] == "aaaa"
    states = "actor_state/state/mp_rank_00_model_states.pt"
    assert set(manifest["files"]) == {states, "model/model.pt", "model/tokenizer.json", ck.STATE_FILE}
    size, sha = manifest["files"][states]
    assert size == (path / states).stat().st_size and sha == ck.file_sha256(path / states)
    assert ck.latest_checkpoint(tmp_path, "aaaa") == path


@pytest.mark.parametrize("damage", ["truncate", "delete", "flip", "entry", "unreadable"])
def test_a_corrupt_checkpoint_falls_back_to_the_older_one_and_says_why(tmp_path, damage, monkeypatch):
    older, newer = save(tmp_path, 1), save(tmp_path, 2)
    states = newer / "actor_state/state/mp_rank_00_model_states.pt"
    if damage == "truncate":  # a kill -9 or a full disk mid-write
        states.write_bytes(states.read_bytes()[:100])
    elif damage == "delete":
        states.unlink()
    elif damage == "flip":  # same size, other bytes
        data = bytearray(states.read_bytes())
        data[-1] ^= 0xFF
        states.write_bytes(bytes(data))
    elif damage == "entry":  # the manifest parses, but the file's entry is not [size, sha256]
        manifest = json.loads((newer / ck.MANIFEST).read_text())
        manifest["files"]["actor_state/state/mp_rank_00_model_states.pt"] = 7
        (newer / ck.MANIFEST).write_text(json.dumps(manifest))
    else:  # a read error (a bad sector: EIO) while hashing
        def eio(path):
            raise OSError(5, "Input/output error", str(path))

        monkeypatch.setattr(ck, "file_sha256", eio)
    said: list[str] = []
    if damage == "unreadable":  # every file fails to read: the older one too
        assert ck.latest_checkpoint(tmp_path, "aaaa", said.append) is None and len(said) == 2
        assert "step_000002" in said[0] and "OSError" in said[0] and "Input/output error" in said[0]
        return
    assert ck.latest_checkpoint(tmp_path, "aaaa", said.append) == older
    assert len(said) == 1 and "step_000002" in said[0] and "mp_rank_00_model_states.pt" in said[0]
    assert {"truncate": "bytes", "delete": "missing", "flip": "sha256", "entry": "TypeError"}[damage] in said[0]
    # moved aside, kept for inspection, never searched again (the reason is printed once)
    assert (tmp_path / "step_000002.corrupt").is_dir() and not newer.exists()
    said.clear()
    assert ck.latest_checkpoint(tmp_path, "aaaa", said.append) == older and said == []


def test_an_incomplete_or_foreign_checkpoint_is_reported(tmp_path):
    save(tmp_path, 1, "bbbb")
    (tmp_path / "step_000002").mkdir()  # half-written by a crash before the marker, or half-pruned
    said: list[str] = []
    assert ck.latest_checkpoint(tmp_path, "aaaa", said.append) is None
    assert any("step_000002" in s and "incomplete" in s for s in said)
    assert any("step_000001" in s and "another config" in s for s in said)


def test_pruning_keeps_other_configs_checkpoints(tmp_path):
    for step in (5, 10):
        save(tmp_path, step, "aaaa")
    for step in (1, 2, 3):  # a second config in the same folder
        save(tmp_path, step, "bbbb")
    fps = {p.name: ck.read_manifest(p)["fingerprint"] for p in tmp_path.glob("step_*")}
    assert fps == {"step_000005": "aaaa", "step_000010": "aaaa", "step_000002": "bbbb", "step_000003": "bbbb"}


def test_pruning_removes_the_marker_first(tmp_path, monkeypatch):
    path = save(tmp_path, 1)

    def dies_halfway(p, ignore_errors=False):
        (Path(p) / ck.STATE_FILE).unlink()
        raise KeyboardInterrupt  # killed in the middle of deleting the folder

    monkeypatch.setattr(ck.shutil, "rmtree", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        ck.remove_checkpoint(path)
    monkeypatch.undo()
    assert path.exists() and not (path / ck.MANIFEST).exists()
    said: list[str] = []
    assert ck.latest_checkpoint(tmp_path, "aaaa", said.append) is None and "incomplete" in said[0]


def test_replacing_a_model_folder_never_loses_the_old_one(tmp_path, monkeypatch):
    out = tmp_path / "model"
    ck.save_hf(FakeEngine(1.0), FakeTokenizer(), out)
    real_rename = Path.rename

    def fails_moving_in(self, target):
        if self.name.endswith(".tmp"):
            raise OSError("killed before the new folder was renamed in")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", fails_moving_in)
    for replace in (lambda: ck.save_hf(FakeEngine(2.0), FakeTokenizer(), out), lambda: ck.copy_model(out, out)):
        with pytest.raises(OSError):
            replace()
        kept = out if out.exists() else out.with_name("model.old")  # the old folder, whole, under one of its names
        assert torch.load(kept / "model.pt")["w"][0] == 1.0
        if not out.exists():
            real_rename(kept, out)
    monkeypatch.undo()
    ck.save_hf(FakeEngine(2.0), FakeTokenizer(), out)
    assert torch.load(out / "model.pt")["w"][0] == 2.0 and not out.with_name("model.old").exists()


def test_write_results_never_leaves_half_written_files(tmp_path):
    from agentrecipe.eval.evaluate import EvalResult, write_results

    good = EvalResult("expert", records=[{"won": True}], transcripts=[{"t": 1}], summary={"w1": {"success": 1.0}})
    write_results(tmp_path, [good])
    before = {f: (tmp_path / f).read_text() for f in ("metrics.json", "episodes.jsonl", "transcripts.jsonl")}
    bad = EvalResult("expert", records=[{"won": True}, {"won": object()}], transcripts=[], summary={"w1": {}})
    with pytest.raises(TypeError):
        write_results(tmp_path, [bad])
    assert {f: (tmp_path / f).read_text() for f in before} == before


def test_stage_fingerprint_covers_params_code_and_inputs(tmp_path, monkeypatch):
    import stages.common as common

    root = tmp_path / "project"
    (root / "stages").mkdir(parents=True)
    (root / "stages" / "rl.py").write_text("x = 1\n")
    (root / "dvc.yaml").write_text(
        "stages:\n  rl:\n    deps: [stages/rl.py, data/envs]\n    params: [rl.lr, env.workers]\n")
    params = tmp_path / "params.yaml"
    params.write_text("rl: {lr: 0.1, seed: 0}\nenv: {workers: 2}\nsft: {lr: 1}\n")
    envs = tmp_path / "envs"
    envs.mkdir()
    (envs / "manifest.jsonl").write_text("{}\n")
    monkeypatch.setattr(common, "ROOT", root)
    base = stage_fingerprint("rl", params, [envs])
    assert stage_fingerprint("rl", params, [envs]) == base
    params.write_text("rl: {lr: 0.1, seed: 0}\nenv: {workers: 2}\nsft: {lr: 2}\n")  # not a key of rl
    assert stage_fingerprint("rl", params, [envs]) == base
    changes = [
        lambda: params.write_text("rl: {lr: 0.1, seed: 0}\nenv: {workers: 1}\nsft: {lr: 2}\n"),  # a listed key
        lambda: (root / "stages" / "rl.py").write_text("x = 2\n"),  # the code
        lambda: (envs / "manifest.jsonl").write_text("{}\n{}\n"),  # an input
    ]
    seen = {base}
    for change in changes:
        change()
        seen.add(stage_fingerprint("rl", params, [envs]))
    assert len(seen) == 4
    # the number of ranks, which DVC does not see: it sets the steps the budget buys. Before, a run
    # resumed on 2 ranks found a 1-rank checkpoint at step 20 of 25 'already trained all 12 steps'
    # and exported it as the finished run.
    one = stage_fingerprint("rl", params, [envs], {"world_size": 1})
    assert stage_fingerprint("rl", params, [envs], {"world_size": 2}) != one
    assert stage_fingerprint("rl", params, [envs], {"world_size": 1}) == one


def test_dvclive_history_is_cut_back_to_the_checkpoint_step(tmp_path):
    live = tmp_path / "live"
    series = live / "plots" / "metrics" / "rollout" / "success.tsv"
    series.parent.mkdir(parents=True)
    series.write_text("step\tsuccess\n1\t0.1\n2\t0.2\n3\t0.3\n4\t0.4\n")
    (live / "metrics.json").write_text(json.dumps({"rollout": {"success": 0.4}, "step": 4}))
    copy_live(live, tmp_path / "restored", upto=2)
    restored = tmp_path / "restored"
    assert (restored / "plots/metrics/rollout/success.tsv").read_text() == "step\tsuccess\n1\t0.1\n2\t0.2\n"
    assert json.loads((restored / "metrics.json").read_text()) == {"rollout": {"success": 0.2}, "step": 2}
    shutil.rmtree(restored)
    copy_live(live, restored)  # no step: copied whole
    assert (restored / "plots/metrics/rollout/success.tsv").read_text() == series.read_text()


def test_checkpoints_are_ordered_by_step_number(tmp_path):
    """Before, folder names sorted as strings: step_1000000 came before step_999999, so pruning
    deleted the checkpoint just written and resume took an older one."""
    for step in (999_998, 999_999, 1_000_000):
        save(tmp_path, step)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_1000000", "step_999999"]
    assert ck.latest_checkpoint(tmp_path, "aaaa").name == "step_1000000"


def test_a_checkpoint_keeps_the_runs_episode_counts_and_training_time(tmp_path):
    """The failure guard's counts go on after a resume: restarted at 0, a few failures just after
    the resume point stopped a run that uninterrupted would have finished. So does the training
    time: before, a resumed stage's wall time left out the runs before the resume."""

    class Loadable(FakeEngine):
        def load_checkpoint(self, folder, tag):
            assert (Path(folder) / tag / "mp_rank_00_model_states.pt").exists()

    tallies = {"played": 80, "failed": 3, "seconds": 61.5}
    path = ck.save_rl_checkpoint(tmp_path, 5, FakeEngine(5), None, FakeTokenizer(), "aaaa", tallies)
    assert ck.load_rl_checkpoint(path, Loadable(), None) == (5, tallies)
    assert ck.tallies_of(ck.read_state(path)) == tallies
    # a checkpoint written before the time was kept: 0 s
    older = ck.save_rl_checkpoint(tmp_path, 6, FakeEngine(6), None, FakeTokenizer(), "aaaa", {"played": 96, "failed": 3})
    assert ck.load_rl_checkpoint(older, Loadable(), None) == (6, {"played": 96, "failed": 3, "seconds": 0.0})


def test_the_best_model_is_the_best_as_of_the_checkpoint_a_run_resumes_from(tmp_path):
    """keep_best: a better model validated after the newest checkpoint waits beside the best until
    the next checkpoint, which keeps the best as of its step. Before, it replaced the best at once:
    killed before the next checkpoint, the resumed run dropped it (its step is replayed) and, with
    it, the better model of an earlier step; a replayed validation that came out worse (vLLM, GPUs)
    then exported a worse model than one its own curve showed."""
    def best(step, success):
        ck.save_best(tmp_path, step, FakeEngine(step), FakeTokenizer(), {"valid/success": success, "valid/score": success})

    best(2, 0.8)
    assert ck.read_best(tmp_path) is None  # pending until its checkpoint
    step3 = save(tmp_path, 3)
    assert ck.read_best(tmp_path)["step"] == 2 and ck.read_best(step3)["step"] == 2
    best(4, 0.9)  # killed here, before the checkpoint of step 5
    assert ck.read_best(tmp_path)["step"] == 2 and ck.read_best(tmp_path, ck.PENDING_BEST_DIR)["step"] == 4
    ck.settle_best(tmp_path, step3)  # the resume from step 3 replays step 4
    assert ck.read_best(tmp_path) == {"step": 2, "valid/success": 0.8, "valid/score": 0.8}
    assert not (tmp_path / ck.PENDING_BEST_DIR).exists()
    # killed after the checkpoint of step 5 was written but before it promoted the pending best
    best(4, 0.9)
    step5 = ck.save_rl_checkpoint(tmp_path, 5, FakeEngine(5), None, FakeTokenizer(), "aaaa")
    (tmp_path / ck.BEST_DIR).rename(tmp_path / (ck.BEST_DIR + ".old"))  # and mid-replacement, say
    ck.settle_best(tmp_path, step5)
    assert ck.read_best(tmp_path)["step"] == 4
    assert torch.load(tmp_path / ck.BEST_DIR / "model.pt")["w"][0] == 4.0  # its weights, not step 2's
    # a run from scratch has no best
    ck.settle_best(tmp_path, None)
    assert ck.read_best(tmp_path) is None


def test_a_resume_from_an_older_checkpoint_keeps_the_best_that_checkpoint_had_seen(tmp_path):
    """Before, one best folder was kept, overwritten by each better model: resumed from an older
    checkpoint (the newest corrupt), the run dropped the newer best (its steps are replayed) and had
    lost the older one, so the first validation after the resume became the best whatever it scored."""
    def best(step, success):
        ck.save_best(tmp_path, step, FakeEngine(step), FakeTokenizer(), {"valid/success": success, "valid/score": success})

    best(5, 0.7)
    for step in (10, 20):
        save(tmp_path, step)
    best(25, 0.8)
    save(tmp_path, 30)
    assert ck.read_best(tmp_path)["step"] == 25
    (tmp_path / "step_000030" / ck.BEST_DIR / "model.pt").write_bytes(b"torn")  # the best, as kept there
    resume = ck.latest_checkpoint(tmp_path, "aaaa", report=None)
    assert resume.name == "step_000020"  # the newest one's best is corrupt; this one's is intact
    assert (tmp_path / "step_000030.corrupt").is_dir()
    ck.settle_best(tmp_path, resume)
    assert ck.read_best(tmp_path) == {"step": 5, "valid/success": 0.7, "valid/score": 0.7}
    assert torch.load(tmp_path / ck.BEST_DIR / "model.pt")["w"][0] == 5.0
    assert not ck.is_better({"valid/success": 0.5, "valid/score": 0.5}, ck.read_best(tmp_path))


def test_a_corrupt_best_shared_by_every_checkpoint_costs_the_best_not_the_training(tmp_path):
    """The kept checkpoints hard-link one best: a damaged best file failed every one of them, so the
    run restarted from step 0. Now the newest resumes, without its best (set aside, reported)."""
    ck.save_best(tmp_path, 5, FakeEngine(5), FakeTokenizer(), {"valid/success": 0.7, "valid/score": 0.7})
    for step in (10, 20):
        save(tmp_path, step)
    (tmp_path / "step_000020" / ck.BEST_DIR / "model.pt").write_bytes(b"torn")  # the same file in step 10
    said = []
    resume = ck.latest_checkpoint(tmp_path, "aaaa", said.append)
    assert resume.name == "step_000020" and len(said) == 1 and "best model is corrupt" in said[0]
    assert (resume / (ck.BEST_DIR + ck.CORRUPT_SUFFIX)).is_dir() and not (resume / ck.BEST_DIR).exists()
    assert (tmp_path / "step_000010").is_dir()  # not moved aside: no older one had an intact best
    ck.check_files(resume, ck.split_best(ck.read_manifest(resume)["files"])[0])  # its training state intact
    ck.settle_best(tmp_path, resume)
    assert ck.read_best(tmp_path) is None and not (tmp_path / ck.BEST_DIR).exists()
    assert ck.latest_checkpoint(tmp_path, "aaaa", report=None) == resume  # again: nothing left to move
    # a corrupt training state still fails the checkpoint whatever its best
    (resume / "model" / "model.pt").write_bytes(b"torn")
    assert ck.latest_checkpoint(tmp_path, "aaaa", report=None).name == "step_000010"


def test_a_corrupt_best_is_not_traded_for_an_older_checkpoint_that_kept_none(tmp_path):
    save(tmp_path, 10)  # no best yet
    ck.save_best(tmp_path, 15, FakeEngine(15), FakeTokenizer(), {"valid/success": 0.7, "valid/score": 0.7})
    save(tmp_path, 20)
    (tmp_path / "step_000020" / ck.BEST_DIR / "model.pt").write_bytes(b"torn")
    resume = ck.latest_checkpoint(tmp_path, "aaaa", report=None)
    assert resume.name == "step_000020" and not (resume / ck.BEST_DIR).exists()
    assert (tmp_path / "step_000010").is_dir()


def test_a_replaced_folder_and_file_are_flushed_to_disk_before_they_count(tmp_path, monkeypatch):
    """A kill leaves the old or the new folder; a power loss could leave the new name on files not yet
    written out (renames reach the disk before data without a flush). Every file and folder of the new
    tree is flushed before the renames, and the parent after them."""
    order = []
    monkeypatch.setattr(ck, "fsync_path", lambda path: order.append(("fsync", Path(path))))
    rename = Path.rename
    monkeypatch.setattr(Path, "rename", lambda self, to: (order.append(("rename", self)), rename(self, to))[1])
    new = tmp_path / "model.tmp"
    (new / "sub").mkdir(parents=True)
    (new / "weights.bin").write_bytes(b"w")
    (new / "sub" / "config.json").write_text("{}")
    (new / "link").symlink_to(new / "weights.bin")
    (tmp_path / "model").mkdir()  # the folder it replaces
    ck.replace_dir(new, tmp_path / "model")
    synced = [p for what, p in order if what == "fsync"]
    renames = [i for i, (what, _) in enumerate(order) if what == "rename"]
    assert set(synced[:4]) == {new, new / "sub", new / "weights.bin", new / "sub" / "config.json"}  # not the link
    assert len(renames) == 2 and renames[0] == 4 and order[-1] == ("fsync", tmp_path)
    assert (tmp_path / "model" / "sub" / "config.json").read_text() == "{}"

    order.clear()
    ck.replace_file(tmp_path / "state.json", "{}")
    assert [p.name for _, p in order] == ["state.json.tmp", tmp_path.name]
