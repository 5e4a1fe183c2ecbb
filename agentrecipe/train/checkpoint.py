"""Saving models as plain HF folders, atomically: a folder is either complete or absent.

A folder is replaced by writing the new one beside it, renaming the old one aside, renaming
the new one in, then deleting the old one (`replace_dir`): a kill at any point leaves the
old folder or the new one under the final name, or, between the two renames, the old one
under ``<name>.old``. The new folder's files are flushed to disk before the renames, and the
renames after (`sync_tree`), so a power loss, not only a kill, leaves complete files under the
final name.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from agentrecipe import dist


def full_state_dict(engine_or_model) -> dict[str, torch.Tensor]:
    """The model's full state dict on CPU (gathers ZeRO-3 partitions)."""
    module = getattr(engine_or_model, "module", engine_or_model)
    if getattr(engine_or_model, "zero_optimization_partition_weights", lambda: False)():
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
    return {k: v.detach().cpu() for k, v in module.state_dict().items()}


def aside_path(final: Path) -> Path:
    """Where `replace_dir` puts the old `final` while it moves the new one in (found there after a kill)."""
    return final.with_name(final.name + ".old")


def fsync_path(path: Path) -> None:
    """Flush one file, or one folder's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(root: Path) -> None:
    """Flush every file and folder under `root` to disk (links are left alone: what they name is not
    this tree's to flush)."""
    for folder, _, files in os.walk(root):
        for name in files:
            if not os.path.islink(os.path.join(folder, name)):
                fsync_path(Path(folder, name))
        fsync_path(Path(folder))


def replace_dir(new: Path, final: Path) -> Path:
    """Move the complete folder `new` to `final`: the old `final` is renamed aside, then deleted."""
    new, final = Path(new), Path(final)
    old = aside_path(final)
    shutil.rmtree(old, ignore_errors=True)
    sync_tree(new)
    if final.exists():
        final.rename(old)
    new.rename(final)
    fsync_path(final.parent)  # the renames
    shutil.rmtree(old, ignore_errors=True)
    return final


def replace_file(path: str | Path, text: str) -> Path:
    """Write `text` to `path` through a temporary file, flushed to disk, and an atomic rename."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    fsync_path(tmp)
    os.replace(tmp, path)
    fsync_path(path.parent)
    return path


def save_hf(engine_or_model, tokenizer, out_dir: str | Path) -> Path:
    """Write model + tokenizer to out_dir via a temporary folder and `replace_dir` (rank 0 only)."""
    out_dir = Path(out_dir)
    state = full_state_dict(engine_or_model)
    if not dist.is_rank0():
        return out_dir
    module = getattr(engine_or_model, "module", engine_or_model)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    module.save_pretrained(tmp, state_dict=state, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    return replace_dir(tmp, out_dir)


def copy_model(src: str | Path, dst: str | Path, copy_function: Callable[[str, str], object] = shutil.copy2) -> Path:
    """Pass a model folder through unchanged (e.g. SFT with zero demonstrations), atomically;
    `copy_function` copies each file (`link_or_copy`: hard links)."""
    dst = Path(dst)
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, copy_function=copy_function)
    return replace_dir(tmp, dst)


# ------------------------------------------------------------------- hashes
def file_sha256(path: str | Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def tree_files(root: str | Path, skip: Iterable[str] = ()) -> dict[str, list]:
    """{relative path: [size, sha256]} of every file under root (sorted), but names in `skip`."""
    root = Path(root)
    skip = set(skip)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name not in skip)
    return {str(p.relative_to(root)): [p.stat().st_size, file_sha256(p)] for p in files}


def hash_paths(paths: Iterable[str | Path]) -> str:
    """One sha256 over the files under `paths` (a file or a folder each; names and contents;
    Python caches skipped). Missing paths count as empty."""
    h = hashlib.sha256()
    for path in paths:
        path = Path(path)
        h.update(f"\0{path.name}\0".encode())
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []
        for f in files:
            if "__pycache__" in f.parts or f.suffix == ".pyc":
                continue
            rel = f.name if f == path else str(f.relative_to(path))
            h.update(f"{rel}\0{file_sha256(f)}\0".encode())
    return h.hexdigest()


# ------------------------------------------------------------- RL checkpoints
# A checkpoint is a folder step_NNNNNN/ holding model/ (plain HF folder),
# actor_state/ and critic_state/ (DeepSpeed: optimizer, scheduler),
# trainer_state.pt (step, RNG states), best/ under rl.keep_best (the best validated model as of
# that step, hard links to the best's files) and, written last, checkpoint.json: the step,
# the config fingerprint and the size and sha256 of every other file. checkpoint.json is
# the marker of a complete checkpoint: it is written inside step_NNNNNN.tmp before the
# folder is renamed, and deleted first when a checkpoint is pruned. The stage keeps one
# root folder per fingerprint, and pruning only ever touches checkpoints of the same one.
STATE_FILE = "trainer_state.pt"
MANIFEST = "checkpoint.json"
CORRUPT_SUFFIX = ".corrupt"


def step_dirs(root: Path) -> list[Path]:
    """step_NNNNNN folders (no .tmp / .old / .corrupt), oldest first (by number: step_1000000 after step_999999)."""
    return sorted((p for p in root.glob("step_*") if p.is_dir() and p.name[5:].isdigit()), key=lambda p: int(p.name[5:]))


def read_manifest(path: str | Path) -> dict:
    """The checkpoint.json of a checkpoint folder (ValueError saying what is wrong with it)."""
    marker = Path(path) / MANIFEST
    if not marker.exists():
        raise ValueError(f"incomplete: no {MANIFEST}")
    try:
        manifest = json.loads(marker.read_text())
        return {"step": int(manifest["step"]), "fingerprint": str(manifest["fingerprint"]),
                "files": dict(manifest["files"])}
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{MANIFEST} unreadable ({type(e).__name__}: {e})") from None


def check_files(path: str | Path, files: dict[str, list]) -> None:
    """Each of `files` ({path under `path`: [size, sha256]}) is there as written; ValueError naming the
    first bad one (a malformed entry and a read error included)."""
    for rel, entry in files.items():
        try:
            problem = _file_problem(Path(path) / rel, entry)
        except (TypeError, ValueError, OSError) as e:
            problem = f"is unreadable ({type(e).__name__}: {e})"
        if problem:
            raise ValueError(f"{rel} {problem}")


def _file_problem(f: Path, entry: list) -> str | None:
    size, sha = entry
    if not f.is_file():
        return "is missing"
    if f.stat().st_size != size:
        return f"has {f.stat().st_size} bytes, {size} were written"
    if file_sha256(f) != sha:
        return "does not match the sha256 recorded when it was written"
    return None


def split_best(files: dict[str, list]) -> tuple[dict[str, list], dict[str, list]]:
    """A manifest's files as (training state, the best model the checkpoint keeps under best/)."""
    best = {rel: v for rel, v in files.items() if rel.startswith(BEST_DIR + "/")}
    return {rel: v for rel, v in files.items() if rel not in best}, best


def remove_checkpoint(path: str | Path) -> None:
    """Delete a checkpoint folder, its marker first (a half-deleted folder never looks complete)."""
    path = Path(path)
    (path / MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)


RUN_START = {"played": 0, "failed": 0, "seconds": 0.0}
"""A run's tallies before its first step (copy it: `dict(RUN_START)`): episodes played and failed
(all ranks) and seconds of training (rank 0's steps with their validation and checkpoints; not the
start-up of each process, nor steps lost to a kill after the last checkpoint)."""


def save_rl_checkpoint(root: str | Path, step: int, actor, critic, tokenizer, fingerprint: str,
                       counts: dict[str, float] | None = None, keep: int = 2) -> Path:
    """Write checkpoint step_NNNNNN under root, then keep the `keep` newest of this fingerprint.
    counts: the run's tallies so far (`RUN_START`'s keys), restored on resume."""
    import random

    root = Path(root)
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp"
    rank0 = dist.is_rank0()
    if rank0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    actor.save_checkpoint(str(tmp / "actor_state"), tag="state")
    if critic is not None:
        critic.save_checkpoint(str(tmp / "critic_state"), tag="state")
    save_hf(actor, tokenizer, tmp / "model")
    if rank0:
        state = {"step": step, "fingerprint": fingerprint, "python_rng": random.getstate(), "torch_rng": torch.get_rng_state(),
                 "episode_counts": dict(counts or RUN_START)}
        torch.save(state, tmp / STATE_FILE)
        best = root / PENDING_BEST_DIR if (root / PENDING_BEST_DIR).is_dir() else root / BEST_DIR
        if best.is_dir():  # the best as of this step, hashed with the rest: a resume restores it intact
            shutil.copytree(best, tmp / BEST_DIR, copy_function=link_or_copy)
        manifest = {"step": step, "fingerprint": fingerprint, "files": tree_files(tmp)}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        if final.exists():
            (final / MANIFEST).unlink(missing_ok=True)
        replace_dir(tmp, final)
        promote_best(root)
        prune_checkpoints(root, fingerprint, keep)
    dist.barrier()
    return final


def prune_checkpoints(root: str | Path, fingerprint: str, keep: int) -> list[Path]:
    """Delete all but the `keep` newest complete checkpoints of `fingerprint` under root."""
    mine = []
    for path in step_dirs(Path(root)):
        try:
            if read_manifest(path)["fingerprint"] == fingerprint:
                mine.append(path)
        except ValueError:
            continue  # not ours to judge: left alone
    doomed = mine[:-keep] if keep > 0 else mine
    for path in doomed:
        remove_checkpoint(path)
    return doomed


def latest_checkpoint(root: str | Path, fingerprint: str, report: Callable[[str], None] | None = print) -> Path | None:
    """The newest complete, intact checkpoint of this fingerprint under root (else None).

    Every checkpoint passed over is reported with the reason. One whose files do not match
    what was recorded when it was written is renamed aside to ``step_NNNNNN.corrupt`` (kept
    for inspection, never considered again) and the next older one is tried. One whose training
    state is intact but whose kept best model (rl.keep_best) is not is passed over for an older
    intact one; where there is none (or the older one kept no best), the newest such is resumed without its best (set aside as
    ``best.corrupt``): checkpoints hard-link one best, so a damaged best file would otherwise
    fail every checkpoint that kept it and restart the run from scratch."""
    report = report or (lambda _msg: None)
    root = Path(root)
    bad_best: list[tuple[Path, str]] = []  # intact but for their best, newest first
    for path in reversed(step_dirs(root)):
        try:
            manifest = read_manifest(path)
        except ValueError as e:
            report(f"checkpoint {path} skipped: {e}; moved to {_move_aside(path)}, trying the next older one")
            continue
        if (fp := manifest["fingerprint"]) != fingerprint:
            report(f"checkpoint {path} skipped: written by another config (fingerprint {fp}, this run {fingerprint})")
            continue
        state, best = split_best(manifest["files"])
        try:
            check_files(path, state)
        except ValueError as e:
            report(f"checkpoint {path} skipped: corrupt, {e}; moved to {_move_aside(path)}, trying the next older one")
            continue
        try:
            check_files(path, best)
        except ValueError as e:
            bad_best.append((path, str(e)))
            continue
        if bad_best and not best:
            break  # an older one without a best: the newer one without its best loses no steps
        for newer, why in bad_best:
            report(f"checkpoint {newer} skipped: its best model is corrupt, {why}; moved to {_move_aside(newer)}")
        return path
    if bad_best:
        path, why = bad_best[0]
        report(f"checkpoint {path}: its best model is corrupt, {why}, and no older checkpoint has an intact one; "
               f"resuming without a best (moved to {_move_aside(path / BEST_DIR)})")
        return path
    return None


def _move_aside(path: Path) -> str:
    """Rename a broken checkpoint (or its best/) to <name>.corrupt (rank 0), out of every later search;
    one already moved is left."""
    aside = path.with_name(path.name + CORRUPT_SUFFIX)
    if dist.is_rank0() and path.exists():
        shutil.rmtree(aside, ignore_errors=True)
        path.rename(aside)
    return aside.name


def checkpoint_step(path: str | Path) -> int:
    return read_manifest(path)["step"]


def load_rl_checkpoint(path: str | Path, actor, critic) -> tuple[int, dict[str, float]]:
    """Restore engines and RNG states from a checkpoint; return the step it was taken after and the
    run's tallies by then (`RUN_START`'s keys)."""
    import random

    path = Path(path)
    try:
        actor.load_checkpoint(str(path / "actor_state"), tag="state")
        if critic is not None:
            critic.load_checkpoint(str(path / "critic_state"), tag="state")
    except Exception as e:  # noqa: BLE001 - name the checkpoint, whatever DeepSpeed raised
        raise _unloadable(path, e) from e
    state = read_state(path)
    random.setstate(state["python_rng"])
    torch.set_rng_state(state["torch_rng"])
    return int(state["step"]), tallies_of(state)


def _unloadable(path: Path, e: Exception) -> RuntimeError:
    return RuntimeError(f"{path}: cannot load this checkpoint ({type(e).__name__}: {e}); "
                        f"delete it or move it aside to resume from an older one")


def read_state(path: str | Path) -> dict:
    """A checkpoint's training state (step, RNG states, tallies); RuntimeError naming it if unreadable."""
    try:
        return torch.load(Path(path) / STATE_FILE, weights_only=False)
    except Exception as e:  # noqa: BLE001 - name the checkpoint, whatever torch raised
        raise _unloadable(Path(path), e) from e


def tallies_of(state: dict) -> dict[str, float]:
    """The run's tallies in a checkpoint's state (a checkpoint of before the seconds were kept: 0 s)."""
    return {**RUN_START, **state.get("episode_counts", {})}


# --------------------------------------------------------------- best model
BEST_DIR = "best"
"""Under a run's checkpoint folder: the model of the best validation up to the newest checkpoint
(rl.keep_best)."""
PENDING_BEST_DIR = "best.pending"
"""Beside it: a better model validated since that checkpoint; the next checkpoint makes it the best."""
BEST_FILE = "best.json"
"""In those folders (and in the exported model): the step and validation figures it was kept for."""


def read_best(root: str | Path, folder: str = BEST_DIR) -> dict | None:
    """{"step", "valid/success", "valid/score"} of the kept best model under `root`, None if there is none."""
    try:
        best = json.loads((Path(root) / folder / BEST_FILE).read_text())
        return {"step": int(best["step"]), "valid/success": float(best["valid/success"]),
                "valid/score": float(best["valid/score"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_better(stats: dict, best: dict | None) -> bool:
    """Higher valid success, then higher valid score; a tie keeps the earlier model."""
    if best is None:
        return True
    return (stats["valid/success"], stats["valid/score"]) > (best["valid/success"], best["valid/score"])


def save_best(root: str | Path, step: int, actor, tokenizer, stats: dict) -> Path:
    """Write the model as `root/best.pending` with its best.json, replacing an earlier pending one
    (every rank calls it: ZeRO-3 gathers the weights; rank 0 writes). The next checkpoint makes it
    `root/best` (`promote_best`): the best then always belongs to the steps a kept checkpoint has
    seen. Written straight to `best`, a kill before the next checkpoint left a best of a step that
    the resumed run replays; its replayed validation (vLLM and GPUs are not bitwise deterministic)
    could come out worse, and the better model of an earlier step was gone."""
    root = Path(root)
    new = save_hf(actor, tokenizer, root / (BEST_DIR + ".new"))
    if dist.is_rank0():
        record = {"step": step, "valid/success": stats["valid/success"], "valid/score": stats["valid/score"]}
        (new / BEST_FILE).write_text(json.dumps(record, indent=1) + "\n")
        replace_dir(new, root / PENDING_BEST_DIR)
    dist.barrier()
    return root / PENDING_BEST_DIR


def promote_best(root: str | Path) -> None:
    """A pending best becomes the best (rank 0, once its step's checkpoint is written)."""
    root = Path(root)
    if (root / PENDING_BEST_DIR).is_dir():
        replace_dir(root / PENDING_BEST_DIR, root / BEST_DIR)


def link_or_copy(src: str, dst: str) -> None:
    """A hard link (no second copy on disk; model files are replaced, never written in place), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def settle_best(root: str | Path, checkpoint: Path | None) -> None:
    """The best as of `checkpoint`, the one a run resumes from (None: from scratch), becomes the
    best under `root` (rank 0; the others read after a barrier); a pending best is dropped, since
    the resumed run replays the steps after the checkpoint and validates them anew. The checkpoint
    keeps its own best (verified with it): before, only the newest best was kept, so a resume from
    an older checkpoint (the newest was corrupt) lost the best of the steps it had seen, and the
    first validation after it became the best whatever it scored."""
    root = Path(root)
    shutil.rmtree(root / PENDING_BEST_DIR, ignore_errors=True)
    kept = Path(checkpoint) / BEST_DIR if checkpoint is not None else None
    if kept is not None and kept.is_dir():
        copy_model(kept, root / BEST_DIR, copy_function=link_or_copy)
    else:
        shutil.rmtree(root / BEST_DIR, ignore_errors=True)
        shutil.rmtree(aside_path(root / BEST_DIR), ignore_errors=True)
