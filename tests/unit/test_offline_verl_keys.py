"""verl's SFT keys (its fsdp_sft_trainer / sft_trainer YAMLs and example scripts) in the offline
configs: moved onto the keys read here, refused with what to use, or warned about once."""

import json
import logging

import pytest

from verl.config.offline import DPOTrainerConfig, SFTTrainerConfig
from verl.data import write_parquet
from verl.data.io import DataError
from verl.data.offline import Encoder, SFTDataset
from verl.errors import ConfigError
from verl.models.tiny import build_char_tokenizer
from verl.trainer.offline.rows import offline_rows

# The keys of verl's examples/sft scripts (gsm8k, its LoRA variant, multi-turn) and sft_trainer YAMLs.
VERL_SFT_KEYS = [
    "data.prompt_key=extra_info", "data.response_key=extra_info", "data.prompt_dict_keys=[question]",
    "+data.response_dict_keys=[answer]", "data.micro_batch_size_per_gpu=4", "data.train_batch_size=16",
    "data.max_length=1024", "data.truncation=error", "data.balance_dp_token=False", "data.chat_template=null",
    "data.custom_cls.path=null", "data.custom_cls.name=null", "data.use_shm=False", "data.pad_mode=no_padding",
    "data.max_token_len_per_gpu=8192", "data.use_dynamic_bsz=False", "data.ignore_input_ids_mismatch=False",
    "data.apply_chat_template_kwargs={}", "data.multiturn.enable=false", "data.multiturn.tools_key=tools",
    "data.train_max_samples=-1", "data.val_max_samples=-1",
    "model.partial_pretrain=Qwen/Qwen2.5-0.5B-Instruct", "model.fsdp_config.model_dtype=bf16",
    "model.fsdp_config.wrap_policy.min_num_params=0", "model.fsdp_config.cpu_offload=False",
    "model.fsdp_config.offload_params=False", "model.external_lib=null", "model.enable_gradient_checkpointing=False",
    "model.trust_remote_code=False", "model.lora_rank=32", "model.lora_alpha=16", "model.target_modules=all-linear",
    "model.use_liger=False", "model.strategy=fsdp2",
    "optim.lr=1e-4", "optim.betas=[0.9,0.95]", "optim.weight_decay=0.01", "optim.warmup_steps_ratio=0.1",
    "optim.clip_grad=1.0", "optim.lr_scheduler=cosine",
    "ulysses_sequence_parallel_size=1", "use_remove_padding=true",
    "trainer.default_local_dir=checkpoints/gsm8k-sft/test", "trainer.default_hdfs_dir=null", "trainer.resume_path=null",
    "trainer.project_name=gsm8k-sft", "trainer.experiment_name=test", "trainer.total_epochs=4",
    "trainer.total_training_steps=null", "trainer.logger=['console']", "trainer.seed=1", "trainer.save_freq=-1",
    "trainer.test_freq=-1", "trainer.nnodes=1", "trainer.n_gpus_per_node=2", "trainer.max_ckpt_to_keep=null",
    "trainer.checkpoint.save_contents=[model,optimizer,extra]", "checkpoint.save_contents=[model,optimizer,extra]",
    "trainer.resume_mode=auto", "trainer.device=cpu",
]


def test_verls_sft_example_keys_load_and_move_onto_the_keys_read_here(caplog):
    config = SFTTrainerConfig.from_overrides(VERL_SFT_KEYS)
    with caplog.at_level(logging.WARNING):
        config.validate(dp_size=2)
        config.validate(dp_size=2)  # idempotent: the moved keys are back at their defaults
    assert caplog.text == ""  # every value above is one that verl's run and this one agree on
    assert config.model.dtype == "bf16" and config.model.fsdp_config.model_dtype is None
    assert config.model.path == "Qwen/Qwen2.5-0.5B-Instruct" and config.model.use_remove_padding is True
    assert config.optim.lr_warmup_steps_ratio == 0.1 and config.optim.warmup_style == "cosine"
    assert config.data.train_max_samples == -1

    moved = SFTTrainerConfig.from_overrides(["data.chat_template='{{ messages }}'", "trainer.resume_path=/ckpt/x",
                                             "trainer.resume_mode=resume_path"])
    moved.validate()
    assert moved.model.custom_chat_template == "{{ messages }}" and moved.data.chat_template is None
    assert moved.trainer.resume_from_path == "/ckpt/x"


