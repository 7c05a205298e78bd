"""Test files split into shards of about equal time, for make test's side-by-side processes
(tools/test_suites.sh): longest first, each onto the shard with the least so far, by the CPU seconds per file in
tests/durations.json (a file not listed there counts DEFAULT).

    python tools/shards.py N K FILE...        the files of shard K of N, one per line
    python tools/shards.py update LOG...      rewrite tests/durations.json from pytest --durations=0 logs
                                              (make test's .cache/test-*.log): each file's seconds, halved
                                              because its processes share two cores
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

TABLE = Path(__file__).resolve().parents[1] / "tests" / "durations.json"
DEFAULT = 3.0


def shards(n: int, files: list[str], seconds: dict[str, float]) -> list[list[str]]:
    out, load = [[] for _ in range(n)], [0.0] * n
    for f in sorted(files, key=lambda f: (-seconds.get(f, DEFAULT), f)):
        k = load.index(min(load))
        out[k].append(f)
        load[k] += seconds.get(f, DEFAULT)
    return [sorted(s) for s in out]


def update(logs: list[str]) -> dict[str, float]:
    spent: Counter = Counter()
    for log in logs:
        for line in Path(log).read_text().splitlines():
            m = re.match(r"^([0-9.]+)s (?:call|setup|teardown)\s+(\S+?)::", line)
            if m:
                spent[m.group(2)] += float(m.group(1))
    return {f: round(s / 2, 1) for f, s in sorted(spent.items())}


def main(argv: list[str]) -> int:
    if argv[:1] == ["update"]:
        TABLE.write_text(json.dumps(update(argv[1:]), indent=0, sort_keys=True) + "\n")
        return 0
    n, k, files = int(argv[0]), int(argv[1]), argv[2:]
    print("\n".join(shards(n, files, json.loads(TABLE.read_text()))[k]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
