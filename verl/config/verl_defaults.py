"""verl's defaults of the free-form sections the schema accepts (profiler, checkpoint, LoRA, ...).

Accepted as free-form mappings holding verl's keys and defaults, so that `a.b.c=value` works without
`+` as it does in verl; only the switches their `verl_option` rules name act (a warning or a
refusal), the rest has no effect.
"""

from __future__ import annotations


def profiler_defaults() -> dict:
    """verl's per-role `profiler` section (actor, ref, rollout, critic)."""
    schedule = {"skip_first": 0, "wait": 0, "warmup": 0, "active": 0, "repeat": 0}
    return {
        "tool": None, "enable": False, "all_ranks": False, "ranks": [], "save_path": None,
        "relocate_results": False, "finish_hook_cmd": None, "finish_hook_all_ranks": False, "finish_hook_ranks": [],
        "tool_config": {
            "nsys": {"discrete": False},
            "npu": {"contents": [], "level": "level0", "analysis": True, "discrete": False,
                    "profile_token_start": None, "profile_token_end": None},
            "torch": {"contents": [], "discrete": False, "schedule": schedule,
                      "profile_token_start": None, "profile_token_end": None},
            "torch_memory": {"trace_alloc_max_entries": 100000, "stack_depth": 32},
            "precision_debugger": {"config_path": None, "steps": None, "stages": None, "strict": False},
        },
    }


def global_profiler_defaults() -> dict:
    """verl's top-level `global_profiler` section."""
    nsight = {"trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true", "cuda-graph-trace": "graph"}
    return {
        "tool": None, "steps": None, "profile_continuous_steps": False, "save_path": "outputs/profile",
        "relocate_results": False, "finish_hook_cmd": None, "finish_hook_all_ranks": False, "finish_hook_ranks": [],
        "global_tool_config": {
            "nsys": {"discrete": False, "controller_nsight_options": dict(nsight),
                     "worker_nsight_options": {**nsight, "capture-range": "cudaProfilerApi",
                                               "capture-range-end": None, "kill": "none"}},
            "torch_memory": {"trace_alloc_max_entries": 100000, "stack_depth": 32, "context": "all",
                             "stacks": "all", "kw_args": {}},
            "precision_debugger": {"config_path": None, "steps": None, "stages": None, "strict": False},
        },
    }


def checkpoint_defaults() -> dict:
    """verl's per-role `checkpoint` section (what a checkpoint holds)."""
    return {"save_contents": ["model", "optimizer", "extra"], "load_contents": ["model", "optimizer", "extra"],
            "async_save": False, "strict": True}


def mtp_defaults() -> dict:
    """verl's `model.mtp` section (multi-token prediction)."""
    return {"enable": False, "enable_train": False, "enable_rollout": False, "detach_encoder": False,
            "mtp_loss_scaling_factor": 0.1, "speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4, "method": "mtp",
            "num_speculative_tokens": 1}


def lora_defaults() -> dict:
    """verl's `model.lora` section (the engine form of the LoRA settings)."""
    return {"type": "lora", "merge": False, "rank": 0, "alpha": 32, "dropout": 0.0,
            "target_modules": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"], "exclude_modules": [],
            "dropout_position": "pre", "lora_A_init_method": "xavier", "lora_B_init_method": "zero",
            "a2a_experimental": False, "dtype": None, "adapter_path": None, "freeze_vision_model": True,
            "freeze_vision_projection": True, "freeze_language_model": True}


def checkpoint_engine_defaults() -> dict:
    """verl's `rollout.checkpoint_engine` section (how weights reach the rollout engine)."""
    return {"backend": "naive", "update_weights_bucket_megabytes": 2048, "engine_kwargs": {},
            "custom_backend_module": None}


def ray_kwargs_defaults() -> dict:
    """verl's top-level `ray_kwargs` section."""
    return {"ray_init": {"num_cpus": None, "runtime_env": {"py_executable": None}}, "timeline_json_file": None}


