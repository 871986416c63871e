"""``PPOTrainer``: one full PPO update on a batch you bring (the beginner tutorial's API).

``step(batch)`` takes prompt+response token ids and one reward per row, and runs the classic
RLHF PPO update (Ouyang et al. 2022; Ziegler et al. 2019):

1. old log-probs (actor) and reference log-probs (frozen reference);
2. values from the critic: a value head on the actor's architecture unless one is given;
3. token rewards: the sequence reward on the last response token, minus ``kl_coef`` x KL per token;
4. GAE advantages and returns (Schulman et al. 2016);
5. ``ppo_epochs`` passes over mini-batches, updating the critic (clipped value loss) and the
   actor (the objective of :meth:`compute_loss`, by default the clipped PPO loss).

The step runs on the RL path of ``RLTrainer``: the actor-rollout-reference worker and the critic
are role worker groups (:mod:`verl.distributed.worker_group`), which under torchrun split every
batch over the ranks and gather the results; the advantages come from
:func:`verl.trainer.ppo.core.apply_kl_and_advantage`, the critic from the role factory.

For training from prompts with generation, rewards and validation, use ``RLTrainer`` through
``python -m verl.trainer.main_ppo``; this class is for driving single updates yourself.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from verl.algorithms import compute_policy_loss, make_kl_controller
from verl.algorithms.dapo import add_to_last_token
from verl.config import AlgorithmConfig, CriticConfig
from verl.config.schema_actor import KL_ESTIMATOR_NAMES
from verl.config.fields import field_specs
from verl.config.node import ConfigNode, option
from verl.errors import ConfigError
from verl.distributed.watchdog import Watchdog
from verl.distributed.worker_group import WorkerGroup, make_worker_group
from verl.protocol import Batch, model_columns
from verl.trainer.base import BaseTrainer
from verl.trainer.ppo.core import apply_kl_and_advantage
from verl.trainer.ppo.roles import value_critic
from verl.trainer.ppo.step_batch import batch_from_dict, check_layout
from verl.utils.keywords import hint_keywords
from verl.utils.preflight import check_context_length, explain_oom, normalize_reward
from verl.workers.critic import Critic

logger = logging.getLogger(__name__)


@dataclass
class PPOStepConfig(ConfigNode):
    """Settings of ``PPOTrainer.step``."""

    kl_coef: float = option(0.05, bounds=">= 0", help="Weight of the per-token KL(policy || reference) penalty in "
                            "the reward.")
    kl_penalty: str = option("kl", choices=KL_ESTIMATOR_NAMES, help="KL estimator for the penalty: kl (k1), abs, "
                             "mse (k2), low_var_kl (k3).")
    gamma: float = option(1.0, bounds="[0, 1]", help="Discount factor of GAE.")
    lam: float = option(0.95, bounds="[0, 1]", help="GAE lambda.")
    cliprange: float = option(0.2, bounds="> 0", help="Clip range of the policy ratio.")
    cliprange_value: float = option(0.2, bounds="> 0", help="Clip range of the value prediction around the old value.")
    ppo_epochs: int = option(1, bounds=">= 1", help="Passes over the batch per step.")
    mini_batch_size: int | None = option(None, bounds=">= 1", help="Rows per optimiser step; null = the whole batch.")
    micro_batch_size: int | None = option(None, bounds=">= 1", help="Rows per forward/backward pass; null = the "
                                          "mini-batch.")
    critic_lr: float = option(1e-5, bounds="> 0", help="Learning rate of the critic.")


class PPOTrainer(BaseTrainer):
    @hint_keywords
    def __init__(self, actor_rollout_ref_worker, config: dict | PPOStepConfig | None = None, *, critic=None,
                 logger=None, output_dir: str | None = None):
        super().__init__(actor_rollout_ref_worker, logger=logger, output_dir=output_dir)
        if not isinstance(config, (PPOStepConfig, Mapping, type(None))):
            raise ConfigError(f"PPOTrainer(config=...) takes the step's settings, a dict of "
                              f"{', '.join(field_specs(PPOStepConfig))} (or a PPOStepConfig), got "
                              f"{type(config).__name__}; a TrainerConfig's actor_rollout_ref section goes to "
                              f"ActorRolloutRefWorker(config=...)")
        meant_lr = next((k for k in ("lr", "learning_rate", "actor_lr") if isinstance(config, Mapping) and k in config),
                        None)
        if meant_lr:  # before: "unknown config key 'lr'; valid keys: ..., critic_lr", which is the critic's
            raise ConfigError(f"PPOTrainer(config=...) has no {meant_lr}: the actor's optimiser is the worker's, set "
                              f"by actor_rollout_ref.actor.optim.lr in the config the worker is built from "
                              f"(critic_lr here is the critic's)")
        self.config = config if isinstance(config, PPOStepConfig) else PPOStepConfig(**(config or {}))
        self.critic = critic or self._build_critic()
        # The role groups of the RL path: these workers in this process, or this rank's under torchrun.
        # No heartbeat: a script driving single steps has no run to report lost ranks of.
        watchdog = Watchdog.inert()
        self.actor_group = make_worker_group(self.worker, "actor_rollout_ref", watchdog)
        self.critic_group = make_worker_group(self.critic, "critic", watchdog)
        # The RL trainer's algorithm section for these settings: GAE, KL in the reward against the reference.
        self.algorithm = AlgorithmConfig(adv_estimator="gae", gamma=self.config.gamma, lam=self.config.lam,
                                         use_kl_in_reward=self.worker.ref is not None,
                                         kl_penalty=self.config.kl_penalty)
        self.kl_ctrl = make_kl_controller("fixed", self.config.kl_coef)
        self._said_mini_batch = False  # a mini-batch larger than a batch is said once

    def _build_critic(self) -> Critic:
        """A value model on the policy's architecture and weights, with this step's critic settings."""
        model_cfg = self.worker.config.model
        critic_cfg = CriticConfig(optim=dict(lr=self.config.critic_lr), cliprange_value=self.config.cliprange_value,
                                  model=dict(trust_remote_code=model_cfg.trust_remote_code,
                                             override_config=dict(model_cfg.override_config)))
        return value_critic(critic_cfg, self.worker.model_path, device=self.worker.device, dtype=model_cfg.dtype,
                            disable_dropout=model_cfg.disable_dropout, samples_per_mini_batch=1, ppo_epochs=1,
                            total_steps=None, config_key="actor_rollout_ref.model.path")

    def prepare(self, data: dict | Batch) -> Batch:
        """Log-probs, values, KL-penalised token rewards, advantages and returns for a batch."""
        if isinstance(data, Batch) and "responses" not in data and "prompt_mask" in data:
            data = data.to_dict()  # the tutorial's columns in a Batch: read as the dict
        if isinstance(data, Batch):
            check_layout(data)
            data = model_columns(data, "PPOTrainer.step")  # int32 ids as int64, for the critic's pass too
        batch = data if isinstance(data, Batch) else batch_from_dict(
            data, self.worker.tokenizer.pad_token_id, normalize_reward,
            vocab_size=self.worker.actor_model.get_input_embeddings().num_embeddings)
        response_length = batch["responses"].shape[1]
        check_context_length(self.worker.actor_model.config, batch["input_ids"].shape[1] - response_length,
                             response_length, truncation_key="tokenizer(truncation=True)",
                             max_prompt_key="tokenizer(max_length=...)")
        batch = batch.to(self.worker.device)
        batch = batch.union(self.actor_group.run("compute_log_prob", batch))
        if self.worker.ref is not None:
            batch = batch.union(self.actor_group.run("compute_ref_log_prob", batch))
        batch["values"] = self.critic_group.run("compute_values", batch)
        mask = batch["response_mask"]
        # The RL path from here: the reward on the last response token, KL in the reward when there
        # is a reference, GAE (verl.trainer.ppo.core.apply_kl_and_advantage).
        batch["token_level_scores"] = add_to_last_token(torch.zeros(mask.shape, dtype=torch.float32,
                                                                    device=mask.device), mask, batch["reward"])
        batch, kl_metrics = apply_kl_and_advantage(batch, self.algorithm, self.kl_ctrl)
        batch.meta["kl_metrics"] = {k: float(v) for k, v in kl_metrics.items()}
        return batch

    def step(self, data: dict | Batch) -> dict:
        """One PPO update; returns ``policy_loss``, ``value_loss`` and the usual statistics."""
        with explain_oom("actor_rollout_ref", method="PPOTrainer.step"):
            return self._step(data)

    def _step(self, data: dict | Batch) -> dict:
        cfg = self.config
        batch = self.prepare(data)
        size = cfg.mini_batch_size or len(batch)
        if size > len(batch) and not self._said_mini_batch:
            self._said_mini_batch = True
            logger.warning("PPOTrainer: mini_batch_size=%d is more than the %d row(s) of this batch, so each step "
                           "makes one update on the whole batch; give batches of at least mini_batch_size rows, or "
                           "set mini_batch_size to the rows of a batch (or null: the whole batch)", size, len(batch))
        critic_metrics = self._update(self.critic_group, "update", batch, size)
        actor_metrics = self._update(self.actor_group, "update_actor", batch, size, loss_fn=self.compute_loss)
        self.global_step += 1
        mask = batch["response_mask"].bool()
        out = {
            "policy_loss": actor_metrics.get("actor/pg_loss", 0.0),
            "value_loss": critic_metrics["critic/vf_loss"],
            "kl": batch.meta["kl_metrics"].get("actor/reward_kl_penalty", 0.0),
            "clipfrac": actor_metrics.get("actor/pg_clipfrac", 0.0),
            "approx_kl": actor_metrics.get("actor/ppo_kl", 0.0),
            "entropy": batch["entropys"][mask].mean().item() if mask.any() else 0.0,
            "policy_grad_norm": actor_metrics["actor/grad_norm"],
            "value_grad_norm": critic_metrics["critic/grad_norm"],
            "vf_clipfrac": critic_metrics.get("critic/vf_clipfrac", 0.0),
            "reward_mean": batch["reward"].float().mean().item(),
            "advantage_mean": batch["advantages"][mask].mean().item() if mask.any() else 0.0,
            "return_mean": batch["returns"][mask].mean().item() if mask.any() else 0.0,
        }
        self.log({**actor_metrics, **critic_metrics, **batch.meta["kl_metrics"],
                  **{f"ppo/{k}": v for k, v in out.items()}})
        return out

    def compute_loss(self, batch: Batch, log_prob, entropy, counts: dict):
        """PPO's clipped surrogate with ``config.cliprange`` (token-mean over the mini-batch)."""
        loss, metrics = compute_policy_loss(batch["old_log_probs"], log_prob, batch["advantages"],
                                            batch["response_mask"], clip_ratio=self.config.cliprange, **counts)
        metrics["actor/pg_loss"] = loss.detach()
        return loss, metrics

    def _update(self, group: WorkerGroup, method: str, batch: Batch, size: int, **kwargs) -> dict:
        """``ppo_epochs`` over mini-batches of ``size`` rows by ``group``'s ``method``: each rank trains
        on its part of every mini-batch (losses are normalised by counts over all ranks and gradients
        summed, so that is the update of the whole batch). Where a mini-batch does not split evenly
        over the ranks (or the batch into mini-batches), every rank trains on all of it instead: each
        rank's loss is then a 1/W share of the whole, and the sum is still exact."""
        micro = self.config.micro_batch_size
        if size % group.world_size or len(batch) % size:
            return group.call(method, batch, mini_batch_size=size, micro_batch_size=micro or size,
                              epochs=self.config.ppo_epochs, **kwargs)
        share = size // group.world_size
        return group.run(method, batch, block=size, mini_batch_size=share, micro_batch_size=micro or share,
                         epochs=self.config.ppo_epochs, **kwargs)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "critic": self.critic.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.critic.load_state_dict(state["critic"])
