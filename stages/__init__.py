"""The pipeline's stages: dvc.yaml runs each as `python -m stages.<name>` (see each module's doc).

A stage run imports torch, transformers, Hydra and more: about a million objects that live until
it exits. Python's cyclic garbage collector scans them again and again while they load, and once
more at exit: about 2 s of CPU per stage run that frees nothing (importing stages.prepare_model and
exiting took 5.5 s, 3.4 s without those scans). So while `python -m stages.<name>` imports its
module, the collector is off (this package is imported first, while Python locates the module and
sys.argv[0] is "-m"), and `imports_done` (called by `stage_args` as the run starts) freezes what the
imports made (`gc.freeze`: kept out of every later scan; modules live to the end anyway) and turns the
collector back on. Anything else that imports a stage module (a test, a script) keeps its collector
as it was.
"""

from __future__ import annotations

import gc
import sys

_PAUSED = sys.argv[:1] == ["-m"] and gc.isenabled()
if _PAUSED:
    gc.disable()


def imports_done() -> None:
    """A stage run's imports are done: freeze what they made and collect again (only in a
    `python -m stages.<name>` run, whose collector this package turned off)."""
    global _PAUSED
    if _PAUSED:
        gc.freeze()
        gc.enable()
        _PAUSED = False