def distillation_defaults() -> dict:
    """verl's top-level `distillation` section's free-form parts (the typed ones are in the schema)."""
    inference = {"name": None, "dtype": None, "gpu_memory_utilization": 0.5, "enforce_eager": True,
                 "cudagraph_capture_sizes": None, "free_cache_engine": True, "data_parallel_size": 1,
                 "expert_parallel_size": 1, "tensor_model_parallel_size": 2, "max_num_batched_tokens": 8192,
                 "max_model_len": None, "max_num_seqs": 1024, "load_format": "auto", "engine_kwargs": {},
                 "limit_images": None, "enable_chunked_prefill": True, "enable_prefix_caching": True,
                 "disable_log_stats": True, "skip_tokenizer_init": True, "prompt_length": None,
                 "response_length": None, "temperature": None}
    return {
        "n_gpus_per_node": 8, "nnodes": 0,
        "teacher_models": {"teacher_model": {"key": None, "model_path": None, "num_replicas": 0,
                                             "inference": inference}},
        "teacher_key": "data_source",
    }


def qat_defaults() -> dict:
    """verl's `qat` section (quantisation-aware training)."""
    return {"enable": False, "mode": "w4a16", "group_size": 16,
            "ignore_patterns": ["lm_head", "embed_tokens", "re:.*mlp.gate$"], "activation_observer": "static_minmax",
            "quantization_config_path": None}


def turbo_defaults() -> dict:
    """verl's `fsdp_config.turbo_config` section (the FSDP-Turbo engine)."""
    plan = {"param_dtype": "bf16", "reduce_dtype": "fp32", "output_dtype": "bf16", "fsdp_implementation": "native",
            "num_to_forward_prefetch": 1, "num_to_backward_prefetch": 1}
    return {"distributed": {"fully_shard_parallel_size": 16, "tensor_parallel_size": 1, "expert_parallel_size": 1,
                            "expert_fully_shard_parallel_size": 1, "ulysses_parallel_size": 1, "fsdp_plan": plan}}


def reward_rollout_defaults() -> dict:
    """verl's `reward.reward_model.rollout` section (the engine serving a reward model)."""
    return {"name": None, "dtype": "bfloat16", "gpu_memory_utilization": 0.5, "enforce_eager": True,
            "cudagraph_capture_sizes": None, "free_cache_engine": True, "data_parallel_size": 1,
            "expert_parallel_size": 1, "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1,
            "max_num_batched_tokens": 8192, "max_model_len": None, "max_num_seqs": 1024, "load_format": "auto",
            "layered_summon": False, "scheduling_policy": "fcfs", "full_determinism": False, "seed": 42,
            "multi_stage_wake_up": False, "engine_kwargs": {}, "limit_images": None, "enable_chunked_prefill": True,
            "enable_prefix_caching": True, "disable_log_stats": True, "skip_tokenizer_init": False,
            "ignore_eos": False, "temperature": 1.0, "top_k": -1, "top_p": 1, "do_sample": True, "n": 1,
            "prompt_length": 2048, "response_length": 2048, "quantization": None, "quantization_config_file": None,
            "mtp": None, "disaggregation": {"enabled": False, "prefill_replicas": 1, "decode_replicas": 1,
                                            "decode_tensor_model_parallel_size": None, "transfer_backend": "nixl",
                                            "bootstrap_port": None, "ib_device": None}}


def transfer_queue_defaults() -> dict:
    """verl's top-level `transfer_queue` section."""
    return {"enable": False, "metrics": {"enabled": False, "port": 0},
            "backend": {"storage_backend": "SimpleStorage",
                        "SimpleStorage": {"total_storage_size": 100000, "num_data_storage_units": 8},
                        "MooncakeStore": {"auto_init": False, "metadata_server": "localhost:50123",
                                          "master_server_address": "localhost:50124", "local_hostname": "localhost",
                                          "protocol": "tcp", "global_segment_size": 4294967296,
                                          "local_buffer_size": 1073741824, "device_name": ""}}}


def skip_defaults() -> dict:
    """verl's top-level `skip` section (rollout caching for debugging)."""
    return {name: {"enable": False, "dump_dir": "~/.verl/rollout_dump", "steps": [], "action": "cache"}
            for name in ("rollout", "rollout_tq", "async_rollout")}
