import pytest

from verl.rewards import RewardError, load_reward_function


def write(tmp_path, text, name="my_reward.py"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_loads_the_named_function_from_a_file(tmp_path):
    path = write(tmp_path, "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                           "    return float(solution_str == ground_truth)\n"
                           "def other(**kw):\n    return 0.5\n")
    fn = load_reward_function(path)
    assert fn(data_source="d", solution_str="7", ground_truth="7", extra_info=None) == 1.0
    assert load_reward_function(str(path), name="other")() == 0.5


def test_missing_file_names_path_and_setting(tmp_path):
    with pytest.raises(RewardError, match=r"nope\.py.*custom_reward_function\.path"):
        load_reward_function(tmp_path / "nope.py")


def test_a_folder_given_as_the_file_lists_the_python_files_in_it(tmp_path):
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "math_reward.py").write_text("def compute_score(**kw):\n    return 0.0\n")
    with pytest.raises(RewardError, match=r"custom_reward_function\.path=.*rewards is a folder, not a reward function "
                                          r"file \(it holds math_reward\.py\); set custom_reward_function\.path to "
                                          r"the \.py file itself"):
        load_reward_function(tmp_path / "rewards")


def test_file_that_raises_on_import_names_file_and_exception(tmp_path):
    path = write(tmp_path, "import definitely_not_a_module_xyz\n")
    with pytest.raises(RewardError, match=r"my_reward\.py raised ModuleNotFoundError.*definitely_not_a_module_xyz"):
        load_reward_function(path)


def test_missing_name_lists_the_functions_defined_there(tmp_path):
    path = write(tmp_path, "from os.path import join\n"
                           "def score_a(**kw): return 1.0\n"
                           "def score_b(**kw): return 0.0\n"
                           "def _helper(): pass\n")
    with pytest.raises(RewardError, match=r"no attribute 'compute_score'.*\['score_a', 'score_b'\]"
                                          r".*custom_reward_function\.name") as info:
        load_reward_function(path)
    assert "join" not in str(info.value) and "_helper" not in str(info.value)


def test_non_callable_attribute_is_refused(tmp_path):
    path = write(tmp_path, "compute_score = 3\n")
    with pytest.raises(RewardError, match="'compute_score' is a int, not a function"):
        load_reward_function(path)


def test_a_helper_module_beside_the_file_imports_as_it_does_for_a_script(tmp_path, monkeypatch):
    """Before: "importing reward function file ... raised ModuleNotFoundError: No module named 'my_norm_helpers'",
    though `python my_reward.py` finds it."""
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "my_norm_helpers", raising=False)
    write(tmp_path, "def norm(text):\n    return text.strip().lower()\n", name="my_norm_helpers.py")
    path = write(tmp_path, "from my_norm_helpers import norm\n"
                           "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                           "    return float(norm(solution_str) == norm(ground_truth))\n")
    assert load_reward_function(path)(data_source="d", solution_str=" Seven ", ground_truth="seven") == 1.0
    assert sys.path[-1] == str(tmp_path)  # after the installed packages: a helper shadows none of them


def test_a_class_named_as_the_function_is_told_to_be_an_instance(tmp_path):
    """Before: "reward function Scorer() cannot be called with the arguments data_source, ...; define it as def
    compute_score(...)", though the class's __call__ has those parameters."""
    path = write(tmp_path, "class Scorer:\n"
                           "    def __call__(self, data_source, solution_str, ground_truth, extra_info=None):\n"
                           "        return 1.0\n"
                           "scorer = Scorer()\n")
    with pytest.raises(RewardError, match=r"my_reward\.py: 'Scorer' is a class, and the reward function is called once "
                                          r"per response; make an instance of it \(it has __call__\) in the file, e\.g\. "
                                          r"scorer = Scorer\(\), and set custom_reward_function\.name=scorer$"):
        load_reward_function(path, name="Scorer")
    assert load_reward_function(path, name="scorer")(data_source="d", solution_str="x", ground_truth="y") == 1.0
