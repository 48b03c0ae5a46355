"""Output of a run: the rich tables, ``latest.json`` and the ``latest.png`` plot."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .runner import Row, ScenarioResult, Target


def fmt(value: float | None, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    v = float(value)
    if v == int(v) and abs(v) >= 1 and unit not in ("ms", "s", "us", "KiB", ""):
        return f"{int(v):,}"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    if a == 0:
        return "0"
    return f"{v:.3g}"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


SHORT = {
    "aiolock-watchdog": "wd",
    "redis-py sleep=0.1": "rp(0.1)",
    "redis-py sleep=0.001": "rp(0.001)",
    "redis-py": "rp",
    "bare task": "bare",
    "redis-py evalsha": "rp-evalsha",
    "floor sync": "floor-sync",
    "1 per lock per period": "ref",
}


def ratio_label(key: str) -> str:
    """``aiolock/raw`` -> ``raw``; ``aiolock-watchdog/raw`` -> ``wd/raw``."""
    num, _, den = key.partition("/")
    den = SHORT.get(den, den)
    return den if num == "aiolock" else f"{SHORT.get(num, num)}/{den}"


def target_text(target: Target) -> Text:
    met = target.met
    threshold = fmt(target.threshold)
    if target.value is None:
        value = "-"
    elif abs(target.value) >= 1000:
        value = fmt(target.value)
    else:
        value = f"{target.value:.4g}"
    body = f"{target.label}: {value} {target.op} {threshold}"
    if met is None:
        return Text(f"? {body} (no value)", style="yellow")
    if met:
        return Text(f"MET {body}", style="green")
    return Text(f"MISSED {body}", style="bold red")


def print_header(console: Console, env: dict[str, Any], settings: dict[str, Any]) -> None:
    load = ", ".join(f"{x:.2f}" for x in env["loadavg_at_start"])
    console.rule("[bold]aiolock benchmarks")
    console.print(
        f"Python {env['python']} ({env['implementation']}), redis-py {env['redis_py']}, "
        f"hiredis {env['hiredis']}, uvloop {env['uvloop']}, aiolock {env['aiolock']}\n"
        f"redis-server {env['redis_server']} at {env['redis_url']}; {env['cpus']} CPUs; "
        f"load average at start {load}\n"
        f"loops: {', '.join(env['loops'])}; quick={settings['quick']}; "
        f"watchdog available: {env['watchdog_available']}\n"
        f"round trips = INFO commandstats calls of {', '.join(env['round_trip_commands'])} "
        f"(not counted, also called inside the benchmarked scripts: "
        f"{', '.join(env['round_trip_excluded'])})"
    )


def print_tables(console: Console, results: Sequence[ScenarioResult]) -> None:
    """One table per scenario: a row per (loop, metric), a column per variant."""
    by_scenario: dict[str, list[ScenarioResult]] = {}
    for res in results:
        by_scenario.setdefault(res.scenario, []).append(res)
    for scenario, runs in by_scenario.items():
        variants: list[str] = []
        notes: dict[str, str] = {}
        for res in runs:
            for row in res.rows:
                variants += [v for v in row.values if v not in variants]
                if row.note and row.metric not in notes:
                    notes[row.metric] = row.note
        loads = "; ".join(
            f"{r.loop}: {r.seconds:.0f} s, load {'/'.join(f'{x:.1f}' for x in r.loadavg_before)}"
            for r in runs
        )
        table = Table(
            title=f"[bold]{scenario}[/bold]  [dim]({loads})[/dim]",
            title_justify="left",
            show_lines=False,
        )
        table.add_column("loop", no_wrap=True)
        table.add_column("metric", no_wrap=True)
        for v in variants:
            table.add_column(v, justify="right", style="bold" if v == "aiolock" else None)
        table.add_column("aiolock / baseline")
        table.add_column("target")
        for res in runs:
            if res.error is not None:
                table.add_row(res.loop, Text(f"ERROR {res.error[-200:]}", style="red"))
                table.add_section()
                continue
            for i, row in enumerate(res.rows):
                unit = f" ({row.unit})" if row.unit else ""
                better = {"higher": " ^", "lower": " v"}.get(row.better, "")
                cells = [fmt(row.values[v], row.unit) if v in row.values else "" for v in variants]
                ratios = ", ".join(
                    f"{ratio_label(k)} {fmt_ratio(r)}" for k, r in row.ratios.items()
                )
                targets = Text("\n").join(target_text(t) for t in row.targets)
                table.add_row(
                    res.loop if i == 0 else "",
                    f"{row.metric}{unit}{better}",
                    *cells,
                    ratios,
                    targets,
                )
            table.add_section()
        console.print(table)
        shorts = ", ".join(f"{b}={a}" for a, b in SHORT.items() if a in variants)
        console.print(
            Text(f"  ^ higher is better, v lower is better. {shorts}. ", style="dim")
            + Text("; ".join(f"{m}: {n}" for m, n in notes.items()), style="dim")
        )
        console.print()


#: The targets of issue 9 ("Core, part 1"), in its order: (figure, scenario, metric, target
#: label, baseline variant). Each is a Target on a row of its scenario; this table gathers them.
ISSUE_TABLE: tuple[tuple[str, str, str, str, str], ...] = (
    ("uncontended cycles/s, aiolock / floor", "uncontended", "acquire+release cycles/s",
     "vs floor", "floor"),
    ("client CPU per cycle, aiolock / floor", "uncontended", "client CPU per cycle",
     "vs floor", "floor"),
    ("hand-off p50, aiolock / asyncio floor", "handoff", "hand-off p50", "vs floor", "floor"),
    ("memory per parked waiter (KiB)", "scale", "memory per waiter", "KiB per waiter", "floor"),
    ("aiolock / redis-py Lock, uncontended", "uncontended", "acquire+release cycles/s",
     "vs redis-py", "redis-py"),
)  # fmt: skip


def print_issue_table(console: Console, results: Sequence[ScenarioResult]) -> None:
    """Issue 9's table: each figure of this run beside its target, per loop, MET or MISSED."""
    loops: list[str] = []
    for res in results:
        if res.loop not in loops:
            loops.append(res.loop)
    table = Table(
        title="[bold]issue 9 targets[/bold]  [dim](all from this run; the issue judges the "
        "asyncio loop; load = 1-min load average before the scenario)[/dim]",
        title_justify="left",
    )
    table.add_column("figure", no_wrap=True)
    for loop in loops:
        table.add_column(f"{loop}: value")
        table.add_column(f"{loop}: measured", style="dim")
    for figure, scenario, metric, label, baseline in ISSUE_TABLE:
        cells: list[Text | str] = []
        for loop in loops:
            found = [
                (res, row, t)
                for res in results
                if res.scenario == scenario and res.loop == loop
                for row in res.rows
                if row.metric == metric
                for t in row.targets
                if t.label == label
            ]
            if not found:
                cells += [Text("not run", style="yellow"), ""]
                continue
            res, row, target = found[0]
            unit = f" {row.unit}" if row.unit else ""
            cells.append(target_text(target))
            vs = row.ratios.get(f"aiolock/{baseline}")
            measured = (
                f"aiolock {fmt(row.values.get('aiolock'), row.unit)}{unit}, {baseline} "
                f"{fmt(row.values.get(baseline), row.unit)}{unit}"
            )
            if not label.startswith("vs "):  # an absolute target: show the ratio as well
                measured += f" ({fmt_ratio(vs)})"
            cells.append(f"{measured}; load {res.loadavg_before[0]:.1f}")
        table.add_row(figure, *cells)
    console.print(table)
    console.print()


