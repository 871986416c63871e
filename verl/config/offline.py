"""Configs of the offline trainers: `SFTTrainerConfig`, `DPOTrainerConfig`, `KTOTrainerConfig`.

Keys follow verl's SFT trainer (`data.train_batch_size`, `data.micro_batch_size_per_gpu`,
`data.max_length`, `model.path`, `optim.lr`, `trainer.total_epochs`, ...). Units: an *example* is
one prompt-response sequence (SFT, KTO); a *pair* is one prompt with a chosen and a rejected
response (DPO). `train_batch_size` counts them per optimiser step over all ranks; each rank runs
its share in micro-batches of `micro_batch_size_per_gpu` (gradient accumulation), and losses are
normalised by the whole step's count, so the micro-batch size never changes the update.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from verl.config.cross_checks import check_fsdp_size
from verl.config.node import ConfigNode, field_specs, option, section
from verl.config.offline_verl import (OfflineFSDPConfig, OfflineModelVerlKeys, OfflineTrainerVerlKeys,
                                      SFTDataVerlKeys, SFTTopLevelVerlKeys, resolve_offline)
from verl.config.schema_actor import FSDPConfig, ModelConfig, OptimConfig
from verl.config.verl_rules import Section, verl_option
from verl.errors import ConfigError

Truncation = Literal["error", "left", "right"]
logger = logging.getLogger("verl.config")
SEED_RANGE = "[0, 4294967295]"  # what numpy's seed takes (the trainers seed random, numpy and torch)

_FILES_HELP = ("a parquet/jsonl file or a list of them; null = rows built from the built-in addition "
               "task (data.builtin_task)")
_TRUNCATION_HELP = ("A sequence longer than max_length raises (error), keeps its last max_length tokens "
                    "(left: the start of the prompt is cut) or its first ones (right: the end of the response "
                    "is cut).")
_MICRO_HELP = ("{unit} per forward/backward pass on each rank (gradient accumulation) and per validation "
               "batch; null = the rank's whole share (and the whole validation set at once).")
_TEMPLATE_HELP = ("Format rows with the tokenizer's chat template (false = prompt text + response text + "
                  "eos, for base models).")


@dataclass
class SFTMultiturnConfig(ConfigNode):
    """verl's switch for conversation rows (its data.multiturn section)."""

    enable: bool = option(False, help="Rows are chat conversations in the messages_key column below (verl's "
                          "form of data.messages_key, which wins when both are set).")
    messages_key: str = option("messages", help="Column of the conversations when enable is true.")
    tools_key: str = option("tools", help="Column of each conversation's tool schemas when enable is true (see "
                            "data.tools_key).")
    enable_thinking_key: str = option("enable_thinking", help="verl's per-row thinking switch column; not read here.")


@dataclass
class _SFTData(Section):
    """Supervised data: prompt/response columns or chat messages."""

    train_files: str | list[str] | None = option(None, help=f"Training rows: {_FILES_HELP}.")
    val_files: str | list[str] | None = option(None, help="Validation rows, same forms; null = none "
                                               "(or the built-in task's held-out split when train_files is null).")
    builtin_task: str = option("addition", help="Built-in task used when train_files is null.")
    prompt_key: str = option("prompt", help="Column holding the prompt: chat messages or text.")
    response_key: str = option("response", help="Column holding the response: text (or assistant messages).")
    prompt_dict_keys: list[str] | None = option(None, help="verl's: when the prompt_key column holds a dict (the "
                                                "extra_info of verl's gsm8k parquet), the keys to read inside it, in "
                                                "order: [question] takes row[prompt_key]['question']; null = the column "
                                                "itself.")
    response_dict_keys: list[str] | None = option(None, help="The same for response_key, e.g. [answer].")
    messages_key: str | None = option(None, help="Column holding whole chat conversations; when set, rows "
                                      "are conversations and the loss is on the assistant turns only "
                                      "(prompt_key/response_key are not used).")
    multiturn: SFTMultiturnConfig = section(SFTMultiturnConfig, help="verl's multiturn.enable / messages_key: "
                                            "the same as data.messages_key.")
    train_batch_size: int = option(32, bounds=">= 1", aliases=("batch_size",), help="Examples per optimiser step, over all ranks.")
    micro_batch_size_per_gpu: int | None = option(None, bounds=">= 1", help=_MICRO_HELP.format(unit="Examples"))
    max_length: int = option(1024, bounds=">= 2", help="Most tokens of prompt + response (see truncation).")
    truncation: Truncation = option("error", help=_TRUNCATION_HELP)
    apply_chat_template: bool = option(True, help=_TEMPLATE_HELP)
    chat_template_kwargs: dict = option({}, aliases=("apply_chat_template_kwargs",), help="Extra keyword arguments "
                                        "for the chat template (verl's name: apply_chat_template_kwargs).")
    shuffle: bool = option(True, help="Shuffle the training rows each epoch.")
    seed: int = option(1, bounds=SEED_RANGE, help="Seed of the shuffling.")


