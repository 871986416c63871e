"""Score functions against assert tests whose expected side uses the standard library (docs/code_reward.md).

Run it:  python examples/rewards/code_asserts.py

The tests compare ``root(x)`` with ``math.sqrt(x)`` and with a declared ``from math import sqrt``.
The expected side is computed in the trainer, so an answer that replaces ``__builtins__`` (making
``math.sqrt(16)`` answer 0 inside its own process) gets nothing for it.
"""

import json

from verl.rewards.scorers.code import score_batch

# As a dataset row would carry it: the test's own import among the asserts, as MBPP's test_imports.
TESTS = json.dumps({"imports": ["from math import sqrt"],
                    "assert": ["assert root(16) == math.sqrt(16)", "assert abs(root(2) - sqrt(2)) < 1e-12",
                               "assert sorted([root(9), root(4)]) == [2.0, 3.0]"]})

ANSWERS = {
    "correct": "```python\nimport math\ndef root(x):\n    return math.sqrt(x)\n```",
    "rounded": "```python\ndef root(x):\n    return round(x ** 0.5, 3)\n```",  # 2 of 3
    "answers_itself": ("```python\nclass Zero(int):\n    def __call__(self, *a, **k):\n        return self\n"
                       "    def __getattr__(self, name):\n        return self\n"
                       "class Missing(dict):\n    def __missing__(self, key):\n        return Zero(0)\n"
                       "def root(x):\n    return Zero(0)\n__builtins__ = Missing()\n```"),
}
EXTRA_INFO = {"sandbox": {"wall_seconds": 2, "cpu_seconds": 2, "memory_bytes": 256 * 2**20}}


def main() -> dict[str, dict]:
    names = list(ANSWERS)
    results = score_batch([ANSWERS[n] for n in names], [TESTS] * len(names), [EXTRA_INFO] * len(names))
    for name, result in zip(names, results):
        print(f"{name:15s} score={result['score']:.2f} passed={result['passed']}/{result['total']} "
              f"status={result['status']}")
    return dict(zip(names, results))


if __name__ == "__main__":
    main()
