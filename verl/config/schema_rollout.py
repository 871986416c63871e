"""The `actor_rollout_ref.rollout` section: response generation, its engines' settings, validation sampling."""

from __future__ import annotations

from dataclasses import dataclass

from verl.config import verl_defaults, verl_rules
from verl.config.verl_rules import Section, verl_option
from verl.config.node import option, section

# What the vLLM engine takes as its dtype (verl.rollout.vllm passes the name on, as torch also reads it).
ROLLOUT_DTYPES = ("auto", "bfloat16", "float16", "half", "float32", "float")


@dataclass
class ValKwargsConfig(Section):
    """Sampling used for validation."""

    n: int = option(1, bounds=">= 1", help="Responses per validation prompt.")
    do_sample: bool = option(False, help="Sample (true) or decode greedily (false).")
    temperature: float = option(0.0, bounds=">= 0", help="Sampling temperature.")
    top_k: int = option(-1, bounds=">= -1", help="Keep the k most likely tokens; -1 = all.")
    top_p: float = option(1.0, bounds="(0, 1]", help="Nucleus sampling mass; 1.0 = off.")


@dataclass
class MultiTurnConfig(Section):
    """Several assistant turns per sample, with tool calls in between (verl's keys; docs/agents.md)."""

    enable: bool = option(False, help="Multi-turn rollouts: the model may call tools, read their results and go "
                          "on, until it answers without a call or a limit is reached.")
    max_assistant_turns: int | None = option(None, bounds=">= 1", help="Assistant turns per sample at most; null = "
                                             "until the response budget (data.max_response_length) is spent.")
    tool_config_path: str | None = option(None, help="verl's tool YAML: tool classes (BaseTool subclasses) with "
                                          "their config and OpenAI schema.")
    function_tool_path: str | None = option(None, aliases=("tool_functions",), help="A Python file whose public "
                                            "functions with type hints and a docstring are tools (or only those "
                                            "decorated with verl.tools.function_tool.function_tool). Also spelled "
                                            "tool_functions.")
    max_parallel_calls: int = option(1, bounds=">= 1", help="Tool calls run per assistant turn at most (the rest "
                                     "are dropped).")
    max_tool_response_length: int = option(256, bounds=">= 1", help="A tool's answer is cut to this many "
                                           "characters.")
    tool_response_truncate_side: str = option("middle", choices=("left", "middle", "right"),
                                              help="Which part of a long tool answer is cut.")
    format: str = option("hermes", choices=("hermes",), help="How tool calls are written: hermes is "
                         "<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call> (Qwen, Hermes).")
    tool_timeout_s: float = option(30.0, bounds="> 0", help="A tool call that takes longer is answered with an "
                                   "error message to the model; a tool's create/calc_reward/release, an environment's "
                                   "or interaction's call that takes longer stops the run naming it.")
    environment: str | None = option(None, help="An environment class that answers each assistant turn that "
                                     "calls no tool (path/to/file.py:ClassName or package.module.ClassName, with "
                                     "reset(sample) and step(message) -> (reply, reward, done); docs/agents.md).")
    max_user_turns: int | None = option(None, bounds=">= 0", help="Replies of the environment per trajectory at most; "
                                        "null = until it says done.")
    interaction_config_path: str | None = option(None, help="verl's interaction YAML (simulated users): classes "
                                                 "with start_interaction, generate_response and "
                                                 "finalize_interaction, picked per row by extra_info."
                                                 "interaction_kwargs.name; they answer like an environment "
                                                 "(docs/agents.md).")
    add_agent_rewards: bool = option(True, help="Add the rewards given along a trajectory (tools' execute and "
                                     "calc_reward, an environment's or interaction's turns) to the reward "
                                     "function's score. false: as in verl, only the reward function scores; it "
                                     "reads them in extra_info (num_turns, turn_scores, tool_rewards).")
    use_inference_chat_template: bool = verl_option(False, help="Re-render earlier turns with the chat template.",
                                                    why="trajectories always keep the token ids the model drew "
                                                    "(token in, token out)")
    tokenization_sanity_check_mode: str = verl_option("strict", help="verl's check of re-tokenized turns.",
                                                      why="earlier turns are never re-tokenized here")
    num_repeat_rollouts: int | None = verl_option(None, help="verl's repeat count of multi-turn rollouts.",
                                                  why="rollout.n sets the samples per prompt")