@dataclass
class SFTDataConfig(SFTDataVerlKeys, _SFTData):
    """Supervised data: prompt/response columns or chat messages (and verl's other SFT data keys)."""


@dataclass
class PreferenceDataConfig(ConfigNode):
    """Preference pairs in TRL's columns: prompt, chosen, rejected."""

    train_files: str | list[str] | None = option(None, help=f"Training pairs: {_FILES_HELP}.")
    val_files: str | list[str] | None = option(None, help="Validation pairs, same forms; null = none "
                                               "(or the built-in task's held-out split when train_files is null).")
    builtin_task: str = option("addition", help="Built-in task used when train_files is null.")
    prompt_key: str = option("prompt", help="Column holding the prompt: chat messages or text.")
    chosen_key: str = option("chosen", help="Column holding the preferred response.")
    rejected_key: str = option("rejected", help="Column holding the dispreferred response.")
    train_batch_size: int = option(32, bounds=">= 1", aliases=("batch_size",), help="Pairs per optimiser step, over all ranks.")
    micro_batch_size_per_gpu: int | None = option(None, bounds=">= 1", help=_MICRO_HELP.format(unit="Pairs"))
    max_length: int = option(1024, bounds=">= 2", help="Most tokens of prompt + one response (see truncation).")
    truncation: Truncation = option("error", help=_TRUNCATION_HELP)
    apply_chat_template: bool = option(True, help=_TEMPLATE_HELP)
    chat_template_kwargs: dict = option({}, help="Extra keyword arguments for the chat template.")
    shuffle: bool = option(True, help="Shuffle the training pairs each epoch.")
    seed: int = option(1, bounds=SEED_RANGE, help="Seed of the shuffling.")


@dataclass
class KTODataConfig(ConfigNode):
    """Unpaired feedback in TRL's columns: prompt, completion, label (true = desirable)."""

    train_files: str | list[str] | None = option(None, help=f"Training examples: {_FILES_HELP}.")
    val_files: str | list[str] | None = option(None, help="Validation examples, same forms; null = none "
                                               "(or the built-in task's held-out split when train_files is null).")
    builtin_task: str = option("addition", help="Built-in task used when train_files is null.")
    prompt_key: str = option("prompt", help="Column holding the prompt: chat messages or text.")
    completion_key: str = option("completion", help="Column holding the response.")
    label_key: str = option("label", help="Column holding the label: true = desirable, false = undesirable.")
    train_batch_size: int = option(32, bounds=">= 1", aliases=("batch_size",), help="Examples per optimiser step, over all "
                                   "ranks; at least 2 (the KL reference point pairs each prompt with "
                                   "another row's completion).")
    micro_batch_size_per_gpu: int | None = option(None, bounds=">= 1", help=_MICRO_HELP.format(unit="Examples"))
    max_length: int = option(1024, bounds=">= 2", help="Most tokens of prompt + completion (see truncation).")
    truncation: Truncation = option("error", help=_TRUNCATION_HELP)
    apply_chat_template: bool = option(True, help=_TEMPLATE_HELP)
    chat_template_kwargs: dict = option({}, help="Extra keyword arguments for the chat template.")
    shuffle: bool = option(True, help="Shuffle the training examples each epoch.")
    seed: int = option(1, bounds=SEED_RANGE, help="Seed of the shuffling.")


