"""On-policy distillation, controller side: the teachers named by ``distillation.*``, checked before
anything is loaded, and the worker group that scores each step's rollouts with them.

The loss and the teacher worker are in :mod:`verl.workers.teacher`; docs/distillation.md has the keys.
"""

from __future__ import annotations

import logging

from verl.config import verl_defaults
from verl.config.cross_checks import log_prob_token_budget
from verl.distributed.worker_group import make_worker_group
from verl.errors import ConfigError
from verl.models.loading import load_tokenizer
from verl.utils.preflight import check_context_length
from verl.workers.teacher import TeacherWorker

logger = logging.getLogger(__name__)

ENTRY_KEYS = ("key", "model_path", "num_replicas", "inference")
_INFERENCE_DEFAULTS = verl_defaults.distillation_defaults()["teacher_models"]["teacher_model"]["inference"]
_SECTION = "distillation.teacher_models"


def loss_settings(config) -> dict | None:
    """The ``distillation.distillation_loss`` keys as a plain dict (what the actor's loss reads), or
    None when distillation is off."""
    if not config.distillation.enabled:
        return None
    return config.distillation.distillation_loss.to_dict()


def resolve_teachers(dist_cfg) -> dict[str, tuple[str, str]]:
    """``{routing key: (entry name, model path)}`` of ``distillation.teacher_models``, as verl reads
    it: one entry is the only teacher (its key is not used); with several, the default entry
    ``teacher_model`` is dropped and each entry needs its own ``key`` and ``model_path``."""
    loss = dist_cfg.distillation_loss
    if loss.loss_mode in ("k1", "kl") and not loss.use_policy_gradient:
        raise ConfigError(f"distillation.distillation_loss.loss_mode={loss.loss_mode} with use_policy_gradient=false "
                          f"backpropagates k1 directly, whose gradient does not depend on the teacher; set "
                          f"use_policy_gradient=true (verl's example launches) or use loss_mode=k3")
    entries = {name: dict(entry or {}) for name, entry in dist_cfg.teacher_models.items()}
    for name, entry in entries.items():
        unknown = sorted(set(entry) - set(ENTRY_KEYS))
        if unknown:
            raise ConfigError(f"{_SECTION}.{name}.{unknown[0]} is not a teacher setting; each teacher takes "
                              f"{', '.join(ENTRY_KEYS)}")
    if len(entries) > 1 and "teacher_model" in entries:
        dropped = entries.pop("teacher_model")
        if dropped.get("model_path") is not None:
            logger.warning("%s.teacher_model.model_path=%s is dropped: with several teachers verl drops the "
                           "default entry teacher_model; give that teacher another name", _SECTION,
                           dropped["model_path"])
    if not entries:
        raise ConfigError(f"distillation.enabled=true needs a teacher: set {_SECTION}.teacher_model.model_path")
    teachers: dict[str, tuple[str, str]] = {}
    for name, entry in entries.items():
        if entry.get("model_path") is None:
            raise ConfigError(f"distillation.enabled=true needs {_SECTION}.{name}.model_path (the teacher model)")
        key = "default" if len(entries) == 1 else entry.get("key")
        if key is None:
            raise ConfigError(f"{_SECTION}.{name}.key is needed with several teachers: the value of the "
                              f"distillation.teacher_key column whose samples this teacher scores")
        if key in teachers:
            raise ConfigError(f"{_SECTION}.{name}.key={key} is also the key of {_SECTION}.{teachers[key][0]}; "
                              f"each teacher needs its own key")
        teachers[str(key)] = (name, str(entry["model_path"]))
        _warn_inert(name, entry)
    return teachers


def _warn_inert(name: str, entry: dict) -> None:
    asked = [f"inference.{k}" for k, v in (entry.get("inference") or {}).items() if _INFERENCE_DEFAULTS.get(k) != v]
    if entry.get("num_replicas"):
        asked.insert(0, "num_replicas")
    if asked:
        logger.warning("%s.%s.{%s} have no effect here: the teacher is a forward pass of the Hugging Face model on "
                       "the trainer's own devices, sharded like the reference (actor_rollout_ref.ref.fsdp_config)",
                       _SECTION, name, ",".join(asked))


def check_tokenizers(student_tokenizer, student_path: str, teachers: dict[str, tuple[str, str]],
                     trust_remote_code: bool = False) -> None:
    """Every teacher reads the student's token ids, so it must have the student's vocabulary."""
    student_vocab = student_tokenizer.get_vocab()
    for name, path in teachers.values():
        teacher_vocab = load_tokenizer(path, trust_remote_code=trust_remote_code,
                                       config_key=f"{_SECTION}.{name}.model_path").get_vocab()
        if teacher_vocab == student_vocab:
            continue
        differ = sorted(set(teacher_vocab.items()) ^ set(student_vocab.items()), key=lambda kv: kv[1])
        example = f"; e.g. token {differ[0][0]!r}" if differ else ""
        raise ConfigError(f"the teacher {path} ({_SECTION}.{name}.model_path) and the student {student_path} "
                          f"(actor_rollout_ref.model.path) have different tokenizers ({len(teacher_vocab)} vs "
                          f"{len(student_vocab)} tokens{example}): on-policy distillation scores the student's "
                          f"token ids with the teacher, so the teacher needs the student's vocabulary")


def teacher_worker(config, teachers: dict[str, tuple[str, str]], device) -> TeacherWorker:
    """The frozen teachers, placed like the reference model (its fsdp_config and micro-batches)."""
    arr = config.actor_rollout_ref
    worker = TeacherWorker({key: path for key, (_, path) in teachers.items()},
                           teacher_key=config.distillation.teacher_key, fsdp_config=arr.ref.fsdp_config,
                           device=device, dtype=arr.model.dtype,
                           micro_batch_size=arr.ref.log_prob_micro_batch_size_per_gpu,
                           max_token_len=log_prob_token_budget(arr, "ref"),
                           remove_padding=arr.model.use_remove_padding,
                           trust_remote_code=arr.model.trust_remote_code,
                           attn_implementation=arr.model.attn_implementation,
                           config_keys={key: f"{_SECTION}.{name}.model_path" for key, (name, _) in teachers.items()})
    for key in teachers:
        check_context_length(worker.model_config(key), config.data.max_prompt_length, config.data.max_response_length)
    return worker


def build_teacher_group(config, teachers: dict[str, tuple[str, str]], device, watchdog):
    """The worker group of the frozen teachers, in this process (or this torchrun rank)."""
    return make_worker_group(teacher_worker(config, teachers, device), "teacher", watchdog)
