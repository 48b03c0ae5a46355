"""What a fault campaign runs: the servers, the objects on them, the clients' settings and
how many actors of each type every worker process runs. Shared by the orchestrator, the
workers and the checker, so that all three agree on names and capacities."""

from __future__ import annotations

from typing import Final

#: the Redis servers: s0 carries every single-server type and is a member of the multi-lock
#: and the red lock with s1 and s2; s3 carries the types whose whole state is their count
#: (the plain semaphore, the latch), which a server restarted empty cannot keep (nothing
#: on the server says who holds a plain permit), so s3 gets every fault but data loss.
SERVERS: Final = ("s0", "s1", "s2", "s3")
#: the servers that may be killed or restarted empty
WIPEABLE: Final = ("s0", "s1", "s2")

LOCKS: Final = ("L0", "L1", "M-a")  # "M-a" is also the multi-lock's member on s0
FENCED: Final = "F0"
SPIN: Final = "K0"
FAIR: Final = "R0"
RW: Final = "W0"
PERMITS: Final = "P0"
PERMITS_CAP: Final = 2
SEMAPHORE: Final = "S0"
SEMAPHORE_CAP: Final = 2
LATCH: Final = "C0"
MULTI: Final = (("s0", "M-a"), ("s1", "M-b"), ("s2", "M-c"))
RED: Final = "RL"
RED_SERVERS: Final = ("s0", "s1", "s2")

#: locks on the Sentinel-managed deployment "sn" (``python -m tests.chaos --sentinel``)
SENTINEL_LOCKS: Final = ("N0", "N1")
#: lock actors per process on it
SENTINEL_ACTORS: Final = 2

#: the clients' configuration: short leases and timeouts, so that faults turn into losses,
#: reconnections and give-ups often (Config fields)
CLIENT: Final = {
    "watchdog_timeout": 1.5,
    "command_timeout": 0.5,
    "cleanup_timeout": 1.0,
    "ping_interval": 1.0,
    "reconnect_max_delay": 0.5,
}
#: the fair lock's wait allowance (seconds)
FAIR_ALLOWANCE: Final = 2.0

#: actors per worker process, by type
ACTORS: Final = {
    "lock": 2,
    "fenced_lock": 1,
    "spin_lock": 1,
    "fair_lock": 1,
    "read_write_lock": 2,
    "permit_semaphore": 1,
    "semaphore": 1,
    "multi_lock": 1,
    "red_lock": 1,
    "latch": 1,
}

#: the keys a campaign leaves on purpose, per server: the counts it set up (semaphores,
#: latch) and the fencing token counter (Redisson's layout gives it no TTL)
KEPT: Final = {
    "s0": {PERMITS, f"redisson_lock_token:{{{FENCED}}}"},
    "s3": {SEMAPHORE, LATCH},
}
