"""Run the reliability suite against real servers and print its table.

    python -m benchmarks.reliability --out runs/reliability.json            # every row, full size
    python -m benchmarks.reliability --size short --cases 1,8,12 --out R.json

Each row starts (or shares) a `python -m server` on loopback, injects its fault, load or abuse with
real aiortc peers, and checks what had to hold. The table: case, what was injected, what had to
hold, the figures, pass/fail; the JSON holds every check and figure. Exit status 1 if a row failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.reliability import cases  # noqa: F401  (registers the rows)
from benchmarks.reliability.harness import CASES, CaseResult, Lab, Size, run_case
from benchmarks.stats import cpu_model


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.reliability", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="where the JSON report goes")
    p.add_argument("--size", choices=[s.value for s in Size], default=Size.FULL.value)
    p.add_argument("--cases", default=None, help="comma-separated row numbers (default: all)")
    p.add_argument("--logs", type=Path, default=None, help="server logs (default: next to --out)")
    args = p.parse_args(argv)
    if args.cases:
        args.numbers = [int(n) for n in args.cases.split(",")]
        unknown = sorted(set(args.numbers) - set(CASES))
        if unknown:
            p.error(f"no such case(s): {unknown}; the rows are {sorted(CASES)}")
    else:
        args.numbers = sorted(CASES)
    return args


def table(results: list[CaseResult]) -> str:
    rows = ["| # | case | injected | must hold | figures | result |", "|---|---|---|---|---|---|"]
    for r in results:
        figures = "; ".join(f"{c.what}: {c.figure}" for c in r.checks)
        if r.error:
            figures += f"; error: {r.error}"
        verdict = "pass" if r.passed else "**FAIL**"
        rows.append(f"| {r.number} | {r.name} | {r.injected} | {r.must_hold} | {figures} | {verdict} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    size = Size(args.size)
    logs = args.logs or args.out.with_suffix("").with_name(args.out.stem + "-logs")
    lab = Lab(size, logs)
    results: list[CaseResult] = []
    t0 = time.monotonic()
    try:
        for n in args.numbers:
            print(f"[{time.monotonic() - t0:6.0f} s] #{n} {CASES[n].name} …", flush=True)
            result = run_case(CASES[n], lab)
            print(result.report(), flush=True)
            results.append(result)
    finally:
        lab.close()
    report = {
        "size": size.value,
        "cpu_model": cpu_model(),
        "seconds": time.monotonic() - t0,
        "passed": all(r.passed for r in results),
        "cases": [r.to_json() for r in results],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=str))
    print()
    print(table(results))
    print(f"\n{sum(r.passed for r in results)}/{len(results)} rows pass; report: {args.out}; server logs: {logs}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
