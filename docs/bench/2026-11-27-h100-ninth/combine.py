"""StormCast's rollout rows in one bench JSON: the eager rows of the rollout bench
(call 3) and the compiled rows of two fresh processes that loaded the artifacts
its background builds made (call 7, ``cold_then_warm.sh``: both found them), on
the same H100 machine. The rollout bench's own compiled row compiles in its
process and did not end within the call.

    python3 docs/bench/2026-11-27-h100-ninth/combine.py
"""

import json
import sys
from pathlib import Path

from earth2studio_compile.tools.bench.results import against_eager

HERE = Path(__file__).parent
rollout = json.loads((HERE / "stormcast-rollout-b3a8d58.json").read_text())
results = [r for r in rollout["results"] if r["mode"] == "eager"]
for name in ("first", "second"):
    row = json.loads((HERE / f"stormcast-aot-{name}-process-b3a8d58.json").read_text())
    row["cache"] = "aot"  # the artifact was there: loaded, verified, captured
    row.update(against_eager(results, row["model"], row["precision"], row))
    results.append(row)
environment = {**rollout["environment"], "date": "2026-11-27T01:06:18+00:00"}
out = {
    "environment": environment,
    "argv": ["docs/bench/2026-11-27-h100-ninth/combine.py", *sys.argv[1:]],
    "results": results,
    "e2e": [],
}
(HERE / "stormcast-aot-b3a8d58.json").write_text(json.dumps(out, indent=1))
