"""User mistakes that used to end in a traceback or a minute of retries: each is one error naming the fix."""

import pytest
import torch

from verl.data import DataError, read_rows
from verl.errors import DeviceError, ModelLoadError
from verl.models import loading


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_asked_for_without_cuda_is_one_line_naming_the_fix():
    with pytest.raises(DeviceError, match=r"trainer.device=cuda but CUDA is not available here .*trainer.device=cpu"):
        loading.resolve_device("cuda")
    with pytest.raises(DeviceError, match=r"trainer.device='gpu0' is not a device"):
        loading.resolve_device("gpu0")
    assert loading.resolve_device("auto") == torch.device("cpu")


def test_a_truncated_parquet_file_is_named_with_its_key(tmp_path):
    from verl.data import write_parquet

    good = write_parquet([{"prompt": "hi"}] * 50, tmp_path / "good.parquet")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(good.read_bytes()[:-40])  # cut off: the footer is gone
    with pytest.raises(DataError, match=r"bad.parquet \(from `data.val_files`\) is not a readable parquet file"):
        read_rows(bad, config_key="data.val_files")
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes('{"prompt": "caf\xe9"}\n'.encode("latin-1"))
    with pytest.raises(DataError, match=r"latin.jsonl \(from `data.train_files`\) is not UTF-8"):
        read_rows(latin)


def test_a_hub_id_without_a_reachable_hub_fails_at_once_or_loads_from_the_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    import transformers

    calls = []
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: calls.append(a))
    with pytest.raises(ModelLoadError, match=r"'org/model' .*not in the Hugging Face cache, and the hub "
                                             r"\(http://127.0.0.1:9\) cannot be reached"):
        loading.load_tokenizer("org/model")
    assert calls == []  # refused before transformers' own retries start
    # In the cache: loaded from there, without the network.
    snapshot = tmp_path / "hub" / "models--org--model" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "hub" / "models--org--model" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--model" / "refs" / "main").write_text("abc123")
    assert loading.hub_access("org/model", "model", "actor_rollout_ref.model.path") == {"local_files_only": True}
    # Offline mode: transformers itself never tries the network, so nothing is probed.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert loading.hub_access("org/other", "model", "actor_rollout_ref.model.path") == {}


@pytest.mark.parametrize("name, named", [("my models/qwen", "no my models/qwen there), and not a hub id"),
                                         ("Qwen/Qwen2-0.5B-Instruct ", "It begins or ends with a space: remove it")])
def test_a_name_that_is_neither_a_folder_nor_a_hub_id_is_one_line_where_the_hub_is_out_of_reach(name, named,
                                                                                                 monkeypatch):
    """Before: huggingface_hub's HFValidationError traceback, from the cache lookup of a hub out of reach."""
    import re

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    for load in (loading.load_tokenizer, loading.load_causal_lm):
        with pytest.raises(ModelLoadError, match=f"'{name}' \\(from `actor_rollout_ref.model.path`\\): it is not "
                                                 f"a local folder.*{re.escape(named)}"):
            load(name)


def test_a_custom_chat_template_from_text_or_file_formats_the_prompts(tiny_model_dir, tmp_path):
    template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}assistant:{% endif %}")
    tok = loading.load_tokenizer(str(tiny_model_dir), chat_template=template)
    text = tok.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True)
    assert text == "user: 2+2?\nassistant:"
    path = tmp_path / "template.jinja"
    path.write_text(template)
    assert loading.load_tokenizer(str(tiny_model_dir), chat_template=str(path)).chat_template == template
    with pytest.raises(ModelLoadError, match=r"custom_chat_template='nowhere.jinja' is neither a Jinja template"):
        loading.load_tokenizer(str(tiny_model_dir), chat_template="nowhere.jinja")
    with pytest.raises(ModelLoadError, match=r"custom_chat_template: the chat template \(text\) does not render"):
        loading.load_tokenizer(str(tiny_model_dir), chat_template="{{ messages[0]['content'] | nosuchfilter }}")