@dataclass
class OfflineModelConfig(OfflineModelVerlKeys, ModelConfig):
    """The policy being trained (its starting weights) and its sharding."""

    path: str | None = option(None, aliases=("partial_pretrain",), help="Hugging Face model id or local folder; "
                              "null = the built-in tiny model (verl's SFT name: partial_pretrain).")

    fsdp_config: OfflineFSDPConfig = section(OfflineFSDPConfig, help="Policy sharding (FSDP2).")


@dataclass
class RefModelConfig(ConfigNode):
    """The frozen reference policy of DPO / KTO."""

    path: str | None = option(None, help="Hugging Face model id or folder; null = a frozen copy of the "
                              "initial policy (model.path).")
    fsdp_config: FSDPConfig = section(FSDPConfig, help="Reference-model sharding (FSDP2).")


@dataclass
class OfflineOptimConfig(OptimConfig):
    """AdamW, learning-rate schedule and gradient clipping."""

    lr: float = option(1e-5, bounds="> 0", help="Peak learning rate.")
    clip_grad: float = option(1.0, bounds="> 0", help="Clip the global gradient norm to this value.")
    lr_warmup_steps_ratio: float = option(0.0, bounds="[0, 1]", aliases=("warmup_steps_ratio",), help="Warm-up "
                                          "length as a fraction of the run's optimiser steps (used when "
                                          "lr_warmup_steps < 0; verl's SFT name: warmup_steps_ratio).")
    warmup_style: Literal["constant", "cosine"] = verl_option(
        "constant", aliases=("lr_scheduler_type", "lr_scheduler"), help="Schedule after warm-up: constant, or "
        "cosine decay to min_lr_ratio * lr (verl's names: lr_scheduler_type, and lr_scheduler in its SFT "
        "trainer; verl's null = constant).", inert=False, why="", normalize=lambda v: "constant" if v is None else v)


@dataclass
class _OfflineTrainerSection(Section):
    """Run length, logging, checkpoints."""

    total_epochs: int = option(1, bounds=">= 1", help="Passes over the training data.")
    total_training_steps: int | None = option(None, bounds=">= 0", aliases=("max_steps",), help="Stop after this "
                                              "many optimiser steps; null (or 0) = total_epochs x steps per epoch.")
    project_name: str = option("verl", help="Project name for loggers.")
    experiment_name: str = option("run", help="Run name for loggers.")
    logger: str | list[str] = option(["console"], help="Loggers: any of console, jsonl, tensorboard, "
                                     "wandb (metrics.jsonl is always written).")
    device: str = option("auto", help="cuda, cpu, or auto (cuda when available). Under torchrun each "
                         "rank uses the GPU of its LOCAL_RANK.")
    dist_timeout_s: float = option(600.0, bounds="> 0", help="Multi-rank jobs: a rank that dies, stops responding or "
                                   "fails ends the whole job within this many seconds, with one line "
                                   "naming the rank and the stage (see docs/distributed.md).")
    save_freq: int = option(-1, help="Save a checkpoint every this many steps and after the last one; "
                            "-1 (any value <= 0) = no checkpoints.")
    max_nonfinite_steps: int = option(3, bounds=">= 0", help="An update whose loss or gradient norm is NaN or "
                                      "inf is skipped (counted as train/num_nonfinite_skipped, with a warning); "
                                      "this many steps in a row with a skipped update stop the run with an error "
                                      "naming optim.lr (0 = stop at the first).")
    test_freq: int = option(-1, help="Validate every this many steps and after the last one; -1 (any value "
                            "<= 0) = only "
                            "before and after training (see val_before_train).")
    val_before_train: bool = option(True, help="Validate before the first step and after the last, so "
                                    "every run reports a before/after pair.")
    resume_mode: Literal["auto", "disable", "resume_path"] = option(
        "auto", help="auto (resume from the latest checkpoint in default_local_dir if any), disable, or "
        "resume_path (from resume_from_path).")
    resume_from_path: str | None = option(None, aliases=("resume_path",), help="Checkpoint folder for "
                                          "resume_mode=resume_path (verl's older SFT name: resume_path).")
    default_local_dir: str = option("outputs/run", help="Folder for checkpoints, metrics.jsonl and the "
                                    "exported model (huggingface/).")
    max_ckpt_to_keep: int | None = option(None, bounds=">= 0", help="Keep only the newest this many checkpoints; "
                                          "null (or 0) = all.")
    progress_bar: bool = option(True, help="Show a progress line.")
    seed: int = option(1, bounds=SEED_RANGE, help="Global seed (initialisation, dropout).")


