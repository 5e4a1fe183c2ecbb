"""Evaluation: success rate with confidence intervals, pass@k, baselines, and the eval loop."""
