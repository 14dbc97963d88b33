"""Compare two runs' metrics.jsonl on every non-timing key, step by step (issue 10's bit-identity check).

Usage: python scripts/compare_metrics.py BEFORE/metrics.jsonl AFTER/metrics.jsonl
Prints the number of steps on each side and the steps whose non-timing records differ (none: ``[]``);
exits 1 when any differ. Timing keys (``time/*``, ``*seconds*``, ``*per_second*``) are ignored.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def stable_records(path: str | Path) -> dict[int, list[dict]]:
    """The records of each step without their timing keys, in file order."""
    out: dict[int, list[dict]] = {}
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        kept = {
            k: v
            for k, v in record.items()
            if not k.startswith("time/") and "seconds" not in k and "per_second" not in k
        }
        out.setdefault(record["step"], []).append(kept)
    return out


def main(before: str, after: str) -> int:
    a, b = stable_records(before), stable_records(after)
    differing = [s for s in sorted(set(a) | set(b)) if a.get(s) != b.get(s)]
    print(f"steps {len(a)} {len(b)} differing steps: {differing[:20]}")
    return 1 if differing else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
