"""Score Python answers by running them against test cases in the sandbox (docs/code_reward.md).

Run it:  python examples/rewards/code_reward.py

It scores five answers to "read two integers, print their sum" and prints one line each. The file
can also be given as ``custom_reward_function.path``: its ``compute_score`` has verl's signature.
"""

import json

from verl.rewards.scorers.code import compute_score, score_batch

__all__ = ["compute_score"]

# As a dataset row would carry it: ground truth as a JSON string.
TESTS = json.dumps({"inputs": ["1 2\n", "10 -3\n", "0 0\n"], "outputs": ["3\n", "7\n", "0\n"]})

ANSWERS = {
    "correct": "Add them:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```",
    "partial": "```python\na, b = map(int, input().split())\nprint(abs(a) + abs(b))\n```",  # 2 of 3
    "loops": "```python\nwhile True:\n    pass\n```",
    "escapes": "```python\nopen('/tmp/pwned', 'w').write('hi')\n```",
    "phones_home": "```python\nimport socket\nsocket.create_connection(('example.com', 80))\n```",
}

# Small limits so the example (and its test) finish fast; a training run would keep the defaults.
EXTRA_INFO = {"sandbox": {"wall_seconds": 2, "cpu_seconds": 2, "memory_bytes": 256 * 2**20}}


def main() -> dict[str, dict]:
    names = list(ANSWERS)
    results = score_batch([ANSWERS[n] for n in names], [TESTS] * len(names),
                          [EXTRA_INFO] * len(names), max_workers=4)
    for name, result in zip(names, results):
        print(f"{name:12s} score={result['score']:.2f} passed={result['passed']}/{result['total']} "
              f"status={result['status']}")
    return dict(zip(names, results))


if __name__ == "__main__":
    main()
