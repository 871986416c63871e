"""verl's Qwen2.5-VL GRPO example (examples/grpo_trainer/run_qwen2_5_vl-7b.sh, geo3k) runs here with its
own keys, on a tiny local Qwen2.5-VL and a geo3k-layout parquet made by examples/data_preprocess/geo3k.py
from pictures in the public Geometry3K layout; only what a user changes for their machine is appended."""

import io
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image, ImageDraw

from helpers import REPO
from verl.data import read_rows, write_parquet
from verl.models.tiny_vision import make_tiny_vl_model_folder
from verl.rewards.scorers import SCORERS
from verl.trainer.main_ppo import main

pytestmark = pytest.mark.slow

# run_qwen2_5_vl-7b.sh, as written (ENGINE, its first argument, given as hf; files and model are the user's)
GEO3K = [
    "algorithm.adv_estimator=grpo", "data.train_batch_size=512", "data.max_prompt_length=1024",
    "data.max_response_length=2048", "data.filter_overlong_prompts=True", "data.truncation='error'",
    "data.image_key=images", "actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.model.use_fused_kernels=True", "actor_rollout_ref.actor.ppo_mini_batch_size=128",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=10", "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.01", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False", "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=20", "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    "actor_rollout_ref.rollout.name=hf", "+actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=True",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.enable_chunked_prefill=False",
    "actor_rollout_ref.rollout.enforce_eager=False", "actor_rollout_ref.rollout.free_cache_engine=True",
    "actor_rollout_ref.rollout.n=5", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=20",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True", "algorithm.use_kl_in_reward=False", "trainer.critic_warmup=0",
    "trainer.logger=['console','wandb']", "trainer.project_name='verl_grpo_example_geo3k'",
    "trainer.experiment_name='qwen2_5_vl_7b_function_rm'", "trainer.n_gpus_per_node=8", "trainer.nnodes=1",
    "trainer.save_freq=20", "trainer.test_freq=5", "trainer.total_epochs=15",
]


def figure(count: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    image = Image.new("RGB", (56, 56), "white")
    draw = ImageDraw.Draw(image)
    for x, y in rng.integers(6, 50, (count, 2)):
        draw.ellipse([x - 4, y - 4, x + 4, y + 4], fill="black")
    return image


def png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_the_geo3k_scorer_weighs_the_boxed_answer_and_the_format_as_verl_does():
    score = SCORERS["hiyouga/geometry3k"]
    assert score("hiyouga/geometry3k", "<think>two dots</think> so \\boxed{2}", "2")["score"] == pytest.approx(1.0)
    assert score("hiyouga/geometry3k", "\\boxed{2}", "2")["score"] == pytest.approx(0.9)
    assert score("hiyouga/geometry3k", "<think>hm</think>\\boxed{3}", "2")["score"] == pytest.approx(0.1)
    assert score("hiyouga/geometry3k", "2", "2")["score"] == 0.0
    assert score("hiyouga/geometry3k", "<think></think>\\boxed{\\frac{4}{2}}", "2")["acc"] == 1.0  # math-equal


def test_verls_geo3k_example_runs_on_a_tiny_vision_language_model(tmp_path):
    raw = tmp_path / "geometry3k"
    for split, seeds in (("train", range(8)), ("test", range(8, 10))):
        write_parquet([{"problem": "<image>How many dots are in the figure?", "answer": str(1 + s % 3),
                        "images": [{"bytes": png(figure(1 + s % 3, s)), "path": None}]} for s in seeds],
                      raw / f"{split}.parquet")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "hf-datasets-cache")}
    done = subprocess.run([sys.executable, str(REPO / "examples" / "data_preprocess" / "geo3k.py"),
                           "--local_dataset_path", str(raw), "--local_save_dir", str(tmp_path / "geo3k")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_rows(str(tmp_path / "geo3k" / "train.parquet"))
    assert len(rows) == 8 and rows[0]["data_source"] == "hiyouga/geometry3k"
    assert rows[0]["prompt"][0]["content"].startswith("<image>How many dots") and "\\boxed{}" in rows[0]["prompt"][0]["content"]

    model = make_tiny_vl_model_folder(tmp_path / "Qwen2.5-VL-tiny", arch="qwen2_5_vl")
    mine = [f"data.train_files={tmp_path / 'geo3k' / 'train.parquet'}", f"data.val_files={tmp_path / 'geo3k' / 'test.parquet'}",
            f"actor_rollout_ref.model.path={model}", "data.train_batch_size=4", "data.max_prompt_length=320",
            "data.max_response_length=8", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.model.enable_gradient_checkpointing=False",
            "trainer.logger=['console']", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=2",
            "trainer.test_freq=2", f"trainer.default_local_dir={tmp_path / 'out'}", "trainer.progress_bar=false",
            "trainer.write_report=false"]
    assert main(GEO3K + mine) == 0
    import json

    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "actor/pg_loss" in m] == [1, 2]
    assert any("val-core/hiyouga/geometry3k/reward/mean@1" in m for m in metrics)
    assert (tmp_path / "out" / "huggingface" / "preprocessor_config.json").exists()