@dataclass
class OfflineTrainerSectionConfig(OfflineTrainerVerlKeys, _OfflineTrainerSection):
    """Run length, logging, checkpoints (and verl's other SFT trainer keys)."""


@dataclass
class DPOAlgorithmConfig(ConfigNode):
    """The DPO objective."""

    beta: float = option(0.1, bounds="> 0", help="Strength of the implicit KL constraint to the reference (DPO's beta; "
                         "IPO's tau; the inverse of SLiC's margin).")
    loss_type: Literal["sigmoid", "ipo", "hinge"] = option(
        "sigmoid", help="sigmoid (DPO, Rafailov et al. 2023), ipo (Azar et al. 2023) or hinge "
        "(SLiC-HF, Zhao et al. 2023).")


@dataclass
class KTOAlgorithmConfig(ConfigNode):
    """The KTO objective (Ethayarajh et al. 2024)."""

    beta: float = option(0.1, bounds="> 0", help="Steepness of the value function around the reference point.")
    desirable_weight: float = option(1.0, bounds="> 0", help="Weight lambda_D of desirable examples' losses.")
    undesirable_weight: float = option(1.0, bounds="> 0", help="Weight lambda_U of undesirable examples' losses; the "
                                       "paper suggests lambda_D * n_D / (lambda_U * n_U) in [1, 4/3].")


def _divisor_hint(total: int, wrong: int) -> str:
    divisors = [d for d in range(1, total + 1) if total % d == 0]
    nearest = [d for d in divisors if d < wrong][-1:] + [d for d in divisors if d > wrong][:1]
    return " or ".join(str(d) for d in nearest)


def check_batch_sizes(data, dp_size: int, unit: str) -> None:
    """`data.train_batch_size` splits over `dp_size` ranks and each share into micro-batches."""
    total, micro = data.train_batch_size, data.micro_batch_size_per_gpu
    if total < 1:
        raise ConfigError(f"data.train_batch_size={total} must be >= 1 ({unit} per optimiser step)")
    if micro is not None and micro < 1:
        raise ConfigError(f"data.micro_batch_size_per_gpu={micro} must be >= 1 ({unit} per forward pass)")
    if dp_size < 1:
        raise ConfigError(f"dp_size={dp_size} must be >= 1 (data-parallel ranks)")
    if total % dp_size:
        raise ConfigError(f"data.train_batch_size={total} {unit} cannot be split evenly over {dp_size} "
                          f"data-parallel ranks ({total} / {dp_size} = {total / dp_size:.2f}); use a multiple "
                          f"of {dp_size}")
    per_rank = total // dp_size
    if micro is not None and micro > per_rank:  # verl's engine SFT scripts (micro-batches by tokens there) do this
        share = f"{per_rank} per rank over {dp_size} ranks" if dp_size > 1 else f"{per_rank}"
        logger.warning("data.micro_batch_size_per_gpu=%d is more than each rank's share of data.train_batch_size=%d "
                       "(%s): each micro-batch is the rank's whole share (the update is the same)", micro, total, share)
    elif micro is not None and per_rank % micro:
        share = f" ({per_rank} per rank over {dp_size} ranks)" if dp_size > 1 else ""
        raise ConfigError(f"data.train_batch_size={total} {unit}{share} is not divisible by "
                          f"data.micro_batch_size_per_gpu={micro} ({per_rank} / {micro} = {per_rank / micro:.2f}); "
                          f"choose a micro-batch size that divides it, e.g. {_divisor_hint(per_rank, micro)}")
    if data.max_length < 2:
        raise ConfigError(f"data.max_length={data.max_length} must be >= 2 (a prompt token and a response token)")