@pytest.mark.parametrize("key, dp, expected", [
    ("trainer.default_hdfs_dir=hdfs://cluster/ckpt", 1,
     "trainer.default_hdfs_dir='hdfs://cluster/ckpt' is not supported here: checkpoints are not copied to HDFS here; "
     "they are written to trainer.default_local_dir"),
    ("data.custom_cls.path=my_data.py", 1, "data.custom_cls.path=my_data.py is not supported here: SFT rows are "
     "read from parquet/jsonl files here; write the rows to a file"),
    ("model.strategy=megatron", 1, "model.strategy=megatron is not supported here: the Megatron-LM backend"),
    ("engine.strategy=megatron", 1, "engine.strategy=megatron is not supported here: the Megatron-LM backend"),
    ("trainer.logger=[console,wandbb]", 1, "unknown logger 'wandbb' in trainer.logger=[console, wandbb]; did you "
     "mean 'wandb'?"),  # with the config, not after the model loads
    ("model.fsdp_config.model_dtype=fp32", 1, "model.fsdp_config.model_dtype=fp32 and model.dtype=bf16 name the same "
     "setting with different values; give only model.dtype"),
])
def test_verls_sft_keys_that_cannot_be_honoured_are_refused_naming_what_to_use(key, dp, expected):
    with pytest.raises(ConfigError) as err:
        SFTTrainerConfig.from_overrides([key, "model.dtype=bf16"]).validate(dp_size=dp)
    assert expected in str(err.value)


def test_verls_sft_keys_without_effect_warn_once_when_their_value_asks_for_something(caplog):
    config = SFTTrainerConfig.from_overrides([
        "data.balance_dp_token=true", "data.use_dynamic_bsz=true", "model.fsdp_config.cpu_offload=true",
        "trainer.n_gpus_per_node=8", "trainer.resume_path=/ckpt/global_step_5", "data.micro_batch_size=4",
        "data.train_batch_size=8", "data.micro_batch_size_per_gpu=16"])
    with caplog.at_level(logging.WARNING):
        config.validate(dp_size=1)
    lines = caplog.text.splitlines()
    for start in ("data.balance_dp_token=true has no effect here", "data.use_dynamic_bsz=true has no effect here",
                  "model.fsdp_config.cpu_offload=true has no effect here",
                  "data.micro_batch_size=4 has no effect here: verl's SFT trainer does not read it either",
                  "data.micro_batch_size_per_gpu=16 is more than each rank's share of data.train_batch_size=8",
                  "trainer.nnodes=1 x trainer.n_gpus_per_node=8 asks for 8 processes, but this job runs 1",
                  "trainer.resume_from_path=/ckpt/global_step_5 has no effect: trainer.resume_mode=auto"):
        assert sum(start in line for line in lines) == 1, start
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # torchrun with 8 processes: what was asked for
        SFTTrainerConfig.from_overrides(["trainer.n_gpus_per_node=8"]).validate(dp_size=8)
    assert caplog.text == ""


def test_dpo_and_kto_take_the_shared_keys_and_not_the_sft_data_ones():
    config = DPOTrainerConfig.from_overrides(["model.fsdp_config.model_dtype=bf16", "trainer.default_hdfs_dir=null"])
    config.validate()
    assert config.model.dtype == "bf16"
    with pytest.raises(ConfigError, match="data.micro_batch_size"):
        DPOTrainerConfig.from_overrides(["data.micro_batch_size=4"])


def test_max_samples_take_a_seeded_subset_when_shuffling_else_the_first_rows(tmp_path):
    rows = [{"prompt": f"p{i}", "response": f"r{i}"} for i in range(20)]
    write_parquet(rows, tmp_path / "train.parquet")
    write_parquet(rows[:10], tmp_path / "val.parquet")

    def chosen(*keys):
        data = SFTTrainerConfig.from_overrides([f"data.train_files={tmp_path / 'train.parquet'}",
                                                f"data.val_files={tmp_path / 'val.parquet'}", *keys]).data
        train, val = offline_rows(data, "sft")
        return [r["prompt"] for r in train], [r["prompt"] for r in val]

    assert chosen() == ([f"p{i}" for i in range(20)], [f"p{i}" for i in range(10)])
    assert chosen("data.train_max_samples=3", "data.val_max_samples=2", "data.shuffle=false") == \
        (["p0", "p1", "p2"], ["p0", "p1"])
    seeded, _ = chosen("data.train_max_samples=5")
    assert len(seeded) == 5 and len(set(seeded)) == 5 and seeded != ["p0", "p1", "p2", "p3", "p4"]
    assert seeded == sorted(seeded, key=lambda p: int(p[1:]))  # file order kept
    assert chosen("data.train_max_samples=5")[0] == seeded  # data.seed fixes it
    assert chosen("data.train_max_samples=5", "data.seed=7")[0] != seeded
    assert chosen("data.train_max_samples=50")[0] == [f"p{i}" for i in range(20)]  # more than there are: all


