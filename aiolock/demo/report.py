"""The demo's results: what one strategy did, judged, and the summary table."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.markup import escape
from rich.table import Table

from .sale import Outcome


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of ``values``; NaN if there are none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True, slots=True)
class DatabaseCheck:
    """The lua strategy's orders as the database has them."""

    store: str
    table: str
    rows: int
    distinct_users: int


@dataclass(frozen=True, slots=True)
class StrategyResult:
    """One strategy's sale, as Redis recorded it and as the buyers saw it."""

    strategy: str
    coupons: int
    attempts: int
    order_users: list[int]
    """The buyer of every order Redis recorded (the orders list, or the stream)."""
    stock_left: int
    elapsed_s: float
    outcomes: Counter[Outcome]
    latencies_ms: list[float] = field(repr=False)
    database: DatabaseCheck | None = None

    @property
    def sold(self) -> int:
        return len(self.order_users)

    @property
    def oversold(self) -> int:
        """Coupons sold beyond the stock (also visible as a negative stock)."""
        return max(0, self.sold - self.coupons, -self.stock_left)

    @property
    def duplicate_users(self) -> int:
        """Users holding more than one coupon."""
        return sum(1 for n in Counter(self.order_users).values() if n > 1)

    @property
    def throughput(self) -> float:
        """Purchase attempts answered per second."""
        return self.attempts / self.elapsed_s if self.elapsed_s > 0 else math.inf

    @property
    def database_ok(self) -> bool:
        """No database involved, or it holds exactly one order per coupon sold."""
        db = self.database
        return db is None or (db.rows == self.sold and db.distinct_users == db.rows)

    @property
    def correct(self) -> bool:
        """Nothing oversold, nobody with two coupons, stock and orders agree, DB agrees."""
        return (
            self.oversold == 0
            and self.duplicate_users == 0
            and self.sold + self.stock_left == self.coupons
            and self.outcomes[Outcome.BOUGHT] == self.sold
            and self.database_ok
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "strategy": self.strategy,
            "coupons": self.coupons,
            "attempts": self.attempts,
            "sold": self.sold,
            "stock_left": self.stock_left,
            "oversold": self.oversold,
            "duplicate_users": self.duplicate_users,
            "outcomes": {str(k): v for k, v in self.outcomes.items()},
            "elapsed_s": round(self.elapsed_s, 4),
            "throughput_per_s": round(self.throughput, 1),
            "wait_p50_ms": round(percentile(self.latencies_ms, 0.5), 3),
            "wait_p99_ms": round(percentile(self.latencies_ms, 0.99), 3),
            "correct": self.correct,
        }
        if self.database is not None:
            data["database"] = {
                "store": self.database.store,
                "table": self.database.table,
                "rows": self.database.rows,
                "distinct_users": self.database.distinct_users,
                "matches_sold": self.database_ok,
            }
        return data


def summary_table(results: Sequence[StrategyResult]) -> Table:
    """The side-by-side table printed at the end of the demo (fits 80 columns)."""
    coupons = results[0].coupons if results else 0
    table = Table(
        title=f"Flash sale: {coupons:,} coupons, one per user",
        caption="oversold: sold beyond the stock; 2+ coupons: users holding more than one;\n"
        "tries/s: purchase attempts answered per second; p50/p99: a buyer's wait",
        box=box.SIMPLE_HEAVY,
        collapse_padding=True,
        pad_edge=False,
    )
    table.add_column("strategy")
    for heading in ("sold", "left", "oversold", "2+ coupons", "tries/s", "p50 ms", "p99 ms"):
        table.add_column(heading, justify="right")
    table.add_column("verdict")
    for r in results:
        table.add_row(
            r.strategy,
            str(r.sold),
            str(r.stock_left),
            _flag(r.oversold),
            _flag(r.duplicate_users),
            f"{r.throughput:,.0f}",
            f"{percentile(r.latencies_ms, 0.5):.1f}",
            f"{percentile(r.latencies_ms, 0.99):.1f}",
            "[green]correct[/]" if r.correct else "[bold red]WRONG[/]",
        )
    return table


def database_line(result: StrategyResult) -> str:
    """What the database got, for a strategy that writes orders to one."""
    db = result.database
    assert db is not None
    status = "[green]OK[/]" if result.database_ok else "[bold red]MISMATCH[/]"
    return (
        f"{result.strategy}: {db.rows} orders in the database for {result.sold} coupons sold, "
        f"{db.rows - db.distinct_users} users twice: {status}\n  {escape(db.store)}, "
        f"table {escape(db.table)}"
    )


def _flag(count: int) -> str:
    return f"[bold red]{count}[/]" if count else "0"
