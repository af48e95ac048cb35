"""The daemon process's garbage-collector settings once it serves (``core.gc_policy``)."""

from __future__ import annotations

import ast
import subprocess
import sys

from ibacm.core.gc_policy import YOUNG_THRESHOLD

_PROBE = """
import gc
import weakref
from ibacm.core import gc_policy
class Node:
    pass
before = gc.get_threshold()
kept = [[n] for n in range(5000)]  # start-up's long-lived objects
garbage = Node()
garbage.me = garbage  # start-up's garbage: a cycle only the collector frees
gone = weakref.ref(garbage)
del garbage
gc.disable()  # nothing collects it before settle does
gc_policy.settle()
print(repr((gc.get_freeze_count(), gc.get_threshold(), before, gone() is None)))
"""


def test_settle_freezes_what_start_up_made_and_collects_the_young_less_often() -> None:
    # In a process of its own: the settings are the whole process's.
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    frozen, threshold, before, garbage_freed = ast.literal_eval(done.stdout.strip())
    assert frozen >= 5000  # the kept lists are out of every later collection
    assert threshold == (YOUNG_THRESHOLD, before[1], before[2])
    assert before[0] < YOUNG_THRESHOLD
    assert garbage_freed  # start-up's garbage was collected, not frozen
