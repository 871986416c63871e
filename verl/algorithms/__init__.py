"""RL math as pure tensor functions: advantage estimators, policy/value/KL/entropy losses, DAPO's
data-side techniques, rollout off-policy correction, and the masked statistics and loss
aggregation they share. No configs, workers or distributed here."""

from verl.algorithms.advantages import (
    ADV_ESTIMATORS,
    NOT_IMPLEMENTED_ESTIMATORS,
    compute_advantage,
    compute_gae_advantage_return,
    compute_gdpo_outcome_advantage,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
)
from verl.algorithms.dapo import add_to_last_token, groups_with_variance, overlong_penalty, truncated_responses
from verl.algorithms.kl import (
    KL_KINDS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_in_reward,
    kl_penalty,
    make_kl_controller,
)
from verl.algorithms.losses import (
    NOT_IMPLEMENTED_LOSSES,
    POLICY_LOSSES,
    compute_entropy_loss,
    compute_kl_loss,
    compute_policy_loss,
    compute_policy_loss_gspo,
    compute_value_loss,
    entropy_from_logits,
)
from verl.algorithms.losses_extra import (
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_kl_cov,
    compute_policy_loss_sapo,
)
from verl.algorithms.preference import DPO_LOSS_TYPES, dpo_loss, kto_loss, kto_reference_point
from verl.algorithms.rollout_correction import truncated_is_weights
from verl.algorithms.utils import AGG_MODES, agg_loss, masked_mean, masked_sum, masked_var, masked_whiten

__all__ = [
    "ADV_ESTIMATORS", "AGG_MODES", "KL_KINDS", "NOT_IMPLEMENTED_ESTIMATORS", "NOT_IMPLEMENTED_LOSSES", "POLICY_LOSSES",
    "AdaptiveKLController", "FixedKLController", "make_kl_controller",
    "agg_loss", "masked_mean", "masked_sum", "masked_var", "masked_whiten",
    "apply_kl_in_reward", "kl_penalty",
    "compute_advantage", "compute_gae_advantage_return", "compute_gdpo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage", "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage", "compute_rloo_outcome_advantage",
    "compute_entropy_loss", "compute_kl_loss", "compute_policy_loss", "compute_policy_loss_gspo",
    "compute_policy_loss_cispo", "compute_policy_loss_clip_cov", "compute_policy_loss_dppo_tv",
    "compute_policy_loss_geo_mean", "compute_policy_loss_gpg", "compute_policy_loss_kl_cov",
    "compute_policy_loss_sapo",
    "compute_value_loss", "entropy_from_logits",
    "DPO_LOSS_TYPES", "dpo_loss", "kto_loss", "kto_reference_point",
    "add_to_last_token", "groups_with_variance", "overlong_penalty", "truncated_responses",
    "truncated_is_weights",
]
