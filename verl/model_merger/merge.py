"""Writing a checkpoint's model as a Hugging Face folder, and comparing it with another folder.

The policy goes through the trainer's own export (:func:`verl.distributed.fsdp.export_hf`), so a
merged ``global_step_N`` is, byte for byte in its weights, what the run's ``huggingface/`` export
would have been at that step: a LoRA policy merged (``W + scaling * B @ A``) into a plain model with
its adapter beside it in ``lora_adapter/`` (``adapter_only``: the adapter folder alone). The critic
becomes what verl's critic is, a ``*ForTokenClassification`` model with one label: the backbone's
weights under its names and the value head as its classifier (``logits[..., 0]`` are the values).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from verl.checkpoint.manager import write_folder_atomically
from verl.errors import VerlError
from verl.model_merger.checkpoint import Located, ModelSource, load_state, locate, model_source, trained_model


@dataclass
class MergeRequest:
    local_dir: str
    target_dir: str | None = None
    hf_model_path: str | None = None
    value_model: bool = False
    adapter_only: bool = False
    tie_word_embedding: bool = False


def load_trained(request: MergeRequest) -> tuple[Located, ModelSource | None, torch.nn.Module]:
    """The checkpoint ``request`` names, its model's source (None for upstream verl's folder: the model's
    config and tokenizer are in its huggingface/) and the model with the trained weights."""
    located = locate(request.local_dir, value_model=request.value_model)
    if located.note:
        print(located.note, flush=True)
    if request.adapter_only and (located.upstream or located.role == "critic"):
        what = "upstream verl's checkpoints are" if located.upstream else "a critic (its value head trained in full) is"
        raise VerlError(f"--adapter_only writes the LoRA adapter of this project's policy checkpoints; {what} "
                        f"written whole: drop --adapter_only")
    source = None
    if located.upstream:
        from verl.model_merger.verl_format import verl_model

        model, located.model_folder = verl_model(located.step_dir, request.hf_model_path)
        located.role = "critic" if type(model).__name__.endswith("ForTokenClassification") else "actor"
    else:
        state = load_state(located.step_dir)
        source = model_source(located, state, request.hf_model_path)
        model = trained_model(located, state, source)
    if request.tie_word_embedding:
        _check_tied(model, located)
    return located, source, model


def merge(request: MergeRequest) -> Path:
    """Write the checkpoint ``request.local_dir`` names as a Hugging Face folder at ``target_dir``; its path."""
    target = check_target(request.target_dir)
    located, source, model = load_trained(request)
    write(model, located, source, target, adapter_only=request.adapter_only)
    what = "LoRA adapter" if request.adapter_only else f"{located.role} model"
    print(f"Merged {located.step_dir} ({located.role}) -> {target}: the {what}, "
          f"{_load_hint(located, request.adapter_only)}", flush=True)
    return target


def _load_hint(located: Located, adapter_only: bool) -> str:
    if adapter_only:
        return "loadable with peft's PeftModel.from_pretrained or actor_rollout_ref.model.lora_adapter_path"
    if located.role == "critic":
        return "loadable with AutoModelForTokenClassification.from_pretrained (logits[..., 0] are the values)"
    return "loadable with AutoModelForCausalLM.from_pretrained"


def check_target(target_dir: str | None) -> Path:
    """``target_dir`` as a path, refused when writing there would replace something that is not a model
    folder (a merge replaces a Hugging Face folder that is there, as the trainer's export does)."""
    if not target_dir:
        raise VerlError("merge needs --target_dir <folder to write the Hugging Face model to>")
    target = Path(target_dir).expanduser()
    if target.is_file():
        raise VerlError(f"--target_dir {target_dir} is a file; give a folder (it is created)")
    if target.is_dir() and any(target.iterdir()) and not ((target / "config.json").is_file()
                                                          or (target / "adapter_config.json").is_file()):
        raise VerlError(f"--target_dir {target_dir} is a folder with other files in it (no config.json): the merge "
                        f"replaces its target, so give a new folder, or an earlier merge's output")
    return target


def write(model: torch.nn.Module, located: Located, source: ModelSource, target: Path, *,
          adapter_only: bool = False) -> None:
    from verl.distributed.fsdp import export_hf
    from verl.models.lora import is_lora_model, save_adapter
    from verl.models.vision import is_vision_model, load_processor

    if located.upstream:  # a plain Hugging Face model already; its tokenizer is beside its config
        from verl.checkpoint import write_hf_folder
        from verl.models.loading import load_tokenizer

        write_hf_folder(model, load_tokenizer(str(located.model_folder), config_key="--hf_model_path"), target)
        return
    if located.role == "critic":
        _write_value_model(model, source, target)
        return
    if adapter_only:
        if not is_lora_model(model):
            raise VerlError(f"--adapter_only: {located.step_dir} is a full fine-tune (no LoRA adapters); drop "
                            f"--adapter_only to write the whole model")
        write_folder_atomically(target, lambda folder: save_adapter(model, model.state_dict(), folder))
        return
    tokenizer = source.tokenizer()
    export_hf(model, load_processor(source.path) if is_vision_model(model) else tokenizer, target)


def value_model_as_token_classifier(value_model: torch.nn.Module) -> torch.nn.Module:
    """The critic's :class:`~verl.models.value_model.ValueModel` as a Hugging Face ``*ForTokenClassification``
    model with one label (LoRA adapters merged in): the same values as ``logits[..., 0]``."""
    import copy

    from transformers import AutoModelForTokenClassification

    from verl.models.lora import merged_weights, plain_model

    inner = value_model.model
    causal = plain_model(inner)
    weights = merged_weights(inner, inner.state_dict())
    head = next(name for name, module in causal.named_modules() if module is causal.get_output_embeddings())
    config = copy.deepcopy(causal.config)
    config.num_labels = 1
    config.architectures = None
    try:
        classifier = AutoModelForTokenClassification.from_config(config, dtype=causal.dtype)
    except ValueError as error:
        raise VerlError(f"transformers has no token-classification model for {config.model_type} models, the form "
                        f"a critic is written in ({str(error).splitlines()[0][:160]}); merge the actor "
                        f"instead") from None
    prefix = classifier.base_model_prefix
    theirs = classifier.state_dict()
    their_head = sorted({name.rsplit(".", 1)[0] for name in theirs if not name.startswith(prefix + ".")})
    if len(their_head) != 1:
        raise VerlError(f"cannot tell the value head of {type(classifier).__name__} (parts outside its backbone: "
                        f"{their_head})")
    renamed = {}
    for name, tensor in weights.items():
        if name.startswith(head + "."):
            renamed[their_head[0] + name[len(head):]] = tensor
        elif name.startswith(prefix + "."):
            renamed[name] = tensor
    missing = sorted(set(theirs) - set(renamed))
    if missing:
        raise VerlError(f"{type(classifier).__name__} has weights the critic does not ({missing[:3]}); merge the "
                        f"actor instead")
    classifier.load_state_dict(renamed, strict=True)
    return classifier.eval()


def _write_value_model(value_model: torch.nn.Module, source: ModelSource, target: Path) -> None:
    from verl.checkpoint import write_hf_folder

    write_hf_folder(value_model_as_token_classifier(value_model), source.tokenizer(), target)


def _check_tied(model: torch.nn.Module, located: Located) -> None:
    """verl's ``--tie-word-embedding``: here the tie is the model's own (its config.json), kept as
    trained; asking for it on a model whose output layer is a weight of its own is refused, since
    tying would drop that trained weight."""
    from verl.models.lora import plain_model

    if located.role == "critic" or not getattr(plain_model(model).config, "tie_word_embeddings", False):
        raise VerlError("--tie-word-embedding: this model's output layer is a trained weight of its own (its config "
                        "has tie_word_embeddings=false), and tying it to the embedding would drop it; drop the flag "
                        "(the merge keeps the model's own tying, whatever it is)")


def compare(merged: Path, reference: Path, role: str) -> list[str]:
    """What differs between the model folders ``merged`` and ``reference``: names, shapes, values."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    auto = AutoModelForTokenClassification if role == "critic" else AutoModelForCausalLM
    if not (reference / "config.json").is_file():
        raise VerlError(f"--test_hf_dir {reference} is not a Hugging Face model folder (no config.json)")
    ours = auto.from_pretrained(merged).state_dict()
    theirs = auto.from_pretrained(reference).state_dict()
    problems = [f"only in the checkpoint: {name}" for name in sorted(set(ours) - set(theirs))]
    problems += [f"only in {reference}: {name}" for name in sorted(set(theirs) - set(ours))]
    for name in sorted(set(ours) & set(theirs)):
        a, b = ours[name], theirs[name]
        if a.shape != b.shape:
            problems.append(f"{name}: shape {tuple(a.shape)} vs {tuple(b.shape)}")
        elif not torch.allclose(a.float(), b.to(a.dtype).float(), rtol=1e-5, atol=1e-6):
            problems.append(f"{name}: values differ (largest difference {(a.float() - b.float()).abs().max():.3g})")
    return problems


def check_against(request: MergeRequest, reference_dir: str) -> int:
    """Merge into a temporary folder and compare with ``reference_dir``; 0 when they agree."""
    reference = Path(reference_dir).expanduser()
    if not reference.is_dir():
        raise VerlError(f"--test_hf_dir {reference_dir} does not exist")
    located, source, model = load_trained(request)
    with tempfile.TemporaryDirectory(prefix="verl-merge-test-") as folder:
        merged = Path(folder) / "merged"
        write(model, located, source, merged)
        problems = compare(merged, reference, located.role)
    if problems:
        raise VerlError(f"{located.step_dir} ({located.role}) differs from {reference}: {len(problems)} problem(s): "
                        + "; ".join(problems[:8]))
    print(f"{located.step_dir} ({located.role}) matches {reference}: same weights", flush=True)
    return 0


__all__ = ["MergeRequest", "check_target", "compare", "merge", "check_against", "value_model_as_token_classifier"]
