"""Prompt format, reply parsing and constrained decoding."""
