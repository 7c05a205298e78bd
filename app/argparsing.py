"""argparse as the command line uses it: one-line errors with a "did you mean", defaults shown where help
leaves them out, positive counts, the installed version."""

from __future__ import annotations

import argparse
import difflib
import os
import re
from importlib.metadata import PackageNotFoundError, version

from attnmeta.compiler.ir.errors import OptionsError


def project_version() -> str:
    try:
        return version("attnmeta")
    except PackageNotFoundError:
        return "unknown (not installed)"


class Defaults(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default unless its help already says it, or there is none to show."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


class OneLine(argparse.ArgumentParser):
    """argparse's errors as one line (not the whole usage), with a "did you mean" for a mistyped
    choice (a backend, mode, pass, log part) or option."""

    def parse_args(self, args=None, namespace=None):
        import sys

        self._argv = list(sys.argv[1:] if args is None else args)  # which command an error is about
        return super().parse_args(args, namespace)

    def _command(self):
        """(name, parser) of the command the arguments chose, or (None, None)."""
        for sp in (a for a in self._actions if isinstance(a, argparse._SubParsersAction)):
            for word in getattr(self, "_argv", ()):
                if word in sp.choices:
                    return word, sp.choices[word]
        return None, None

    def error(self, message: str):
        name, chosen = self._command()
        known = [o for a in self._actions for o in a.option_strings]
        argv = list(getattr(self, "_argv", ()))
        before = argv[:argv.index(name)] if name in argv else argv  # what came before the command word
        stray = [w.split("=")[0] for w in before if w.startswith("-") and w.split("=")[0] not in known]
        if ("required: cmd" in message or "argument cmd:" in message) and stray:  # an option before any command
            cmds = [c for sp in self._actions if isinstance(sp, argparse._SubParsersAction) for c in sp.choices]
            owners = [c for sp in self._actions if isinstance(sp, argparse._SubParsersAction)
                      for c, p in sp.choices.items() if stray[0] in (o for a in p._actions for o in a.option_strings)]
            where = f"; it is an option of {', '.join(f'{self.prog} {c}' for c in owners)}" if owners else ""
            self.exit(2, f"{self.prog}: unknown option {stray[0]}{where}; give a command first: "
                         f"{self.prog} {{{','.join(cmds)}}} ...; {self.prog} --help for usage\n")
        close = []
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:
            choices = re.findall(r"'?([\w.:/-]+)'?", m.group(2))
            close = difflib.get_close_matches(m.group(1), choices, n=1)
            if "--backend" in message and (":" in m.group(1) or m.group(1).endswith(".py")):
                self.exit(2, f"{self.prog}: --backend {m.group(1)}: {self.prog} serves attnmeta's built-in kinds "
                             f"(its model reads their fields); compile a spec of your own with attnmeta compile "
                             f"{m.group(1)} and serve it as examples/serve.py does\n")
        m = re.search(r"unrecognized arguments: (\S+)", message)
        owners: list[str] = []
        prog = self.prog
        if m:
            mine = [o for o in known if o.startswith("--")]
            if chosen is not None:  # the suggestion is one of the chosen command's own options
                mine = [o for a in chosen._actions for o in a.option_strings if o.startswith("--")]
                prog = f"{self.prog} {name}"
            for sp in (a for a in self._actions if isinstance(a, argparse._SubParsersAction)):
                for other, p in sp.choices.items():
                    if other != name and m.group(1) in (o for a in p._actions for o in a.option_strings):
                        owners.append(other)
            # another command's option is not a typo: name its commands; suggest a near option of this one only
            close = difflib.get_close_matches(m.group(1), mine, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        if owners:
            hint = f" ({m.group(1)} is an option of {', '.join(f'{self.prog} {o}' for o in owners)}, not of " \
                   f"{prog}" + (f"; did you mean {close[0]!r}?)" if close else ")")
        self.exit(2, f"{prog}: {message}{hint}; {prog} --help for usage\n")


def positive(text: str) -> int:
    """An int of at least 1 (a count of steps, a batch size)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def device(text: str) -> str:
    """cpu, cuda or cuda:N (checked here: torch's own error names two dozen device types and no flag)."""
    if text == "cpu" or text == "cuda" or (text.startswith("cuda:") and text[5:].isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:N, got {text!r}")


def writable_dir(d: str) -> str:
    """``d`` exists (or is made) and can be written; otherwise the error says which and why."""
    try:
        os.makedirs(d, exist_ok=True)
        probe = os.path.join(d, f".attnmeta-write-{os.getpid()}")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        raise OptionsError(f"dump directory {d!r} is not writable ({e.strerror}); pick another --dump-dir") from None
    return d


def writable_file(path: str, flag: str) -> str:
    """``path`` can be written: its folder exists and takes a file (checked before any work, so a compile does not
    end in a traceback from the writer)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise OptionsError(f"{flag} {path}: that is a directory; give a file name in it")
    if not os.path.isdir(folder):
        raise OptionsError(f"{flag} {path}: the directory {folder} does not exist; create it, or write elsewhere")
    probe = os.path.join(folder, f".attnmeta-write-{os.getpid()}")
    try:  # a real write: os.access says yes to root in /proc, and to a read-only mount
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        raise OptionsError(f"{flag} {path}: the directory {folder} is not writable ({e.strerror}); write "
                           "elsewhere") from None
    return path
