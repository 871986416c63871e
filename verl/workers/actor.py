"""The actor (policy being trained) and the reference policy: log-probs and PPO updates.

Both are a Hugging Face causal LM; the reference simply has no optimiser. Methods take and
return a :class:`~verl.protocol.Batch`; what the batch must hold is listed in each docstring.
"""

from __future__ import annotations

import torch

from verl.algorithms import NOT_IMPLEMENTED_LOSSES, POLICY_LOSSES, agg_loss, compute_kl_loss, truncated_is_weights
from verl.algorithms.distillation import distillation_loss
from verl.algorithms.rollout_correction import RolloutCorrection, rollout_correction_of
from verl.config.key_errors import check_choice
from verl.models.logprob import check_packing, compute_response_logprobs
from verl.models.vision import media_of
from verl.models.shared_prompt import resolve_prompt_sharing
from verl.protocol import Batch
from verl.workers.engine import TrainingEngine, agg_counts, micro_batch_groups, restore_order, token_counts


ADDITIVE_METRICS = {"actor/pg_loss", "actor/entropy_loss", "actor/kl_loss", "actor/loss",
                    # reported by the update itself when the step is on-policy (see ppo_loss)
                    "actor/entropy", "actor/rollout_log_prob_diff", "actor/ref_kl",
                    # on-policy distillation (verl.workers.teacher)
                    "actor/distillation/loss", "actor/distillation/abs_loss"}
# Keys of the actor section (dotted below it) a policy loss reads besides the clip ratios, by loss_mode.
LOSS_SETTINGS = {
    "sapo": ("tau_pos", "tau_neg"),
    "clip_cov": ("policy_loss.clip_cov_ratio", "policy_loss.clip_cov_lb", "policy_loss.clip_cov_ub"),
    "kl_cov": ("policy_loss.kl_cov_ratio", "policy_loss.ppo_kl_coef"),
}


def _model_inputs(mb: Batch, device):
    return (mb["input_ids"].to(device), mb["attention_mask"].to(device), mb["position_ids"].to(device),
            mb["responses"].to(device))


class PolicyModel:
    """A causal LM that scores responses: the base of the actor and the reference."""

    def __init__(self, model: torch.nn.Module, device: torch.device, micro_batch_size: int | None = None, *,
                 max_token_len: int | None = None, remove_padding: bool = False, data_parallel: bool = True,
                 share_prompts: bool | None = False, max_length: int | None = None):
        """``micro_batch_size`` rows per log-prob forward pass (null: all), or with ``max_token_len``
        (dynamic batch size) balanced passes of at most that many tokens. ``remove_padding`` runs
        every pass on packed sequences (checked to be exact for this model first). ``share_prompts``
        runs each distinct prompt once (:mod:`verl.models.shared_prompt`): None = where the model
        allows it, True = required; ``self.share_prompts`` says what was decided. ``max_length``: the longest
        sequence (prompt + response) the run passes, when known (a model with a sliding window shares prompts
        when its window holds that)."""
        # The model comes ready: placed on ``device`` and, where its role asks for it, sharded
        # (``verl.distributed.fsdp.parallelize``) by whoever built it. Roles know nothing of placement.
        self.model = model
        self.device = device
        self.micro_batch_size = micro_batch_size
        self.max_token_len = max_token_len
        self.remove_padding = remove_padding
        self.data_parallel = data_parallel
        if remove_padding:
            check_packing(model, device, "actor_rollout_ref.model.use_remove_padding")
        self.share_prompts = resolve_prompt_sharing(model, device, share_prompts, remove_padding=remove_padding,
                                                    max_length=max_length)

    @torch.no_grad()
    def compute_log_prob(self, batch: Batch, *, with_entropy: bool = False, with_sum_pi_squared: bool = False):
        """Log-probs ``[B, T_resp]`` (and entropies) of ``batch["responses"]``; with
        ``with_sum_pi_squared`` also sum_v pi(v)^2 per token, as a third value.

        Needs ``input_ids``, ``attention_mask``, ``position_ids``, ``responses``; the sampling
        temperature is read from ``batch.meta["temperature"]`` (default 1).
        """
        temperature = batch.meta.get("temperature", 1.0)
        was_training = self.model.training
        self.model.eval()
        log_probs, entropies, spps = [], [], []
        groups = micro_batch_groups(batch, self.micro_batch_size, self.max_token_len,
                                    data_parallel=self.data_parallel)
        try:
            for rows in groups:
                # An empty group (another rank needs more passes) still runs one, for FSDP's collectives.
                mb = batch.index(rows or [0])
                lp, ent, *spp = compute_response_logprobs(
                    self.model, *_model_inputs(mb, self.device), temperature=temperature,
                    with_entropy=with_entropy, remove_padding=self.remove_padding,
                    with_sum_pi_squared=with_sum_pi_squared, share_prompts=self.share_prompts, media=media_of(mb))
                if rows:
                    log_probs.append(lp)
                    entropies.append(ent)
                    spps.extend(spp)
        finally:
            self.model.train(was_training)
        out_device = batch["responses"].device
        log_prob = restore_order(groups, log_probs).to(out_device)
        entropy = restore_order(groups, entropies).to(out_device) if with_entropy else None
        if with_sum_pi_squared:
            return log_prob, entropy, restore_order(groups, spps).to(out_device)
        return log_prob, entropy


