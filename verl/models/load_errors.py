"""The one-line errors of a model that does not load: a missing or wrong folder (a file, a LoRA adapter,
a run's output folder, a checkpoint), a config.json transformers cannot build, a hub id that cannot be
fetched, and a keyword the model class refuses. :mod:`verl.models.loading` raises them."""

from __future__ import annotations

import json
import os
from pathlib import Path

from verl.errors import ModelLoadError
from verl.models.folder_checks import model_section


def looks_like_path(name: str) -> bool:
    # Hub ids are "name" or "org/name"; anything else is meant as a folder.
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or Path(name).expanduser().exists()


def _model_folders_near(folder: Path) -> str:
    """Where the model probably is, for a folder without config.json: a run's output folder holds its
    trained model in ``huggingface/``; a checkpoint (``global_step_N``, its ``state.pt``) is for resuming."""
    for run in (folder, folder.parent):
        if (run / "huggingface" / "config.json").is_file():
            kind = "a checkpoint to resume from (state.pt)" if run != folder else "a training run's output folder"
            return f"It is {kind}; the run's trained model is {run / 'huggingface'}: point there."
    if (folder / "state.pt").is_file():
        return ("It is a checkpoint to resume from (state.pt), not a model; a run writes its trained model to "
                "huggingface/ in its output folder (trainer.default_local_dir): point there.")
    found = sorted(str(p.parent) for depth in ("*/config.json", "*/*/config.json", "*/*/*/config.json")
                   for p in folder.glob(depth))[:3]
    if found:
        return f"Folders under it that hold one: {', '.join(found)}."
    return "Give the folder that holds config.json and the weights, or a hub id like 'Qwen/Qwen2-0.5B'."


def cwd_note(name: str) -> str:
    """For 'models/qwen' meant as a folder: a relative path is read from the current folder, which is named."""
    if "/" not in name or name.startswith(("/", "~")):
        return ""
    return f" (a relative path is read from the current folder, {os.getcwd()}: no {name} there)"


def _adapter_fix(folder: Path, config_key: str) -> str:
    """The two keys that train on from a LoRA adapter: its base model and the adapter itself."""
    try:
        base = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        base = None
    section = config_key.rsplit(".", 1)[0] if config_key.endswith(".path") else "actor_rollout_ref.model"
    return (f"set `{config_key}={base or '<its base model>'}` and `{section}.lora_adapter_path={folder}` to "
            f"train on from the adapter (or merge it into its base model first)")


def load_error(what: str, name: str, config_key: str, exc: Exception) -> ModelLoadError:
    if looks_like_path(name) and not Path(name).expanduser().exists():
        return ModelLoadError(f"{what} folder not found: {name!r} (from `{config_key}`). "
                              f"Give an existing folder that holds config.json, or a hub id like 'Qwen/Qwen2-0.5B'.")
    folder = Path(name).expanduser()
    if folder.is_file():
        return ModelLoadError(f"{what} {name!r} (from `{config_key}`) is a file; a model is a folder (config.json, "
                              f"weights, tokenizer): set `{config_key}={folder.parent}`")
    if folder.is_dir() and (folder / "adapter_config.json").is_file() and not (folder / "config.json").is_file():
        return ModelLoadError(f"{what} folder {name!r} (from `{config_key}`) holds a LoRA adapter "
                              f"(adapter_config.json), not a model: {_adapter_fix(folder, config_key)}")
    if folder.is_dir() and not (folder / "config.json").is_file():
        return ModelLoadError(f"could not load the {what} from folder {name!r} (from `{config_key}`): it holds no "
                              f"config.json. {_model_folders_near(folder)}")
    if folder.is_dir():
        return ModelLoadError(f"could not load the {what} from folder {name!r} (from `{config_key}`): "
                              + (_config_problem(folder, config_key, exc) or f"{type(exc).__name__}: {exc}"))
    return ModelLoadError(
        f"could not load the {what} {name!r} (from `{config_key}`): it is not a local folder{cwd_note(name)} and the "
        f"Hugging Face hub could not provide it ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). "
        f"Check the id, or download it where the hub is reachable (`huggingface-cli download {name} "
        f"--local-dir DIR`) and set `{config_key}=DIR`; with HF_HUB_OFFLINE=1 only local folders and the cache "
        f"are tried.")


def _config_problem(folder: Path, config_key: str, exc: Exception) -> str | None:
    """transformers' own words for a config.json it cannot build, said in this project's keys: its
    "pass the argument `trust_remote_code=True`", and its paragraph on an unknown model type."""
    import transformers

    text = str(exc)
    if "trust_remote_code" in text:
        section = model_section(config_key)
        switch = f"`{section}.trust_remote_code=true`" if section else "trust_remote_code=True"
        return (f"its config.json asks for modelling code shipped in the folder (auto_map); set {switch} to run it "
                f"(only for a model whose code you trust)")
    if "does not recognize this architecture" in text:
        try:
            model_type = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
        except (OSError, ValueError, AttributeError):
            model_type = None
        return (f"its config.json has model_type {model_type!r}, which transformers {transformers.__version__} "
                f"(installed here) does not know: a model newer than this transformers (upgrade it: pip install -U "
                f"transformers), a model_type misspelt in config.json, or a model whose code ships in the folder "
                f"(then config.json has an auto_map)")
    return None


def unknown_keyword(exc: TypeError, kwargs: dict) -> ModelLoadError | None:
    """A keyword of the caller's that ``from_pretrained`` handed on to the model class, whose
    constructor fails on it (``load_in_8bit``, a misspelt ``torch_dtype``): one line naming it."""
    import re

    import transformers

    found = re.search(r"(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'", str(exc))
    if not found or found.group(2) not in kwargs:
        return None
    name = found.group(2)
    hint = ("; 8-bit and 4-bit weights are asked for with quantization_config=BitsAndBytesConfig(...), which needs "
            "bitsandbytes and a GPU" if name.startswith("load_in_") else
            "; the weights' dtype is torch_dtype= (or dtype=)" if "type" in name else "")
    return ModelLoadError(f"{name}={kwargs[name]!r} is not a keyword that from_pretrained or {found.group(1)} takes "
                          f"(transformers {transformers.__version__}): remove it{hint}")
