"""Rewards: rule scorers, loading a user's reward function by path, and the rule reward manager."""

from verl.errors import RewardError
from verl.rewards.loader import load_reward_function
from verl.rewards.manager import RuleRewardManager
from verl.rewards.scorers import SCORERS, default_compute_score

__all__ = ["SCORERS", "RewardError", "RuleRewardManager", "default_compute_score", "load_reward_function"]
