"""A stand-alone grader process for the delayed-reward test: it watches a run's SQL buffer for
pending experiences, waits ``delay`` seconds (a slow judge), then posts their rewards with
``trine buffer reward RUN_DIR FILE`` — the same path a human labeller or an external service uses.

Usage: python tests/e2e/grader.py RUN_DIR DELAY STOP_FILE
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trine.buffer.inspect import read_rows


def main(run_dir: str, delay: float, stop_file: str) -> None:
    posted: set[str] = set()
    while not Path(stop_file).exists():
        if not (Path(run_dir) / "buffer.db").exists():
            time.sleep(0.2)
            continue
        pending = [e for e, _ in read_rows(run_dir, "pending") if e.id not in posted]
        if not pending:
            time.sleep(0.2)
            continue
        time.sleep(delay)
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            for e in pending:
                correct = e.info.get("response", "").strip() == str(e.info.get("answer"))
                f.write(json.dumps({"id": e.id, "reward": float(correct)}) + "\n")
        subprocess.run(
            [sys.executable, "-m", "trine.cli", "buffer", "reward", run_dir, f.name],
            check=True,
            capture_output=True,
        )
        posted.update(e.id for e in pending)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), sys.argv[3])
