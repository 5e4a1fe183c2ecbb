"""Prefect flows over the DVC pipeline: run the DAG (`pipeline`), run an ablation grid (`sweep`).

`make ui` serves both (flows/serve.py, deployments in prefect.yaml).
"""
