"""SFT and RL training loops on DeepSpeed engines; checkpoints."""