def test_the_worker_and_its_prompts_use_the_configured_template(tiny_model_dir, tmp_path):
    from verl import ActorRolloutRefWorker
    from verl.config import TrainerConfig
    from verl.data import RLDataset, write_parquet

    cfg = TrainerConfig.from_cli([f"actor_rollout_ref.model.path={tiny_model_dir}", "actor_rollout_ref.rollout.name=hf",
                                  "actor_rollout_ref.model.custom_chat_template='Q: {{ messages[0].content }} A:'"])
    worker = ActorRolloutRefWorker(config=cfg.actor_rollout_ref, with_ref=False, device="cpu")
    rows = write_parquet([{"prompt": [{"role": "user", "content": "3+4"}]}], tmp_path / "p.parquet")
    item = RLDataset(str(rows), worker.tokenizer, cfg.data)[0]
    assert worker.tokenizer.decode(item["input_ids"]) == "Q: 3+4 A:"


def test_gae_without_its_critic_is_refused_before_step_0():
    from verl.config import ConfigError, TrainerConfig

    cfg = TrainerConfig.from_cli(["algorithm.adv_estimator=gae", "critic.enable=false"])
    with pytest.raises(ConfigError, match=r"adv_estimator=gae computes advantages from a critic's values, and "
                                          r"critic.enable=false turns the critic off"):
        cfg.validate()


def test_an_output_folder_that_cannot_be_written_fails_before_anything_loads(tmp_path):
    from verl.errors import VerlError
    from verl.trainer.ppo.build import check_output_dir

    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(VerlError, match=r"trainer.default_local_dir=.*a_file/run: the output folder cannot be created"):
        check_output_dir(blocker / "run", "trainer.default_local_dir")
    check_output_dir(tmp_path / "ok" / "run", "trainer.default_local_dir")
    assert (tmp_path / "ok" / "run").is_dir() and not any((tmp_path / "ok" / "run").iterdir())


def test_an_sft_run_whose_loss_has_not_moved_is_told_to_raise_the_learning_rate():
    from verl.trainer.sft.trainer import stalled_loss_warning

    history = [(0, {"val/loss": 3.4512}), (20, {"val/loss": 3.4498})]  # -0.04%
    message = stalled_loss_warning(history, 1e-5)
    assert "val/loss has not moved after 20 steps (3.4512 -> 3.4498): with optim.lr=1e-05" in message
    assert "optim.lr=1e-3" in message
    assert stalled_loss_warning([(0, {"val/loss": 3.45}), (20, {"val/loss": 2.9})], 1e-3) is None  # it learns
    assert stalled_loss_warning([(0, {"val/loss": 3.45})], 1e-5) is None  # nothing to compare yet
    assert stalled_loss_warning([(10, {"val/loss": 3.45}), (20, {"val/loss": 3.45})], 1e-5) is None  # no step 0
    assert stalled_loss_warning(history + [(40, {"val/loss": 3.449})], 1e-5) is None  # warned once, at the first


@pytest.mark.parametrize("args, named", [
    (["custom_reward_function.name=my_score"], "custom_reward_function.name='my_score' without custom_reward_function.path"),
    (["custom_reward_function.reward_kwargs={scale: 2}"], "custom_reward_function.reward_kwargs={'scale': 2} without"),
    (["reward.custom_reward_function.name=my_score"], "reward.custom_reward_function.name='my_score' without "
                                                      "reward.custom_reward_function.path"),
])
def test_a_reward_function_name_without_its_file_is_refused_not_ignored(args, named):
    """Before, the name was never read: the built-in scorers scored the run and it ended with code 0."""
    from verl.config import ConfigError, TrainerConfig

    with pytest.raises(ConfigError, match=r"set (reward\.)?custom_reward_function\.path=my_reward\.py") as info:
        TrainerConfig.from_cli(args).validate()
    assert named in str(info.value)
    TrainerConfig.from_cli(args + [f"{args[0].split('.name')[0].split('.reward_kwargs')[0]}.path=r.py"]).validate()


