"""How many of upstream verl's example launch scripts parse in this project's config system.

Method
  1. Every ``examples/**/*.sh`` at HEAD of a bare clone of verl is extracted (with the rest of
     ``examples/``, so relative ``--config-path`` folders resolve) into a temp dir.
  2. Each script runs under bash (20 s timeout, cwd = HOME = temp dir, stdin /dev/null, a minimal
     environment without GPU variables) with a PATH whose first folder holds stub executables for
     python/python3/torchrun/ray/nvidia-smi/pip/git/wget/curl/sleep/... The python and torchrun
     stubs write their cwd and argv (NUL-separated) to a capture folder, one file per call;
     ``python -c`` exits 1 (so ``python3 -c 'import torch_npu'`` probes choose the GPU path);
     ``ray`` records too (``ray job submit ... -- python3 -m ...``: what follows ``--``);
     ``nohup`` and ``uv run ... python3`` run the python command; ``tee`` is ``cat``; the rest
     print nothing and exit 0 (``nvidia-smi`` lists 8 GPUs); ``ulimit`` is a no-op function
     (BASH_ENV prelude). A script stopping on a variable the user must set (``FOO: unbound
     variable``, ``${FOO:?...}``) is rerun with it set to a dummy path. So bash itself expands
     variables, defaults and arrays exactly as in a real run.
  3. Captured calls running ``-m verl.trainer.main_ppo`` are launches; their overrides are the
     arguments after the module name. Each is loaded in-process with
     ``TrainerConfig.from_cli(overrides)`` (cwd = the launch's cwd), then ``cfg.validate()`` and
     ``check_algorithm_names(cfg)`` (what main_ppo checks before loading anything: consistency and
     names only, never that data/model files exist), and classified as
     ``parsed+validated`` / ``parsed, validate error`` / ``refused backend`` (a ConfigError naming
     a backend of verl/config/key_errors.py BACKENDS) / ``parse error`` / ``crash`` (non-ConfigError).
     A separate heuristic flags launches that obviously use Megatron/VeOmni/another backend.
  4. Every distinct ``key=value`` override key of the non-refused launches is applied alone
     (first occurrence) with ``TrainerConfig.from_cli([override])``: OK vs error per key.
  5. Launches of verl's SFT entry points (``verl.trainer.fsdp_sft_trainer``, ``verl.trainer.sft_trainer``)
     are loaded the same way with ``SFTTrainerConfig`` and validated for torchrun's
     ``--nproc_per_node`` ranks, and counted apart. A script that stops with its usage line (it
     wants positional arguments: ``<nproc_per_node> <save_path>``) is rerun with ``2 $HOME/save``.

Run from the repository root:
    .venv/bin/python scripts/verl_launch_scan.py [-v] [--json out.json] [--verl-git DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
import subprocess
import sys
import tarfile
import tempfile
import traceback
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from verl.config import ConfigError, TrainerConfig  # noqa: E402
from verl.config.key_errors import BACKENDS  # noqa: E402
from verl.config.offline import SFTTrainerConfig  # noqa: E402
from verl.trainer.ppo.build import check_algorithm_names  # noqa: E402

MODULE = "verl.trainer.main_ppo"
SFT_MODULES = ("verl.trainer.fsdp_sft_trainer", "verl.trainer.sft_trainer")
RECORD = 'mkdir -p "$SCAN_CAPTURE"; printf "%s\\0" "$SCAN_SCRIPT" "$PWD" "$(basename "$0")" "$@" ' \
         '> "$SCAN_CAPTURE/$(date +%s%N)-$$-$RANDOM"\n'
STUBS = {
    "python python3 torchrun": RECORD + '[ "${1:-}" = -c ] && exit 1\nexit 0\n',
    "ray": RECORD + "exit 0\n",
    "nvidia-smi": 'for i in 0 1 2 3 4 5 6 7; do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i)"; done\n',
    "nohup": 'exec "$@"\n',
    "uv": 'while [ $# -gt 0 ] && [[ "$1" != python* ]]; do shift; done\n[ $# -gt 0 ] && exec "$@"\nexit 0\n',
    "tee": "cat\n",
    "huggingface-cli hf wget curl pip pip3 git sleep ssh scp modelscope npu-smi": "exit 0\n",
}
PRELUDE = "ulimit() { :; }\n"  # sourced by every bash (BASH_ENV): raising limits is refused in a sandbox
# "line 9: FOO: unbound variable" / "${FOO:?must set FOO}": a variable the user must set; set it and rerun.
NEEDS_VAR = re.compile(r": line \d+: ([A-Za-z_]\w*): (.*)$")
BACKEND_HINT = re.compile(r"megatron|mlite|veomni|torchtitan|fsdp_turbo|automodel", re.I)


def extract_examples(git_dir: str, dest: Path) -> list[str]:
    """Write `examples/` at HEAD under `dest`; return the .sh paths (relative, sorted)."""
    tar = subprocess.run(["git", "--git-dir", git_dir, "archive", "HEAD", "examples"],
                         check=True, capture_output=True).stdout
    tmp = dest / "examples.tar"
    tmp.write_bytes(tar)
    with tarfile.open(tmp) as tf:
        tf.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    tmp.unlink()
    return sorted(str(p.relative_to(dest)) for p in (dest / "examples").rglob("*.sh"))


def make_stubs(bindir: Path) -> None:
    bindir.mkdir()
    for names, body in STUBS.items():
        for name in names.split():
            (bindir / name).write_text("#!/bin/bash\n" + body)
            (bindir / name).chmod(0o755)
    (bindir / "prelude.sh").write_text(PRELUDE)


def run_script(root: Path, bindir: Path, capture: Path, script: str) -> tuple[str | None, dict]:
    """Run one script with the stubs: (None, or a note when it timed out / failed; variables set for it).

    A script that stops because a variable the user must set is unset is rerun (up to 5 times)
    with that variable set to a dummy path under the temp dir (``vllm`` for a variable naming an
    inference backend or engine)."""
    env = {"PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin", "HOME": str(root), "LANG": "C.UTF-8",
           "BASH_ENV": str(bindir / "prelude.sh"), "SCAN_CAPTURE": str(capture), "SCAN_SCRIPT": script}
    given: dict[str, str] = {}
    args: list[str] = []
    for _ in range(7):
        try:
            p = subprocess.run(["bash", script, *args], cwd=root, env={**env, **given}, stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            return "timeout", given
        if p.returncode and not args and "usage:" in (p.stdout + p.stderr).lower():
            args = ["2", f"{root}/save"]  # verl's SFT scripts: <nproc_per_node> <save_path>
            continue
        last = (p.stderr.strip().splitlines() or [""])[-1]
        m = NEEDS_VAR.search(last)
        if p.returncode and m and m.group(1) not in given and (m.group(1).isupper() or "unbound" in m.group(2)):
            name = m.group(1)
            # A rollout engine the script asks the user to choose: vLLM, upstream's default.
            given[name] = "vllm" if "BACKEND" in name or "ENGINE" in name else f"{root}/{name.lower()}"
            continue
        return (f"exit {p.returncode}: {last[:200]}" if p.returncode else None), given
    return "too many unset variables", given


def _nproc(cmd: str, argv: list[str]) -> int:
    """torchrun's ``--nproc_per_node`` (1 for a plain ``python -m`` launch)."""
    if cmd != "torchrun" and "torch.distributed.run" not in argv:
        return 1
    for i, arg in enumerate(argv):
        value = arg.split("=", 1)[1] if arg.startswith("--nproc_per_node=") else \
            argv[i + 1] if arg == "--nproc_per_node" and i + 1 < len(argv) else None
        if value is not None:
            return int(value) if value.isdigit() else 1
    return 1


