"""Every Python snippet in the README runs as written."""

import pathlib
import re

import pytest

README = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
SNIPPETS = re.findall(r"```python\n(.*?)```", README, re.S)


def test_the_readme_has_snippets():
    assert len(SNIPPETS) >= 2


@pytest.mark.parametrize("k", range(len(SNIPPETS)))
def test_readme_snippet_runs(k):
    exec(compile(SNIPPETS[k], f"README.md snippet {k}", "exec"), {"__name__": "readme"})