def test_rows_without_a_ground_truth_among_rows_with_one_are_counted_once_for_a_custom_reward(caplog):
    """A reward function of the user's gets ground_truth=None for such rows, and most compare with it:
    they would score 0 all run without a word (the built-in scorers stop the run; a function may need none)."""
    from verl.rewards.scorers import warn_rows_without_ground_truth

    rows = [{"ground_truth": str(i), "index": i} for i in range(9)]
    for i in (2, 3, 4, 5, 6, 8):
        rows[i]["ground_truth"] = None
    with caplog.at_level("WARNING", logger="verl.rewards.scorers"):
        assert warn_rows_without_ground_truth(rows, "data.val_files") == 6
    assert len(caplog.records) == 1
    assert "data.val_files: 6 of 9 rows have no ground truth (rows 2, 3, 4, 5, 6, ...)" in caplog.text
    assert "Fill in reward_model.ground_truth" in caplog.text
    caplog.clear()
    assert warn_rows_without_ground_truth([{"ground_truth": None}] * 3, "data.train_files") == 0  # needs none
    assert warn_rows_without_ground_truth([{"ground_truth": 0}] * 3, "data.train_files") == 0  # 0 is an answer
    assert caplog.text == ""


def test_a_model_path_at_a_file_a_run_or_a_checkpoint_names_the_model_folder(tiny_model_dir, tmp_path):
    """Before: transformers' 'Unrecognized model ... Should have a model_type key', or for a file the hub's
    'Repo id must be in the form ...'."""
    import shutil

    with pytest.raises(ModelLoadError, match=r"config\.json' \(from `actor_rollout_ref\.model\.path`\) is a file; a model "
                                             rf"is a folder .*set `actor_rollout_ref\.model\.path={tiny_model_dir}`"):
        loading.load_tokenizer(str(tiny_model_dir / "config.json"))
    run = tmp_path / "run"
    shutil.copytree(tiny_model_dir, run / "huggingface")
    (run / "global_step_2").mkdir()
    (run / "global_step_2" / "state.pt").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=rf"holds no config\.json\. It is a training run's output folder; the run's "
                                             rf"trained model is {run}/huggingface: point there"):
        loading.load_tokenizer(str(run))
    with pytest.raises(ModelLoadError, match=rf"It is a checkpoint to resume from \(state\.pt\); the run's trained model "
                                             rf"is {run}/huggingface"):
        loading.load_causal_lm_config(str(run / "global_step_2"))
    with pytest.raises(ModelLoadError, match=rf"Folders under it that hold one: {run}/huggingface\."):
        loading.load_tokenizer(str(tmp_path))


@pytest.mark.parametrize("arg, message", [
    ("data.train_files=", "data.train_files is empty (data.train_files=''): give a .parquet/.jsonl file"),
    ("data.val_files=[a.parquet,'']", "data.val_files holds an empty path (data.val_files=[a.parquet, '']): give"),
    ("trainer.default_local_dir=", "trainer.default_local_dir is empty (trainer.default_local_dir=''): give the output "
                                   "folder, e.g. trainer.default_local_dir=outputs/run"),
    ("custom_reward_function.path=", "custom_reward_function.path is empty (custom_reward_function.path=''): give the "
                                     ".py file"),
    ("actor_rollout_ref.model.path=", "actor_rollout_ref.model.path is empty"),
])
def test_an_empty_path_is_refused_before_it_reads_or_writes_the_current_folder(arg, message):
    """`key=` gives ''. Before: data files '' read the current folder as a dataset, an output folder ''
    wrote the run's checkpoints and report into it, a reward path '' meant no reward function."""
    from verl.config import ConfigError, TrainerConfig

    with pytest.raises(ConfigError) as info:
        TrainerConfig.from_cli([arg]).validate()
    assert message in str(info.value)


