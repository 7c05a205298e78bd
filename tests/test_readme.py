"""Every Python snippet in the README runs as written."""

import pathlib
import re

import pytest

README = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
SNIPPETS = re.findall(r"```python\n(.*?)```", README, re.S)


def test_the_readme_has_snippets():
    assert len(SNIPPETS) >= 2


def needs_sglang(snippet: str) -> bool:
    """Snippets that import SGLang run in the SGLang test environment (tests/integrations)."""
    return "sglang" in snippet


@pytest.mark.parametrize("k", range(len(SNIPPETS)))
def test_readme_snippet_runs(k):
    if needs_sglang(SNIPPETS[k]):
        pytest.skip("an SGLang snippet: tests/integrations/test_sglang_docs.py runs it where SGLang is installed")
    run_snippet(k)


def run_snippet(k: int) -> None:
    exec(compile(SNIPPETS[k], f"README.md snippet {k}", "exec"), {"__name__": "readme"})
