"""Supervised fine-tuning end to end on the tiny model: the loss falls, the policy loads back,
micro-batching does not change the update, resuming equals not stopping, bad input exits 2."""

import json
import logging

import pytest
import torch
from helpers import gradient_of_one_step
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl.data import write_jsonl, write_parquet
from verl.data.offline import addition_rows
from verl.trainer.main_sft import main
from verl.trainer.sft import SFTTrainer

pytestmark = pytest.mark.slow


def metrics(out_dir):
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def config(tiny_model_dir, tmp_path, **data):
    train = write_parquet(addition_rows("sft", "train", n=256, seed=0), tmp_path / "train.parquet")
    return {"model": {"path": str(tiny_model_dir)},
            "data": {"train_files": str(train), "train_batch_size": 8, **data},
            "optim": {"lr": 1e-3, "weight_decay": 0.0},
            "trainer": {"total_training_steps": 2, "default_local_dir": str(tmp_path / "out"), "logger": [],
                        "progress_bar": False, "resume_mode": "disable"}}


def test_sft_cli_lowers_the_held_out_loss_and_writes_a_loadable_policy(tiny_model_dir, tmp_path, capsys):
    train = write_parquet(addition_rows("sft", "train", n=1024, seed=0), tmp_path / "train.parquet")
    val = write_jsonl(addition_rows("sft", "test", n=64, seed=1), tmp_path / "val.jsonl")
    out = tmp_path / "out"
    code = main([f"model.path={tiny_model_dir}", f"data.train_files={train}", f"data.val_files={val}",
                 "data.train_batch_size=32", "data.micro_batch_size_per_gpu=16", "optim.lr=3e-3",
                 "optim.weight_decay=0.0", "trainer.total_training_steps=40", "trainer.test_freq=20",
                 f"trainer.default_local_dir={out}", "trainer.progress_bar=false", "trainer.logger=[]"])
    assert code == 0
    rows = metrics(out)
    train_rows = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train_rows] == list(range(1, 41))
    for key in ("train/lr", "train/grad_norm", "timing_s/step"):
        assert key in train_rows[0], key
    val_loss = [(r["step"], r["val/loss"]) for r in rows if "val/loss" in r]
    assert [s for s, _ in val_loss] == [0, 20, 40]
    # Measured: held-out loss per response token 5.51 -> 1.98 (step 20) -> 1.55 (step 40).
    assert val_loss[-1][1] < 0.5 * val_loss[0][1]
    assert sum(r["train/loss"] for r in train_rows[-5:]) < 0.5 * sum(r["train/loss"] for r in train_rows[:5])
    assert "val/loss" in capsys.readouterr().out  # the summary table
    model = AutoModelForCausalLM.from_pretrained(out / "huggingface")
    tokenizer = AutoTokenizer.from_pretrained(out / "huggingface")
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert not torch.equal(model.lm_head.weight, original.lm_head.weight)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "12+34="}], tokenize=False,
                                           add_generation_prompt=True)
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    generated = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    answer = tokenizer.decode(generated[0, ids.shape[1]:], skip_special_tokens=True)
    assert answer.isdigit(), answer  # it learned the answer format at least


def test_chat_conversations_train_on_assistant_turns(tiny_model_dir, tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"{i}+1="}, {"role": "assistant", "content": str(i + 1)},
                          {"role": "user", "content": "again"}, {"role": "assistant", "content": str(i + 1)}]}
            for i in range(16)]
    cfg = config(tiny_model_dir, tmp_path, messages_key="messages")
    cfg["data"]["train_files"] = str(write_jsonl(rows, tmp_path / "chat.jsonl"))
    trainer = SFTTrainer(cfg)
    batch = next(trainer.train_loader)
    # every loss-mask token is an assistant token: digits and eos, never the user's text
    targets = batch["input_ids"][batch["loss_mask"].bool()].tolist()
    assert {trainer.tokenizer.decode([t]) for t in targets} <= set("0123456789") | {"</s>"}
    result = trainer.fit()
    assert result["steps"] == 2 and (tmp_path / "out" / "huggingface" / "config.json").exists()


