"""``BaseTrainer``: scheduling, logging and checkpointing around an objective you can replace.

Subclass it and override :meth:`BaseTrainer.compute_loss` to change what the policy optimises;
batching, micro-batch accumulation, gradient clipping, logging and checkpoints stay as they are::

    class MyTrainer(PPOTrainer):
        def compute_loss(self, batch, log_prob, entropy, counts):
            loss, metrics = super().compute_loss(batch, log_prob, entropy, counts)
            return loss - 0.01 * agg_loss(entropy, batch["response_mask"], "token-mean", **counts), metrics
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from verl.checkpoint import CheckpointManager
from verl.config.node import ConfigNode
from verl.config.schema import LoggerConfig
from verl.distributed.process_group import is_main_process
from verl.errors import ConfigError
from verl.protocol import Batch
from verl.tracking import Tracker
from verl.trainer.run_loop import save_checkpoint


def logger_spec(trainer: str, logger) -> dict:
    """``logger=`` as the tutorial gives it, ``dict(type="wandb", project="my-rl")``, checked as TrainerConfig's
    ``logger`` section; the logger names alone (``"wandb"``, ``["console", "tensorboard"]``, as trainer.logger
    takes them) are its ``type``. Before, another key (``backend=``, verl's ``project_name=``) was dropped without
    a word, so the run logged to the console alone or under the project "verl"."""
    if logger is None:
        return {}
    if isinstance(logger, (str, list, tuple)):
        logger = {"type": list(logger) if isinstance(logger, tuple) else logger}
    if not isinstance(logger, Mapping):
        raise ConfigError(f"{trainer}(logger=...) takes a dict such as dict(type='wandb', project='my-rl'), or the "
                          f"logger names ('wandb', ['console', 'tensorboard']); got {type(logger).__name__}")
    try:
        section = LoggerConfig.from_dict(dict(logger))
    except ConfigError as e:
        raise ConfigError(f"{trainer}(logger=...): {e}") from None
    return {key: value for key, value in section.to_dict().items() if value is not None}


class BaseTrainer:
    def __init__(self, actor_rollout_ref_worker, *, logger=None, output_dir: str | None = None):
        # The config meant for the worker, nothing (the worker not built yet), or a model (the worker loads its own).
        if isinstance(actor_rollout_ref_worker, (ConfigNode, Mapping, str)) or not all(
                hasattr(actor_rollout_ref_worker, name) for name in ("actor_model", "tokenizer", "update_actor")):
            raise ConfigError(f"{type(self).__name__}(actor_rollout_ref_worker=...) takes the worker built from the "
                              f"config, got {type(actor_rollout_ref_worker).__name__}; build it first: worker = "
                              f"ActorRolloutRefWorker(config=cfg.actor_rollout_ref), then "
                              f"{type(self).__name__}(actor_rollout_ref_worker=worker)"
                              + ("; the worker loads the model itself from actor_rollout_ref.model.path"
                                 if hasattr(actor_rollout_ref_worker, "generate") else ""))
        self.worker = actor_rollout_ref_worker
        self.global_step = self._start_step = 0
        self._rewound = False  # the output folder's rows after _start_step are cleared at the first log
        self.output_dir = Path(output_dir) if output_dir else None
        self.tracker = None
        if logger is not None or output_dir is not None:
            spec = logger_spec(type(self).__name__, logger)
            backends = spec.get("type", "console")
            self.tracker = Tracker(backends, self.output_dir or Path("outputs") / spec.get("project", "verl"),
                                   project=spec.get("project", "verl"), experiment=spec.get("name", "run"),
                                   progress_bar=False, record=is_main_process())

    def compute_loss(self, batch: Batch, log_prob, entropy, counts: dict):
        """The policy objective for one micro-batch: ``(loss, metrics)``.

        ``batch`` holds the micro-batch (``response_mask``, ``old_log_probs``, ``advantages``,
        ``ref_log_prob`` when a reference exists, ...); ``log_prob`` and ``entropy`` are ``[B, T_resp]``
        under the current policy, with gradients; ``counts`` holds the mini-batch's
        ``global_tokens`` / ``global_seqs`` (and the ``norm_len`` of ``seq-mean-token-sum-norm``) so
        that micro-batches add up to the mini-batch loss: pass it on as ``agg_loss(..., **counts)``.
        The default is the PPO clipped objective configured on the actor.
        """
        return self.worker.actor.ppo_loss(batch, log_prob, entropy, counts)

    def log(self, metrics: dict) -> None:
        if self.tracker is not None:
            if not self._rewound:
                # As a run started again does: the rows an earlier trainer logged to this output folder after
                # this one's start go (a notebook cell run twice wrote steps 1, 2, 1, 2 into one metrics.jsonl).
                self._rewound = True
                self.tracker.rewind(self._start_step)
            self.tracker.log(metrics, self.global_step)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {"global_step": self.global_step, "actor": self.worker.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.global_step = state["global_step"]
        if not self._rewound:
            self._start_step = self.global_step
        self.worker.load_state_dict(state["actor"])

    def save_checkpoint(self, directory: str) -> Path:
        """Write a resumable checkpoint (``directory/global_step_N``), crash-safe. Under torchrun every
        rank calls it (gathering the sharded state is a collective) and rank 0 writes."""
        return save_checkpoint(CheckpointManager(directory, main=is_main_process()), self.global_step, self.state_dict())

    def load_checkpoint(self, directory: str) -> None:
        """Resume from the newest checkpoint under ``directory`` that loads (a damaged newer one is
        skipped with a warning)."""
        found = CheckpointManager(directory, main=is_main_process()).load_latest()
        if found is None:
            raise FileNotFoundError(f"no complete checkpoint under {directory}")
        self.load_state_dict(found[1])
