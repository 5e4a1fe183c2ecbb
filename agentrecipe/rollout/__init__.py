"""Multi-turn rollouts and generation backends."""