def test_a_kl_coefficient_without_its_switch_is_said_to_have_no_effect(caplog):
    """verl's recipes set kl_loss_coef together with use_kl_loss=true; the coefficient alone is read by nothing."""
    from verl.config import TrainerConfig

    with caplog.at_level("WARNING", logger="verl.config"):
        TrainerConfig.from_cli(["actor_rollout_ref.actor.kl_loss_coef=0.1"]).validate()
        TrainerConfig.from_cli(["algorithm.kl_ctrl.kl_coef=0.1", "algorithm.kl_ctrl.type=adaptive"]).validate()
        TrainerConfig.from_cli(["actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.1",
                                "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0.1"]).validate()
    messages = [r.getMessage() for r in caplog.records if "no effect" in r.getMessage()]
    assert messages == [
        "actor_rollout_ref.actor.kl_loss_coef=0.1 has no effect: actor_rollout_ref.actor.use_kl_loss=false turns it "
        "off; set actor_rollout_ref.actor.use_kl_loss=true to use it, or leave it at the default",
        "algorithm.kl_ctrl.kl_coef=0.1 and algorithm.kl_ctrl.type=adaptive have no effect: algorithm.use_kl_in_reward="
        "false turns it off; set algorithm.use_kl_in_reward=true to use it, or leave them at the default"]


def test_an_unknown_dtype_is_named_as_such_not_as_a_folder_that_cannot_be_loaded(tiny_model_dir):
    with pytest.raises(ModelLoadError) as info:
        loading.load_causal_lm(str(tiny_model_dir), dtype="bfloat17")
    assert str(info.value).startswith("unknown dtype 'bfloat17'; use one of ['bf16', 'bfloat16'")  # before: "could
    assert "could not load the model from folder" not in str(info.value)  # not load the model from folder ...: ..."


def test_a_resume_path_without_resume_mode_resume_path_is_said_to_be_ignored(caplog):
    """As in verl, trainer.resume_from_path is read only under resume_mode=resume_path: before, a run given
    only the path started from step 0 (or resumed from another checkpoint) without a word."""
    from verl.config import TrainerConfig

    with caplog.at_level("WARNING", logger="verl.config"):
        TrainerConfig.from_cli(["trainer.resume_from_path=out/global_step_5"]).validate()
        TrainerConfig.from_cli(["trainer.resume_from_path=out/global_step_5", "trainer.resume_mode=resume_path"]).validate()
    assert [r.getMessage() for r in caplog.records if "resume_from_path" in r.getMessage()] == [
        "trainer.resume_from_path=out/global_step_5 has no effect: trainer.resume_mode=auto resumes from the newest "
        "checkpoint in trainer.default_local_dir, if any; set trainer.resume_mode=resume_path to resume from it"]


