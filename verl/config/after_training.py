"""Configs of the commands run after training: ``GenerationConfig`` (``verl.trainer.main_generation``) and
``EvalConfig`` (``verl.trainer.main_eval``).

Keys follow verl's ``generation.yaml`` and ``evaluation.yaml``. Where the defaults differ from verl's
(``rollout.top_p`` 1.0 and ``top_k`` -1 here: no filtering unless asked; ``rollout.name`` auto), the
help text says so; docs/after_training.md lists the differences.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl.config.node import option, section
from verl.config.schema_rollout import ROLLOUT_DTYPES
from verl.config.verl_rules import Section, verl_option
from verl.errors import ConfigError

TRUNCATIONS = ("error", "left", "right", "middle")
ENGINES = ("auto", "hf", "native", "vllm")
ONE_PROCESS = "generation runs in this one process, on one device (vllm: tensor_model_parallel_size devices)"


@dataclass
class GenerationTrainerConfig(Section):
    """Where generation runs."""

    nnodes: int = verl_option(1, bounds=">= 1", help="Machines.", inert=False, why="generation runs on one machine "
                              "here", refuse_if=lambda v: v > 1, when="above 1", instead="run one command per machine "
                              "on a share of the prompts")
    n_gpus_per_node: int = verl_option(1, bounds=">= 1", help="Devices per machine.", why=ONE_PROCESS)
    device: str = option("auto", help="auto (cuda when available, else cpu), cpu, cuda or cuda:N.")


@dataclass
class GenerationDataConfig(Section):
    """The prompts and where the responses go."""

    path: str | None = option(None, help="Parquet/jsonl file of prompts (verl's RL data: a prompt column of chat "
                              "messages or text). Required.")
    prompt_key: str = option("prompt", help="Column holding each row's prompt.")
    n_samples: int = option(5, bounds=">= 1", help="Responses per prompt (verl's default 5). More than 1 needs "
                            "sampling (rollout.do_sample=true, temperature > 0).")
    output_path: str | None = option(None, help="Parquet file to write: the input's columns plus `responses` (a "
                                     "list of n_samples texts per row). Its folder is created. Required.")
    batch_size: int = option(128, bounds=">= 1", help="Prompts per generate call.")
    truncation: str = option("error", choices=TRUNCATIONS, help="A prompt longer than rollout.prompt_length "
                             "raises (error), or is cut on the left, right or in the middle (verl cuts without "
                             "saying).")
    apply_chat_template: bool = option(True, help="Render message prompts with the tokenizer's chat template (with "
                                       "the generation prompt).")
    chat_template_kwargs: dict = option({}, help="Extra keyword arguments of the chat template, e.g. "
                                        "{enable_thinking: false}.")


@dataclass
class GenerationModelConfig(Section):
    """The model that generates: a Hugging Face folder (a run's huggingface/ export or a merged checkpoint)."""

    path: str | None = option(None, help="Hugging Face model folder or hub id. Required.")
    tokenizer_path: str | None = option(None, help="Tokenizer folder or id; null = model.path.")
    trust_remote_code: bool = option(False, help="Allow custom modelling code from the model repository.")
    external_lib: str | None = option(None, help="A Python module imported first (to register custom models).")
    dtype: str = option("auto", help="Weights' dtype for hf/native: auto (the folder's), float32, bfloat16, "
                        "float16.")


@dataclass
class GenerationRolloutConfig(Section):
    """How responses are drawn, and the vLLM engine's settings."""

    name: str = option("auto", choices=ENGINES, help="Engine: auto (native where its fast decoder covers the "
                       "model, else hf), hf, native or vllm (verl's default is vllm).")
    temperature: float = option(1.0, bounds=">= 0", help="Sampling temperature; 0 = greedy.")
    top_k: int = option(-1, bounds=">= -1", help="Keep the k most likely tokens; -1 = all (verl's yaml: 50).")
    top_p: float = option(1.0, bounds="(0, 1]", help="Nucleus sampling mass; 1.0 = off (verl's yaml: 0.7).")
    do_sample: bool = option(True, help="Sample (true) or decode greedily (false).")
    prompt_length: int = option(1536, bounds=">= 1", help="Longest prompt in tokens (see data.truncation).")
    response_length: int = option(512, bounds=">= 1", help="Most tokens per response.")
    seed: int = option(1, bounds="[0, 4294967295]", help="Seed of the sampling: the same command draws the same "
                       "responses.")
    n: int = verl_option(1, bounds=">= 1", help="verl's rollout.n.", inert=False, why="data.n_samples sets the "
                         "responses per prompt", refuse_if=lambda v: v > 1, when="above 1",
                         instead="set data.n_samples")
    dtype: str = option("auto", choices=ROLLOUT_DTYPES, help="vllm: weight dtype inside the engine.")
    gpu_memory_utilization: float = option(0.5, bounds="(0, 1]", help="vllm: fraction of GPU memory it takes.")
    tensor_model_parallel_size: int = option(1, bounds=">= 1", help="vllm: GPUs the model is split over.")
    max_num_seqs: int = option(256, bounds=">= 1", help="Most sequences decoded at once.")
    max_num_batched_tokens: int = option(8192, bounds=">= 1", help="vllm: most tokens per engine step.")
    max_model_len: int | None = option(None, bounds=">= 1", help="vllm: longest sequence; null = prompt_length + "
                                       "response_length.")
    enforce_eager: bool = option(True, help="vllm: no CUDA graphs.")
    enable_chunked_prefill: bool = option(True, help="vllm: chunked prefill.")
    ignore_eos: bool = verl_option(False, help="Keep generating after EOS.", inert=False, why="generation stops at "
                                   "EOS here", refuse_if=lambda v: v, when="when true")
    mode: str = verl_option("sync", help="verl's engine API.", why="the engine is called in this process")
    free_cache_engine: bool = verl_option(True, help="vllm: sleep between calls.", why="there is one call per batch")
    load_format: str = verl_option("dummy_dtensor", help="How vllm loads its first weights.",
                                   why="vllm reads model.path's weights")
    disable_log_stats: bool = verl_option(True, help="Silence vllm's statistics.", why="cosmetic")
    log_prob_micro_batch_size: int | None = verl_option(None, help="verl's.", why="no log-probs are computed")
    log_prob_micro_batch_size_per_gpu: int | None = verl_option(None, help="verl's.", why="no log-probs are computed")

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature == 0


@dataclass
class GenerationConfig(Section):
    """``python -m verl.trainer.main_generation``: n responses per prompt of a parquet file."""

    trainer: GenerationTrainerConfig = section(GenerationTrainerConfig, help="Where generation runs.")
    data: GenerationDataConfig = section(GenerationDataConfig, help="Prompts in, responses out.")
    model: GenerationModelConfig = section(GenerationModelConfig, help="The model.")
    rollout: GenerationRolloutConfig = section(GenerationRolloutConfig, help="Sampling and engine settings.")

    def validate(self) -> None:
        for key in ("data.path", "data.output_path", "model.path"):
            if not self.get(key):
                raise ConfigError(f"{key} is required: main_generation {key}=<{_WHAT[key]}>")
        if self.data.n_samples > 1 and self.rollout.greedy:
            why = "rollout.do_sample=false" if not self.rollout.do_sample else "rollout.temperature=0"
            raise ConfigError(f"data.n_samples={self.data.n_samples} with greedy decoding ({why}) gives "
                              f"{self.data.n_samples} identical responses per prompt: set data.n_samples=1, or "
                              f"sample (rollout.do_sample=true and rollout.temperature > 0)")


_WHAT = {"data.path": "parquet of prompts", "data.output_path": "parquet to write",
         "model.path": "Hugging Face model folder", "data.eval_path": "parquet with responses"}


@dataclass
class EvalDataConfig(Section):
    """The scored file: main_generation's output (or any file with a column of responses)."""

    path: str | None = option(None, help="Parquet/jsonl file with a responses column. Required.")
    response_key: str = option("responses", help="Column of each row's responses (a list of texts; a text "
                               "counts as one).")
    data_source_key: str = option("data_source", help="Column naming the scorer of each row (its data source).")
    reward_model_key: str = option("reward_model", help="Column holding {ground_truth: ...} (verl's layout).")


@dataclass
class EvalRewardFunctionConfig(Section):
    """Your own scorer instead of the built-in one of each data source."""

    path: str | None = option(None, help="Python file defining the function; null = the built-in scorer of "
                              "each row's data source.")
    name: str = option("compute_score", help="Function name in that file; called as name(data_source=..., "
                       "solution_str=..., ground_truth=..., extra_info=...) -> float or {score: ...}.")
    reward_kwargs: dict = option({}, help="Extra keyword arguments passed to the function.")


@dataclass
class EvalConfig(Section):
    """``python -m verl.trainer.main_eval``: score each row's responses; pass@k and mean per data source."""

    data: EvalDataConfig = section(EvalDataConfig, help="The file of responses.")
    custom_reward_function: EvalRewardFunctionConfig = section(EvalRewardFunctionConfig,
                                                               help="Your scorer (null path = built-in ones).")
    pass_score: float = option(1.0, help="A response passes when its score is at least this (pass@k: some of a "
                               "row's k responses passes).")

    def validate(self) -> None:
        if not self.data.path:
            raise ConfigError("data.path is required: main_eval data.path=<parquet with responses> (main_generation's "
                              "data.output_path)")
