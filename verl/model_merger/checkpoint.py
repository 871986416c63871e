"""Finding a training checkpoint from the folder a user names, and rebuilding its model.

Our layout (:mod:`verl.checkpoint.manager`) keeps one file per step, ``global_step_N/state.pt``,
holding the actor's (and the critic's) full weights under their parameter names; verl's keeps a
folder per role, ``global_step_N/actor/`` with one shard file per rank. People coming from verl
type ``--local_dir <run>/global_step_N/actor``, so :func:`locate` takes, for the same checkpoint:

* ``<run>/global_step_N`` (the step folder; the actor unless ``--is-value-model``),
* ``<run>/global_step_N/actor`` or ``.../critic`` (verl's role folder: no such folder exists here,
  the role is read from the name),
* ``<run>`` (the run folder: its newest checkpoint, the one a resume would take, said on stdout).

The model is rebuilt the way the trainer built it, from the settings the run saved (the checkpoint's
``config`` for RL runs, the run folder's ``config.yaml`` for SFT/DPO/KTO): the same folder, dtype,
``override_config`` and LoRA adapters, then the checkpoint's weights load into it. A LoRA checkpoint
holds the adapters alone, so the base weights come from the model folder, checked against the
fingerprint of the base the run trained on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from verl.checkpoint import CheckpointManager
from verl.errors import VerlError

ROLES = ("actor", "critic")


@dataclass
class Located:
    step_dir: Path  # global_step_N
    role: str  # actor | critic
    note: str = ""  # how the folder given was read, when not literally (printed)
    upstream: bool = False  # upstream verl's folder of rank files (verl.model_merger.verl_format)
    model_folder: Path | None = None  # upstream: the folder of its config and tokenizer


def locate(local_dir: str, *, value_model: bool = False) -> Located:
    """The checkpoint ``--local_dir`` names (see the module's docstring), or one VerlError saying what
    the folder is and which folder to give instead."""
    given = Path(local_dir).expanduser()
    role_from_name = None
    path = given
    if given.name in ROLES and (given.parent / "state.pt").is_file() and not any(given.glob("model_world_size_*")):
        role_from_name, path = given.name, given.parent  # verl's global_step_N/actor
    if role_from_name == "actor" and value_model:
        raise VerlError(f"--local_dir {local_dir} names the actor and --is-value-model asks for the critic: give "
                        f"{path}/critic (or drop --is-value-model)")
    role = "critic" if value_model else role_from_name or "actor"
    if (path / "state.pt").is_file():
        note = f"{given} is read as the {role} of {path}/state.pt" if role_from_name else ""
        return Located(path, role, note)
    from verl.model_merger.verl_format import is_verl_checkpoint

    if is_verl_checkpoint(given):  # upstream verl's global_step_N/actor (or critic): read as it is
        return Located(given, "critic" if given.name == "critic" or value_model else "actor",
                       f"{given} is upstream verl's sharded checkpoint: its rank files are joined", upstream=True)
    if (path / "config.json").is_file():
        raise VerlError(f"--local_dir {local_dir} is already a Hugging Face model folder (config.json): load it with "
                        f"AutoModelForCausalLM.from_pretrained({str(path)!r}) or give it to model.path; the merger "
                        f"reads a training checkpoint, a global_step_N folder of a run")
    if path.is_dir() and any(path.glob("global_step_*")):
        newest = CheckpointManager(path, main=False).latest()
        if newest is None:
            raise VerlError(f"--local_dir {local_dir}: its global_step_* folders hold no state.pt (damaged or "
                            f"emptied); give another run's folder")
        return Located(newest, role, f"{given} is a run folder: merging its newest checkpoint, {newest.name} "
                                     f"(give {newest.parent}/global_step_N for another step)")
    if not given.exists():
        near = _steps_near(given)
        raise VerlError(f"--local_dir {local_dir} does not exist{near}; give a run's global_step_N folder (or "
                        f"global_step_N/actor, or the run folder: trainer.default_local_dir)")
    raise VerlError(f"--local_dir {local_dir} holds no checkpoint (no state.pt, no global_step_N folders); give a "
                    f"run's global_step_N folder (or global_step_N/actor, or the run folder: "
                    f"trainer.default_local_dir)")


def _steps_near(path: Path) -> str:
    """``; that run has global_step_1, global_step_2`` when a parent of ``path`` is a run folder."""
    for parent in list(path.parents)[:3]:
        steps = sorted((p.name for p in parent.glob("global_step_*") if (p / "state.pt").is_file()),
                       key=lambda name: int(name.rsplit("_", 1)[1]) if name.rsplit("_", 1)[1].isdigit() else -1)
        if steps:
            return f"; {parent} has {', '.join(steps)}"
    return ""


def load_state(step_dir: Path) -> dict:
    try:
        return CheckpointManager(step_dir.parent, main=False).load(step_dir)
    except Exception as error:  # torch.load reports damage as many types
        raise VerlError(f"{step_dir}/state.pt does not load ({type(error).__name__}: "
                        f"{(str(error).splitlines() or [''])[0][:200]}); give another global_step_N") from None


@dataclass
class ModelSource:
    """Where the trained model's architecture, tokenizer and (for LoRA) base weights come from."""

    section: object  # the model config section (ModelConfig, CriticModelConfig or OfflineModelConfig)
    path: str  # the model folder (config.json, tokenizer, base weights)
    dtype: str | None
    disable_dropout: bool
    tokenizer_section: object = None  # the section whose tokenizer_path / chat template the run used

    def tokenizer(self):
        """The run's tokenizer (its chat template too), from the policy's section."""
        from verl.models.loading import load_tokenizer

        section = self.tokenizer_section or self.section
        return load_tokenizer(section.tokenizer_path or self.path, trust_remote_code=section.trust_remote_code,
                              chat_template=section.custom_chat_template)


def model_source(located: Located, state: dict, hf_model_path: str | None) -> ModelSource:
    """The settings of the run that wrote ``state``, for ``located.role``; ``hf_model_path`` replaces
    the model folder they name (a model moved since the run)."""
    from verl.workers.actor_rollout_ref import policy_folder

    if "policy" in state:  # SFT / DPO / KTO: the settings are the run folder's config.yaml
        if located.role == "critic":
            raise VerlError(f"{located.step_dir} is a checkpoint of an offline run (SFT/DPO/KTO), which trains no "
                            f"critic; drop --is-value-model (and give global_step_N or global_step_N/actor)")
        section = _offline_model_section(located.step_dir.parent / "config.yaml", hf_model_path)
        path = hf_model_path or policy_folder(section)
        return ModelSource(section, path, section.dtype, section.disable_dropout, section)
    if "actor" not in state:
        raise VerlError(f"{located.step_dir}/state.pt is not a training checkpoint of this project (it holds "
                        f"{sorted(state)[:8]}, no 'actor' or 'policy' weights)")
    if located.role == "critic" and "critic" not in state:
        raise VerlError(f"{located.step_dir} holds no critic: the run trained none (its advantage estimator needs "
                        f"no value model, e.g. grpo); merge the actor (drop --is-value-model / the critic folder)")
    config = _saved_settings(state.get("config"), located, hf_model_path)
    arr = config.actor_rollout_ref
    if located.role == "actor":
        path = hf_model_path or policy_folder(arr.model)
        return ModelSource(arr.model, path, arr.model.dtype, arr.model.disable_dropout, arr.model)
    critic = config.critic.model
    path = hf_model_path or (str(critic.path) if critic.path else policy_folder(arr.model))
    return ModelSource(critic, path, arr.model.dtype, arr.model.disable_dropout, arr.model)


def _saved_settings(saved: dict | None, located: Located, hf_model_path: str | None):
    """The RL run's TrainerConfig as its checkpoint recorded it; without a record that loads, the
    defaults on ``--hf_model_path`` (a LoRA checkpoint then does not fit, and says so)."""
    from verl.config import TrainerConfig
    from verl.errors import ConfigError

    problem = "does not record the run's settings"
    if saved is not None:
        try:
            return TrainerConfig.from_dict(saved)
        except ConfigError as error:  # saved by another version of this project
            problem = f"records settings this version does not read ({error})"
    if hf_model_path is None:
        raise VerlError(f"{located.step_dir}/state.pt {problem}; give the model folder the run started from with "
                        f"--hf_model_path")
    config = TrainerConfig()
    config.actor_rollout_ref.model.path = hf_model_path
    return config


def _offline_model_section(config_file: Path, hf_model_path: str | None):
    from verl.config.offline import OfflineModelConfig
    from verl.config.yaml_text import read_yaml

    if not config_file.is_file():
        if hf_model_path is None:
            raise VerlError(f"{config_file} is missing (the run's settings, written when it started); give the "
                            f"model folder the run started from with --hf_model_path")
        return OfflineModelConfig(path=hf_model_path)
    data = read_yaml(config_file) or {}
    return OfflineModelConfig.from_dict(data.get("model") or {})


def trained_model(located: Located, state: dict, source: ModelSource) -> torch.nn.Module:
    """The model of ``located.role`` with the checkpoint's weights: the policy (a plain or PEFT causal
    LM) or the critic's :class:`~verl.models.value_model.ValueModel`."""
    from verl.models.loading import load_causal_lm
    from verl.models.lora import apply_lora, lora_requested

    section = source.section
    model = load_causal_lm(source.path, dtype=source.dtype, trust_remote_code=section.trust_remote_code,
                           override_config=dict(section.override_config), disable_dropout=source.disable_dropout,
                           attn_implementation=getattr(section, "attn_implementation", None),
                           config_key="--hf_model_path (or the run's model.path)")
    if located.role == "critic":
        from verl.models.value_model import ValueModel

        model = ValueModel(model)
        if lora_requested(section):
            model.use_lora(section)
        entry = state["critic"]
    else:
        if lora_requested(section):
            model = apply_lora(model, section)
        entry = state["policy"] if "policy" in state else state["actor"]
    _load_weights(model, entry, located, source.path)
    return model.eval()


def _load_weights(model: torch.nn.Module, entry: dict, located: Located, path: str) -> None:
    from verl.workers.engine import changed_frozen

    weights = entry["model"]
    current = model.state_dict()
    where = f"{located.step_dir} ({located.role})"
    frozen = entry.get("frozen_fingerprint")
    if frozen:  # LoRA: the checkpoint holds the adapters; the base weights must be the run's
        changed = changed_frozen(current, frozen)
        if changed:
            raise VerlError(f"{where} holds LoRA adapters trained on other base weights than those of {path} "
                            f"({len(changed)} tensors differ, first: {changed[0]}): give the model folder the run "
                            f"started from with --hf_model_path")
    foreign = sorted(set(weights) - set(current))
    wrong = [f"{name} {tuple(weights[name].shape)} vs {tuple(current[name].shape)}" for name in weights
             if name in current and tuple(weights[name].shape) != tuple(current[name].shape)]
    missing = sorted(set(current) - set(weights) - set(frozen or ()))
    if foreign or wrong or missing:
        detail = (f"names the model lacks: {foreign[:3]}" if foreign else f"shapes differ: {wrong[:3]}" if wrong
                  else f"weights missing from the checkpoint: {missing[:3]}")
        raise VerlError(f"{where} does not fit the model at {path} ({detail}): give the model folder the run "
                        f"started from with --hf_model_path")
    with torch.no_grad():
        for name, tensor in weights.items():
            current[name].copy_(tensor)
