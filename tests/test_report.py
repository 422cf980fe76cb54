"""The HTML report: self-contained, opens in headless Chromium with no console errors, figures
render, and a damaged file in the store does not stop it."""
from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mixzoo.cli import main

sys.path.insert(0, str(Path(__file__).parent))
from test_leaderboard_store import full_store, real_store  # noqa: E402

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _install_chromium() -> str | None:
    exe = shutil.which("chromium")
    if exe:
        return exe
    if shutil.which("apt-get") and os.geteuid() == 0:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for cmd in (["apt-get", "install", "-y", "-q", "chromium"], ["apt-get", "update", "-q"],
                    ["apt-get", "install", "-y", "-q", "chromium"]):
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
            if cmd[1] == "install" and r.returncode == 0:
                break
    return shutil.which("chromium")


@pytest.fixture(scope="session")
def chromium():
    exe = _install_chromium()
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is not installed and 'apt-get install -y chromium' failed (CI must run this test)")
        pytest.skip("chromium not installed and could not be installed here")
    return exe


@pytest.fixture(scope="session")
def full_results(tmp_path_factory):
    return full_store(tmp_path_factory.getbasetemp())


def _chromium(exe: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    profile.mkdir()
    return subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def report(full_results, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "report.html"
    assert main(["--results", str(full_results), "leaderboard", "report", "--out", str(out)]) == 0
    return out


def test_report_is_self_contained_and_complete(report):
    page = report.read_text()
    # nothing fetched from anywhere: no external URL in any src/href, a CSP that forbids it
    assert not re.search(r'(src|href)="(?!data:|#)', page)
    assert "default-src 'none'" in page and "<script" not in page
    imgs = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(imgs) >= 4      # bars, mqar vs kv, mad-* vs vocab_size..., ttr curves
    for b in imgs:
        assert base64.b64decode(b)[:8] == b"\x89PNG\r\n\x1a\n"
    for text in ("MAD score", "Ranking per task", "Test-time regression", "Provenance", "crashed-run.parquet",
                 "test: mqar softmax lr=0.03 kv=2", "torch", "git_sha"):
        assert text in page, text
    assert "4/6 tasks" in page


def _console(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln or "Failed to load" in ln]


def test_report_opens_in_chromium_without_console_errors(report, chromium, tmp_path):
    # the detector itself sees a console error when there is one
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>console.error('boom')</script></body></html>")
    assert any("boom" in ln for ln in _console(_chromium(chromium, tmp_path, "--dump-dom", bad.as_uri()).stderr))
    shot = tmp_path / "report.png"
    r = _chromium(chromium, tmp_path, f"--screenshot={shot}", "--window-size=1280,2400",
                  "--virtual-time-budget=3000", report.as_uri())
    assert shot.exists() and shot.stat().st_size > 20_000, r.stderr[-2000:]
    assert _console(r.stderr) == [], _console(r.stderr)
    # keep the screenshot beside the report for a human to look at
    shutil.copy(shot, report.with_suffix(".png"))


def test_report_figures_render(report, chromium, tmp_path):
    # a copy of the page with a probe that writes, into the DOM, how many images decoded
    page = report.read_text()
    page = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page)
    probe = ("<script>window.addEventListener('load',()=>{const im=[...document.images];"
             "document.body.setAttribute('data-probe',im.length+':'+im.filter(i=>i.complete&&i.naturalWidth>200)"
             ".length);});</script>")
    probed = tmp_path / "probe.html"
    probed.write_text(page.replace("</body>", probe + "</body>"))
    r = _chromium(chromium, tmp_path, "--dump-dom", "--virtual-time-budget=3000", probed.as_uri())
    m = re.search(r'data-probe="(\d+):(\d+)"', r.stdout)
    assert m, r.stderr[-2000:]
    total, ok = map(int, m.groups())
    assert total >= 4 and ok == total


def test_report_of_an_empty_or_wholly_damaged_store(tmp_path, capsys):
    assert main(["--results", str(tmp_path / "empty"), "leaderboard", "report"]) == 0
    assert "The leaderboard is empty" in (tmp_path / "empty" / "report.html").read_text()
    part = tmp_path / "bad" / "leaderboard" / "suite=mqar" / "task=mqar"
    part.mkdir(parents=True)
    (part / "half.parquet").write_bytes(b"PAR1\x00\x01")
    assert main(["--results", str(tmp_path / "bad"), "leaderboard", "report", "--out", str(tmp_path / "r.html")]) == 0
    assert "half.parquet" in (tmp_path / "r.html").read_text()
    assert main(["--results", str(tmp_path / "bad"), "leaderboard", "show"]) == 0
    assert main(["--results", str(tmp_path / "bad"), "leaderboard", "plot"]) == 2     # nothing to plot: one line
    err = capsys.readouterr().err
    assert "half.parquet" in err and "nothing to plot" in err and "Traceback" not in err


def test_report_takes_curves_from_a_file(tmp_path_factory, tmp_path):
    import json
    real = real_store(tmp_path_factory.getbasetemp())           # no ttr rows in this store
    curves = tmp_path / "c.json"
    curves.write_text(json.dumps({"softmax": [0.9, 0.5, 0.3], "lla": [0.9, 0.2, 0.1]}))
    out = tmp_path / "r.html"
    assert main(["--results", str(real), "leaderboard", "report", "--out", str(out)]) == 0
    assert "Test-time regression" not in out.read_text()
    assert main(["--results", str(real), "leaderboard", "report", "--curves", str(curves), "--out", str(out)]) == 0
    page = out.read_text()
    assert "Test-time regression" in page and page.count("data:image/png") == 4     # bars, mqar vs kv, its curves, ttr