def print_summary(
    console: Console, results: Sequence[ScenarioResult], close_hangs: Sequence[str]
) -> None:
    met = missed = unknown = 0
    lines: list[Text] = []
    for res in results:
        for row in res.rows:
            for t in row.targets:
                status = t.met
                if status is None:
                    unknown += 1
                elif status:
                    met += 1
                else:
                    missed += 1
                    lines.append(Text(f"  {res.scenario}/{res.loop}: ") + target_text(t))
    errors = [r for r in results if r.error is not None]
    console.rule("[bold]targets")
    console.print(
        f"{met} met, {missed} missed, {unknown} without a value, {len(errors)} scenario errors"
    )
    for line in lines:
        console.print(line)
    for res in errors:
        console.print(Text(f"  ERROR {res.scenario}/{res.loop}: {res.error}", style="red"))
    if close_hangs:
        console.print(
            Text(
                f"  aiolock AioLock.aclose() hung or raised {len(close_hangs)} time(s) "
                "(bounded by the benchmark, see aclose_hangs in the JSON):",
                style="bold red",
            )
        )
        for text in sorted(set(close_hangs)):
            console.print(Text(f"    {text}", style="red"))


# --------------------------------------------------------------------------------------------
# the plot
# --------------------------------------------------------------------------------------------

