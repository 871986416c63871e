"""scripts/verl_launch_scan.py on a small verl-like repository: bash expands the launch lines (variables,
defaults, arrays, torchrun), and each launch is loaded and classified by this project's config."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPTS = {
    # verl's style: variables with defaults, an array of overrides, torchrun in front.
    "examples/grpo/run_fsdp.sh": """set -x
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B}
args=(algorithm.adv_estimator=grpo "data.train_batch_size=${BATCH:-8}" actor_rollout_ref.model.path=$MODEL)
python3 -m verl.trainer.main_ppo "${args[@]}" actor_rollout_ref.rollout.n=4 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=4 trainer.logger='["console"]' $@
""",
    "examples/grpo/run_megatron.sh": """torchrun --nproc_per_node=8 -m verl.trainer.main_ppo \\
    actor_rollout_ref.actor.optim.min_lr=1e-7 actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2
""",
    "examples/grpo/run_typo.sh": "python3 -m verl.trainer.main_ppo data.train_batch_sise=8\n",
    "examples/grpo/run_needs_var.sh": 'python3 -m verl.trainer.main_ppo "data.train_files=${DATA_ROOT:?set DATA_ROOT}/x.parquet"\n',
    "examples/sft/run_sft.sh": "python3 -m verl.trainer.fsdp_sft_trainer model.path=x\n",
    # verl's newer SFT scripts: positional arguments, torchrun's process count, the engine's group choice.
    "examples/sft/run_engine.sh": """if [ "$#" -lt 2 ]; then echo "Usage: run_engine.sh <nproc_per_node> <save_path>"; exit 1; fi
torchrun --standalone --nnodes=1 --nproc_per_node=$1 -m verl.trainer.sft_trainer engine=fsdp \\
    data.train_batch_size=3 trainer.default_local_dir=$2
""",
}


@pytest.fixture(scope="module")
def scan(tmp_path_factory):
    repo = tmp_path_factory.mktemp("verl_repo")
    for path, text in SCRIPTS.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "examples"], check=True)
    out = repo / "scan.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "verl_launch_scan.py"), "--verl-git",
                           str(repo / ".git"), "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text()), proc.stdout


def test_bash_expands_the_launch_and_the_config_loads_it(scan):
    data, _ = scan
    by_script = {launch["script"]: launch for launch in data["launches"]}
    fsdp = by_script["examples/grpo/run_fsdp.sh"]
    assert fsdp["overrides"][:3] == ["algorithm.adv_estimator=grpo", "data.train_batch_size=8",
                                     "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B"]
    assert fsdp["category"] == "parsed+validated"


def test_each_launch_gets_its_category_and_first_error_line(scan):
    data, stdout = scan
    by_script = {launch["script"]: launch for launch in data["launches"]}
    assert set(by_script) == {"examples/grpo/run_fsdp.sh", "examples/grpo/run_megatron.sh",
                              "examples/grpo/run_typo.sh", "examples/grpo/run_needs_var.sh"}  # not the SFT one
    megatron = by_script["examples/grpo/run_megatron.sh"]
    assert megatron["category"] == "refused backend" and "Megatron-LM" in megatron["detail"]
    typo = by_script["examples/grpo/run_typo.sh"]
    assert typo["category"] == "parse error" and "did you mean data.train_batch_size" in typo["detail"]
    # A variable the user must set is given a dummy value, and the launch is loaded.
    assert data["script_vars"]["examples/grpo/run_needs_var.sh"] == ["DATA_ROOT"]
    assert by_script["examples/grpo/run_needs_var.sh"]["category"] == "parsed+validated"
    assert data["categories"] == {"parsed+validated": 2, "refused backend": 1, "parse error": 1}
    assert "6 .sh files under examples/, 4 of them launch verl.trainer.main_ppo" in stdout
    # verl's SFT entry point is loaded with the SFT config and counted apart.
    sft = {launch["script"]: launch for launch in data["sft_launches"]}
    plain = sft["examples/sft/run_sft.sh"]
    assert (plain["module"], plain["overrides"], plain["nproc"], plain["category"]) == (
        "verl.trainer.fsdp_sft_trainer", ["model.path=x"], 1, "parsed+validated")
    engine = sft["examples/sft/run_engine.sh"]  # rerun with "2 $HOME/save": validated for 2 ranks
    assert (engine["module"], engine["nproc"], engine["category"]) == ("verl.trainer.sft_trainer", 2, "error")
    assert "data.train_batch_size=3 examples cannot be split evenly over 2 data-parallel ranks" in engine["detail"]