def sft_launches_from(calls: list[tuple[str, str, str, list[str]]]) -> list[dict]:
    """Launches of verl's SFT entry points in the captured calls, with torchrun's process count."""
    out = []
    for script, cwd, cmd, argv in calls:
        idx = next((i + 1 for i in range(len(argv) - 1) if argv[i] == "-m" and argv[i + 1] in SFT_MODULES), None)
        if idx is not None:
            out.append({"script": script, "cwd": cwd, "module": argv[idx], "nproc": _nproc(cmd, argv),
                        "overrides": argv[idx + 1:]})
    return out


def classify_sft(launch: dict) -> tuple[str, str]:
    """(category, detail) for one SFT launch: loaded with SFTTrainerConfig, validated for its ranks."""
    with contextlib.chdir(launch["cwd"]):
        try:
            SFTTrainerConfig.from_cli(launch["overrides"]).validate(dp_size=launch["nproc"])
        except ConfigError as e:
            msg = first_line(e)
            return ("refused backend" if re.search(r"the [\w -]+ backend is not supported", msg) else "error"), msg
        except Exception:
            return "crash", traceback.format_exc().strip().splitlines()[-1]
    return "parsed+validated", ""


def captured_calls(capture: Path) -> list[tuple[str, str, str, list[str]]]:
    """``(script, cwd, command, argv)`` of every call the stubs recorded, in call order."""
    calls = []
    for f in sorted(capture.iterdir()):
        script, cwd, cmd, *argv = f.read_bytes().split(b"\0")[:-1]
        calls.append((script.decode(), cwd.decode(), cmd.decode(), [a.decode(errors="replace") for a in argv]))
    return calls


