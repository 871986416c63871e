"""verl.utils.command: a command-line process freezes the heap out of the garbage collector's scans once
its modules are imported and again at its exit; a program that calls an entry point's main() is frozen
only at its exit, and the exit still does everything it did (other exit callbacks, files flushed and closed)."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def _out(code: str, cwd: Path) -> list[str]:
    result = _run(code, cwd)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_the_heap_freezes_at_exit_not_before_and_the_exit_still_finalises(tmp_path):
    out = _out(f"""
        import atexit, gc, weakref
        atexit.register(lambda: print("after", gc.get_freeze_count() > 0))   # runs after ours (last in, first out)
        from verl.utils.command import freeze_heap_at_exit
        freeze_heap_at_exit()
        freeze_heap_at_exit()   # once per process
        gc.collect()
        print("before", gc.get_freeze_count() > 0)
        class Holder: pass
        log = open({str(tmp_path / "unclosed.txt")!r}, "w")   # never closed: the exit must still flush it
        log.write("written before exit")
        held = Holder()
        weakref.finalize(held, print, "finalizer ran")
        """, tmp_path)
    assert out == ["before", "False", "finalizer", "ran", "after", "True"]
    assert (tmp_path / "unclosed.txt").read_text() == "written before exit"


def test_run_command_freezes_before_main_and_exits_with_its_code(tmp_path):
    result = _run("""
        import gc
        from verl.utils.command import run_command
        def main():
            print("frozen while main runs:", gc.get_freeze_count() > 0)
            return 3
        run_command(main)
        """, tmp_path)
    assert result.returncode == 3, result.stderr
    assert result.stdout.split() == ["frozen", "while", "main", "runs:", "True"]


def test_the_console_script_freezes_its_imports_and_a_caller_of_main_is_left_alone(tmp_path):
    out = _out("""
        import gc
        from verl.cli import _imported
        _imported(False)      # verl.cli.main(["eval", ...]) called by a program: nothing frozen
        print(gc.get_freeze_count())
        _imported(True)       # the `verl` console script (main() reads sys.argv)
        print(gc.get_freeze_count() > 0)
        """, tmp_path)
    assert out == ["0", "True"]


def test_every_command_line_entry_registers_the_exit_freeze(tmp_path):
    # `verl <command>`, every trainer's run_entry, the merger and the doctor: in place once the command runs.
    for call in ("from verl.cli import main; main(['version'])",
                 "from verl.trainer.entry import run_entry; run_entry(lambda: None, [], None)",
                 "from verl.model_merger.__main__ import main; main(['merge', '--local_dir', 'none', '--target_dir', 'out'])",
                 "from verl.doctor import main; main(['--json', '--skip-step'])"):
        out = _out(f"""
            import atexit, gc
            atexit.register(lambda: print("frozen", gc.get_freeze_count() > 0))
            {call}
            """, tmp_path)
        assert out[-2:] == ["frozen", "True"], (call, out)


def _main_block_calls(tree: ast.Module) -> list[str]:
    """The names called in the module's ``if __name__ == "__main__":`` block, if it has one."""
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            return [ast.unparse(call.func) for stmt in node.body for call in ast.walk(stmt) if isinstance(call, ast.Call)]
    return []


def test_every_entry_module_runs_its_main_through_run_command():
    entries = {}
    for path in sorted((REPO / "verl").rglob("*.py")):
        calls = _main_block_calls(ast.parse(path.read_text()))
        if "main" in calls or "run_command" in calls:
            entries[str(path.relative_to(REPO))] = calls
    assert "verl/trainer/main_ppo.py" in entries and "verl/cli.py" in entries, entries
    assert len(entries) >= 12, entries
    for path, calls in entries.items():
        assert calls == ["run_command"], f"{path}: `if __name__ == '__main__':` calls {calls}, not run_command(main)"


def test_a_reader_that_stops_early_ends_a_command_quietly(tmp_path):
    # `verl train --help | head -1`: the reader is gone before the help is written (closed at once here,
    # while the command still imports), so writing it fails with EPIPE; exit 141, as a C program's, no traceback.
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    for command in ([sys.executable, "-m", "verl.trainer.main_ppo", "--help"],
                    [sys.executable, "-c", "import sys; from verl.cli import main; sys.argv = ['verl', 'train', '--help']; "
                                           "sys.exit(main())"]):
        proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdout.close()
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 141, (command, err.decode()[-2000:])
        assert b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()[-2000:]
