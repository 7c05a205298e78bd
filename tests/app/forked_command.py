"""Run many ``attnmeta`` invocations as the installed command runs them, without paying torch's import once per
invocation (about 3 s of one core each; 150 of them would be most of a CI run).

``python -m tests.app.forked_command DIR < rows.json`` loads the ``attnmeta`` console script's entry point (the
function the installed command calls), imports what its commands import, then forks one child per row: the child
changes to DIR, writes its stdout and stderr to files, sets ``sys.argv`` and calls the entry point as the script
does (``sys.exit(main())``); an exception it does not catch prints its traceback and exits 1, as Python would. It
prints ``[[rc, stdout, stderr], ...]`` as JSON, one per row, in order."""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import traceback
from importlib.metadata import entry_points


def _child(main, argv: list[str], cwd: str, out: str, err: str, limit: int) -> None:
    signal.alarm(limit)  # a row that hangs dies with SIGALRM, reported as its exit status
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - the child ends with os._exit
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    sys.argv = ["attnmeta", *argv]
    try:
        rc = main()
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else (print(e.code, file=sys.stderr), 1)[1])
    except BaseException:  # what the interpreter does with an exception nobody caught
        traceback.print_exc()
        rc = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc if isinstance(rc, int) else 0)


def run(rows: list[list[str]], cwd: str, workers: int = 2, limit: int = 240) -> list[tuple[int, str, str]]:
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "attnmeta"]
    main = script.load()
    import torch  # noqa: F401 - what the commands import, once, before the forks

    import attnmeta.app.bench  # noqa: F401
    import attnmeta.app.demo  # noqa: F401
    import attnmeta.compiler  # noqa: F401
    import attnmeta.runtime  # noqa: F401

    tmp = tempfile.mkdtemp(prefix="attnmeta-rows-")
    files = [(os.path.join(tmp, f"{i}.out"), os.path.join(tmp, f"{i}.err")) for i in range(len(rows))]
    running: dict[int, int] = {}
    status: dict[int, int] = {}
    todo = list(range(len(rows)))
    while todo or running:
        while todo and len(running) < workers:
            i = todo.pop(0)
            pid = os.fork()
            if pid == 0:
                _child(main, rows[i], cwd, *files[i], limit)
            running[pid] = i
        pid, st = os.wait()
        status[running.pop(pid)] = os.waitstatus_to_exitcode(st)
    out = []
    for i, (o, e) in enumerate(files):
        with open(o) as fo, open(e) as fe:
            out.append((status[i], fo.read(), fe.read()))
    return out


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the children run side by side
    print(json.dumps(run(json.load(sys.stdin), sys.argv[1], int(os.environ.get("ATTNMETA_ROW_WORKERS", "2")))))
