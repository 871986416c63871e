"""A vision-language policy trained by `python -m verl.trainer.main_ppo` (issue 27): a tiny Qwen2-VL built
offline, prompts with images in verl's layout, GRPO with the reference's KL, validation; the export
holds the processor and loads; a run resumed from its step-2 checkpoint equals the uninterrupted one."""

import io
import shutil

import numpy as np
import torch
import pytest
from PIL import Image, ImageDraw

from helpers import run_torchrun_module
from zygote import ray_worker_keys
from rl_compare import assert_same_metrics, assert_same_weights, run_plain, step_metrics, without_async
from verl.data import write_parquet
from verl.models.tiny_vision import make_tiny_vl_model_folder

pytestmark = pytest.mark.slow

# Any signal will do here (the model is random): a reward that varies between samples moves the weights.
REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n" \
         "    return float(ord(solution_str[0]) % 2) if solution_str else 0.0\n"


def dots(count: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    image = Image.new("RGB", (56, 56), "white")
    draw = ImageDraw.Draw(image)
    for x, y in rng.integers(6, 50, (count, 2)):
        draw.ellipse([x - 4, y - 4, x + 4, y + 4], fill="black")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def vl_task(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vl-task")
    rows = [{"prompt": [{"role": "user", "content": "<image>How many dots?"}],
             "images": [{"bytes": dots(1 + i % 3, i)}], "data_source": "dots",
             "reward_model": {"style": "rule", "ground_truth": str(1 + i % 3)}} for i in range(12)]
    write_parquet(rows[:8], folder / "train.parquet")
    write_parquet(rows[8:], folder / "val.parquet")
    (folder / "reward.py").write_text(REWARD)
    return make_tiny_vl_model_folder(folder / "model"), folder


def args(model, folder, out, *extra):
    # verl's geo3k example sets use_remove_padding=true: the actor's passes run on packed rows, images included.
    return [f"actor_rollout_ref.model.path={model}", f"data.train_files={folder / 'train.parquet'}",
            f"data.val_files={folder / 'val.parquet'}", f"custom_reward_function.path={folder / 'reward.py'}",
            "algorithm.adv_estimator=grpo", "data.train_batch_size=4", "data.max_prompt_length=32",
            "data.max_response_length=4", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.model.use_remove_padding=true", "trainer.total_training_steps=3", "trainer.test_freq=3",
            "trainer.save_freq=2", "trainer.val_sampled=true", f"trainer.default_local_dir={out}",
            "trainer.progress_bar=false", "trainer.write_report=false", *extra]


@pytest.fixture(scope="module")
def one_process(vl_task, tmp_path_factory):
    model, folder = vl_task
    out = tmp_path_factory.mktemp("vl-run")
    return out, run_plain(args(model, folder, out))


def test_grpo_trains_a_vision_language_policy_exports_its_processor_and_resumes_exactly(vl_task, one_process,
                                                                                       tmp_path):
    from transformers import AutoModelForImageTextToText

    from verl.models.vision import load_processor

    model, folder = vl_task
    out, done = one_process
    assert "Vision-language policy (qwen2_vl)" in done.stdout and "use_remove_padding" not in done.stdout
    assert "(AutoModelForImageTextToText.from_pretrained)" in done.stdout
    metrics = step_metrics(out)
    assert all(metrics[step]["actor/pg_loss"] != 0 for step in (1, 2, 3))  # the samples' rewards differ
    assert metrics[3]["actor/kl_loss"] > 0 and "val-core/dots/reward/mean@1" in metrics[3]
    assert metrics[1]["prompt_length/mean"] > len("Q: How many dots?\nA: ")  # the image's tokens count
    # The export: the model with its processor, loaded as the hub's are, and it generates from an image.
    exported = out / "huggingface"
    assert (exported / "preprocessor_config.json").exists()
    policy = AutoModelForImageTextToText.from_pretrained(exported)
    processor = load_processor(str(exported))
    text = processor.apply_chat_template([{"role": "user", "content": [{"type": "image"},
                                                                       {"type": "text", "text": "How many?"}]}],
                                         add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=[Image.open(io.BytesIO(dots(2, 0)))], return_tensors="pt")
    assert policy.generate(**inputs, max_new_tokens=2, do_sample=False).shape[1] == inputs["input_ids"].shape[1] + 2
    # Resume from the step-2 checkpoint: step 3 and the final weights equal the uninterrupted run's.
    resumed = tmp_path / "resumed"
    shutil.copytree(out / "global_step_2", resumed / "global_step_2")
    done = run_plain(args(model, folder, resumed))
    assert done.stdout.count("Resumed from") == 1
    assert_same_metrics({3: metrics[3]}, {3: step_metrics(resumed)[3]})
    assert_same_weights(exported, resumed / "huggingface", model)


def test_two_torchrun_ranks_and_two_ray_actors_train_a_vision_language_policy_exactly_like_one_process(
        vl_task, one_process, tmp_path):
    model, folder = vl_task
    out = tmp_path / "two-ranks"
    done = run_torchrun_module("verl.trainer.main_ppo", args(model, folder, out, "trainer.n_gpus_per_node=2"))
    assert done.returncode == 0, done.stderr[-3000:]
    # each rank holds half of every step's rows and their images; FSDP shards both towers
    assert_same_metrics(step_metrics(one_process[0]), step_metrics(out))
    assert_same_weights(one_process[0] / "huggingface", out / "huggingface", model)
    # Ray: the driver holds the data; each actor gets its rows with their images
    ray = tmp_path / "ray"
    run_plain(args(model, folder, ray, "trainer.backend=ray", "trainer.n_gpus_per_node=2", *ray_worker_keys()),
              env={"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"})
    assert_same_metrics(step_metrics(one_process[0]), step_metrics(ray))
    assert_same_weights(one_process[0] / "huggingface", ray / "huggingface", model)



def test_a_vision_language_policy_trains_asynchronously(vl_task, one_process, tmp_path):
    model, folder = vl_task
    # Bound 0: the rollout process gets each step's images with its prompts; the run is the one-process run.
    bound0 = tmp_path / "bound0"
    run_plain(args(model, folder, bound0, "async_training.enable=true"))
    assert_same_metrics(step_metrics(one_process[0]), without_async(step_metrics(bound0)))
    assert_same_weights(one_process[0] / "huggingface", bound0 / "huggingface", model)
    # verl's geo3k fully-async scripts: one step off, partial rollouts (a row stopped by new weights goes on
    # with its images: tests/unit/test_vision_rollout.py), LoRA adapters sent alone, the rollout validating
    # (with the pictures of the held-out prompts).
    off = tmp_path / "off"
    done = run_plain(args(model, folder, off, "async_training.enable=true", "async_training.max_staleness=1",
                          "async_training.partial_rollout=true", "actor_rollout_ref.model.lora_rank=8",
                          "async_training.use_trainer_do_validate=false"))
    assert "Vision-language policy (qwen2_vl)" in done.stdout and "the adapters alone" in done.stdout
    assert "validation: on the rollout" in done.stdout
    metrics = step_metrics(off)
    assert all(any(k.startswith("val-core/") for k in metrics[step]) for step in (0, 3))
    # (with partial rollouts a request may start on weights newer than those it went out with: timing)
    assert metrics[1]["async/staleness_max"] == 0 and all(metrics[step]["async/staleness_max"] <= 1 for step in (2, 3))
    assert all(metrics[step]["actor/pg_loss"] != 0 for step in (1, 2, 3))


def test_lora_goes_on_the_language_model_and_a_frozen_vision_tower_keeps_its_weights(vl_task, tmp_path):
    from safetensors.torch import load_file

    model, folder = vl_task
    initial = load_file(model / "model.safetensors")

    def changed(out):
        final = load_file(out / "huggingface" / "model.safetensors")
        moved = {name for name in initial if not torch.equal(initial[name], final[name])}
        return {name for name in moved if "visual" in name}, {name for name in moved if "visual" not in name}

    # verl's run_qwen2_5_vl-7b_freeze_vision.sh: the tower's weights stay, the language model trains
    # (rolled out by the native engine here: its log-probs with the images are the actor's)
    frozen = tmp_path / "frozen"
    done = run_plain(args(model, folder, frozen, "actor_rollout_ref.actor.freeze_vision_tower=true",
                          "actor_rollout_ref.rollout.name=native", "actor_rollout_ref.rollout.calculate_log_probs=true",
                          "trainer.total_training_steps=2"))
    assert "rollouts by the native engine" in done.stdout
    vision, language = changed(frozen)
    assert not vision and language
    assert all(step_metrics(frozen)[step]["actor/rollout_log_prob_diff"] < 1e-4 for step in (1, 2))
    # verl's run_qwen2_5_vl-7b_lora.sh (exclude_modules left unset: the tower is left out all the same);
    # the rollout generates with the merged adapters: its log-probs are the actor's
    lora = tmp_path / "lora"
    run_plain(args(model, folder, lora, "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
                   "actor_rollout_ref.model.target_modules=all-linear", "actor_rollout_ref.rollout.calculate_log_probs=true",
                   "trainer.total_training_steps=2"))
    vision, language = changed(lora)
    assert not vision and language
    assert (lora / "huggingface" / "lora_adapter" / "adapter_config.json").exists()
    adapter = load_file(lora / "huggingface" / "lora_adapter" / "adapter_model.safetensors")
    assert adapter and not any("visual" in name for name in adapter)
    metrics = step_metrics(lora)
    assert all(metrics[step]["actor/rollout_log_prob_diff"] < 1e-4 for step in (1, 2))


def test_ppo_with_a_vision_language_critic(vl_task, tmp_path):
    model, folder = vl_task
    out = tmp_path / "ppo"
    run_plain(args(model, folder, out, "algorithm.adv_estimator=gae", "critic.optim.lr=1e-2",
                   "critic.model.use_remove_padding=true", "trainer.total_training_steps=2"))
    metrics = step_metrics(out)
    assert metrics[1]["critic/vf_loss"] > 0 and metrics[2]["critic/values/mean"] != 0  # the critic learned


def test_qwen3_vl_trains_with_lora_too(vl_task, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    _, folder = vl_task
    model = make_tiny_vl_model_folder(tmp_path / "qwen3-vl", arch="qwen3_vl")  # 16-pixel patches, deepstack
    out = tmp_path / "qwen3"
    done = run_plain(args(model, folder, out, "actor_rollout_ref.model.lora_rank=4", "trainer.total_training_steps=2"))
    assert "Vision-language policy (qwen3_vl)" in done.stdout
    adapter = load_file(out / "huggingface" / "lora_adapter" / "adapter_model.safetensors")
    assert adapter and not any("visual" in name for name in adapter)
    assert any(t.abs().max() > 0 for name, t in adapter.items() if "lora_B" in name)  # B starts at 0: it trained
    assert type(AutoModelForImageTextToText.from_pretrained(out / "huggingface")).__name__ == \
        "Qwen3VLForConditionalGeneration"
