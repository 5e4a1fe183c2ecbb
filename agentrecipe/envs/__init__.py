"""Text environments behind one protocol (see base.py)."""
from agentrecipe.envs.base import Env, GameSpec, Observation

__all__ = ["Env", "GameSpec", "Observation"]