class _OfflineConfig(ConfigNode):
    """Shared by the offline configs: the batch checks."""

    _unit = "examples"

    def validate(self, dp_size: int = 1) -> None:
        """Raise ConfigError for inconsistent settings (batch-size arithmetic shown in the message).

        `dp_size` is the number of data-parallel ranks (torchrun's world size; 1 in a plain process).
        """
        resolve_offline(self, max(dp_size, 1))  # verl's SFT spellings first: the checks read the keys they move to
        check_batch_sizes(self.data, dp_size, self._unit)
        for key in ("model.fsdp_config.fsdp_size", "ref.fsdp_config.fsdp_size"):
            if "ref" in field_specs(type(self)) or not key.startswith("ref."):
                check_fsdp_size(key, self.get(key))
        if self.optim.clip_grad <= 0:
            raise ConfigError(f"optim.clip_grad={self.optim.clip_grad} must be > 0 (the usual value is 1.0)")


@dataclass
class _SFTSections(_OfflineConfig):
    """Supervised fine-tuning: next-token loss on the response (or assistant) tokens."""

    data: SFTDataConfig = section(SFTDataConfig, help="Supervised data and batching.")
    model: OfflineModelConfig = section(OfflineModelConfig, help="Policy model.")
    optim: OfflineOptimConfig = section(OfflineOptimConfig, help="Optimiser and schedule.")
    trainer: OfflineTrainerSectionConfig = section(
        OfflineTrainerSectionConfig(default_local_dir="outputs/sft", experiment_name="sft"),
        help="Run control, logging, checkpoints.")


@dataclass
class SFTTrainerConfig(SFTTopLevelVerlKeys, _SFTSections):
    """Supervised fine-tuning: next-token loss on the response (or assistant) tokens (verl's SFT
    keys: :mod:`verl.config.offline_verl`)."""


@dataclass
class DPOTrainerConfig(_OfflineConfig):
    """Direct preference optimisation (and IPO / SLiC-HF hinge) against a frozen reference."""

    _unit = "pairs"

    data: PreferenceDataConfig = section(PreferenceDataConfig, help="Preference pairs and batching.")
    model: OfflineModelConfig = section(OfflineModelConfig, help="Policy model.")
    ref: RefModelConfig = section(RefModelConfig, help="Frozen reference model.")
    optim: OfflineOptimConfig = section(OfflineOptimConfig(lr=1e-6), help="Optimiser and schedule.")
    algorithm: DPOAlgorithmConfig = section(DPOAlgorithmConfig, help="DPO objective.")
    trainer: OfflineTrainerSectionConfig = section(
        OfflineTrainerSectionConfig(default_local_dir="outputs/dpo", experiment_name="dpo"),
        help="Run control, logging, checkpoints.")

    def validate(self, dp_size: int = 1) -> None:
        super().validate(dp_size)
        if self.algorithm.beta <= 0:
            raise ConfigError(f"algorithm.beta={self.algorithm.beta} must be > 0 (the usual value is 0.1)")


@dataclass
class KTOTrainerConfig(_OfflineConfig):
    """Kahneman-Tversky optimisation on unpaired desirable / undesirable examples."""

    data: KTODataConfig = section(KTODataConfig, help="Unpaired examples and batching.")
    model: OfflineModelConfig = section(OfflineModelConfig, help="Policy model.")
    ref: RefModelConfig = section(RefModelConfig, help="Frozen reference model.")
    optim: OfflineOptimConfig = section(OfflineOptimConfig(lr=1e-6), help="Optimiser and schedule.")
    algorithm: KTOAlgorithmConfig = section(KTOAlgorithmConfig, help="KTO objective.")
    trainer: OfflineTrainerSectionConfig = section(
        OfflineTrainerSectionConfig(default_local_dir="outputs/kto", experiment_name="kto"),
        help="Run control, logging, checkpoints.")

    def validate(self, dp_size: int = 1) -> None:
        super().validate(dp_size)
        algo = self.algorithm
        if algo.beta <= 0:
            raise ConfigError(f"algorithm.beta={algo.beta} must be > 0 (the usual value is 0.1)")
        for name in ("desirable_weight", "undesirable_weight"):
            if getattr(algo, name) <= 0:
                raise ConfigError(f"algorithm.{name}={getattr(algo, name)} must be > 0 (the default is 1.0)")
        if self.data.train_batch_size < 2:
            raise ConfigError(f"data.train_batch_size={self.data.train_batch_size} must be >= 2 for KTO: the KL "
                              f"reference point pairs each prompt with another example's completion")
