"""tools/bench_ab.py's comparison (two builds' replayed steps from one device call) on runs written by hand:
each side's mean over its runs, this tree minus the reference, a cell one side lacks named, each run's
first line (which device, which pinning) shown."""

import json
import os
import runpy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AB = runpy.run_path(os.path.join(ROOT, "tools", "bench_ab.py"), run_name="bench_ab")


def _row(bs, attnmeta, floor, equal=60, kind="triton"):
    return {"kind": kind, "page": 1, "mode": "decode", "bs": bs, "attnmeta_us": attnmeta, "floor_us": floor,
            "over_us": attnmeta - floor, "equal": equal, "steps": 60}


def test_each_side_is_the_mean_of_its_runs_and_the_difference_is_this_minus_the_reference(tmp_path):
    runs = {"1-ref": [_row(1, 22.0, 16.0), _row(8, 30.0, 20.0)],
            "2-this": [_row(1, 21.0, 16.0), _row(8, 33.0, 21.0), _row(1, 9.0, 5.0, kind="flashinfer")],
            "3-this": [_row(1, 23.0, 18.0), _row(8, 35.0, 23.0, equal=59)],
            "4-ref": [_row(1, 26.0, 18.0), _row(8, 32.0, 22.0)]}
    for name, rows in runs.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(rows))
        (tmp_path / f"{name}.log").write_text(f"torch 2.11, NVIDIA H100 80GB HBM3, host pinned to CPU 0 ({name})\n|...")
    text = AB["compare"](str(tmp_path))
    assert "runs: 2 of the reference" in text and ", 2 of this tree" in text
    assert "4-ref: torch 2.11, NVIDIA H100 80GB HBM3, host pinned to CPU 0 (4-ref)" in text
    # bs 1: ref (22 + 26) / 2 = 24, this (21 + 23) / 2 = 22; floors 17 and 17; over floor 7 and 5
    assert "| triton | 1 | decode | 1 | 24.0 | 22.0 | -2.0 | 17.0 | 17.0 | +7.0 | +5.0 | 240/240 |" in text
    # bs 8: ref 31, this 34 (+3); floors 21 and 22; one step of one run unequal
    assert "| triton | 1 | decode | 8 | 31.0 | 34.0 | +3.0 | 21.0 | 22.0 | +10.0 | +12.0 | 239/240 |" in text
    assert "| flashinfer | 1 | decode | 1 | | | measured on one side only |" in text


def test_a_run_cut_short_compares_what_it_has(tmp_path):
    (tmp_path / "1-ref.json").write_text(json.dumps([_row(1, 20.0, 15.0)]))
    (tmp_path / "2-this.json").write_text(json.dumps([_row(1, 21.5, 15.5)]))
    text = AB["compare"](str(tmp_path))
    assert "runs: 1 of the reference" in text and ", 1 of this tree" in text
    assert "| triton | 1 | decode | 1 | 20.0 | 21.5 | +1.5 | 15.0 | 15.5 | +5.0 | +6.0 | 120/120 |" in text
