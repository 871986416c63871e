"""The hack bank (issue 9): programs that try to get a reward without solving the task score 0,
and a correct solution scores 1, as root and as an unprivileged user (see ``sandbox_attacks.py``)."""

import json
import os

import pytest

from sandbox_attacks import BANK, LIMITS, LINUX_ONLY, SECRET, driver_report

pytestmark = LINUX_ONLY


@pytest.mark.parametrize("mode", ["root", "user", "root-weak", "user-weak"])
def test_hack_bank_scores_zero_and_a_correct_solution_one_through_compute_score(mode):
    bank = driver_report(mode)["bank"]
    scores = {name: bank[name].get("score", bank[name]) for name in BANK}
    assert scores == {name: score for name, (_, _, score) in BANK.items()}


def test_hack_bank_through_the_reward_manager_scores_zero_and_a_correct_solution_one():
    """In this process (the trainer) and through RuleRewardManager, as the trainer scores a step."""
    import torch

    from verl.models.tiny import build_char_tokenizer
    from verl.protocol import Batch
    from verl.rewards import RuleRewardManager

    tok = build_char_tokenizer()
    names = list(BANK)
    texts = [BANK[n][0].replace("__TRAINER__", str(os.getpid())) for n in names]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    assert [tok.decode(i) for i in ids] == texts
    width = max(map(len, ids))
    responses = torch.tensor([row + [0] * (width - len(row)) for row in ids])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids])
    batch = Batch({"responses": responses, "response_mask": mask},
                  {"data_source": ["code"] * len(names), "ground_truth": [json.dumps(BANK[n][1]) for n in names],
                   "extra_info": [{"sandbox": LIMITS}] * len(names)})
    scores, columns = RuleRewardManager(tok)(batch)
    got = dict(zip(names, scores.sum(-1).tolist()))
    assert got == {name: score for name, (_, _, score) in BANK.items()}, dict(zip(names, columns["status"]))


def test_control_without_the_trainer_protection_the_attacks_do_read_the_trainer():
    """The trainer-reading attacks are real: against a trainer left dumpable, with no namespaces,
    they find its environment and the expected output in its memory (and score 1). So the tests
    above that see nothing leak show the protection working, not a broken attack."""
    report = driver_report("user-unprotected")
    assert report["dumpable"] == 1 and any("NOT protected" in w for w in report["warnings"])
    assert "LEAK" in report["attacks"]["trainer_environ"]["stdout"]
    assert SECRET in report["attacks"]["trainer_memory"]["stdout"]
    assert report["bank"]["answer_read_from_trainer_memory"]["score"] == 1.0
