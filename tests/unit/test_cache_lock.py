"""Two runs that build the same cache entry at once: the second waits for the first (flock), says so
once, and then finds the entry built; a holder that dies releases the lock."""

import select
import subprocess
import sys

from verl.utils.cache import cache_lock

WAITER = """
import sys
from pathlib import Path
from verl.utils.cache import cache_lock
entry = Path(sys.argv[1])
with cache_lock(entry, waiting="waiting for the other build"):
    print("built by the first" if (entry / "done").exists() else "building", flush=True)
"""


def _waiter(entry):
    return subprocess.Popen([sys.executable, "-c", WAITER, str(entry)], stdout=subprocess.PIPE, text=True)


def test_a_second_builder_waits_for_the_first_and_finds_its_result(tmp_path):
    entry = tmp_path / "warmstart-abc"
    with cache_lock(entry):
        proc = _waiter(entry)
        # Its first line comes once it has reached the lock (however long its start-up takes on a loaded
        # machine); a waiter that did not wait would say "building" instead.
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready, "the second builder said nothing in 120 s"
        assert proc.stdout.readline().strip() == "waiting for the other build"
        assert proc.poll() is None, "the second builder did not wait"
        entry.mkdir()
        (entry / "done").write_text("1")
    out, _ = proc.communicate(timeout=60)
    assert out.splitlines() == ["built by the first"]


def test_an_unheld_lock_is_taken_at_once_and_a_dead_holder_releases_it(tmp_path):
    entry = tmp_path / "entry"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from verl.utils.cache import cache_lock\n"
                               "with cache_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(600)",
                               str(entry)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.kill()  # a crash mid-build: the kernel drops its lock
    holder.wait()
    out, _ = _waiter(entry).communicate(timeout=60)
    assert out.splitlines() == ["building"]