TOOL_TEMPLATE = ("{% if tools %}TOOLS:{{ tools | tojson }}\n{% endif %}{% for m in messages %}<{{ m.role }}>"
                 "{{ m.content }}</s>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object", "properties": {}}}}]


def test_a_conversations_tool_schemas_are_rendered_by_the_chat_template():
    # verl's multi-turn SFT files carry a tools column; the chat template puts the schemas in the prompt
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = TOOL_TEMPLATE
    encoder = Encoder(tokenizer, max_length=512)
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    rows = [{"messages": chat, "tools": TOOLS}, {"messages": chat, "tools": json.dumps(TOOLS)},
            {"messages": chat, "tools": None}, {"messages": chat, "tools": []}, {"messages": chat}]
    items = SFTDataset(rows, encoder, messages_key="messages", tools_key="tools").items
    texts = [tokenizer.decode(ids) for ids, _ in items]
    assert texts[0] == texts[1] == 'TOOLS:' + json.dumps(TOOLS) + '\n<user>hi</s><assistant>yo</s>'
    assert texts[2] == texts[3] == texts[4] == '<user>hi</s><assistant>yo</s>'
    for ids, mask in items:  # the loss stays on the assistant turn: "yo</s>"
        assert tokenizer.decode([t for t, m in zip(ids, mask) if m]) == "yo</s>"
    with pytest.raises(DataError, match=r"row 0 of data.train_files: column 'tools' should hold a list of tool "
                                        r"schemas \(dicts\), got str"):
        SFTDataset([{"messages": chat, "tools": '"calc"'}], encoder, messages_key="messages", tools_key="tools")
    with pytest.raises(DataError, match="column 'tools' is not a JSON list of tool schemas"):
        SFTDataset([{"messages": chat, "tools": "[{"}], encoder, messages_key="messages", tools_key="tools")


# The launch of verl's engine-based SFT trainer (examples/sft/*/run_*_fsdp.sh): config-group choices and the
# engine section.
VERL_ENGINE_SFT_KEYS = [
    "data.messages_key=messages", "data.micro_batch_size_per_gpu=4", "optim.lr=1e-4", "engine=fsdp",
    "engine.ulysses_sequence_parallel_size=1", "model.path=Qwen/Qwen2.5-0.5B-Instruct", "model.use_remove_padding=true",
    "trainer.default_local_dir=/tmp/sft-ckpt", "trainer.logger=[\"console\",\"wandb\"]", "trainer.total_epochs=1",
    "model=hf_model", "optim=fsdp", "data.enable_thinking_default=none", "data.num_workers=8",
    "trainer.balance_batch=True", "trainer.profile_interval=[-1,-1]",
]


def test_verls_engine_sft_launch_takes_its_group_choices_and_engine_section(caplog):
    with caplog.at_level(logging.INFO, logger="verl.config.overrides"):
        config = SFTTrainerConfig.from_cli(VERL_ENGINE_SFT_KEYS)
    assert "engine=fsdp: FSDP is the backend here already" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        config.validate(dp_size=8)
    assert caplog.text == ""
    moved = SFTTrainerConfig.from_cli(["engine=fsdp", "engine.param_offload=true", "engine.optimizer_offload=true",
                                       "engine.fsdp_size=2", "engine.model_dtype=bf16", "engine.dtype=bf16"])
    moved.validate(dp_size=4)
    fsdp = moved.model.fsdp_config
    assert (fsdp.param_offload, fsdp.optimizer_offload, fsdp.fsdp_size, moved.model.dtype,
            fsdp.mixed_precision.param_dtype) == (True, True, 2, "bf16", "bf16")
    assert (moved.engine.param_offload, moved.engine.fsdp_size, moved.engine.model_dtype) == (False, -1, None)
    with pytest.raises(ConfigError, match="engine=megatron: the Megatron-LM backend is not supported here"):
        SFTTrainerConfig.from_cli(["engine=megatron"])
    with pytest.raises(ConfigError, match="model expects OfflineModelConfig, got 'hf' \\(str\\)"):
        SFTTrainerConfig.from_cli(["model=hf"])  # not a choice verl has: the section's own message
    with caplog.at_level(logging.WARNING):
        SFTTrainerConfig.from_cli(["engine.ulysses_sequence_parallel_size=2"]).validate(dp_size=2)
    assert "engine.ulysses_sequence_parallel_size=2 has no effect here: sequence parallelism is not implemented" in \
        caplog.text
