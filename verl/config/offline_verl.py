"""verl's SFT keys (its ``fsdp_sft_trainer`` / ``sft_trainer`` YAMLs and example scripts) that the
offline configs take besides their own: each works here, or moves onto the key read here at
``validate()``, or is accepted with no effect (its help says why; a value that asks for something
not done here logs a warning), or is refused with one line naming what to use. The sections of
:mod:`verl.config.offline` list these mixins before their own base, so verl's keys come last in
``--help`` and ``--cfg job``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from verl.config import verl_rules
from verl.config.compat import Move, apply_move
from verl.config.cross_checks import check_loggers, warn_if_resume_path_unused
from verl.config.fields import dotted_keys
from verl.config.node import option, section
from verl.config.schema_actor import Dtype, EngineFSDPConfig, FSDPConfig
from verl.config.verl_rules import Section, strategy_option, verl_option

logger = logging.getLogger("verl.config")

_MEMORY_OR_SPEED = "micro-batches hold data.micro_batch_size_per_gpu examples here (a memory setting only: losses " \
                   "are normalised by the whole step, so the update is the same)"


def _checkpoint_section():
    return verl_option({"save_contents": ["model", "optimizer", "extra"],
                        "load_contents": ["model", "optimizer", "extra"]},
                       help="What a checkpoint holds (verl's checkpoint section).",
                       why="a checkpoint holds the model, the optimiser and the trainer state here, and the Hugging "
                       "Face folder is exported at the end of the run")


@dataclass
class SFTDataVerlKeys(Section):
    """verl's SFT data keys."""

    micro_batch_size: int | None = verl_option(None, bounds=">= 1", help="verl's older SFT micro-batch size.",
                                               why="verl's SFT trainer does not read it either: "
                                               "data.micro_batch_size_per_gpu sets the micro-batch (a memory "
                                               "setting; the update is the same)", warn_if=lambda v: v is not None,
                                               when="to a number")
    train_max_samples: int = option(-1, bounds=">= -1", help="Train on at most this many rows of data.train_files "
                                    "(a subset drawn with data.seed when data.shuffle, else the first ones); -1 (or "
                                    "0) = all.")
    val_max_samples: int = option(-1, bounds=">= -1", help="The same for data.val_files.")
    chat_template: str | None = option(None, help="verl's SFT name of model.custom_chat_template (a Jinja template "
                                       "as text, or a file holding it); validate() moves it there.")
    tools_key: str = option("tools", help="Column of a conversation row's tool schemas (a list, or that list as "
                            "JSON text), rendered by the chat template as the rollout renders them; a row without "
                            "that column (or with an empty value) has no tools.")
    enable_thinking_key: str = verl_option("enable_thinking", help="Column of per-row thinking switches.",
                                           why="no per-row template switch is read (use data.chat_template_kwargs "
                                           "for all rows)")
    balance_dp_token: bool = verl_option(False, help="Balance tokens, not rows, over data-parallel ranks.",
                                         why="each rank takes an equal number of rows (the update is the same)",
                                         warn_if=bool, when="to true")
    use_dynamic_bsz: bool = verl_option(False, help="Micro-batches by token count.", why=_MEMORY_OR_SPEED,
                                        warn_if=bool, when="to true")
    max_token_len_per_gpu: int = verl_option(8192, help="Token budget of a dynamic micro-batch.",
                                             why=_MEMORY_OR_SPEED)
    pad_mode: str = verl_option("no_padding", help="How a micro-batch is padded.",
                                why="micro-batches are right-padded here; padding is masked out of the loss")
    use_shm: bool = verl_option(False, help="Copy the data files to /dev/shm first.",
                                why="files are read where they are")
    ignore_input_ids_mismatch: bool = verl_option(False, help="Accept turn-by-turn tokenisation that differs from "
                                                  "the whole conversation's.",
                                                  why="a conversation is tokenised whole here")
    enable_thinking_default: str | bool | None = verl_option("none", help="The thinking switch of rows without "
                                                             "enable_thinking_key.", why="no per-row template "
                                                             "switch is read (use data.chat_template_kwargs)")
    num_workers: int = verl_option(8, help="Data-loader worker processes.", why="rows are tokenised once, up front")
    custom_cls: dict = verl_option({"path": None, "name": None}, help="A dataset class of your own.",
                                   inert=False, why="SFT rows are read from parquet/jsonl files here",
                                   refuse_if=lambda v: bool(v.get("path")), when="unless path is null",
                                   instead="write the rows to a file with prompt/response (or messages) columns",
                                   keys=("path", "name"))


@dataclass
class OfflineFSDPConfig(FSDPConfig):
    """FSDP2 sharding of an offline trainer's model, with verl's SFT FSDP keys."""

    model_dtype: Dtype | None = option(None, help="verl's SFT name of model.dtype (the dtype weights are loaded "
                                       "and trained in); validate() moves it there.")
    wrap_policy: dict = verl_option({"min_num_params": 0}, help="Which modules are wrapped as FSDP units.",
                                    why="every transformer block is one FSDP unit here")
    cpu_offload: bool = verl_option(False, help="verl's FSDP1 CPU offload.", why=verl_rules.MEMORY_ONLY +
                                    " (use param_offload / optimizer_offload)", warn_if=bool, when="to true")
    offload_params: bool = verl_option(False, help="verl's FSDP1 parameter offload.", why=verl_rules.MEMORY_ONLY +
                                       " (use param_offload)", warn_if=bool, when="to true")


