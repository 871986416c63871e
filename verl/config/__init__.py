"""Typed, documented config: sections as dataclasses, YAML files, `a.b.c=value` overrides.

    cfg = TrainerConfig(data=dict(train_batch_size=8), actor_rollout_ref=dict(rollout=dict(n=4)))
    cfg = TrainerConfig.from_cli(["--config-file", "run.yaml", "actor_rollout_ref.actor.optim.lr=1e-6"])
    cfg.validate()                      # batch-size arithmetic, checked once
    TrainerConfig.describe("data.train_batch_size")   # the help text of any key
"""

from verl.config.node import ConfigNode, option, section
from verl.config.offline import DPOTrainerConfig, KTOTrainerConfig, SFTTrainerConfig
from verl.config.overrides import parse_overrides
from verl.config.schema import (
    AlgorithmConfig,
    CriticConfig,
    CriticModelConfig,
    CustomRewardFunctionConfig,
    DataConfig,
    KLControlConfig,
    LoggerConfig,
    RewardModelConfig,
    RewardModelModelConfig,
    SFTWarmstartConfig,
    TrainerConfig,
    TrainerSectionConfig,
    render_default_yaml,
)
from verl.config.schema_actor import (
    ActorConfig,
    ActorRolloutRefConfig,
    FSDPConfig,
    MixedPrecisionConfig,
    ModelConfig,
    OptimConfig,
    PolicyLossConfig,
    RefConfig,
    RolloutConfig,
    ValKwargsConfig,
)
from verl.errors import ConfigError

__all__ = [
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AlgorithmConfig",
    "ConfigError",
    "ConfigNode",
    "CriticConfig",
    "CriticModelConfig",
    "CustomRewardFunctionConfig",
    "DPOTrainerConfig",
    "DataConfig",
    "FSDPConfig",
    "KLControlConfig",
    "KTOTrainerConfig",
    "LoggerConfig",
    "MixedPrecisionConfig",
    "ModelConfig",
    "OptimConfig",
    "PolicyLossConfig",
    "RefConfig",
    "RewardModelConfig",
    "RewardModelModelConfig",
    "RolloutConfig",
    "SFTTrainerConfig",
    "SFTWarmstartConfig",
    "TrainerConfig",
    "TrainerSectionConfig",
    "ValKwargsConfig",
    "option",
    "parse_overrides",
    "render_default_yaml",
    "section",
]