# verl's keys of a standalone rollout pool under actor_rollout_ref.rollout: read by its V1 separate_async mode.
ROLLOUT_OWN_DEVICES = ("the rollout shares the trainer's devices in a synchronous run; for devices of its own set "
                       "async_training.enable=true, async_training.rollout_placement=ranks and rollout.nnodes / "
                       "rollout.n_gpus_per_node (trainer.v1.trainer_mode=separate_async reads these two keys)")


@dataclass
class RolloutConfig(Section):
    """Response generation."""

    name: str = option("auto", help="Rollout engine: auto (the fastest for the model, said at start: native for "
                       "Qwen2, Qwen3, Llama, Mistral and Phi-3, hf for other models), hf (Hugging Face generate), native "
                       "(verl's own KV-cache decode loop: shared prefill of a prompt's samples, finished rows leave "
                       "the batch, a lean decoder for those five families; same samples as hf), vllm, or dummy (tests).")
    n: int = option(8, bounds=">= 1", help="Responses sampled per prompt (samples per prompt); group-baseline "
                    "estimators such as GRPO (the default) need 2 or more.")
    temperature: float = option(1.0, bounds=">= 0", help="Sampling temperature.")
    top_k: int = option(-1, bounds=">= -1", help="Keep the k most likely tokens; -1 = all.")
    top_p: float = option(1.0, bounds="(0, 1]", help="Nucleus sampling mass; 1.0 = off.")
    do_sample: bool = option(True, help="Sample (true) or decode greedily (false).")
    dtype: str = option("auto", choices=ROLLOUT_DTYPES, help="Weight dtype inside the vLLM engine: bfloat16, "
                        "float16 (half), float32 (float), or auto (bfloat16 on a GPU, the actor's dtype on a CPU).")
    gpu_memory_utilization: float = option(0.5, bounds="(0, 1]", help="vLLM: fraction of GPU memory for weights and KV cache "
                                           "(on a CPU, of the machine's memory; the CPU build's KV cache is "
                                           "sized from max_num_seqs and max_model_len instead).")
    tensor_model_parallel_size: int = option(1, bounds=">= 1", help="GPUs one vLLM model is split over (vllm only: "
                                             "hf and native hold the whole model on every rank, and warn at start "
                                             "when this is above 1).")
    max_num_seqs: int = option(256, bounds=">= 1", help="Most sequences the engine decodes at once; the others "
                               "wait. vLLM and native give them the slots of sequences that finish (continuous "
                               "batching); hf, and native on a model's own forward, run waves of this many.")
    max_model_len: int | None = option(None, bounds=">= 1", help="vLLM: longest sequence (prompt + response) the engine "
                                       "serves; null = data.max_prompt_length + data.max_response_length.")
    max_num_batched_tokens: int = option(8192, bounds=">= 1", help="vLLM: most tokens one engine step processes.")
    enforce_eager: bool = option(True, help="vLLM: run the model eagerly (no CUDA graphs, no torch.compile): "
                                 "fast start-up; false trades start-up time for decode speed.")
    enable_chunked_prefill: bool = option(True, help="vLLM: split long prefills into chunks scheduled "
                                          "beside decodes.")
    enable_prefix_caching: bool = option(True, help="vLLM: reuse the KV cache of shared prompt prefixes "
                                         "(the n samples of a prompt); dropped at every weight sync.")
    free_cache_engine: bool = option(True, help="vLLM on a GPU: sleep between rollouts (weights offloaded, "
                                     "KV cache freed) so training has the memory; vLLM's CPU build has "
                                     "no sleep mode and keeps its cache.")
    engine_kwargs: dict = option({"vllm": {}, "sglang": {}, "trtllm": {}}, help="Extra keyword arguments per "
                                 "engine, passed as they are (engine_kwargs.vllm: to vllm.LLM; they override the "
                                 "keys above). The sglang and trtllm entries are verl's; those engines are not "
                                 "supported here.")
    generation_batch_size: int | None = option(None, bounds=">= 1", help="Prompts per generate call; null = "
                                               "the whole step at once. hf and native: that many prompts' "
                                               "samples at most are decoded at once, and max_num_seqs rows.")
    log_prob_micro_batch_size_per_gpu: int | None = option(None, bounds=">= 1", help="Samples per forward pass "
                                                           "when recomputing old log-probs; null = all at once. Ignored with "
                                                           "log_prob_use_dynamic_bsz.")
    log_prob_use_dynamic_bsz: bool | None = option(None, help="Cut old-log-prob passes by tokens (at most "
                                                   "log_prob_max_token_len_per_gpu each) instead of "
                                                   "log_prob_micro_batch_size_per_gpu rows; null = actor.use_dynamic_bsz.")
    log_prob_max_token_len_per_gpu: int | None = option(None, bounds=">= 1", help="Token budget of one old-log-prob "
                                                        "pass; null = actor.ppo_max_token_len_per_gpu.")
    calculate_log_probs: bool = option(False, help="The engine reports rollout_log_probs: each sampled "
                                       "token's log-prob under the distribution it was drawn from (after "
                                       "temperature, top-k, top-p). On by itself with actor.rollout_is_correction.")
    device: str | None = option(None, help="Device that receives rollout outputs; null = the actor's device.")
    val_kwargs: ValKwargsConfig = section(ValKwargsConfig, help="Sampling for validation.")
    # verl's other rollout keys.
    mtp: dict | None = verl_option(None, help="verl copies model.mtp here.", inert=False,
                                   why="multi-token prediction is not implemented",
                                   refuse_if=lambda v: bool(v and v.get("enable")), when="when enabled",
                                   keys=("enable",))
    qat: dict | None = verl_option(None, help="verl copies the actor's qat section here.", inert=False,
                                   why="quantisation-aware training is not implemented",
                                   refuse_if=lambda v: bool(v and v.get("enable")), when="when enabled",
                                   keys=("enable",))
    mode: str = verl_option("async", help="sync or async engine API.", why="the rollout is called in-process "
                            "here; both give the same samples", refuse_if=lambda v: v not in ("sync", "async"),
                            when="for anything but sync / async")
    prompt_length: int | None = option(None, link="data.max_prompt_length", fallback=512, bounds=">= 1",
                                       help="Longest prompt the engine serves. null follows data.max_prompt_length "
                                       "(512 for a section outside a TrainerConfig); validate() refuses a "
                                       "different value (set data.max_prompt_length).")
    response_length: int | None = option(None, link="data.max_response_length", fallback=512, bounds=">= 1",
                                         help="Most tokens generated per response. null follows "
                                         "data.max_response_length (512 for a section outside a TrainerConfig); "
                                         "validate() refuses a different value (set data.max_response_length).")
    log_prob_micro_batch_size: int | None = option(None, bounds=">= 1", help="verl's older global form of "
                                                   "log_prob_micro_batch_size_per_gpu; validate() divides it by the "
                                                   "data-parallel size and moves it there.")
    ignore_eos: bool = verl_option(False, help="Keep generating after the EOS token.", inert=False,
                                   why="generation stops at EOS here", refuse_if=bool, when="when true")
    logprobs_mode: str = verl_option("processed_logprobs", help="Which log-probs the engine reports.", inert=False,
                                     why="the rollout reports log-probs after temperature / top-k / top-p "
                                     "(processed_logprobs)", refuse_if=lambda v: v != "processed_logprobs",
                                     when="for anything but processed_logprobs")
    over_sample_rate: float = verl_option(0, help="Stop a rollout once this fraction of requests is left.",
                                          inert=False, why="every request of a step is generated here",
                                          refuse_if=lambda v: v != 0, when="unless 0")
    quantization: str | None = verl_option(None, help="Quantised rollout weights.", inert=False,
                                           why="the rollout runs the actor's weights unquantised",
                                           refuse_if=lambda v: v is not None, when="unless null")
    quantization_config_file: str | None = verl_option(None, help="Quantisation config of the rollout.",
                                                       inert=False, why="the rollout runs the actor's weights "
                                                       "unquantised", refuse_if=lambda v: v is not None,
                                                       when="unless null")
    multi_turn: MultiTurnConfig = section(MultiTurnConfig, help="Multi-turn rollouts with tool calls "
                                          "(docs/agents.md).")
    agent: dict = verl_option({"num_workers": 8, "default_agent_loop": "single_turn_agent",
                               "agent_loop_config_path": None, "custom_async_server": {"path": None, "name": None}},
                              inert=False, help="verl's agent loop: single_turn_agent, or tool_agent (the "
                              "multi-turn tool loop, which multi_turn.enable=true runs).",
                              why="the loop follows multi_turn.enable here",
                              refuse_if=lambda v: (v.get("default_agent_loop", "single_turn_agent")
                                                   not in ("single_turn_agent", "tool_agent")
                                                   or v.get("agent_loop_config_path") is not None),
                              when="with another agent loop", instead="use multi_turn.enable=true for tool calls",
                              keys=("default_agent_loop", "agent_loop_config_path"))
    nnodes: int = verl_option(0, help="Machines of a standalone rollout pool; 0 = share the trainer's.",
                              why=ROLLOUT_OWN_DEVICES, warn_if=bool, when="above 0")
    n_gpus_per_node: int | None = verl_option(None, help="Devices per machine of a standalone rollout pool.",
                                              why=ROLLOUT_OWN_DEVICES)
    standalone_gpu_memory_utilization: float | None = verl_option(
        None, help="verl: vLLM's gpu_memory_utilization on the rollout's own GPUs (null: gpu_memory_utilization).",
        why="vLLM runs on the trainer's devices here (a rollout process shares them; rollout ranks of their own run "
            "hf or native), with gpu_memory_utilization")
    data_parallel_size: int = verl_option(1, help="Engine data-parallel replicas.", why="one engine per "
                                          "trainer process here", warn_if=lambda v: v != 1, when="above 1")
    expert_parallel_size: int = verl_option(1, help="Engine expert parallelism.", why="not used here",
                                            warn_if=lambda v: v != 1, when="above 1")
    pipeline_model_parallel_size: int = verl_option(1, help="Engine pipeline parallelism.", why="not used here",
                                                    warn_if=lambda v: v != 1, when="above 1")
    cudagraph_capture_sizes: list[int] | None = verl_option(
        None, help="Batch sizes vLLM captures CUDA graphs for.", why="pass it as "
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_capture_sizes=[...]",
        warn_if=lambda v: v is not None, when="to a list")
    load_format: str = verl_option("dummy", help="How the engine loads its first weights.",
                                   why="the engine's weights come from the actor at every sync")
    layered_summon: bool = verl_option(False, help="Gather the actor's weights layer by layer for the sync.",
                                       why=verl_rules.MEMORY_ONLY)
    scheduling_policy: str = verl_option("fcfs", help="Engine request scheduling.", why="the engine's default")
    full_determinism: bool = verl_option(False, help="Deterministic engine kernels (debugging).",
                                         why="not switched on", warn_if=bool, when="to true")
    seed: int = verl_option(42, help="Seed of the engine.", why="trainer.seed seeds the sampling here")
    disable_log_stats: bool = verl_option(True, help="Silence the engine's statistics log.", why="cosmetic")
    multi_stage_wake_up: bool = verl_option(False, help="SGLang: wake the engine up in stages.",
                                            why="SGLang is not supported")
    skip_tokenizer_init: bool = verl_option(True, help="The engine takes token ids only.",
                                            why="the engine always gets token ids here")
    enable_rollout_routing_replay: bool = verl_option(False, help="Record MoE routing in the rollout.",
                                                      inert=False, why="MoE routing replay is not implemented",
                                                      refuse_if=bool, when="when true")
    moe_load_balance_metrics_interval: int = verl_option(0, help="Log MoE load-balance metrics every this "
                                                         "many steps.", why="not logged here",
                                                         warn_if=bool, when="above 0")
    checkpoint_engine: dict = verl_option(verl_defaults.checkpoint_engine_defaults(), help="How weights reach the "
                                          "engine.", why="weights are synced in-process here")
    trace: dict = verl_option({"project_name": None, "experiment_name": None, "backend": None,
                               "token2text": False, "max_samples_per_step_per_worker": None},
                              help="Rollout tracing (weave, mlflow).", why="rollout tracing is not implemented",
                              warn_if=lambda v: v.get("backend") is not None, when="with a backend",
                              keys=("backend",))
    prometheus: dict = verl_option({"enable": False, "port": 9090, "file": None, "served_model_name": None},
                                   help="Prometheus metrics of the engine.",
                                   why="not exported here", warn_if=lambda v: bool(v.get("enable")),
                                   when="enable=true", keys=("enable",))
    disaggregation: dict = verl_option({"enabled": False, "prefill_replicas": 1, "decode_replicas": 1,
                                        "decode_tensor_model_parallel_size": None, "transfer_backend": "nixl",
                                        "bootstrap_port": None, "ib_device": None},
                                       help="Prefill/decode disaggregation.", why="not used here",
                                       warn_if=lambda v: bool(v.get("enabled")), when="enabled=true",
                                       keys=("enabled",))
    profiler: dict = verl_option(verl_defaults.profiler_defaults(), help="verl's per-role profiler.",
                                 why="profiling is not implemented", warn_if=lambda v: bool(v.get("enable")),
                                 when="enable=true", keys=("enable",))