@dataclass
class OfflineModelVerlKeys(Section):
    """verl's SFT model keys."""

    strategy: str = strategy_option("verl's SFT backend: fsdp or fsdp2 (both run this project's FSDP2).")


@dataclass
class OfflineTrainerVerlKeys(Section):
    """verl's SFT trainer keys."""

    default_hdfs_dir: str | None = verl_option(None, help="Where verl copies checkpoints to HDFS.", inert=False,
                                               why="checkpoints are not copied to HDFS here",
                                               refuse_if=lambda v: v is not None, when="unless null",
                                               instead="they are written to trainer.default_local_dir; copy "
                                               "that folder yourself")
    nnodes: int = verl_option(1, bounds=">= 1", help="Machines of the job.", why="the processes are torchrun's "
                              "(--nnodes, --nproc_per_node); a product of nnodes and n_gpus_per_node other than 1 "
                              "that differs from torchrun's world size logs a warning")
    n_gpus_per_node: int = verl_option(1, bounds=">= 1", help="GPUs per machine.", why="the processes are "
                                       "torchrun's (see nnodes)")
    checkpoint: dict = _checkpoint_section()
    balance_batch: bool = verl_option(True, help="Balance tokens over data-parallel ranks.",
                                      why="each rank takes an equal number of rows (the update is the same)")
    profile_interval: list = verl_option([-1, -1], help="Steps to profile.", why="nothing is profiled here")


@dataclass
class SFTTopLevelVerlKeys(Section):
    """verl's top-level SFT keys."""

    ulysses_sequence_parallel_size: int = option(1, bounds=">= 1", help="verl's Ulysses sequence-parallel group "
                                                 "size. No sequence parallelism here (every rank holds whole "
                                                 "sequences; the update is the same): above 1 logs a warning.")
    use_remove_padding: bool = option(False, help="verl's top-level SFT key: true sets model.use_remove_padding.")
    checkpoint: dict = _checkpoint_section()
    engine: EngineFSDPConfig = section(EngineFSDPConfig, help="verl's engine section of its engine-based SFT "
                                       "trainer (engine=fsdp): validate() moves param_offload, optimizer_offload "
                                       "and fsdp_size to model.fsdp_config, model_dtype to model.dtype, dtype to "
                                       "model.fsdp_config.mixed_precision.param_dtype; the rest as for the RL roles.")
    profiler: dict = verl_option({}, help="verl's profiler section.", why="nothing is profiled here")


# verl's SFT spellings that move onto the keys read here (see verl.config.compat.Move).
OFFLINE_MOVES = (
    Move("data.chat_template", "model.custom_chat_template"),
    Move("model.fsdp_config.model_dtype", "model.dtype", dst_default="float32"),
    # The engine-based SFT trainer's engine section.
    Move("engine.model_dtype", "model.dtype", dst_default="float32"),
    Move("engine.dtype", "model.fsdp_config.mixed_precision.param_dtype", dst_default="auto"),
    Move("engine.param_offload", "model.fsdp_config.param_offload", unset=False, dst_default=False),
    Move("engine.optimizer_offload", "model.fsdp_config.optimizer_offload", unset=False, dst_default=False),
    Move("engine.fsdp_size", "model.fsdp_config.fsdp_size", unset=-1, dst_default=-1),
)


def resolve_offline(cfg, dp_size: int) -> None:
    """Move verl's SFT spellings onto the keys read here and check what its other keys ask for
    (idempotent: a moved key is back at its default). Any offline config: the keys its sections lack
    are skipped."""
    keys = set(dotted_keys(type(cfg)))
    for move in OFFLINE_MOVES:
        if move.src in keys:
            apply_move(cfg, move, dp_size)
    if getattr(cfg, "use_remove_padding", False):
        cfg.model.use_remove_padding = True
    if getattr(cfg, "ulysses_sequence_parallel_size", 1) > 1:
        logger.warning("ulysses_sequence_parallel_size=%d: there is no sequence parallelism here; every rank "
                       "trains on whole sequences (the same update, more memory per rank)",
                       cfg.ulysses_sequence_parallel_size)
    trainer = cfg.trainer
    asked = trainer.nnodes * trainer.n_gpus_per_node
    if asked != 1 and asked != dp_size:
        logger.warning("trainer.nnodes=%d x trainer.n_gpus_per_node=%d asks for %d processes, but this job runs "
                       "%d: the number of processes is torchrun's (torchrun --nnodes=N --nproc_per_node=M -m ...)",
                       trainer.nnodes, trainer.n_gpus_per_node, asked, dp_size)
    warn_if_resume_path_unused(trainer)
    check_loggers(cfg, ("trainer.logger",))
    verl_rules.check(cfg)