_COLORS = {
    "aiolock": "#1f77b4",
    "aiolock-watchdog": "#6baed6",
    "floor": "#7f7f7f",
    "floor sync": "#bdbdbd",
    "redis-py evalsha": "#ff9896",
    "bare task": "#7f7f7f",
    "1 per lock per period": "#7f7f7f",
    "redis-py": "#d62728",
    "redis-py sleep=0.1": "#d62728",
    "redis-py sleep=0.001": "#ff9896",
}


#: the figures whose ratios go into the "advantage" summary panel
KEY_METRICS = frozenset(
    {
        "acquire+release cycles/s",
        "client CPU per cycle",
        "acquisitions/s",
        "busy fraction",
        "wait p99",
        "round trips per acquisition",
        "Jain fairness",
        "hand-off p50",
        "hand-off p99",
        "memory per waiter",
        "all waiters acquired once",
    }
)


def _attainment(t: Target) -> float | None:
    """1.0 = exactly on target, > 1 better than the target (for >= and <=)."""
    if t.value is None or math.isnan(t.value):
        return None
    if t.op == "==":
        return 1.0 if t.met else 0.0
    if t.op == ">=":
        return t.value / t.threshold if t.threshold else None
    return t.threshold / t.value if t.value else math.inf


def write_plot(path: Path, results: Sequence[ScenarioResult], env: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple[str, str], list[Row]] = {}
    advantages: list[tuple[str, float]] = []
    for res in results:
        for row in res.rows:
            if any(v for v in row.values.values()):  # all-zero rows live in the targets panel
                groups.setdefault((row.scenario, row.metric), []).append(row)
            for key, rv in row.ratios.items():
                if rv and row.better and key.startswith("aiolock/") and row.metric in KEY_METRICS:
                    adv = rv if row.better == "higher" else 1 / rv
                    label = f"{res.scenario}/{res.loop}: {row.metric} vs {ratio_label(key)}"
                    advantages.append((label, adv))
    targets = [(res, t) for res in results for row in res.rows for t in row.targets]
    cols = 4
    rows_n = math.ceil(len(groups) / cols)
    summary_h = max(4.0, 0.16 * max(len(targets), len(advantages)))
    fig = plt.figure(figsize=(5.2 * cols, 3.6 * rows_n + summary_h))
    grid = fig.add_gridspec(rows_n + 1, cols, height_ratios=[3.6] * rows_n + [summary_h])
    flat = [fig.add_subplot(grid[i // cols, i % cols]) for i in range(len(groups))]
    for ax, ((scenario, metric), rows) in zip(flat, groups.items(), strict=False):
        loops = [r.loop for r in rows]
        variants: list[str] = []
        for r in rows:
            variants += [v for v in r.values if v not in variants]
        width = 0.8 / max(1, len(variants))
        positive = all(
            (r.values.get(v) or 0) > 0 for r in rows for v in variants if r.values.get(v)
        )
        for i, variant in enumerate(variants):
            xs = [j + (i - (len(variants) - 1) / 2) * width for j in range(len(loops))]
            ys = [r.values.get(variant) or 0.0 for r in rows]
            bars = ax.bar(xs, ys, width, label=variant, color=_COLORS.get(variant))
            ax.bar_label(bars, labels=[fmt(y) for y in ys], fontsize=6, rotation=90, padding=2)
        ax.set_xticks(range(len(loops)), loops)
        unit = rows[0].unit
        ax.set_title(f"{scenario}: {metric}" + (f" ({unit})" if unit else ""), fontsize=9)
        if rows[0].log_scale and positive:
            ax.set_yscale("log")
        ax.margins(y=0.25)
        ax.legend(fontsize=6, loc="best")
        ax.tick_params(labelsize=7)
    ax = fig.add_subplot(grid[rows_n, 0:2])
    labels = [
        f"{res.scenario}/{res.loop}\n{t.label} {t.op} {fmt(t.threshold)}" for res, t in targets
    ]
    values = [_attainment(t) for _, t in targets]
    shown = [v if v is not None and math.isfinite(v) else 0.0 for v in values]
    colors = ["#2ca02c" if t.met else "#d62728" for _, t in targets]
    ax.barh(range(len(labels)), shown, color=colors)
    ax.set_yticks(range(len(labels)), [lbl.replace("\n", ": ") for lbl in labels], fontsize=7)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_title("targets: value vs target (>= 1 met)", fontsize=9)
    ax.tick_params(axis="x", labelsize=7)
    ax.invert_yaxis()
    ax = fig.add_subplot(grid[rows_n, 2:4])
    ax.barh(
        range(len(advantages)),
        [a for _, a in advantages],
        color=["#2ca02c" if a >= 1 else "#d62728" for _, a in advantages],
    )
    ax.set_yticks(range(len(advantages)), [lbl for lbl, _ in advantages], fontsize=7)
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_title("aiolock advantage over each baseline (x, > 1 = aiolock better)", fontsize=9)
    ax.tick_params(axis="x", labelsize=7)
    ax.invert_yaxis()
    load = ", ".join(f"{x:.2f}" for x in env["loadavg_at_start"])
    fig.suptitle(
        f"aiolock benchmarks {env['started_at']} - Python {env['python']}, redis-server "
        f"{env['redis_server']}, redis-py {env['redis_py']}, {env['cpus']} CPUs, load {load}",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# re-rendering a saved run: python -m benchmarks.report [path/to/latest.json]
# --------------------------------------------------------------------------------------------


def load(path: Path) -> tuple[dict[str, Any], list[ScenarioResult], list[str]]:
    """Read a ``latest.json`` back into results (for re-printing and re-plotting)."""
    data = json.loads(path.read_text())
    results = []
    for r in data["results"]:
        rows = []
        for row in r["rows"]:
            targets = [
                Target(t["label"], t["value"], t["op"], t["threshold"]) for t in row["targets"]
            ]
            rows.append(Row(**{**row, "targets": targets}))
        res = ScenarioResult(r["scenario"], r["loop"], rows, r["details"], error=r["error"])
        res.seconds = r["seconds"]
        res.loadavg_before = tuple(r["loadavg_before"])
        res.loadavg_after = tuple(r["loadavg_after"])
        results.append(res)
    return data["environment"], results, data.get("aclose_hangs", [])


def main(argv: Sequence[str] | None = None) -> None:
    import argparse

    from .runner import RESULTS_DIR

    parser = argparse.ArgumentParser(prog="python -m benchmarks.report")
    parser.add_argument("json", nargs="?", type=Path, default=RESULTS_DIR / "latest.json")
    parser.add_argument("--plot", type=Path, help="also write the PNG here")
    args = parser.parse_args(argv)
    env, results, hangs = load(args.json)
    console = Console(width=max(160, Console().width))
    print_header(console, env, {"quick": "?"})
    print_tables(console, results)
    print_issue_table(console, results)
    print_summary(console, results, hangs)
    if args.plot:
        write_plot(args.plot, results, env)


if __name__ == "__main__":
    main()
