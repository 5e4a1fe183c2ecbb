"""Prefect flows over the DVC pipeline: run the DAG (`pipeline`), run a sweep on DVC's experiment queue (`sweep`).

`make ui` serves both (flows/serve.py, deployments in prefect.yaml).
"""

import os

from flows.settings import prefect_env

# The flows run from the shell too (`python -m flows.pipeline`, `python -m flows.sweep`), not only
# under make: Prefect's state stays in the project (.prefect/) and telemetry stays off, as the Makefile
# sets them, unless the caller set them. Before, a plain shell wrote ~/.prefect/prefect.db.
os.environ.update(prefect_env())
