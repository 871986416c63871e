"""verl: reinforcement-learning post-training for Hugging Face causal language models."""

from verl.version import __version__

__all__ = ["__version__"]
