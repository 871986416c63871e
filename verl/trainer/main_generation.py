"""``python -m verl.trainer.main_generation data.path=... model.path=... data.output_path=... [key=value ...]``

Generates ``data.n_samples`` responses for each prompt of a parquet (or jsonl) file with a Hugging Face
model (a run's ``huggingface/`` export, or a checkpoint merged with ``python -m verl.model_merger``) and
writes the file back with a ``responses`` column: a list of ``n_samples`` texts per row. Score it with
``python -m verl.trainer.main_eval data.path=<output_path>``. Keys follow verl's generation.yaml; see
docs/after_training.md.
"""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path

from verl.config.after_training import GenerationConfig
from verl.errors import VerlError
from verl.trainer.entry import config_entry

logger = logging.getLogger(__name__)


def check_output_path(path: str) -> Path:
    """``data.output_path`` as a path whose folder exists (created now, before any model loads) and is
    writable; a folder given as the file, or a file in the way of the folder, is refused."""
    from verl.trainer.ppo.build import check_output_dir

    out = Path(path).expanduser()
    if out.is_dir():
        raise VerlError(f"data.output_path={path} is a folder; give the parquet file to write, e.g. "
                        f"data.output_path={out / 'generations.parquet'}")
    blocking = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise VerlError(f"data.output_path={path}: {blocking} is a file, so the folder cannot be created; give "
                        f"another path")
    check_output_dir(out.parent, "data.output_path's folder")
    return out


def fitted(ids: list[int], row: int, prompt_length: int, truncation: str) -> list[int]:
    """Row ``row``'s prompt ids within ``rollout.prompt_length``: cut as ``data.truncation`` says, or refused."""
    from verl.data.prompt_rows import cut_prompt

    if len(ids) > prompt_length and truncation == "error":
        raise VerlError(f"data.path: the prompt of row {row} is {len(ids)} tokens long, over rollout.prompt_length="
                        f"{prompt_length}; raise rollout.prompt_length, or set data.truncation=left|right|middle to "
                        f"cut such prompts")
    return cut_prompt(ids, prompt_length, truncation)


def engine_name(name: str, model) -> str:
    """``rollout.name``, ``auto`` made the engine for ``model``'s architecture."""
    from verl.rollout import auto_engine

    return name if name != "auto" else auto_engine(model.config.model_type)[0]


def _engine(config: GenerationConfig, model, tokenizer, device):
    from verl.config.schema_rollout import RolloutConfig
    from verl.rollout import build_rollout

    cfg = config.rollout
    name = engine_name(cfg.name, model)
    # The trainer's rollout section with this command's settings (hf and native read max_num_seqs alone).
    engine_cfg = RolloutConfig(name=name, n=config.data.n_samples, dtype=cfg.dtype,
                               gpu_memory_utilization=cfg.gpu_memory_utilization,
                               tensor_model_parallel_size=cfg.tensor_model_parallel_size,
                               max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
                               enforce_eager=cfg.enforce_eager, enable_chunked_prefill=cfg.enable_chunked_prefill,
                               prompt_length=cfg.prompt_length, response_length=cfg.response_length)
    engine = build_rollout(name, model, tokenizer, seed=cfg.seed, device=device, model_path=config.model.path,
                           rollout_config=engine_cfg, max_model_len=cfg.max_model_len
                           or cfg.prompt_length + cfg.response_length,
                           trust_remote_code=config.model.trust_remote_code)
    return name, engine


