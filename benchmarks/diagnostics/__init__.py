"""Small reproductions of aiolock misbehaviour found while benchmarking (run with ``python -m``).

* ``benchmarks.diagnostics.aclose_hang`` - ``AioLock.aclose()`` hangs (or raises) right after a
  waiter took the lock: the pub/sub writer task swallows its cancellation.
* ``benchmarks.diagnostics.lost_wakeup`` - two processes contend, then stop: are waiters left
  waiting while the lock is free (a lost wake-up)?
"""
