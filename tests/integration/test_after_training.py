"""The commands run after training, on one shared tiny run: ``verl.model_merger`` (a checkpoint as a
Hugging Face folder), ``verl.trainer.main_generation`` (n responses per prompt) and
``verl.trainer.main_eval`` (pass@k and mean per data source), with the mistakes users make."""

import json

import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

from tests.integration.helpers import echo_launch, run_torchrun
from verl.data import write_parquet
from verl.model_merger.__main__ import main as merger
from verl.trainer.main_eval import main as evaluate
from verl.trainer.main_generation import main as generation
from verl.trainer.main_ppo import main as train

pytestmark = pytest.mark.slow
torch.set_num_threads(1)

REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return len(set(solution_str)) / (1 + len(solution_str))
'''


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    """A PPO run with a critic (2 steps, both saved), a LoRA GRPO run and a PPO run whose critic has LoRA
    adapters (1 step each)."""
    tmp = tmp_path_factory.mktemp("after-training")
    gae = echo_launch(tiny_model_dir, tmp / "gae", REWARD, steps=2, lr="5e-2")
    assert train([*gae, "algorithm.adv_estimator=gae", "critic.optim.lr=1e-2", "trainer.save_freq=1",
                  "actor_rollout_ref.rollout.name=hf"]) == 0
    lora = echo_launch(tiny_model_dir, tmp / "lora", REWARD, steps=1, lr="5e-2")
    assert train([*lora, "algorithm.adv_estimator=grpo", "actor_rollout_ref.model.lora_rank=4",
                  "actor_rollout_ref.model.lora_alpha=8", "actor_rollout_ref.model.target_modules=all-linear",
                  "trainer.save_freq=1"]) == 0
    critic_lora = echo_launch(tiny_model_dir, tmp / "critic_lora", REWARD, steps=1, lr="5e-2")
    assert train([*critic_lora, "algorithm.adv_estimator=gae", "critic.optim.lr=1e-2", "trainer.save_freq=1",
                  "critic.model.lora_rank=4", "critic.model.lora_alpha=8", "critic.model.target_modules=all-linear"]) == 0
    return {"gae": tmp / "gae" / "out", "lora": tmp / "lora" / "out", "critic_lora": tmp / "critic_lora" / "out",
            "tmp": tmp, "model": tiny_model_dir}


def _weights(folder, auto=AutoModelForCausalLM):
    return auto.from_pretrained(folder).state_dict()


def _greedy(folder, prompt="say 3:", tokenizer_folder=None):
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder or folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    return model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)[0].tolist()


def test_merge_takes_the_step_folder_verls_actor_spelling_and_the_run_folder(runs, tmp_path, capsys):
    out = runs["gae"]
    for name, local_dir in (("step", out / "global_step_2"), ("actor", out / "global_step_2" / "actor"),
                            ("run", out)):
        assert merger(["merge", "--backend", "fsdp", "--local_dir", str(local_dir),
                       "--target_dir", str(tmp_path / name)]) == 0
    said = capsys.readouterr().out
    assert "is a run folder: merging its newest checkpoint, global_step_2" in said
    assert "global_step_2/actor is read as the actor of" in said
    # The last step merged is the run's own export, weight for weight, and decodes the same tokens.
    exported = _weights(out / "huggingface")
    for name in ("step", "actor", "run"):
        merged = _weights(tmp_path / name)
        assert merged.keys() == exported.keys()
        assert all(torch.equal(merged[k], exported[k]) for k in merged)
    assert _greedy(tmp_path / "step") == _greedy(out / "huggingface")
    # verl's recipe writes into the checkpoint's own actor folder; here that folder is made, and read again.
    recipe = out / "global_step_2" / "actor"
    for _ in range(2):
        assert merger(["merge", "--local_dir", str(recipe), "--target_dir", str(recipe / "huggingface")]) == 0
    assert _greedy(recipe / "huggingface") == _greedy(out / "huggingface")
    # An earlier step is another model.
    first = tmp_path / "first"
    assert merger(["merge", "--local_dir", str(out / "global_step_1"), "--target_dir", str(first)]) == 0
    assert not torch.equal(_weights(first)["model.embed_tokens.weight"], exported["model.embed_tokens.weight"])


def test_test_subcommand_compares_with_a_reference_folder(runs, capsys):
    out = runs["gae"]
    assert merger(["test", "--backend", "fsdp", "--local_dir", str(out / "global_step_2"),
                   "--test_hf_dir", str(out / "huggingface")]) == 0
    assert "matches" in capsys.readouterr().out
    assert merger(["test", "--local_dir", str(out / "global_step_1"), "--test_hf_dir", str(out / "huggingface")]) == 2
    assert "values differ" in capsys.readouterr().err


@pytest.mark.parametrize("run", ["gae", "critic_lora"])
def test_the_critic_merges_to_a_token_classifier_with_the_trained_values(runs, tmp_path, run):
    from verl.model_merger.checkpoint import load_state, locate, model_source, trained_model

    out = runs[run]
    assert merger(["merge", "--local_dir", str(out / "global_step_1" / "critic"), "--target_dir",
                   str(tmp_path / "critic")]) == 0
    assert merger(["merge", "--local_dir", str(out / "global_step_1"), "--is-value-model", "--target_dir",
                   str(tmp_path / "critic2")]) == 0
    classifier = AutoModelForTokenClassification.from_pretrained(tmp_path / "critic").eval()
    assert classifier.config.num_labels == 1
    located = locate(str(out / "global_step_1"), value_model=True)
    state = load_state(located.step_dir)
    value_model = trained_model(located, state, model_source(located, state, None))
    assert value_model.model.get_output_embeddings().weight.abs().sum() > 0  # the head trained off its zero start
    ids = torch.tensor([[5, 17, 42, 9, 3]])
    with torch.no_grad():
        expected = value_model(ids, torch.ones_like(ids))
        values = classifier(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[..., 0]
    torch.testing.assert_close(values, expected, rtol=1e-5, atol=1e-6)
    again = _weights(tmp_path / "critic2", AutoModelForTokenClassification)
    assert all(torch.equal(again[k], v) for k, v in classifier.state_dict().items())


def test_a_lora_checkpoint_merges_to_the_full_model_or_to_its_adapter(runs, tmp_path):
    from peft import PeftModel

    out = runs["lora"]
    assert merger(["merge", "--local_dir", str(out / "global_step_1" / "actor"), "--target_dir",
                   str(tmp_path / "merged")]) == 0
    merged, exported = _weights(tmp_path / "merged"), _weights(out / "huggingface")
    assert merged.keys() == exported.keys() and all(torch.equal(merged[k], exported[k]) for k in merged)
    assert (tmp_path / "merged" / "lora_adapter" / "adapter_config.json").is_file()
    assert merger(["merge", "--local_dir", str(out), "--adapter_only", "--target_dir", str(tmp_path / "adapter")]) == 0
    assert not (tmp_path / "adapter" / "config.json").exists()
    with_adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(runs["model"]),
                                             tmp_path / "adapter").eval()
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    ids = torch.tensor([[5, 17, 42, 9, 3]])
    with torch.no_grad():
        torch.testing.assert_close(with_adapter(ids).logits, plain(ids).logits, rtol=1e-4, atol=1e-5)
    # The adapter was trained on the tiny model's weights: another base is refused, naming the fix.
    other = runs["tmp"] / "other-base"
    AutoModelForCausalLM.from_pretrained(runs["model"]).apply(
        lambda m: torch.nn.init.normal_(m.weight) if isinstance(m, torch.nn.Linear) else None).save_pretrained(other)
    AutoTokenizer.from_pretrained(runs["model"]).save_pretrained(other)
    assert merger(["merge", "--local_dir", str(out), "--hf_model_path", str(other), "--target_dir",
                   str(tmp_path / "x")]) == 2


@pytest.mark.parametrize("case, said", [
    ("missing-step", "does not exist; {gae} has global_step_1, global_step_2"),
    ("hf-folder", "is already a Hugging Face model folder"),
    ("verl-shards-missing", "lacks the files of rank(s) [1] of model_world_size_2"),
    ("no-critic", "holds no critic"),
    ("target-in-use", "is a folder with other files in it"),
    ("megatron", "this project trains with FSDP only"),
    ("private-alone", "--private applies to an upload"),
    ("adapter-of-full", "is a full fine-tune"),
    ("adapter-of-critic", "a critic (its value head trained in full) is written whole"),
    ("tie-on-critic", "--tie-word-embedding: this model's output layer is a trained weight of its own"),
    ("critic-and-actor", "names the actor and --is-value-model asks for the critic"),
])
def test_merge_refuses_what_users_get_wrong_with_one_line(runs, tmp_path, capsys, case, said):
    gae, lora = runs["gae"], runs["lora"]
    target = ["--target_dir", str(tmp_path / "merged")]
    verl_dir = tmp_path / "verl_ckpt" / "global_step_5" / "actor"
    verl_dir.mkdir(parents=True)
    (verl_dir / "model_world_size_2_rank_0.pt").write_bytes(b"")  # rank 1's file left behind
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    args = {"missing-step": ["merge", "--local_dir", str(gae / "global_step_7" / "actor"), *target],
            "hf-folder": ["merge", "--local_dir", str(gae / "huggingface"), *target],
            "verl-shards-missing": ["merge", "--local_dir", str(verl_dir), *target],
            "no-critic": ["merge", "--local_dir", str(lora / "global_step_1" / "critic"), *target],
            "target-in-use": ["merge", "--local_dir", str(gae), "--target_dir", str(busy)],
            "megatron": ["merge", "--backend", "megatron", "--local_dir", str(gae), *target],
            "private-alone": ["merge", "--local_dir", str(gae), "--private", *target],
            "adapter-of-full": ["merge", "--local_dir", str(gae), "--adapter_only", *target],
            "adapter-of-critic": ["merge", "--local_dir", str(gae / "global_step_1" / "critic"), "--adapter_only",
                                  *target],
            "tie-on-critic": ["merge", "--local_dir", str(gae), "--is-value-model", "--tie-word-embedding", *target],
            "critic-and-actor": ["merge", "--local_dir", str(gae / "global_step_1" / "actor"), "--is-value-model",
                                 *target]}[case]
    assert merger(args) == 2
    err = capsys.readouterr().err
    assert said.format(gae=gae) in err and err.startswith("error: ") and err.count("\n") == 1
    assert (busy / "notes.txt").read_text() == "mine"


def test_generation_then_eval_on_the_merged_model(runs, tmp_path, capsys):
    merged = tmp_path / "merged"
    assert merger(["merge", "--local_dir", str(runs["gae"]), "--target_dir", str(merged)]) == 0
    prompts = runs["tmp"] / "gae" / "train.parquet"
    out = tmp_path / "new" / "folder" / "gen.parquet"  # its folder does not exist yet: created
    common = [f"data.path={prompts}", f"model.path={merged}", "rollout.prompt_length=32", "rollout.response_length=6"]
    assert generation([*common, f"data.output_path={out}", "data.n_samples=3", "data.batch_size=5"]) == 0
    table = pd.read_parquet(out)
    assert list(table.columns) == ["prompt", "data_source", "reward_model", "responses"] and len(table) == 16
    assert all(len(r) == 3 and all(isinstance(t, str) for t in r) for r in table["responses"])
    # rollout.seed fixes the samples, whatever the batch and slot sizes; another seed draws others.
    again, other = tmp_path / "again.parquet", tmp_path / "other.parquet"
    assert generation([*common, f"data.output_path={again}", "data.n_samples=3", "data.batch_size=16",
                       "rollout.max_num_seqs=2"]) == 0
    assert generation([*common, f"data.output_path={other}", "data.n_samples=3", "rollout.seed=2"]) == 0
    assert [list(r) for r in pd.read_parquet(again)["responses"]] == [list(r) for r in table["responses"]]
    assert [list(r) for r in pd.read_parquet(other)["responses"]] != [list(r) for r in table["responses"]]
    # Greedy decoding through the engine gives transformers' greedy tokens.
    greedy = tmp_path / "greedy.parquet"
    assert generation([*common, f"data.output_path={greedy}", "data.n_samples=1", "rollout.do_sample=false",
                       "data.apply_chat_template=false", "rollout.name=hf"]) == 0
    tokenizer = AutoTokenizer.from_pretrained(merged)
    model = AutoModelForCausalLM.from_pretrained(merged).eval()
    first = pd.read_parquet(greedy).iloc[0]
    prompt = first["prompt"][0]["content"]
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    expected = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert first["responses"][0] == tokenizer.decode(expected[0, ids.shape[1]:], skip_special_tokens=True)
    capsys.readouterr()

    # Scoring the generations with the run's own reward function: the numbers worked out here.
    reward = runs["tmp"] / "gae" / "reward.py"
    assert evaluate([f"data.path={out}", f"custom_reward_function.path={reward}", "pass_score=0.5"]) == 0
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    scores = [[len(set(t)) / (1 + len(t)) for t in row] for row in table["responses"]]
    assert metrics["test_score/echo"] == pytest.approx(sum(sum(s) / 3 for s in scores) / 16)
    assert metrics["pass@3/echo"] == pytest.approx(sum(max(s) >= 0.5 for s in scores) / 16)


def test_eval_with_built_in_scorers_by_hand(tmp_path, capsys):
    rows = [{"data_source": "exact_match", "reward_model": {"ground_truth": "7"}, "responses": ["7", "8", "7 "]},
            {"data_source": "exact_match", "reward_model": {"ground_truth": "2"}, "responses": ["3", "4", "5"]},
            {"data_source": "gsm8k", "reward_model": {"ground_truth": "12"},
             "responses": ["so #### 12", "#### 13", "x"]}]
    path = write_parquet(rows, tmp_path / "scored.parquet")
    assert evaluate([f"data.path={path}"]) == 0
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # exact_match: row 1 scores 1, 0, 1 (mean 2/3, passes); row 2 scores 0, 0, 0. gsm8k: 1, 0, 0.
    assert metrics == pytest.approx({"test_score/exact_match": (2 / 3 + 0) / 2, "pass@3/exact_match": 0.5,
                                     "test_score/gsm8k": 1 / 3, "pass@3/gsm8k": 1.0})
    # A jsonl file whose rows have different numbers of responses (a text counts as one).
    rows[2]["responses"] = "#### 13"
    rows.append({"data_source": "gsm8k", "reward_model": {"ground_truth": "5"}, "responses": ["#### 5", "#### 5"]})
    lines = tmp_path / "scored.jsonl"
    lines.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert evaluate([f"data.path={lines}"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert json.loads(printed[-1])["pass@1-2/gsm8k"] == 0.5 and json.loads(printed[-1])["test_score/gsm8k"] == 0.5
    assert printed[-2].split() == ["gsm8k", "2", "1-2", "0.5000", "0.5000"]


@pytest.mark.parametrize("args, said", [
    (["data.n_samples=4", "rollout.temperature=0"], "data.n_samples=4 with greedy decoding"),
    (["data.prompt_key=question"], "no prompt column 'question'"),
    (["rollout.temprature=0.5"], "did you mean rollout.temperature?"),
    (["data.output_path={tmp}"], "is a folder; give the parquet file to write"),
    (["data.output_path={tmp}/file.txt/out.parquet"], "is a file, so the folder cannot be created"),
    (["model.path=null"], "model.path is required"),
    (["rollout.n=4"], "data.n_samples sets the responses per prompt"),
    (["rollout.prompt_length=4"], "row 0 is 13 tokens long, over rollout.prompt_length=4; raise rollout.prompt_length"),
    (["rollout.response_length=40000"], "Lower rollout.response_length (to 243 or less"),
    (["rollout.name=sglang"], "rollout.name='sglang' is not one of"),
])
def test_generation_refuses_what_users_get_wrong(runs, tmp_path, capsys, args, said):
    (tmp_path / "file.txt").write_text("")
    base = [f"data.path={runs['tmp'] / 'gae' / 'train.parquet'}", f"model.path={runs['gae'] / 'huggingface'}",
            f"data.output_path={tmp_path / 'gen.parquet'}"]
    assert generation([*base, *(a.format(tmp=tmp_path) for a in args)]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1
    assert not (tmp_path / "gen.parquet").exists()


@pytest.mark.parametrize("rows, args, said", [
    ([{"data_source": "gsm8k", "reward_model": {"ground_truth": "1"}}], [], "has no 'responses' column"),
    ([{"reward_model": {"ground_truth": "1"}, "responses": ["1"]}], [], "has no 'data_source'"),
    ([{"data_source": "gsm8k", "responses": ["1"]}], [], "has no ground truth"),
    ([{"data_source": "gsm8k", "responses": ["1"]}], ["data.respons_key=x"], "did you mean data.response_key?"),
    ([{"data_source": "echo", "responses": ["1"]}], [], "no built-in reward scorer for data_source='echo'"),
])
def test_eval_refuses_what_users_get_wrong(tmp_path, capsys, rows, args, said):
    path = write_parquet(rows, tmp_path / "rows.parquet")
    assert evaluate([f"data.path={path}", *args]) == 2
    assert said in capsys.readouterr().err


def test_each_command_has_help(capsys):
    for command, words in ((generation, ["data.n_samples", "rollout.temperature", "data.output_path"]),
                           (evaluate, ["data.response_key", "custom_reward_function.path", "pass_score"])):
        assert command(["--help"]) == 0
        said = capsys.readouterr().out
        assert all(word in said for word in words)
    # Hydra's --cfg job (verl's scripts use it): the config the command would use, nothing run.
    assert generation(["--cfg", "job", "data.n_samples=2", "rollout.temperature=0.7"]) == 0
    shown = capsys.readouterr().out
    assert "n_samples: 2" in shown and "temperature: 0.7" in shown
    assert evaluate(["--cfg", "job", "pass_score=0.5"]) == 0 and "pass_score: 0.5" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        merger(["merge", "--help"])
    assert done.value.code == 0
    said = capsys.readouterr().out
    assert all(flag in said for flag in ("--local_dir", "--target_dir", "--hf_model_path", "--adapter_only",
                                         "--is-value-model", "--hf_upload_path", "--private"))
    # argparse's own refusals: a missing flag, a sub-command left out (exit 2, the usage printed).
    for args in (["merge", "--target_dir", "x"], ["--local_dir", "x"]):
        with pytest.raises(SystemExit) as done:
            merger(args)
        assert done.value.code == 2
    assert "the following arguments are required: --local_dir" in capsys.readouterr().err


# What upstream verl's FSDP checkpoint manager writes for each role: every rank saves its own
# model.state_dict() (FSDP2 DTensor shards) as model_world_size_W_rank_R.pt, and the model's config
# and tokenizer go to huggingface/. Made here by sharding over 2 gloo ranks.
UPSTREAM_SAVE = """
import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

from verl.config.schema_actor import FSDPConfig
from verl.distributed.fsdp import parallelize
from verl.distributed.process_group import ensure_process_group

source, out = Path(sys.argv[1]), Path(sys.argv[2])
ensure_process_group()
rank, world = dist.get_rank(), dist.get_world_size()
critic_config = AutoConfig.from_pretrained(source, num_labels=1)
critic_config.architectures = None
lora = get_peft_model(AutoModelForCausalLM.from_pretrained(source),
                      LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
for role, model in (("actor", AutoModelForCausalLM.from_pretrained(source)),
                    ("critic", AutoModelForTokenClassification.from_config(critic_config)), ("lora", lora)):
    torch.manual_seed(7)
    with torch.no_grad():  # trained: every weight moved off the folder's (LoRA's B too)
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.01)
    folder = out / "global_step_3" / role
    if rank == 0:  # the full weights, before sharding (a LoRA model merged by peft)
        (copy.deepcopy(model).merge_and_unload() if role == "lora" else model).save_pretrained(out / f"expected_{role}")
        (AutoConfig.from_pretrained(source) if role == "lora" else model.config).save_pretrained(folder / "huggingface")
        AutoTokenizer.from_pretrained(source).save_pretrained(folder / "huggingface")
        if role == "lora":  # verl writes the adapters' rank and alpha beside the shards
            (folder / "lora_train_meta.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "task_type": "CAUSAL_LM"}))
    model = parallelize(model, FSDPConfig(), device="cpu")
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), folder / f"model_world_size_{world}_rank_{rank}.pt")
    dist.barrier()
"""


def test_upstream_verls_sharded_checkpoint_merges_to_its_full_weights(runs, tmp_path, capsys):
    out = tmp_path / "verl_run"
    run_torchrun(UPSTREAM_SAVE, str(runs["model"]), str(out), tmp_path=tmp_path)
    actor = out / "global_step_3" / "actor"
    assert sorted(p.name for p in actor.glob("*.pt")) == ["model_world_size_2_rank_0.pt",
                                                          "model_world_size_2_rank_1.pt"]
    assert merger(["merge", "--backend", "fsdp", "--local_dir", str(actor), "--target_dir", str(tmp_path / "a")]) == 0
    assert "upstream verl's sharded checkpoint: its rank files are joined" in capsys.readouterr().out
    merged, expected = _weights(tmp_path / "a"), _weights(out / "expected_actor")
    assert merged.keys() == expected.keys() and all(torch.equal(merged[k], expected[k]) for k in merged)
    assert _greedy(tmp_path / "a") == _greedy(out / "expected_actor", tokenizer_folder=tmp_path / "a")
    assert merger(["test", "--local_dir", str(actor), "--test_hf_dir", str(out / "expected_actor")]) == 0
    # verl's critic, a one-label token classifier, comes back as one.
    assert merger(["merge", "--local_dir", str(out / "global_step_3" / "critic"), "--target_dir",
                   str(tmp_path / "c")]) == 0
    merged, expected = (_weights(tmp_path / "c", AutoModelForTokenClassification),
                        _weights(out / "expected_critic", AutoModelForTokenClassification))
    assert merged.keys() == expected.keys() and all(torch.equal(merged[k], expected[k]) for k in merged)
    # verl's LoRA checkpoint (the PEFT model's whole state + lora_train_meta.json): the adapters merged in.
    lora = out / "global_step_3" / "lora"
    assert merger(["merge", "--local_dir", str(lora), "--target_dir", str(tmp_path / "l")]) == 0
    merged, expected = _weights(tmp_path / "l"), _weights(out / "expected_lora")
    assert merged.keys() == expected.keys()
    for name in merged:
        torch.testing.assert_close(merged[name], expected[name], rtol=1e-6, atol=1e-7)
    (lora / "lora_train_meta.json").unlink()
    assert merger(["merge", "--local_dir", str(lora), "--target_dir", str(tmp_path / "l")]) == 2
    assert "no lora_train_meta.json" in capsys.readouterr().err
    # Without its huggingface/ folder the model is unknown: --hf_model_path names it.
    (actor / "huggingface" / "config.json").unlink()
    assert merger(["merge", "--local_dir", str(actor), "--target_dir", str(tmp_path / "b")]) == 2
    assert "give the model folder the run started from with --hf_model_path" in capsys.readouterr().err
    assert merger(["merge", "--local_dir", str(actor), "--hf_model_path", str(runs["model"]), "--target_dir",
                   str(tmp_path / "b")]) == 0


def test_an_sft_checkpoint_merges_with_the_settings_of_its_run_folder(runs, tmp_path, capsys):
    from verl.trainer.main_sft import main as sft

    rows = [{"prompt": [{"role": "user", "content": f"say {i}:"}], "response": str(i)} for i in range(8)]
    train = write_parquet(rows, tmp_path / "sft.parquet")
    out = tmp_path / "sft"
    assert sft([f"model.path={runs['model']}", f"data.train_files={train}", "data.train_batch_size=4",
                "data.max_length=32", "trainer.total_training_steps=1", "trainer.save_freq=1", "optim.lr=1e-2",
                f"trainer.default_local_dir={out}", "trainer.progress_bar=false"]) == 0
    assert merger(["test", "--local_dir", str(out / "global_step_1"), "--test_hf_dir", str(out / "huggingface")]) == 0
    assert merger(["merge", "--local_dir", str(out / "global_step_1" / "critic"), "--target_dir",
                   str(tmp_path / "x")]) == 2
    assert "offline run (SFT/DPO/KTO), which trains no critic" in capsys.readouterr().err


def test_a_failed_upload_says_so_and_keeps_the_merged_folder(runs, tmp_path, capsys, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no hub here: the upload fails
    target = tmp_path / "merged"
    assert merger(["merge", "--local_dir", str(runs["gae"]), "--target_dir", str(target),
                   "--hf_upload_path", "someone/tiny", "--private"]) == 2
    err = capsys.readouterr().err
    assert "uploading" in err and "to someone/tiny failed" in err and "the merged folder is written" in err
    assert (target / "config.json").is_file()


def test_settings_saved_by_another_version_need_the_model_folder(runs, tmp_path, capsys):
    state = torch.load(runs["gae"] / "global_step_2" / "state.pt", weights_only=False)
    state["config"]["actor_rollout_ref"]["model"]["renamed_later"] = 1
    (tmp_path / "run" / "global_step_2").mkdir(parents=True)
    torch.save(state, tmp_path / "run" / "global_step_2" / "state.pt")
    args = ["merge", "--local_dir", str(tmp_path / "run"), "--target_dir", str(tmp_path / "merged")]
    assert merger(args) == 2
    assert "records settings this version does not read" in capsys.readouterr().err
    assert merger([*args, "--hf_model_path", str(runs["model"])]) == 0
    assert _greedy(tmp_path / "merged") == _greedy(runs["gae"] / "huggingface")
