"""The HTML report: self-contained, every code link lands on an IR line, the graph drawn with and
without Graphviz, and the page opened in a real headless Chromium, whose screenshot must show the
pass table and a drawn graph (by their colours, read back from the PNG)."""

import os
import re
import shutil
import struct
import subprocess
import zlib

import pytest

from attnmeta.app import draw, report
from attnmeta.app.cli import main
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
# CI installs Chromium and sets this: there the browser test must run, not skip.
REQUIRED = os.environ.get("ATTNMETA_REQUIRE_BROWSER") == "1"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TABLE_HEAD, IN_GRAPH, OUT_GRAPH = (0xEE, 0xEE, 0xEE), (0xC8, 0xF0, 0xC8), (0xFF, 0xD9, 0xA0)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("dumps")
    opts = CompileOptions(max_bs=8, capture_sizes=(1, 4, 8), max_context_len=512,
                          modes=("decode", "target_verify"), dump_dir=str(d))
    compile_backend("flashinfer", opts)
    run = os.path.realpath(d / "flashinfer" / "latest")
    report.write(run)
    return run


def test_report_is_self_contained_and_its_code_links_land_on_ir_lines(run):
    page = open(os.path.join(run, "report.html")).read()
    assert '<table id="passes">' in page and page.count("<svg") == 2  # one graph per dumped (mode, bs)
    assert not re.search(r"<script|<link |src=\"http|href=\"http", page)
    links = re.findall(r'href="#([\w-]+)"', page)
    ids = set(re.findall(r'id="([\w-]+)"', page))
    assert links and set(links) <= ids, sorted(set(links) - ids)
    # every annotated kernel variable names its IR value and the spec line it came from
    assert re.search(r'# <a class="v" href="#decode-8-kv_indices">%kv_indices</a> .*backends/flashinfer/spec\.py:\d+',
                     page)


@pytest.mark.parametrize("use_dot", [False, pytest.param(True, marks=pytest.mark.skipif(
    not shutil.which("dot"), reason="Graphviz's dot is not installed"))], ids=["own-layout", "graphviz"])
def test_the_graph_is_drawn_with_regions_and_kernels(run, use_dot):
    from attnmeta.compiler.ir import parse

    stage = sorted(f for f in os.listdir(os.path.join(run, "decode", "bs8")) if f.endswith("fuse.ir"))[-1]
    g = parse(open(os.path.join(run, "decode", "bs8", stage)).read())
    out = draw.svg(g, use_dot=use_dot)
    assert out.startswith("<svg") and out.rstrip().endswith("</svg>")
    for n in g.nodes:  # every node is drawn, its region coloured
        assert n.name in out
    assert "#c8f0c8" in out.lower() and "#ffd9a0" in out.lower()
    assert "k0" in out  # the fused kernel's frame


def test_inspect_html_writes_the_report_where_asked(run, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["inspect", run, "--html", str(out)]) == 0
    assert out.read_text() == report.render(run)


