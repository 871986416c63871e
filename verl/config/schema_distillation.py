"""The `distillation` section: frozen teachers score the student's rollouts (verl's on-policy
distillation; docs/distillation.md)."""

from __future__ import annotations

from dataclasses import dataclass

from verl.config import verl_defaults
from verl.config.node import option, section
from verl.config.verl_rules import Section, verl_option


# verl's per-token estimators of KL(student || teacher) (Schulman's k1/k2/k3 and their other names).
DISTILLATION_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
_TOPK_ONLY = "read only by loss_mode=forward_kl_topk, which is not implemented here (as in verl, the estimator modes ignore it)"


@dataclass
class DistillationLossConfig(Section):
    """How the teacher's log-probs enter the student's loss (docs/distillation.md)."""

    loss_mode: str = verl_option("k3", help="Per-token estimator of KL(student || teacher) on the student's sampled "
                                 "tokens: k1 (= kl), abs, k2 (= mse), k3 (= low_var_kl).", inert=False,
                                 refuse_if=lambda v: v not in DISTILLATION_ESTIMATORS, when="for anything else",
                                 why="only the single-sample estimators " + ", ".join(DISTILLATION_ESTIMATORS)
                                 + " are implemented (forward_kl_topk needs the student's full logits inside the "
                                 "loss, which the actor's update does not keep)",
                                 instead="use k1 with use_policy_gradient=true (verl's example launches) or k3")
    topk: int | None = verl_option(32, help="k of the top-k loss modes.", why=_TOPK_ONLY)
    use_task_rewards: bool = option(True, help="Keep the RL loss on the task rewards and add "
                                    "distillation_loss_coef x the distillation loss; false = the distillation loss "
                                    "alone (the PPO loss, its entropy bonus and KL loss are dropped, as in verl).")
    distillation_loss_coef: float = option(1.0, bounds=">= 0", help="Weight of the distillation loss when use_task_rewards is true.")
    loss_max_clamp: float | None = option(None, bounds="> 0", help="Clamp each token's distillation loss to "
                                          "[-loss_max_clamp, loss_max_clamp]; null = no clamp.")
    log_prob_min_clamp: float | None = verl_option(None, help="Lower clamp of the top-k log-probs.", why=_TOPK_ONLY)
    use_policy_gradient: bool = option(False, help="true: minus each token's (clamped, detached) distillation loss "
                                       "is its advantage in a clipped policy-gradient loss (Thinking Machines' "
                                       "on-policy distillation; use k1). false: the loss is backpropagated directly "
                                       "(GKD, Agarwal et al. 2023; use k3; k1 is refused, its gradient does not "
                                       "depend on the teacher).")
    policy_loss_mode: str = verl_option("vanilla", help="Policy loss of use_policy_gradient.", inert=False,
                                        refuse_if=lambda v: v != "vanilla", when="for anything but vanilla",
                                        why="verl's distillation has only the vanilla policy loss")
    clip_ratio: float = option(0.2, bounds="> 0", help="PPO clip ratio of the use_policy_gradient loss (with clip_ratio_low / "
                               "clip_ratio_high; dual-clip c = 3).")
    clip_ratio_low: float = option(0.2, bounds="> 0", help="Lower clip ratio of the use_policy_gradient loss.")
    clip_ratio_high: float = option(0.2, bounds="> 0", help="Upper clip ratio of the use_policy_gradient loss.")
    use_chunked_topk: bool = verl_option(False, help="Chunked top-k log-probs.", why=_TOPK_ONLY)
    chunked_topk_chunk_size: int = verl_option(4096, help="Tokens per chunk of use_chunked_topk.", why=_TOPK_ONLY)


_TEACHER_POOL = ("the teachers run on the trainer's own devices, sharded like the reference "
                 "(actor_rollout_ref.ref.fsdp_config)")


@dataclass
class DistillationConfig(Section):
    """verl's on-policy distillation: frozen teachers score the student's rollouts (docs/distillation.md)."""

    enabled: bool = option(False, help="Distil from the teacher models in teacher_models.")
    distillation_loss: DistillationLossConfig = section(DistillationLossConfig, help="The distillation loss.")
    n_gpus_per_node: int = verl_option(8, help="Devices per machine of verl's teacher pool.", why=_TEACHER_POOL)
    nnodes: int = verl_option(0, help="Machines of verl's teacher pool.", why=_TEACHER_POOL,
                              warn_if=lambda v: v > 0, when="above 0")
    teacher_models: dict = option(verl_defaults.distillation_defaults()["teacher_models"], help="Teachers by name, each "
                                  "{key, model_path, num_replicas, inference}: model_path (same tokenizer as the "
                                  "student) is read; key routes samples to it when there are several (the default "
                                  "entry teacher_model is dropped once others are added, as in verl); num_replicas "
                                  "and inference.* have no effect here (a warning when set): " + _TEACHER_POOL + ".")
    teacher_key: str = option("data_source", help="Column whose value picks each sample's teacher (the teacher "
                              "whose key equals it) when there are several teachers; unused with one.")
