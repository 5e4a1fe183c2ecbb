"""agentrecipe: reproducible RL recipes for LLM agents in text environments."""
__version__ = "0.1.0"
