"""docs/RELIABILITY.md stays true: every bad input in its table gets the error it names (the cases
live in tests/bad_inputs.py, which also prints the table), the table in the doc is the one the code
prints today, and every test the bug-class table cites exists."""

import pathlib
import re

import pytest

from tests.bad_inputs import CASES, table

DOC = pathlib.Path(__file__).parent.parent / "docs" / "RELIABILITY.md"
TESTS = pathlib.Path(__file__).parent


@pytest.mark.parametrize("case", CASES, ids=[c.what[:40] for c in CASES])
def test_each_bad_input_gets_its_error(case):
    with pytest.raises(BaseException) as e:  # noqa: B017  (the class is checked by name below)
        case.run()
    assert type(e.value).__name__ == case.error
    assert case.says in str(e.value)


def test_the_documented_table_is_the_current_one():
    text = DOC.read_text()
    start, end = "<!-- bad-inputs:start -->\n", "<!-- bad-inputs:end -->"
    documented = text[text.index(start) + len(start) : text.index(end)]
    assert documented == table(), "docs/RELIABILITY.md is stale: regenerate with python -m tests.bad_inputs"


def test_every_cited_test_exists():
    names = set()
    for f in TESTS.rglob("test_*.py"):
        names |= set(re.findall(r"^def (test_\w+)", f.read_text(), re.M))
    cited = set(re.findall(r"`(test_\w+)`", DOC.read_text()))
    assert cited and cited <= names, f"cited but missing: {sorted(cited - names)}"