def test_a_token_budget_below_the_longest_sample_is_said_once_naming_each_budget(caplog):
    """With dynamic batch size a sample longer than its budget runs alone, past the budget (verl stops there):
    each budget below data.max_prompt_length + data.max_response_length is named, with the sum."""
    from verl.config import TrainerConfig

    lengths = ["data.max_prompt_length=512", "data.max_response_length=1024"]
    with caplog.at_level("WARNING", logger="verl.config"):
        TrainerConfig.from_cli([*lengths, "actor_rollout_ref.actor.use_dynamic_bsz=true",
                                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1024",
                                "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=4096"]).validate()
        TrainerConfig.from_cli([*lengths, "actor_rollout_ref.actor.use_dynamic_bsz=true",
                                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1536"]).validate()  # fits
        TrainerConfig.from_cli([*lengths, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=100"]).validate()  # off
    messages = [r.getMessage() for r in caplog.records if "longest sample" in r.getMessage()]
    assert len(messages) == 1
    assert messages[0].startswith(
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1024, actor_rollout_ref.rollout.log_prob_max_token_len_per_"
        "gpu=1024 are below the longest sample, data.max_prompt_length + data.max_response_length = 1536 tokens")
    assert "raise them to at least 1536" in messages[0]



def test_a_model_path_at_a_lora_adapter_names_its_base_model_and_the_adapter_key(tmp_path):
    """Before: 'it holds no config.json. Give the folder that holds config.json and the weights'."""
    adapter = tmp_path / "my-lora"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"base_model_name_or_path": "Qwen/Qwen2-0.5B", "peft_type": "LORA"}')
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=rf"holds a LoRA adapter \(adapter_config.json\), not a model: set "
                                             rf"`actor_rollout_ref.model.path=Qwen/Qwen2-0.5B` and "
                                             rf"`actor_rollout_ref.model.lora_adapter_path={adapter}`"):
        loading.load_tokenizer(str(adapter))


@pytest.mark.parametrize("arg, message", [
    ("trainer.logger=[console,wandbb]", "unknown logger 'wandbb' in trainer.logger=[console, wandbb]; did you mean "
                                        "'wandb'? choose from console, jsonl, tensorboard, wandb"),
    ("trainer.logger='console,wandb'", "trainer.logger='console,wandb' is one name holding commas; write a list: "
                                       "trainer.logger=[console,wandb]"),
    ("logger.type=tensorbord", "unknown logger 'tensorbord' in logger.type=tensorbord; did you mean 'tensorboard'?"),
])
def test_a_misspelt_logger_is_refused_with_the_config_not_after_the_data_loads(arg, message):
    from verl.config import ConfigError, TrainerConfig

    with pytest.raises(ConfigError) as info:
        TrainerConfig.from_cli([arg]).validate()
    assert message in str(info.value)
    TrainerConfig.from_cli(["trainer.logger=console"]).validate()  # one name, as verl also takes it
    TrainerConfig.from_cli(["trainer.logger=[console,mlflow]"]).validate()  # verl's: refused by name at the start


@pytest.mark.parametrize("args, why", [
    (["data.train_files=t.parquet"], "no data.val_files is given"),
    (["data.train_files=t.parquet", "data.val_files=v.parquet", "trainer.val_before_train=false"],
     "trainer.val_before_train=false"),
])
def test_zero_training_steps_with_nothing_to_validate_is_refused(args, why):
    """Before: the run loaded the models, trained no step, exported the model it was given and ended with 0."""
    from verl.config import ConfigError, TrainerConfig

    with pytest.raises(ConfigError, match=rf"trainer.total_training_steps=0 trains no step \(it only validates\), "
                                          rf"and {why}: the run would do nothing"):
        TrainerConfig.from_cli(["trainer.total_training_steps=0", *args]).validate()
    TrainerConfig.from_cli(["trainer.total_training_steps=0", "data.train_files=t.parquet",
                            "data.val_files=v.parquet"]).validate()  # verl's val_only


def test_exact_match_takes_a_whole_float_answer_as_the_integer_it_is():
    """pandas stores an integer column with a gap as float64: 3.0 never matched the response "3", so every
    row scored 0 without a word."""
    from verl.rewards.scorers import exact_match

    assert exact_match("exact_match", " 3\n", 3.0) == 1.0
    assert exact_match("exact_match", "3.0", 3.0) == 1.0
    assert exact_match("exact_match", "3", 3.5) == 0.0
    assert exact_match("exact_match", "3", "3.0") == 0.0  # text is compared as written


def test_a_relative_model_path_that_is_not_here_names_the_current_folder(tmp_path, monkeypatch):
    """'models/tiny' from another folder was read as a hub id, and the message spoke of the hub only."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match=rf"'models/tiny' .*it is not a local folder \(a relative path is read "
                                             rf"from the current folder, {tmp_path}: no models/tiny there\)"):
        loading.load_tokenizer("models/tiny")


def test_a_reward_of_one_numpy_or_torch_value_and_a_list_of_accepted_answers_are_scored():
    """Before: np.array(0.5) stopped the run as 'not a number', and exact_match compared the response with
    str(['2', 'two']), so a row listing its accepted answers scored 0 whatever the model wrote."""
    import numpy as np

    from verl.rewards.manager import as_score
    from verl.rewards.scorers import exact_match

    one_value = (np.array(0.5), np.array([1.0]), torch.tensor([2.0]), torch.tensor([[3.0]]), np.array([[4.0]]))
    assert [as_score(v, "f", 0)[0] for v in one_value] == [0.5, 1.0, 2.0, 3.0, 4.0]
    with pytest.raises(ValueError, match=r"returned array\(\[1., 2.\]\) \(ndarray\) for sample 0"):
        as_score(np.array([1.0, 2.0]), "f", 0)
    assert exact_match("exact_match", "two", ["2", "two"]) == 1.0
    assert exact_match("exact_match", "3", [3.0]) == 1.0
    assert exact_match("exact_match", "2", []) == 0.0


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device, message", [
    ("gpu", r"^actor_rollout_ref.rollout.device='gpu' is not a device \(.*\); use auto, cpu, cuda or cuda:N$"),
    ("cuda", r"^actor_rollout_ref.rollout.device=cuda but CUDA is not available here \(.*\); use "
             r"actor_rollout_ref.rollout.device=cpu, or leave it unset \(the actor's device\)"),
])
def test_a_rollout_device_this_machine_lacks_is_refused_before_the_model_loads(device, message):
    """Before: torch's "Expected one of cpu, cuda, ..." after the models loaded ('gpu'), or an AssertionError
    "Torch not compiled with CUDA enabled" at the first generation ('cuda', the tutorial's table's advice)."""
    from verl.config import TrainerConfig
    from verl.workers.actor_rollout_ref import ActorRolloutRefWorker

    config = TrainerConfig(actor_rollout_ref=dict(model=dict(path="/nonexistent/model"),  # never reached
                                                  rollout=dict(name="dummy", device=device)))
    with pytest.raises(DeviceError, match=message):
        ActorRolloutRefWorker(config=config.actor_rollout_ref)


def test_float16_weights_to_train_are_refused_before_the_first_update():
    """Before: AdamW's state rounded to 0 in float16 and the first update wrote NaN into the weights (a RL run then
    skipped every step and refused to save, advising a lower learning rate)."""
    from verl.config.schema_actor import FSDPConfig, OptimConfig
    from verl.errors import VerlError
    from verl.workers.optim import build_training

    half = torch.nn.Linear(4, 4).half()
    with pytest.raises(VerlError, match=r"^the weights to train are float16 \(model.dtype=fp16, or auto on a float16 "
                                        r"checkpoint\): AdamW cannot update float16 weights .*"
                                        r"mixed_precision.param_dtype=fp16 \(or bf16\)$"):
        build_training(half, OptimConfig(), FSDPConfig(), total_steps=1, seed=0)
    # Frozen float16 weights (a LoRA base) with float32 ones to train are fine, as are bfloat16 weights.
    mixed = torch.nn.Sequential(torch.nn.Linear(4, 4).half().requires_grad_(False), torch.nn.Linear(4, 4))
    build_training(mixed, OptimConfig(), FSDPConfig(), total_steps=1, seed=0)
    build_training(torch.nn.Linear(4, 4).bfloat16(), OptimConfig(), FSDPConfig(), total_steps=1, seed=0)


def test_load_hf_model_takes_a_pathlib_path_and_names_a_gpu_device_map_without_cuda(tiny_model_dir):
    """Before: AttributeError: 'PosixPath' object has no attribute 'startswith', and transformers'
    AssertionError "Torch not compiled with CUDA enabled" for device_map='cuda'."""
    from pathlib import Path

    from verl.utils.model import load_hf_model, load_hf_tokenizer

    assert load_hf_model(Path(tiny_model_dir)).config.model_type == "qwen2"
    assert load_hf_tokenizer(Path(tiny_model_dir)).pad_token is not None
    if not torch.cuda.is_available():
        for device_map in ("cuda", "cuda:0", 0, {"": "cuda"}):
            with pytest.raises(DeviceError, match=r"^device_map=.* puts the model on a GPU, but CUDA is not available "
                                                  r"here \(.*\); leave device_map out \(the model loads on the CPU\)"):
                load_hf_model(str(tiny_model_dir), device_map=device_map)


def test_load_hf_model_without_a_model_or_with_it_under_another_name_says_what_to_pass(tiny_model_dir):
    """Before: TypeError "expected str, bytes or os.PathLike object, not NoneType" for a config's model.path of
    null (the built-in model), and "missing 1 required positional argument" for transformers' keyword name."""
    from verl.utils.model import load_hf_model, load_hf_tokenizer

    for load in (load_hf_model, load_hf_tokenizer):
        name = load.__name__
        with pytest.raises(ModelLoadError, match=f"^{name} needs a model: a hub id .* got None. A config's model.path "
                                                 f"of null means the built-in tiny model: .*builtin_model_path"):
            load(None)
        with pytest.raises(ModelLoadError, match=f"^{name} takes the model as model_name_or_path .*got "
                                                 f"pretrained_model_name_or_path='.*': write {name}\\("):
            load(pretrained_model_name_or_path=str(tiny_model_dir))
    assert load_hf_model(model_name_or_path=str(tiny_model_dir)).config.model_type == "qwen2"


def test_a_keyword_the_model_class_does_not_take_is_named_not_raised_from_its_constructor(tiny_model_dir):
    """Before: TypeError: Qwen2ForCausalLM.__init__() got an unexpected keyword argument 'torch_type', raised
    from inside transformers' from_pretrained (and so for QLoRA tutorials' load_in_8bit=True, gone in
    transformers 5)."""
    import transformers

    from verl.utils.model import load_hf_model

    with pytest.raises(ModelLoadError, match=r"^torch_type=torch\.bfloat16 is not a keyword that from_pretrained or "
                                             r"Qwen2ForCausalLM takes \(transformers .*\): remove it; the weights' "
                                             r"dtype is torch_dtype= \(or dtype=\)$"):
        load_hf_model(str(tiny_model_dir), torch_type=torch.bfloat16)
    if int(transformers.__version__.split(".")[0]) >= 5:
        with pytest.raises(ModelLoadError, match=r"^load_in_8bit=True is not a keyword .*: remove it; 8-bit and "
                                                 r"4-bit weights are asked for with quantization_config="):
            load_hf_model(str(tiny_model_dir), load_in_8bit=True)


def test_critic_settings_in_a_run_without_a_critic_are_said_to_have_no_effect(caplog):
    """A PPO launch changed to GRPO keeps its critic.* keys, or critic.model.path is given to GRPO: before, no
    critic was built and nothing was said."""
    from verl.config import TrainerConfig

    with caplog.at_level("WARNING", logger="verl.config"):
        TrainerConfig.from_cli(["critic.model.path=models/critic", "critic.ppo_epochs=2"]).validate()
        TrainerConfig.from_cli(["critic.model.path=models/critic", "algorithm.adv_estimator=gae"]).validate()
        TrainerConfig.from_cli(["critic.model.path=models/critic", "critic.enable=true"]).validate()  # trained
    assert [r.getMessage() for r in caplog.records if "critic" in r.getMessage()] == [
        "critic.model.path=models/critic, critic.ppo_epochs=2 have no effect: algorithm.adv_estimator=grpo trains no "
        "critic (only gae does); set algorithm.adv_estimator=gae to train with a critic, or leave them at the default"]


@pytest.mark.parametrize("build, message", [
    (lambda: __import__("verl.trainer.ppo", fromlist=["PPOTrainer"]).PPOTrainer(worker=None),
     r"^PPOTrainer\(\) got an unexpected keyword argument 'worker' \(did you mean actor_rollout_ref_worker=\?\); it "
     r"takes actor_rollout_ref_worker, config, critic, logger, output_dir$"),
    (lambda: __import__("verl.trainer.ppo", fromlist=["PPOTrainer"]).PPOTrainer(None, ppo_config={}),
     r"'ppo_config' \(did you mean config=\?\)"),
    (lambda: __import__("verl", fromlist=["ActorRolloutRefWorker"]).ActorRolloutRefWorker(cfg=None),
     r"^ActorRolloutRefWorker\(\) got an unexpected keyword argument 'cfg' \(did you mean config=\?\); it takes config, "),
    (lambda: __import__("verl", fromlist=["ActorRolloutRefWorker"]).ActorRolloutRefWorker(None, ref=False),
     r"'ref' \(did you mean with_ref=\?\)"),
    (lambda: __import__("verl", fromlist=["ActorRolloutRefWorker"]).ActorRolloutRefWorker(None, model_path="x"),
     r"^ActorRolloutRefWorker\(\) got an unexpected keyword argument 'model_path'; it takes config, tokenizer"),
])
def test_a_misnamed_argument_of_the_tutorials_classes_names_the_one_meant(build, message):
    """Before: Python's "got an unexpected keyword argument 'worker'" alone, for the tutorial's two classes."""
    with pytest.raises(TypeError, match=message):
        build()