def launches_from(calls: list[tuple[str, str, str, list[str]]]) -> list[dict]:
    """Main-ppo launches in the captured calls (ordered by call time)."""
    out = []
    for script, cwd, cmd, argv in calls:
        if cmd == "ray":
            if "--" not in argv:
                continue
            argv = argv[argv.index("--") + 1:]
        idx = next((i + 1 for i in range(len(argv) - 1) if argv[i] == "-m" and argv[i + 1] == MODULE), None)
        if idx is None:
            idx = next((i for i, a in enumerate(argv) if a.endswith("verl/trainer/main_ppo.py")), None)
        if idx is not None:
            out.append({"script": script, "cwd": cwd, "via": cmd, "overrides": argv[idx + 1:]})
    return out


def obvious_backend(overrides: list[str]) -> str | None:
    """The non-FSDP backend that the overrides obviously select (a heuristic), else None: a
    --config-name naming one, a set key of one (actor.megatron.x=...), or a selector key
    (model_engine, *.strategy, a@b group choice) whose value names one."""
    for i, arg in enumerate(overrides):
        key, _, value = arg.partition("=")
        if key == "--config-name":
            m = BACKEND_HINT.search(value or (overrides[i + 1] if i + 1 < len(overrides) else ""))
        elif "=" in arg and not arg.startswith("-"):
            m = BACKEND_HINT.search(key) if value not in ("null", "None", "") else None
            if m is None and ("@" in key or key.endswith(("model_engine", "strategy"))):
                m = BACKEND_HINT.search(value)
        else:
            m = None
        if m:
            return m.group(0).lower()
    return None


def cut(text: str, n: int = 220) -> str:
    return text if len(text) <= n else text[:n] + "..."


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def classify(launch: dict) -> tuple[str, str]:
    """(category, detail) for one launch, loading it with our config system."""
    with contextlib.chdir(launch["cwd"]):
        try:
            cfg = TrainerConfig.from_cli(launch["overrides"])
        except ConfigError as e:
            msg = first_line(e)
            # Refusals name the backend ("the Megatron-LM backend"); "attention_backend" is no such thing.
            names = {n.lower() for n in BACKENDS} | {v.lower() for v in BACKENDS.values()}
            named = re.search(r"(?:the |of the )([\w-]+) backend", msg, re.I)
            return ("refused backend" if named and named.group(1).lower() in names | {"megatron"}
                    else "parse error"), msg
        except Exception:
            return "crash", traceback.format_exc().strip().splitlines()[-1]
        try:
            cfg.validate()
            # What main_ppo checks before loading anything: estimator, loss and engine names.
            check_algorithm_names(cfg)
        except ConfigError as e:
            return "parsed, validate error", first_line(e)
        except Exception:
            return "crash", traceback.format_exc().strip().splitlines()[-1]
    return "parsed+validated", ""


