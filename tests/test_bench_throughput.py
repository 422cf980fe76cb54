"""``mixzoo bench throughput`` on the CPU (quick shapes): the side-by-side table, with each
mechanism's backend, and its JSON."""
import json

from mixzoo.cli import main


def test_bench_throughput_quick_table_and_json(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MIXZOO_BENCH_PACKING", "0")
    out = tmp_path / "tp.json"
    assert main(["bench", "throughput", "--quick", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| quick | softmax (sdpa) | off |" in text
    assert "| quick | softmax (sdpa) | off, full head |" in text
    res = json.loads(out.read_text())
    rows = {r["compile"]: r for r in res["rows"]}
    assert set(rows) == {"off", "off, full head"}
    for r in rows.values():
        assert r["backend"] == "sdpa" and r["plain"] > 0 and r["mixzoo"] > 0
    assert res["mad_rates"]["softmax"] > 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