def test_micro_batches_accumulate_to_the_full_batch_gradient(tiny_model_dir, tmp_path):
    # 8 examples of 3 or 4 response tokens in 4 micro-batches: each divides by the step's token count
    full = gradient_of_one_step(SFTTrainer(config(tiny_model_dir, tmp_path / "full")))
    micro = gradient_of_one_step(SFTTrainer(config(tiny_model_dir, tmp_path / "micro", micro_batch_size_per_gpu=2)))
    assert full[0] == pytest.approx(micro[0], rel=1e-5)
    for name, grad in full[1].items():
        torch.testing.assert_close(micro[1][name], grad, rtol=1e-4, atol=1e-7)


def test_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(tiny_model_dir, tmp_path, caplog):
    straight = config(tiny_model_dir, tmp_path / "a")
    straight["trainer"]["total_training_steps"] = 4
    SFTTrainer(straight).fit()
    interrupted = config(tiny_model_dir, tmp_path / "b")
    interrupted["trainer"].update(save_freq=2, resume_mode="auto")
    SFTTrainer(interrupted).fit()  # stops after step 2, with a checkpoint
    interrupted["trainer"]["total_training_steps"] = 4
    resumed = SFTTrainer(interrupted)
    with caplog.at_level(logging.WARNING, logger="verl.trainer.run_loop"):
        resumed.fit()
    assert "setting(s) other than" not in caplog.text  # a longer run, saved more often: nothing to say
    assert resumed.global_step == 4
    assert (tmp_path / "b" / "out" / "global_step_4" / "state.pt").exists()
    a = AutoModelForCausalLM.from_pretrained(tmp_path / "a" / "out" / "huggingface").state_dict()
    b = AutoModelForCausalLM.from_pretrained(tmp_path / "b" / "out" / "huggingface").state_dict()
    for key in a:
        assert torch.equal(a[key], b[key]), key

    # Resumed under another learning rate: said, as the RL trainer says it (before: nothing).
    interrupted["trainer"]["total_training_steps"] = 5
    interrupted["optim"]["lr"] = 1e-4
    with caplog.at_level(logging.WARNING, logger="verl.trainer.run_loop"):
        SFTTrainer(interrupted).fit()
    assert "under 1 setting(s) other than those of the run that saved it: optim.lr: 0.001 -> 0.0001" in caplog.text


@pytest.mark.parametrize("args, expected", [
    (["data.train_files={tmp}/nope.parquet"], ["nope.parquet", "data.train_files"]),
    (["data.train_files={bad}"], ["'prompt'", "'response'", "question, answer", "data.prompt_key",
                                  "data.response_key"]),
    (["trainer.totl_epochs=3"], ["did you mean trainer.total_epochs"]),
    (["data.train_batch_size=8", "data.micro_batch_size_per_gpu=3"], ["8 / 3 = 2.67", "e.g. 2 or 4"]),
    (["data.train_files={long}", "data.max_length=8"], ["over data.max_length=8", "data.truncation=left"]),
])
def test_bad_input_exits_2_with_one_clear_message(tiny_model_dir, tmp_path, capsys, args, expected):
    bad = write_parquet([{"question": "1+1=", "answer": "2"}] * 4, tmp_path / "bad.parquet")
    long = write_parquet([{"prompt": "1+1+1+1+1=", "response": "5"}] * 4, tmp_path / "long.parquet")
    args = [a.format(tmp=tmp_path, bad=bad, long=long) for a in args]
    code = main([f"model.path={tiny_model_dir}", f"trainer.default_local_dir={tmp_path / 'out'}", *args])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error:") and "Traceback" not in err
    for text in expected:
        assert text in err, (text, err)


def test_help_lists_the_sft_keys(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "data.response_key" in out and "data.messages_key" in out and "optim.clip_grad" in out


def test_verls_multiturn_keys_train_on_the_conversations_as_messages_key_does(tiny_model_dir, tmp_path):
    # verl's multiturn SFT script: data.multiturn.enable=true data.multiturn.messages_key=messages
    rows = [{"conv": [{"role": "user", "content": f"{a}+1="}, {"role": "assistant", "content": str(a + 1)}]}
            for a in range(8)]
    files = {"train_files": str(write_parquet(rows, tmp_path / "conv.parquet"))}
    verl_style = SFTTrainer(config(tiny_model_dir, tmp_path, **files, multiturn={"enable": True, "messages_key": "conv"}))
    ours = SFTTrainer(config(tiny_model_dir, tmp_path, **files, messages_key="conv"))
    assert len(verl_style.train_set) == 8
    assert [verl_style.train_set[i] for i in range(8)] == [ours.train_set[i] for i in range(8)]
