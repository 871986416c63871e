"""The hack bank (issues 9 and 22): programs that try to get a reward without solving the task score 0,
and correct solutions score 1, as root and as an unprivileged user, through the reward manager, with
the audit hook on and off (see ``sandbox_attacks.py``)."""

import pytest

from sandbox_attacks import BANK, BANK_NO_HOOK, LINUX_ONLY, SECRET, driver_report

pytestmark = LINUX_ONLY


@pytest.mark.parametrize("mode", ["root", "user", "root-weak", "user-weak"])
def test_hack_bank_scores_zero_and_a_correct_solution_one(mode):
    """As root and as a plain user the bank goes through the trainer's RuleRewardManager (token ids
    in, scores out); in the weak modes through compute_score."""
    report = driver_report(mode)
    scores = {name: report["bank"][name].get("score", report["bank"][name]) for name in BANK}
    expected = {name: score for name, (_, _, score) in BANK.items()}
    if mode.endswith("weak") and not any(entry.get("layers", {}).get("landlock") for entry in report["attacks"].values()):
        expected.pop("answer_read_from_a_dataset_file")  # weak mode without Landlock: reads are not confined
        scores.pop("answer_read_from_a_dataset_file")
    assert scores == expected
    assert report["bank_escaped"] == []  # the trainer's shm file, terminal and session key untouched


@pytest.mark.parametrize("mode", ["root", "user"])
def test_with_the_hook_off_the_hacks_of_issue_22_still_score_zero_through_the_reward_manager(mode):
    bank = driver_report(mode)["bank/no-hook"]
    assert sorted(bank) == sorted(BANK_NO_HOOK)
    assert {name: bank[name]["score"] for name in bank} == {name: BANK[name][2] for name in BANK_NO_HOOK}


@pytest.mark.parametrize("mode", ["root", "user"])
def test_the_logged_status_is_the_trainers_view_not_the_programs(mode):
    report = driver_report(mode)
    for bank in ("bank", "bank/no-hook"):
        assert report[bank]["spoofed_memory_error"]["status"] == "error"  # a class named MemoryError is not one
        assert report[bank]["spoofed_memory_error_by_metaclass"]["status"] == "error"  # nor one equal to it
        assert report[bank]["colliding_set_result"]["status"] == "wrong_answer"  # refused, not rebuilt
        assert report[bank]["answer_read_from_the_session_keyring"]["status"] == "blocked"
    assert report["bank"]["expected_side_shadowed/stdlib_names"]["status"] == "unsupported"


def test_control_without_the_trainer_protection_the_attacks_do_read_the_trainer():
    """The trainer-reading attacks are real: against a trainer left dumpable, with no namespaces,
    they find its environment and the expected output in its memory (and score 1). So the tests
    above that see nothing leak show the protection working, not a broken attack."""
    report = driver_report("user-unprotected")
    assert report["dumpable"] == 1 and any("NOT protected" in w for w in report["warnings"])
    assert "LEAK" in report["attacks"]["trainer_environ"]["stdout"]
    assert SECRET in report["attacks"]["trainer_memory"]["stdout"]
    assert report["bank"]["answer_read_from_trainer_memory"]["score"] == 1.0
