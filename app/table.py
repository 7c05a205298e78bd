"""One formatter for every table the command line prints: aligned text, or markdown."""

from __future__ import annotations


def table(rows: list[dict], cols: list[str], markdown: bool = False, title: str = "") -> str:
    """``rows`` as columns ``cols``; numbers right-aligned, text left-aligned."""
    cells = [[_fmt(r.get(c)) for c in cols] for r in rows]
    right = [all(isinstance(r.get(c), int | float) or r.get(c) is None for r in rows) for c in cols]
    head = [f"{title}\n" if title else ""]
    if markdown:
        lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---:" if r else "---" for r in right) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in cells]
        return head[0] + "\n".join(lines)
    width = [max(len(c), *(len(row[k]) for row in cells)) if cells else len(c) for k, c in enumerate(cols)]

    def line(vals):
        return "  ".join(v.rjust(w) if r else v.ljust(w) for v, w, r in zip(vals, width, right, strict=True)).rstrip()

    return head[0] + "\n".join([line(cols), line(["-" * w for w in width]), *(line(row) for row in cells)])


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)