def generate(config: GenerationConfig) -> Path:
    """Run the generation ``config`` describes; the path of the file written."""
    import torch

    from verl.data.collate import collate_prompts
    from verl.data.dataset import RLDataset
    from verl.data.io import read_rows, write_parquet
    from verl.models.loading import (check_token_ids, describe_causal_lm, load_causal_lm, load_tokenizer,
                                     resolve_device)
    from verl.rollout import SamplingParams
    from verl.utils.preflight import check_context_length

    config.validate()
    data, model_cfg, rollout = config.data, config.model, config.rollout
    out = check_output_path(data.output_path)
    if model_cfg.external_lib:
        try:
            importlib.import_module(model_cfg.external_lib)
        except ImportError as error:
            raise VerlError(f"model.external_lib={model_cfg.external_lib} does not import: {error}") from None
    if config.trainer.n_gpus_per_node > 1 and rollout.name != "vllm":
        logger.warning("trainer.n_gpus_per_node=%d: generation runs on one device here (vllm splits a model over "
                       "rollout.tensor_model_parallel_size devices)", config.trainer.n_gpus_per_node)
    device = resolve_device(config.trainer.device)
    tokenizer = load_tokenizer(model_cfg.tokenizer_path or model_cfg.path,
                               trust_remote_code=model_cfg.trust_remote_code,
                               config_key="model.tokenizer_path" if model_cfg.tokenizer_path else "model.path")
    # Lengths are checked below, against this command's keys (the dataset's message names the trainer's).
    dataset = RLDataset(data.path, tokenizer, prompt_key=data.prompt_key, max_prompt_length=sys.maxsize,
                        truncation="error", filter_overlong_prompts=False,
                        apply_chat_template=data.apply_chat_template,
                        chat_template_kwargs=dict(data.chat_template_kwargs),
                        config_key="data.path")
    rows = read_rows(data.path, config_key="data.path")
    # Described first (config and dtype alone): vllm reads the folder itself, hf and native get the model.
    model = describe_causal_lm(model_cfg.path, dtype=model_cfg.dtype, trust_remote_code=model_cfg.trust_remote_code,
                               config_key="model.path")
    prompts = [fitted(dataset[i]["input_ids"], i, rollout.prompt_length, data.truncation) for i in range(len(dataset))]
    check_context_length(model.config, max(len(ids) for ids in prompts), rollout.response_length,
                         truncation_key="data.truncation", max_prompt_key="rollout.prompt_length",
                         max_response_key="rollout.response_length", filter_key=None)
    check_token_ids(tokenizer, model.config, prompts, data_key="data.path", tokenizer_key="model.tokenizer_path")
    if engine_name(rollout.name, model) != "vllm":
        model = load_causal_lm(model_cfg.path, dtype=model_cfg.dtype, trust_remote_code=model_cfg.trust_remote_code,
                               config_key="model.path").to(device).eval()
    name, engine = _engine(config, model, tokenizer, device)
    params = SamplingParams(max_new_tokens=rollout.response_length, n=data.n_samples, temperature=rollout.temperature,
                            top_p=rollout.top_p, top_k=rollout.top_k, do_sample=rollout.do_sample)
    responses: list[list[str]] = []
    with torch.no_grad():
        for start in range(0, len(dataset), data.batch_size):
            items = [{**dataset[i], "input_ids": prompts[i]}
                     for i in range(start, min(start + data.batch_size, len(dataset)))]
            batch = engine.generate(collate_prompts(items, tokenizer.pad_token_id).to(device), params)
            texts = tokenizer.batch_decode(batch["responses"], skip_special_tokens=True)
            responses += [texts[k:k + data.n_samples] for k in range(0, len(texts), data.n_samples)]
            logger.info("generated %d of %d prompts", len(responses), len(dataset))
    if any("responses" in row for row in rows):
        logger.warning("data.path=%s already has a responses column: the output's holds the new responses", data.path)
    written = [{**row, "responses": answers} for row, answers in zip(rows, responses)]
    write_parquet(written, out)
    print(f"Generated {data.n_samples} response(s) for each of {len(written)} prompts with {model_cfg.path} "
          f"(engine {name}) -> {out}\nScore them: python -m verl.trainer.main_eval data.path={out}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    return config_entry(GenerationConfig, generate, sys.argv[1:] if argv is None else argv, __doc__)


if __name__ == "__main__":
    from verl.utils.command import run_command

    run_command(main)