def _png_colours(path: str) -> dict[tuple[int, int, int], int]:
    """How many pixels of each colour an 8-bit RGB(A) PNG holds: the filters of the PNG spec,
    undone row by row (no imaging library is a dependency of the project)."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and ctype in (2, 6), (depth, ctype)
            px = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride = zlib.decompress(idat), w * px
    prev, counts = bytearray(stride), {}
    for y in range(h):
        f, row = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = row[i - px] if i >= px else 0
            b, c = prev[i], prev[i - px] if i >= px else 0
            if f == 1:
                row[i] = (row[i] + a) & 255
            elif f == 2:
                row[i] = (row[i] + b) & 255
            elif f == 3:
                row[i] = (row[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        for x in range(0, stride, px):
            key = (row[x], row[x + 1], row[x + 2])
            counts[key] = counts.get(key, 0) + 1
        prev = row
    return counts


@pytest.mark.skipif(not BROWSER and not REQUIRED, reason="no Chromium here (CI installs it)")
def test_report_loads_in_headless_chromium_and_its_screenshot_shows_table_and_graph(run, tmp_path):
    assert BROWSER, "ATTNMETA_REQUIRE_BROWSER=1 but no chromium on PATH"
    url = "file://" + os.path.join(run, "report.html")
    common = [BROWSER, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run([*common, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert '<table id="passes">' in dom.stdout and "<svg" in dom.stdout and "</html>" in dom.stdout
    assert "CONSOLE" not in dom.stderr, [ln for ln in dom.stderr.splitlines() if "CONSOLE" in ln]
    shot = tmp_path / "report.png"
    r = subprocess.run([*common, "--window-size=1000,1500", f"--screenshot={shot}", url],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    colours = _png_colours(str(shot))
    # the pass table's header cells, and the graph's in_graph and out_graph boxes, are on screen
    assert colours.get(TABLE_HEAD, 0) > 500, "no pass table in the screenshot"
    assert colours.get(IN_GRAPH, 0) > 2000 and colours.get(OUT_GRAPH, 0) > 2000, "no graph in the screenshot"


def test_a_failed_compile_is_dumped_inspected_and_reported(tmp_path, capsys):
    """The broken example with --dump-dir --report: the run folder holds the pass table up to the failing
    pass, labelled failed, the IR that pass was given and every violation; inspect, --diff and --html
    read it without a traceback, and the report opens on the violations, each with its spec line."""
    import json

    ex = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "mine_broken.py") + ":SPEC"
    d = tmp_path / "dumps"
    assert main(["compile", ex, "--max-bs", "8", "--page-size", "16", "--dump-dir", str(d), "--report"]) == 2
    err = capsys.readouterr().err
    assert "\nattnmeta: check-split rejected" in err and "Traceback" not in err  # after the failed pass's IR
    run = os.path.realpath(d / "mine_broken" / "latest")
    data = json.load(open(os.path.join(run, "passes.json")))
    assert data["status"] == "failed" and data["failure"]["pass"] == "check-split"
    rules = {(v["rule"], v["origin"]) for v in data["failure"]["violations"]}
    assert rules == {("host-value-in-graph", "examples/mine_broken.py:26"),
                     ("missing-fill-value", "examples/mine_broken.py:19")}
    assert os.path.exists(os.path.join(run, data["failure"]["ir"]))
    assert main(["inspect", str(d)]) == 0
    out = capsys.readouterr().out
    assert "(failed)" in out and "FAILED in pass check-split (decode, bs 8)" in out
    assert "[missing-fill-value] %req_pool_indices at examples/mine_broken.py:19" in out
    assert main(["inspect", str(d), "--diff"]) == 0 and "check-split.failed.ir" in capsys.readouterr().out
    assert main(["inspect", str(d), "--html"]) == 0
    page = open(os.path.join(run, "report.html")).read()
    assert "<table id='violations'>" in page and "examples/mine_broken.py:26" in page
    assert page.index("id='failure'") < page.index('<table id="passes">')  # it opens on the failure
    assert "id='v-req_pool_indices' class='del'" in page and "id='v-cu_seqlens_k' class='del'" in page
    # the pass table ends on the pass that failed, and the graph it was given outlines each violation in red
    assert "<tr class='failed'><td>check-split</td>" in page and "failed: SplitError" in page
    from attnmeta.app.draw import layered, svg
    from attnmeta.compiler.ir import parse

    given = parse(open(os.path.join(run, data["failure"]["ir"])).read())
    marked = frozenset({"req_pool_indices", "cu_seqlens_k"})
    assert layered(given, marked=marked).count('stroke="red"') == 2  # without Graphviz
    from attnmeta.compiler.ir.dot import to_dot

    assert to_dot(given, marked).count("color=red") == 2  # with it
    assert svg(given, marked=marked) in page
    os.remove(os.path.join(run, "passes.json"))  # a compile killed before its end
    assert main(["inspect", run]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no passes.json" in err
    if BROWSER:
        dom = subprocess.run([BROWSER, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                              "file://" + os.path.join(run, "report.html")], capture_output=True, text=True,
                             timeout=120)
        assert dom.returncode == 0 and 'id="violations"' in dom.stdout and "missing-fill-value" in dom.stdout


def test_without_graphviz_edges_are_arrows_and_a_large_graph_opens_collapsed(tmp_path):
    """The layout of our own: every edge an arrow, rows ordered to untangle them; a graph past
    draw.BIG nodes (DSV4's) opens in the report with each fused kernel as one box, the full graph a
    click away."""
    cb = compile_backend("dsv4", CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=1024,
                                                dump_dir=str(tmp_path)))
    g = cb.plan(ForwardMode.DECODE, 4).graph
    assert len(g.nodes) > draw.BIG
    full = draw.layered(g)
    assert full.count("marker-end=\"url(#arrow)\"") == full.count("<path d=\"M ") - 1 > len(g.nodes)  # - the arrowhead
    small = draw.layered(g, collapsed=True)
    kernels = set(dict(g.kernels).values())
    assert small.count(">fused kernel ") == len(kernels) and small.count("<rect") < len(g.nodes) // 2
    run = os.path.realpath(tmp_path / "dsv4" / "latest")
    page = open(report.write(run)).read()
    assert page.index(">fused kernel ") < page.index("<summary>the full graph")


def test_without_graphviz_the_report_says_how_to_get_its_layout(tmp_path, monkeypatch):
    """A report written where Graphviz is missing says, once, that its graphs use attnmeta's own layout and how
    to install Graphviz; with dot on the PATH it says nothing of it."""
    compile_backend("triton", CompileOptions(max_bs=4, capture_sizes=(4,), dump_dir=str(tmp_path)))
    run = os.path.realpath(tmp_path / "triton" / "latest")
    monkeypatch.setattr(draw.shutil, "which", lambda name: None)
    page = open(report.write(run)).read()
    assert page.count("Graphviz's <code>dot</code> is not installed") == 1 and "apt install graphviz" in page
    monkeypatch.setattr(draw.shutil, "which", lambda name: "/usr/bin/dot" if name == "dot" else None)
    assert report._graphviz_hint() == ""  # (not drawn here: dot may not really be installed)
