"""mutual-rl: Mutual Reinforcement Learning for heterogeneous LLM policies."""
__version__ = "0.1.0"
