"""An example reward function for ``custom_reward_function.path``: verl's signature.

Scores 1.0 when the last number in the response equals the ground truth. Returning a dict adds
per-sample fields to the logs (here: whether the response contained a number at all).
"""

import re

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    numbers = _NUMBER.findall(solution_str.replace(",", ""))
    if not numbers:
        return {"score": 0.0, "has_number": 0.0}
    return {"score": 1.0 if float(numbers[-1]) == float(ground_truth) else 0.0, "has_number": 1.0}
