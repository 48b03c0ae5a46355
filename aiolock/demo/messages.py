"""What the demo's runner and its worker processes tell each other: one JSON object per line.

The runner writes a :class:`Job` on a worker's stdin; the worker answers on its stdout with
``{"event": "ready"}`` once (after its imports), then per job ``progress`` events and finally
one ``done`` (a :class:`WorkerResult`) or ``error`` event.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from .sale import Outcome


@dataclass(frozen=True, slots=True)
class Job:
    """One worker's share of one strategy's sale."""

    strategy: str
    redis_url: str
    key_prefix: str
    attempts: list[tuple[int, int]]
    """(attempt number, user id) pairs, in arrival order; the number makes the order id."""
    concurrency: int
    """How many buyers (asyncio tasks) this worker runs at once."""

    def to_line(self) -> bytes:
        return json.dumps(asdict(self)).encode() + b"\n"

    @classmethod
    def from_line(cls, line: str | bytes) -> Job:
        data = json.loads(line)
        data["attempts"] = [(int(n), int(user)) for n, user in data["attempts"]]
        return cls(**data)


@dataclass(slots=True)
class WorkerResult:
    """What one worker saw: how each attempt ended and how long each buyer waited."""

    outcomes: Counter[Outcome] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)

    def add(self, outcome: Outcome, latency_ms: float) -> None:
        self.outcomes[outcome] += 1
        self.latencies_ms.append(latency_ms)

    def to_event(self) -> dict[str, Any]:
        return {
            "event": "done",
            "outcomes": {str(outcome): n for outcome, n in self.outcomes.items()},
            "latencies_ms": [round(ms, 3) for ms in self.latencies_ms],
        }

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> WorkerResult:
        outcomes = Counter({Outcome(name): int(n) for name, n in event["outcomes"].items()})
        return cls(outcomes, [float(ms) for ms in event["latencies_ms"]])
