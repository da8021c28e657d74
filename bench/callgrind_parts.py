"""The instruction totals of a callgrind run split into parts (`--dump-before=FUNCTION`): one file ``cg.N`` per part.

Used by the benchmarks that mark their steps with a call callgrind dumps before (``os.getppid``):
`bench/internals_cost.py`, `bench/pg_direct_cost.py`.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path


def part_totals(out: Path) -> list[int]:
    """Instructions of each part under `out` (``cg.1``, ``cg.2``, … in part order; 0 for a part without a total)."""
    parts = sorted(glob.glob(str(out / "cg.*")), key=lambda p: [int(x) for x in re.findall(r"\d+", p.rsplit("cg", 1)[1])])
    totals = []
    for p in parts:
        text = Path(p).read_text(errors="replace")
        m = re.search(r"^summary:\s+(\d+)", text, re.M) or re.search(r"^totals:\s+(\d+)", text, re.M)
        totals.append(int(m.group(1)) if m else 0)
    return totals
