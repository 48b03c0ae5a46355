"""aiolock's benchmarks: ``python -m benchmarks`` (see ``benchmarks/README.md``).

Scenarios, each measured side by side with its baseline in the same run:

* :mod:`benchmarks.uncontended` - acquire+release cycles/s vs the raw Lua scripts and redis-py
* :mod:`benchmarks.contended` - 2 processes x 25 tasks on one lock vs redis-py's polling Lock
* :mod:`benchmarks.handoff` - release -> acquire latency across processes
* :mod:`benchmarks.scale` - 10,000 waiters on 1,000 names; 10,000 watchdog-held locks
* :mod:`benchmarks.profile` - pyinstrument/cProfile of the hot paths:
  ``python -m benchmarks.profile``
"""
