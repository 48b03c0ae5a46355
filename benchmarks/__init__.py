"""aiolock's benchmarks: ``python -m benchmarks`` (see ``benchmarks/README.md``).

Scenarios, each measured side by side with its baseline in the same run:

* :mod:`benchmarks.floor` - the physical floor: aiolock's Lua scripts on raw asyncio (and
  blocking) connections, no library; the baseline every scenario compares aiolock with
* :mod:`benchmarks.uncontended` - acquire+release cycles/s vs the floor and redis-py
* :mod:`benchmarks.contended` - 2 processes x 25 tasks on one lock vs redis-py's polling Lock
* :mod:`benchmarks.handoff` - release -> acquire latency across processes
* :mod:`benchmarks.scale` - 10,000 waiters on 1,000 names; 10,000 watchdog-held locks
* :mod:`benchmarks.composite` - a multi-lock of 3 locks and a red lock of 3 masters vs one
  lock; the red lock's parallel acquire vs the same 3 locks taken one after another
* :mod:`benchmarks.profile` - pyinstrument/cProfile of the hot paths:
  ``python -m benchmarks.profile``
"""