class Actor(PolicyModel):
    """The policy under training: PPO-style updates over mini- and micro-batches."""

    def __init__(self, model, config, device, *, samples_per_mini_batch: int, total_steps: int | None,
                 log_prob_micro_batch_size: int | None = None, log_prob_max_token_len: int | None = None,
                 remove_padding: bool = False, seed: int = 0, norm_len: int | None = None,
                 rollout_correction: RolloutCorrection | None = None, share_prompts: bool | None = False,
                 max_length: int | None = None):
        """``config`` is the ``actor_rollout_ref.actor`` section (its ``use_dynamic_bsz`` and
        ``ppo_max_token_len_per_gpu`` shape the update's micro-batches); the old-log-prob passes
        take ``log_prob_micro_batch_size`` or ``log_prob_max_token_len`` (the rollout section's)."""
        check_choice("actor_rollout_ref.actor.policy_loss.loss_mode", config.policy_loss.loss_mode,
                     list(POLICY_LOSSES), "policy loss", NOT_IMPLEMENTED_LOSSES)
        super().__init__(model, device, log_prob_micro_batch_size, max_token_len=log_prob_max_token_len,
                         remove_padding=remove_padding, share_prompts=share_prompts, max_length=max_length)
        self.config = config
        # verl's algorithm.rollout_correction, passed in by the trainer; alone, token-level TIS from this section.
        self.rollout_correction = rollout_correction or rollout_correction_of(config)
        self.update_max_token_len = config.ppo_max_token_len_per_gpu if config.use_dynamic_bsz else None
        self.samples_per_mini_batch = samples_per_mini_batch
        # The constant length normaliser of seq-mean-token-sum-norm (the configured maximum
        # response length), so that every micro-batch divides by the same number.
        self.norm_len = norm_len
        self.engine = TrainingEngine(self.model, config.optim, config.fsdp_config, device, grad_clip=config.grad_clip,
                                     total_steps=total_steps, seed=seed, metric_prefix="actor")
        self.policy_loss_fn = POLICY_LOSSES[config.policy_loss.loss_mode]
        # The loss's own settings beyond PPO's clip ratios, under verl's key names.
        self.loss_settings = {key.rsplit(".", 1)[-1]: config.get(key)
                              for key in LOSS_SETTINGS.get(config.policy_loss.loss_mode, ())}

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.engine.optimizer

    def ppo_loss(self, mb: Batch, log_prob: torch.Tensor, entropy: torch.Tensor, counts: dict):
        """The default objective: clipped policy loss, minus an entropy bonus, plus a KL loss.

        A loss function gets the micro-batch (on its own device), the log-probs and entropies
        ``[B, T_resp]`` of its responses under the current policy (with gradients), and
        ``counts`` (``global_tokens``, ``global_seqs`` of the mini-batch on all data-parallel ranks
        and the ``norm_len`` of ``seq-mean-token-sum-norm``, for normalising:
        ``agg_loss(..., **counts)``).
        It returns ``(loss, metrics)``; metrics listed in ``ADDITIVE_METRICS`` are summed over
        micro-batches, the rest averaged. With ``rollout_is_correction`` the policy loss of each
        token is weighted by the truncated ratio of ``old_log_probs`` to ``rollout_log_probs``;
        weights :meth:`update` computed for the whole batch (``rollout_is_weights``) come first.
        """
        cfg = self.config
        mask = mb["response_mask"]
        if self.rollout_correction.bypass_mode:
            return self._bypass_loss(mb, log_prob, entropy, counts)
        on_policy = "old_log_probs" not in mb
        # Without old_log_probs the update is on-policy (one epoch, one mini-batch: the trainer skips
        # the separate pass): the policy that sampled is the one being updated, so its log-probs are
        # the current ones, detached.
        old_log_probs = log_prob.detach() if on_policy else mb["old_log_probs"]
        is_weights, is_metrics = None, {}
        if "rollout_is_weights" in mb:
            is_weights = mb["rollout_is_weights"]
        elif cfg.rollout_is_correction:
            is_weights, is_metrics = truncated_is_weights(old_log_probs, mb["rollout_log_probs"], mask,
                                                          cfg.rollout_is_threshold)
        pg_loss, metrics = self.policy_loss_fn(
            old_log_probs, log_prob, mb["advantages"], mask,
            clip_ratio=cfg.clip_ratio, clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high,
            clip_ratio_c=cfg.clip_ratio_c, loss_agg_mode=cfg.loss_agg_mode, rollout_is_weights=is_weights,
            **self.loss_settings, **counts)
        metrics.update(is_metrics)
        if on_policy:
            metrics.update(self._on_policy_metrics(mb, old_log_probs, entropy, counts))
        return self._add_regularisers(mb, pg_loss, metrics, log_prob, entropy, counts)

    def _bypass_loss(self, mb: Batch, log_prob, entropy, counts: dict):
        """verl's bypass mode: the rollout's log-probs are pi_old (the trainer ran no old-log-prob pass,
        whatever the epochs and mini-batches), and the policy loss is ``loss_type``'s with its
        importance weights and rejection computed per micro-batch from the current policy
        (:func:`~verl.algorithms.rollout_correction.bypass_policy_loss`)."""
        if "rollout_log_probs" not in mb:
            raise ValueError("algorithm.rollout_correction.bypass_mode=true uses the rollout's log-probs as the "
                             "old ones, and this batch has no rollout_log_probs: set "
                             "actor_rollout_ref.rollout.calculate_log_probs=true with an engine that reports them")
        cfg = self.config
        pg_loss, metrics = self.rollout_correction.bypass_loss(
            log_prob, mb["rollout_log_probs"], mb["advantages"], mb["response_mask"],
            clip_ratio=cfg.clip_ratio, clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high,
            clip_ratio_c=cfg.clip_ratio_c, loss_agg_mode=cfg.loss_agg_mode, **counts)
        # The skipped pass's metrics (entropy, rollout/ref gaps), from the update's own forward.
        metrics.update(self._on_policy_metrics(mb, log_prob.detach(), entropy, counts))
        return self._add_regularisers(mb, pg_loss, metrics, log_prob, entropy, counts)

    def _add_regularisers(self, mb: Batch, pg_loss, metrics: dict, log_prob, entropy, counts: dict):
        """``pg_loss`` minus the entropy bonus plus the KL loss, over the full ``response_mask``."""
        cfg = self.config
        mask = mb["response_mask"]
        loss = pg_loss
        metrics["actor/pg_loss"] = pg_loss.detach()
        if cfg.entropy_coeff != 0:
            entropy_loss = agg_loss(entropy, mask, cfg.loss_agg_mode, **counts)
            loss = loss - cfg.entropy_coeff * entropy_loss
            metrics["actor/entropy_loss"] = entropy_loss.detach()
        if cfg.use_kl_loss:
            kl_loss, _ = compute_kl_loss(log_prob, mb["ref_log_prob"], mask, cfg.kl_loss_type, cfg.loss_agg_mode,
                                         **counts)
            loss = loss + cfg.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss.detach()
            metrics["actor/kl_coef"] = cfg.kl_loss_coef
        if "teacher_log_prob" in mb:  # on-policy distillation: its settings travel in the batch's meta
            # pi_old as the policy loss has it: the rollout's (bypass mode), the old pass's, or on-policy the current.
            old = (mb["rollout_log_probs"] if self.rollout_correction.bypass_mode
                   else mb["old_log_probs"] if "old_log_probs" in mb else log_prob.detach())
            loss, metrics = distillation_loss(loss, metrics, settings=mb.meta["distillation"], log_prob=log_prob,
                                              old_log_prob=old, teacher_log_prob=mb["teacher_log_prob"], mask=mask,
                                              loss_agg_mode=cfg.loss_agg_mode, counts=counts,
                                              rollout_is_weights=mb["rollout_is_weights"]
                                              if "rollout_is_weights" in mb else None)
        return loss, metrics

    @staticmethod
    def _on_policy_metrics(mb: Batch, log_prob, entropy, counts: dict) -> dict:
        """What the skipped old-log-prob pass would have given the step's metrics, as token means over
        the mini-batch (additive: micro-batches and ranks sum to the whole)."""
        mask = mb["response_mask"]
        out = {"actor/entropy": agg_loss(entropy.detach(), mask, "token-mean", **counts)}
        if "rollout_log_probs" in mb:
            out["actor/rollout_log_prob_diff"] = agg_loss((log_prob - mb["rollout_log_probs"]).abs(), mask,
                                                          "token-mean", **counts)
        if "ref_log_prob" in mb:
            out["actor/ref_kl"] = agg_loss(log_prob - mb["ref_log_prob"], mask, "token-mean", **counts)
        return out

    def update(self, batch: Batch, *, micro_batch_size: int | None = None, loss_fn=None,
               mini_batch_size: int | None = None, epochs: int | None = None) -> dict[str, float]:
        """PPO epochs over mini-batches; one optimiser step per mini-batch.

        ``loss_fn`` (default :meth:`ppo_loss`) turns a micro-batch and its log-probs into a loss.
        The default needs ``old_log_probs``, ``advantages``, ``response_mask`` (+ ``ref_log_prob``
        with a KL loss). Each micro-batch loss is normalised by its mini-batch's token and sequence
        counts over all data-parallel ranks, so accumulating micro-batches (and summing gradients
        over ranks) gives exactly the gradient of the whole mini-batch in one process.
        ``mini_batch_size`` (samples) and ``epochs`` override the configured values for this call.
        With ``use_dynamic_bsz`` the micro-batches are cut by tokens and ``micro_batch_size`` is ignored.

        Data-parallel: ``batch`` is this rank's share; the ranks may hold different numbers of
        samples only as long as they run equally many mini- and micro-batches (checked). The metrics
        returned are those of all ranks together (loss terms summed, the rest averaged).
        """
        loss_fn = loss_fn or self.ppo_loss
        temperature = batch.meta.get("temperature", 1.0)
        batch, correction_metrics = self._rollout_correction(batch)

        def loss_of_log_probs(model, mb: Batch, counts: dict):
            log_prob, entropy = compute_response_logprobs(
                model, mb["input_ids"], mb["attention_mask"], mb["position_ids"], mb["responses"],
                temperature=temperature, with_entropy=True, remove_padding=self.remove_padding,
                share_prompts=self.share_prompts, media=media_of(mb))
            return loss_fn(mb, log_prob, entropy, agg_counts(counts, self.norm_len))

        metrics = self.engine.train_batch(
            batch, loss_of_log_probs, counts_fn=token_counts, additive=ADDITIVE_METRICS,
            micro_batch_size=micro_batch_size, mini_batch_size=mini_batch_size or self.samples_per_mini_batch,
            epochs=epochs or self.config.ppo_epochs, shuffle=self.config.shuffle,
            max_token_len=self.update_max_token_len)
        return {**metrics, **correction_metrics}

    def _rollout_correction(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """verl's rollout correction beyond per-token TIS (sequence-level weights, batch
        normalisation, rejection sampling), computed once over the whole batch before the first
        gradient step, from the old log-probs, as verl does: the batch comes back with
        ``rollout_is_weights`` and with the rejected tokens out of ``response_mask`` (so out of
        every loss term and its token counts). The ``rollout_corr/*`` metrics are this rank's."""
        correction = self.rollout_correction
        if not correction.batch_level:
            return batch, {}
        # A copy: the caller keeps its own response_mask (response-length metrics and the like).
        batch = Batch(batch.tensors, batch.non_tensors, batch.meta)
        if "old_log_probs" not in batch:
            # An on-policy step (the trainer skipped the old-log-prob pass): the weights that sampled
            # are the current ones, so one forward gives the old log-probs the batch-level statistics need.
            batch["old_log_probs"], _ = self.compute_log_prob(batch)
        weights, batch["response_mask"], metrics = correction.apply(batch["old_log_probs"], batch["rollout_log_probs"],
                                                                    batch["response_mask"])
        if weights is not None:
            batch["rollout_is_weights"] = weights
        return batch, metrics

    def state_dict(self) -> dict:
        return self.engine.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.engine.load_state_dict(state)
