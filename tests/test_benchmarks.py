"""The benchmark scripts run end to end on tiny sizes (smoke tests: no timing is asserted)."""
from __future__ import annotations

import runpy
import sys



def test_throughput_benchmark_runs_all_three_systems(tiny_llama_folder, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["throughput.py", "--model", str(tiny_llama_folder), "--num-requests", "3",
                                      "--min-input", "4", "--max-input", "12", "--min-output", "2",
                                      "--max-output", "5", "--rounds", "1", "--profile"])
    runpy.run_path("benchmarks/throughput.py", run_name="__main__")
    out = capsys.readouterr().out
    for name in ("minivllm", "hf-static", "hf-cb", "MFU", "where the time goes", "forward"):
        assert name in out


def test_prefix_caching_benchmark_runs_on_and_off(tiny_llama_folder, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["prefix_caching.py", "--model", str(tiny_llama_folder), "--quick"])
    runpy.run_path("benchmarks/prefix_caching.py", run_name="__main__")
    out = capsys.readouterr().out
    for text in ("TTFT mean s", "total tok/s", "caching on vs off", "greedy tokens identical: True"):
        assert text in out
