"""One flash sale in Redis: its key names, the buyers' outcomes, and who tries to buy when."""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum


class Outcome(StrEnum):
    """What a purchase attempt tells the buyer."""

    BOUGHT = "bought"
    SOLD_OUT = "sold_out"
    ALREADY_BOUGHT = "already_bought"


@dataclass(frozen=True, slots=True)
class SaleKeys:
    """The Redis keys and lock names of one strategy's run, all under ``prefix``.

    Data keys carry the ``{seckill}`` hash tag so that the Lua script's keys share one cluster
    slot; every name starts with the run's prefix, so a run never touches anyone else's data
    and its keys can be found again (``pattern``) and deleted.
    """

    prefix: str

    @classmethod
    def for_run(cls, run_id: str, strategy: str) -> SaleKeys:
        return cls(f"aiolock-demo:{run_id}:{strategy}:")

    @property
    def stock(self) -> str:
        """A string: the coupons left."""
        return f"{self.prefix}{{seckill}}:stock"

    @property
    def buyers(self) -> str:
        """A set of the user ids that bought (the one-per-user check)."""
        return f"{self.prefix}{{seckill}}:buyers"

    @property
    def orders(self) -> str:
        """A list with one user id per order (naive and lock strategies)."""
        return f"{self.prefix}{{seckill}}:orders"

    @property
    def stream(self) -> str:
        """The stream of orders waiting for the database writers (lua strategy)."""
        return f"{self.prefix}{{seckill}}:order-stream"

    @property
    def stock_lock(self) -> str:
        return f"{self.prefix}seckill:stock"

    def user_lock(self, user_id: int) -> str:
        return f"{self.prefix}seckill:user:{user_id}"

    @property
    def pattern(self) -> str:
        """A SCAN pattern matching every key of this run (locks and their side keys too)."""
        return f"*{self.prefix}*"


def arrivals(users: int, attempts: int, seed: int) -> list[int]:
    """The user ids (1..users) of ``attempts`` purchase attempts, in arrival order.

    Every user tries at least once when there are enough attempts; the rest are second (and
    third...) tries of random users, so some users try more than once. Same seed, same list.
    """
    rng = random.Random(seed)
    if attempts < users:
        return rng.sample(range(1, users + 1), attempts)
    order = list(range(1, users + 1))
    order += rng.choices(range(1, users + 1), k=attempts - users)
    rng.shuffle(order)
    return order