def key_stats(launches: list[dict]) -> dict:
    """Apply each distinct override key (first occurrence) alone."""
    first: dict[str, tuple[str, str]] = {}
    for launch in launches:
        for arg in launch["overrides"]:
            if "=" in arg and not arg.startswith("-"):
                first.setdefault(arg.split("=", 1)[0], (arg, launch["cwd"]))
    failing = {}
    for key, (arg, cwd) in sorted(first.items()):
        with contextlib.chdir(cwd):
            try:
                TrainerConfig.from_cli([arg])
            except Exception as e:  # ConfigError, or a crash
                failing[key] = {"override": arg, "error": first_line(e) if isinstance(e, ConfigError)
                                else "crash: " + traceback.format_exc().strip().splitlines()[-1]}
    kinds = Counter("unknown key" if f["error"].startswith("unknown config key") else "not supported here"
                    if "is not supported here" in f["error"] else "other" for f in failing.values())
    return {"distinct": len(first), "ok": len(first) - len(failing), "failing": failing, "failing_kinds": kinds}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verl-git", default="/work/.mirror/verl-project+verl/repo")
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("-v", action="store_true", help="print each launch's failure")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # "has no effect here" warnings of the loader
    head = subprocess.run(["git", "--git-dir", args.verl_git, "rev-parse", "HEAD"],
                          check=True, capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="verl_scan_") as tmp:
        root = Path(tmp)
        scripts = extract_examples(args.verl_git, root)
        mentions = {s for s in scripts if re.search(re.escape(MODULE) + r"(?![\w.])", (root / s).read_text(errors="replace"))}
        make_stubs(root / ".stubs")
        script_notes, script_vars = {}, {}
        for script in scripts:
            note, given = run_script(root, root / ".stubs", root / ".capture", script)
            if note:
                script_notes[script] = note
            if given:
                script_vars[script] = sorted(given)
        calls = captured_calls(root / ".capture") if (root / ".capture").exists() else []
        launches = launches_from(calls)
        for launch in launches:
            launch["obvious_backend"] = obvious_backend(launch["overrides"])
            launch["category"], launch["detail"] = classify(launch)
        keys = key_stats([l for l in launches if l["category"] != "refused backend" and not l["obvious_backend"]])
        sft = sft_launches_from(calls)
        for launch in sft:
            launch["category"], launch["detail"] = classify_sft(launch)
        text = json.dumps({"launches": launches, "keys": keys, "sft": sft}).replace(tmp, "$TMP")  # no temp paths
        launches, keys, sft = (json.loads(text)[k] for k in ("launches", "keys", "sft"))
    cats = Counter(l["category"] for l in launches)
    with_launch = {l["script"] for l in launches}
    print(f"verl HEAD {head[:12]}: {len(scripts)} .sh files under examples/, {len(with_launch)} of them "
          f"launch {MODULE}; {len(launches)} launches")
    print(f"obviously another backend (heuristic): {sum(bool(l['obvious_backend']) for l in launches)}; "
          f"refused backend but not flagged: {sum(l['category'] == 'refused backend' and not l['obvious_backend'] for l in launches)}; "
          f"flagged but not refused: {sum(l['category'] != 'refused backend' and bool(l['obvious_backend']) for l in launches)}")
    for cat in ("parsed+validated", "parsed, validate error", "refused backend", "parse error", "crash"):
        print(f"  {cat:24s} {cats.get(cat, 0)}")
    missed = sorted(mentions - with_launch)
    print(f"scripts mentioning {MODULE}: {len(mentions)}; without a captured launch: {len(missed)}"
          + "".join(f"\n    {s}" for s in missed))
    if script_vars:
        print("scripts rerun with required variables set: " +
              "; ".join(f"{s} ({', '.join(v)})" for s, v in script_vars.items()))
    print(f"scripts that timed out / exited non-zero: {len(script_notes)}")
    for s, n in script_notes.items():
        if args.v or s in mentions:
            print(f"    {s}{' [mentions main_ppo]' if s in mentions else ''}: {n}")
    print("failing launches (not parsed+validated, not refused backend):")
    for l in launches:
        if l["category"] not in ("parsed+validated", "refused backend"):
            print(f"  {l['script']} [{l['category']}{'; ' + l['obvious_backend'] if l['obvious_backend'] else ''}] "
                  f"{cut(l['detail'])}")
    if args.v:
        print("refused-backend launches:")
        for l in launches:
            if l["category"] == "refused backend":
                print(f"  {l['script']} [{l['obvious_backend'] or 'not flagged'}] {cut(l['detail'])}")
    print(f"distinct override keys in launches neither refused nor flagged as another backend: {keys['distinct']}; "
          f"parse alone: {keys['ok']}; error: {len(keys['failing'])} {dict(keys['failing_kinds'])}")
    for key, info in keys["failing"].items():
        print(f"  {info['override']}: {cut(info['error'])}")
    sft_cats = Counter(l["category"] for l in sft)
    print(f"SFT launches ({' / '.join(SFT_MODULES)}): {len(sft)} in {len({l['script'] for l in sft})} scripts")
    for cat in ("parsed+validated", "refused backend", "error", "crash"):
        print(f"  {cat:24s} {sft_cats.get(cat, 0)}")
    for l in sft:
        if l["category"] != "parsed+validated":
            print(f"  {l['script']} [{l['category']}] {cut(l['detail'])}")
    if args.json:
        Path(args.json).write_text(json.dumps({"verl_head": head, "sh_files": scripts, "script_notes": script_notes,
                                               "script_vars": script_vars,
                                               "launches": launches, "categories": dict(cats), "keys": keys,
                                               "sft_launches": sft, "sft_categories": dict(sft_cats)},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
