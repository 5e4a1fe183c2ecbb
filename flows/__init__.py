"""Prefect flows over the DVC pipeline: run the DAG (`pipeline`), run a sweep on DVC's experiment queue (`sweep`).

`make ui` serves both (flows/serve.py, deployments in prefect.yaml).
"""
