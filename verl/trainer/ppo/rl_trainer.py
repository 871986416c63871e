"""The PPO-family RL loop: ``RLTrainer.fit()`` runs the RL step of DESIGN.md, stage by stage.

The trainer is the single controller: it owns the data loader, the KL controller, the logger and
the checkpoints, and moves one :class:`~verl.protocol.Batch` through the role worker groups.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict

from verl.algorithms import make_kl_controller
from verl.algorithms.advantages import estimator_inputs
from verl.checkpoint import CheckpointManager, restore_rng_state, rng_state
from verl.distributed.process_group import is_main_process
from verl.distributed.watchdog import Watchdog
from verl.distributed.worker_group import Traffic
from verl.protocol import Batch
from verl.trainer.flat_rewards import FlatRewards
from verl.trainer.nonfinite import NonfiniteGuard
from verl.trainer.ppo.core import apply_kl_and_advantage, compute_data_metrics
from verl.trainer.ppo.sampling import StepSampler
from verl.trainer.ppo.validation import run_validation, select_generations
from verl.trainer.progress import rl_postfix
from verl.trainer.run_loop import (refuse_changed_lora, resume_from_checkpoint, run_loop, save_checkpoint,
                                  warn_changed_settings)
from verl.trainer.timing import timer
from verl.workers.token_balance import balanced_order

logger = logging.getLogger(__name__)

# The learning rate to lower when a stage's updates keep coming out NaN or inf.
# Stages whose skipped updates are counted: (metric prefix, the learning-rate key a fix names).
NONFINITE_STAGES = {"update_critic": ("critic", "critic.optim.lr"),
                    "update_actor": ("actor", "actor_rollout_ref.actor.optim.lr")}


class RLTrainer:
    """Runs on every rank of a torchrun job alike (each with the same data; the worker groups split
    each batch over the ranks and gather the results), so every rank holds the same batch and
    metrics. Rank 0 alone writes: logs, progress, checkpoints, the Hugging Face folder."""

    label = "RL"  # on the progress line

    def __init__(self, config, *, actor_rollout_ref, reward, train_loader, val_batches: list[Batch],
                 tracker, out_dir, total_steps: int, watchdog: Watchdog, critic=None, use_ref: bool = False,
                 teacher=None, distillation: dict | None = None, placement=None):
        """``teacher``: the group of frozen teachers of on-policy distillation, whose settings
        (``distillation.distillation_loss`` as a dict) reach the actor's loss in ``batch.meta``.
        ``placement``: the :class:`~verl.trainer.ppo.placement.Roles` the groups belong to, released
        by :meth:`close` (Ray's actors and their resource pools)."""
        self.config = config
        self.actor_rollout_ref = actor_rollout_ref
        self.critic = critic
        self.reward = reward
        self.train_loader = train_loader
        self.val_batches = val_batches
        self.tracker = tracker
        self.out_dir = out_dir
        self.total_steps = total_steps
        self.use_ref = use_ref
        self.teacher = teacher
        self.distillation = distillation
        self.watchdog = watchdog
        self.placement = placement
        self.is_main = is_main_process()
        self.sampler = StepSampler(config, actor_rollout_ref, reward)
        kl = config.algorithm.kl_ctrl
        self.kl_ctrl = make_kl_controller(kl.type, kl.kl_coef, kl.target_kl, kl.horizon)
        self.checkpoints = CheckpointManager(out_dir, config.trainer.max_actor_ckpt_to_keep, main=self.is_main)
        self.global_step = 0
        self.stage_seconds: dict[str, float] = defaultdict(float)
        self.val_history: list[tuple[int, dict]] = []
        self.nonfinite = NonfiniteGuard(config.trainer.max_nonfinite_steps, NONFINITE_STAGES, warn=self.is_main)
        self.flat_rewards = FlatRewards(warn=self.is_main)

    # ------------------------------------------------------------------ the RL step
    def fit(self) -> dict:
        """Train to ``total_steps`` (resuming from the latest checkpoint; see :func:`run_loop`)."""
        run_loop(self, self.config.trainer)
        return {"steps": self.global_step, "stage_seconds": dict(self.stage_seconds),
                "validation": self.val_history}

    def close(self) -> None:
        """Release the workers' processes (the Ray actors; nothing in one process or under torchrun).
        The trainer's groups cannot be called afterwards."""
        if self.placement is not None:
            self.placement.shutdown()

    def next_step(self) -> dict:
        self.global_step += 1
        metrics = self.train_step(next(self.train_loader))
        self.watch_step(metrics)
        return metrics

    def watch_step(self, metrics: dict) -> None:
        """What a finished step's metrics tell about the run: warn about a step whose actor or critic skipped
        an update (NaN/inf loss or gradient norm) and stop once more than ``trainer.max_nonfinite_steps`` steps
        in a row did (verl.trainer.nonfinite); warn when the first steps score every sample alike
        (verl.trainer.flat_rewards)."""
        self.nonfinite.observe(self.global_step, metrics, lambda m: self.tracker.log(m, self.global_step))
        self.flat_rewards.observe(self.global_step, metrics)

    def train_step(self, prompts: Batch) -> dict:
        timing: dict[str, float] = {}
        metrics: dict[str, float] = {}
        traffic = self.traffic()
        with timer("step", timing):
            # Stages gen, gen_baseline (ReMax) and reward; DAPO dynamic sampling draws more prompts here.
            batch, sample_metrics = self.sampler.generate_and_score(prompts, self.train_loader, timing,
                                                                    step=self.global_step)
            metrics.update(sample_metrics)
            batch = self.learn(batch, metrics, timing)
        return self.step_metrics(batch, metrics, timing, traffic)

    def traffic(self) -> Traffic:
        """Counts the bytes the groups move between processes from now on (``perf/bytes_*``)."""
        return Traffic((self.actor_rollout_ref, self.critic, self.reward, self.teacher))

    def learn(self, batch: Batch, metrics: dict, timing: dict) -> Batch:
        """The stages after a scored rollout batch: old and reference log-probs, values, advantages,
        the critic's and the actor's updates. Returns the batch as the update saw it."""
        algo = self.config.algorithm
        if self.bypass_old_log_prob():
            batch = self._rollout_as_old_log_probs(batch)
        elif not self.on_policy_update(len(batch)):
            with timer("old_log_prob", timing):
                batch = batch.union(self.actor_rollout_ref.run("compute_log_prob", batch))
        if self.use_ref:
            with timer("ref", timing):
                batch = batch.union(self.actor_rollout_ref.run("compute_ref_log_prob", batch,
                                                               private=self.read_by_the_actor_alone(batch)))
        if self.teacher is not None:
            with timer("teacher", timing):
                batch = batch.union(self.teacher.run("compute_teacher_log_prob", batch))
            batch.meta["distillation"] = self.distillation
        if self.critic is not None:
            with timer("values", timing):
                batch = batch.union(Batch({"values": self.critic.run("compute_values", batch)}))
        with timer("adv", timing):
            batch, kl_metrics = apply_kl_and_advantage(batch, algo, self.kl_ctrl)
            metrics.update(kl_metrics)
        if self.config.trainer.balance_batch:
            batch = self._balanced(batch)
        if self.critic is not None:
            with timer("update_critic", timing):
                metrics.update(self.critic.run("update", batch, block=self.samples_per_mini_batch("critic")))
        if self.global_step > self.config.critic.warmup_steps:
            with timer("update_actor", timing):
                metrics.update(self.actor_rollout_ref.run("update_actor", batch,
                                                          block=self.samples_per_mini_batch("actor")))
        for group in (self.actor_rollout_ref, self.critic, self.reward, self.teacher):
            if group is not None:
                group.end_step()
        return batch

    def step_metrics(self, batch: Batch, metrics: dict, timing: dict, traffic: Traffic) -> dict:
        """The step's metrics: the stages' own, the data's, timing, throughput and bytes moved."""
        metrics.update(compute_data_metrics(batch, self.config.data.max_response_length))
        metrics.update(timing)
        n_tokens = int(batch["attention_mask"].sum())
        metrics["perf/total_num_tokens"] = n_tokens
        metrics["perf/time_per_step"] = timing["timing_s/step"]
        metrics["perf/throughput"] = n_tokens / max(timing["timing_s/step"], 1e-9)
        metrics.update(traffic.metrics())
        for key, seconds in timing.items():
            self.stage_seconds[key.split("/", 1)[1]] += seconds
        return metrics

    def on_policy_update(self, rows: int) -> bool:
        """Whether this step's actor update is exactly on-policy: one PPO epoch over one mini-batch, so
        the weights that sampled are the ones the loss differentiates, and the old log-probs are the
        current ones (the update takes them, detached, from its own forward: one pass over the batch
        fewer, as TRL does). Not when anything reads the old log-probs before the update (KL in the
        reward, an estimator that takes them, such as the optimal token baseline)."""
        actor = self.config.actor_rollout_ref.actor
        algo = self.config.algorithm
        return (actor.ppo_epochs == 1 and rows <= self.samples_per_mini_batch("actor")
                and not algo.use_kl_in_reward and "old_log_probs" not in estimator_inputs(algo.adv_estimator))

    def read_by_the_actor_alone(self, batch: Batch) -> tuple[str, ...]:
        """Reference columns that only the actor's own loss reads, never this controller: the reference
        log-probs, unless the KL penalty of the reward or the old-vs-reference KL metric reads them here
        (the latter only where the old log-probs came back too). The group decides where they live."""
        if self.config.algorithm.use_kl_in_reward or "old_log_probs" in batch:
            return ()
        return ("ref_log_prob",)

    def bypass_old_log_prob(self) -> bool:
        """verl's ``algorithm.rollout_correction.bypass_mode``: no old-log-prob pass at all, whatever the
        epochs and mini-batches; the rollout engine's log-probs play pi_old (the actor reads them itself)."""
        return bool(self.config.algorithm.rollout_correction.bypass_mode)

    def _rollout_as_old_log_probs(self, batch: Batch) -> Batch:
        """The batch of a bypass-mode step: checked to hold ``rollout_log_probs``; with KL in the reward
        (which reads pi_old before the update) they also become ``old_log_probs``, as in verl."""
        if "rollout_log_probs" not in batch:
            raise ValueError("algorithm.rollout_correction.bypass_mode=true uses the rollout's log-probs as the old "
                             "ones, and the rollout reported none: set actor_rollout_ref.rollout.calculate_log_probs="
                             "true with an engine that reports them")
        if self.config.algorithm.use_kl_in_reward:
            batch = batch.union(Batch({"old_log_probs": batch["rollout_log_probs"]}))
        return batch

    def _balanced(self, batch: Batch) -> Batch:
        """The step's samples reordered within every mini-batch (of the actor and the critic both) so
        that the contiguous shares the ranks get hold similar numbers of tokens. Advantages are
        already computed (groups are found by uid), so order within a mini-batch is free."""
        block = self.samples_per_mini_batch("actor")
        if self.critic is not None:
            block = math.gcd(block, self.samples_per_mini_batch("critic"))
        lengths = batch["attention_mask"].sum(-1).tolist()
        return batch.index(balanced_order(lengths, self.actor_rollout_ref.world_size, block))

    def samples_per_mini_batch(self, role: str) -> int:
        """Rows of one optimiser step of ``role``: the group splits each such block over the ranks,
        so that every rank trains on its part of the same mini-batches one process would."""
        return self.config.derived_sizes(dp_size=1, role=role)["samples_per_mini_batch"]

    # ------------------------------------------------------------------ what run_loop calls
    def has_validation(self) -> bool:
        return bool(self.val_batches)

    def goal_reached(self) -> bool:
        return False  # an RL run trains its total_training_steps

    def postfix(self, metrics: dict) -> str:
        return rl_postfix(metrics)

    def export(self) -> None:
        self.actor_rollout_ref.call("export_hf", self.out_dir / "huggingface")

    # ------------------------------------------------------------------ validation
    def validate(self, generations: list[dict] | None = None) -> dict[str, float]:
        """Greedy (and sampled) decoding on the validation set: see ``verl.trainer.ppo.validation``."""
        start = time.perf_counter()
        metrics = run_validation(self.actor_rollout_ref, self.reward, self.val_batches, self.config, generations)
        self.stage_seconds["validate"] += time.perf_counter() - start
        return metrics

    def log_validation(self) -> None:
        generations = self.generations_wanted()
        self.record_validation(self.global_step, self.validate(generations), generations)

    def generations_wanted(self) -> list[dict] | None:
        """A list for validation's samples when ``trainer.log_val_generations`` asks for them, else None."""
        return [] if self.config.trainer.log_val_generations else None

    def record_validation(self, step: int, metrics: dict[str, float], generations: list[dict] | None) -> None:
        """The validation of ``step``: into the history (checkpointed) and to every logger."""
        self.val_history.append((step, metrics))
        self.tracker.log(metrics, step)
        if generations:
            self.tracker.log_generations(select_generations(generations, self.config.trainer.log_val_generations),
                                         step)
        if self.is_main:
            logger.info("validation at step %d: %s", step, ", ".join(f"{k}={v:.3f}" for k, v in metrics.items()))

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        # Full (unsharded) tensors: a checkpoint resumes at any number of ranks.
        state = {"global_step": self.global_step, "actor": self.actor_rollout_ref.call("state_dict"),
                 "loader": self.train_loader.state_dict(), "kl_coef": self.kl_ctrl.value, "rng": rng_state(),
                 "val_history": self.val_history, "stage_seconds": dict(self.stage_seconds),
                 "config": self.config.to_dict()}  # a resume under other settings is told which
        if self.critic is not None:
            state["critic"] = self.critic.call("state_dict")
        return state

    def load_state_dict(self, state: dict) -> None:
        ahead = state.get("async", {}).get("done", {})
        if ahead and self.is_main:
            logger.warning("this checkpoint of an asynchronous run holds %d batch(es) generated ahead (steps %s); a "
                           "synchronous resume does not train on them and their prompts are skipped; resume with "
                           "async_training.enable=true to train on them", len(ahead), sorted(ahead))
        current = self.config.to_dict()
        models = ("actor_rollout_ref.model",) + (("critic.model",) if self.critic is not None and "critic" in state
                                                 else ())
        refuse_changed_lora(state.get("config"), current, models, self.checkpoints.root)
        if self.is_main:
            warn_changed_settings(state.get("config"), current, self.checkpoints.root)
        self.actor_rollout_ref.call("load_state_dict", state["actor"])
        if self.critic is not None and "critic" in state:
            self.critic.call("load_state_dict", state["critic"])
        elif self.critic is not None and self.is_main:
            saved = (state.get("config") or {}).get("algorithm", {}).get("adv_estimator", "unknown")
            logger.warning("the checkpoint in %s holds no critic (its run used algorithm.adv_estimator=%s): the critic "
                           "starts untrained from critic.model.path at step %d, and so do its optimizer and "
                           "learning-rate schedule; set critic.warmup_steps to update it alone for a few steps first",
                           self.checkpoints.root, saved, state["global_step"])
        self.train_loader.load_state_dict(state["loader"])
        self.kl_ctrl.value = state["kl_coef"]
        restore_rng_state(state["rng"])
        self.global_step = state["global_step"]
        self.val_history = state["val_history"]
        self.stage_seconds.update(state["stage_seconds"])

    def save_checkpoint(self) -> None:
        start = time.perf_counter()
        save_checkpoint(self.checkpoints, self.global_step, self.state_dict())
        self.stage_seconds["save_checkpoint"] += time.perf_counter() - start

    def resume(self) -> None:
        """Load the checkpoint ``trainer.resume_mode`` points at, if any."""
        resume_from_checkpoint(self, self.checkpoints, self.config.trainer)

