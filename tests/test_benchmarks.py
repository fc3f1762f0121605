"""The benchmark scripts run end to end on tiny sizes (smoke tests: no timing is asserted), each writing its JSON
result (benchmarks/results.py) into the test's folder, never into benchmarks/results/."""
from __future__ import annotations

import json
import runpy
import sys

import pytest


def result_of(folder, benchmark: str) -> dict:
    """The one result the run wrote: the machine, versions and command it carries, and at least one round."""
    files = sorted(folder.glob(f"{benchmark}-*.json"))
    assert len(files) == 1, f"expected one {benchmark} result in {folder}, found {files}"
    doc = json.loads(files[0].read_text())
    assert doc["benchmark"] == benchmark and doc["source"] == "measured" and doc["rounds"]
    assert doc["command"].startswith(f"python benchmarks/{benchmark}.py ")
    assert {"cpu", "flags", "usable_cpus"} <= set(doc["machine"]) and {"python", "torch"} <= set(doc["versions"])
    return doc


def test_throughput_benchmark_runs_all_three_systems(tiny_llama_folder, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["throughput.py", "--model", str(tiny_llama_folder), "--num-requests", "3",
                                      "--min-input", "4", "--max-input", "12", "--min-output", "2",
                                      "--max-output", "5", "--rounds", "1", "--profile", "--gemm-size", "256",
                                      "--results", str(tmp_path)])
    runpy.run_path("benchmarks/throughput.py", run_name="__main__")
    out = capsys.readouterr().out
    for name in ("minivllm", "hf-static", "hf-cb", "MFU", "where the time goes", "forward"):
        assert name in out
    doc = result_of(tmp_path, "throughput")
    assert {"minivllm s", "hf-static s", "hf-cb s"} <= set(doc["rounds"][0])


def test_prefix_caching_benchmark_runs_on_and_off(tiny_llama_folder, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["prefix_caching.py", "--model", str(tiny_llama_folder), "--quick",
                                      "--results", str(tmp_path)])
    runpy.run_path("benchmarks/prefix_caching.py", run_name="__main__")
    out = capsys.readouterr().out
    for text in ("TTFT mean s", "total tok/s", "caching on vs off", "greedy tokens identical: True"):
        assert text in out
    doc = result_of(tmp_path, "prefix_caching")
    assert {r["prefix caching"] for r in doc["rounds"]} == {"on", "off"}


def test_throughput_benchmark_prints_each_round_bf16_and_the_floor(tiny_llama_folder, capsys, monkeypatch, tmp_path):
    workload = tmp_path / "w.json"
    monkeypatch.setattr(sys, "argv", ["throughput.py", "--model", str(tiny_llama_folder), "--num-requests", "2",
                                      "--min-input", "4", "--max-input", "8", "--min-output", "2",
                                      "--max-output", "3", "--rounds", "2", "--systems", "minivllm",
                                      "--gemm-size", "256", "--write-workload", str(workload),
                                      "--results", str(tmp_path)])
    runpy.run_path("benchmarks/throughput.py", run_name="__main__")
    out = capsys.readouterr().out
    for text in ("round 1:", "round 2:", "minivllm-bf16", "floor bfloat16:", "floor float32:", "x the floor"):
        assert text in out
    assert len(json.loads(workload.read_text())["prompt_token_ids"]) == 2
    doc = result_of(tmp_path, "throughput")
    assert [r["round"] for r in doc["rounds"]] == [1, 2] and "minivllm-bf16 MFU" in doc["summary"]


def test_shared_cpu_benchmark_runs_each_configuration_alone_and_beside_a_neighbour(tiny_llama_folder, capsys,
                                                                                  monkeypatch, tmp_path):
    # two of the four OpenMP configurations (each run starts an engine); --configs picks them
    monkeypatch.setattr(sys, "argv", ["shared_cpu.py", "--model", str(tiny_llama_folder), "--num-requests", "2",
                                      "--rounds", "1", "--configs", "passive,spin-2000", "--results", str(tmp_path)])
    runpy.run_path("benchmarks/shared_cpu.py", run_name="__main__")
    out = capsys.readouterr().out
    for text in ("passive + neighbour", "spin-2000 + neighbour", "spin-2000 ", "beside a neighbour s"):
        assert text in out
    doc = result_of(tmp_path, "shared_cpu")
    assert sorted((r["child OpenMP"], r["neighbour"]) for r in doc["rounds"]) == [
        ("passive", False), ("passive", True), ("spin-2000", False), ("spin-2000", True)]


def test_tensor_parallel_benchmark_runs_both_sizes(tiny_llama_folder, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["tensor_parallel.py", "--model", str(tiny_llama_folder), "--quick",
                                      "--tensor-parallel-size", "2", "--results", str(tmp_path)])
    runpy.run_path("benchmarks/tensor_parallel.py", run_name="__main__")
    out = capsys.readouterr().out
    for text in ("TP=1 vs TP=2", "round 1:", "ratios (TP=2 / TP=1) per round", "identical greedy tokens"):
        assert text in out
    doc = result_of(tmp_path, "tensor_parallel")
    assert "TP=2 / TP=1" in doc["rounds"][0]


@pytest.mark.timeout(600)  # bounds a hang; on a busy machine each round also waits out wait_until_idle
def test_serving_benchmark_runs_against_a_real_server(tiny_llama_folder, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["serve_vs_vllm.py", "--systems", "minivllm", "--model", str(tiny_llama_folder),
                                      "--num-prompts", "4", "--concurrency", "2", "--rounds", "1", "--min-input", "4",
                                      "--max-input", "8", "--min-output", "2", "--max-output", "4", "--dtype",
                                      "float32", "--max-model-len", "256", "--results", str(tmp_path)])
    runpy.run_path("benchmarks/serve_vs_vllm.py", run_name="__main__")
    out = capsys.readouterr().out
    for text in ("minivllm server ready", "round 1 minivllm", "output tok/s", "TTFT p50", "TPOT p50", "idle after",
                 "p50 of the opening burst", "the rest"):
        assert text in out
    doc = result_of(tmp_path, "serve_vs_vllm")
    assert doc["rounds"][0]["system"] == "minivllm" and doc["rounds"][0]["tok_s"] > 0


@pytest.mark.timeout(600)  # as above
def test_sweep_benchmark_prints_the_table_and_draws_the_figure(tiny_llama_folder, capsys, monkeypatch, tmp_path):
    figure = tmp_path / "sweep.png"
    monkeypatch.setattr(sys, "argv", ["sweep.py", "--systems", "minivllm", "--model", str(tiny_llama_folder), "--quick",
                                      "--dtype", "float32", "--out", str(figure), "--results", str(tmp_path)])
    runpy.run_path("benchmarks/sweep.py", run_name="__main__")
    out = capsys.readouterr().out
    for text in ("floor inputs", "concurrency      1", "prompt_len", "figure written"):
        assert text in out
    assert figure.stat().st_size > 10_000
    doc = result_of(tmp_path, "sweep")
    assert {r["sweep"] for r in doc["rounds"]} == {"concurrency", "prompt_len"}


def test_prefill_attention_benchmark_compares_kernel_and_sdpa(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["prefill_attention.py", "--tokens", "3", "40", "--context", "5", "--rounds",
                                      "2", "--min-seconds", "0", "--results", str(tmp_path)])
    runpy.run_path("benchmarks/prefill_attention.py", run_name="__main__")
    lines = [line for line in capsys.readouterr().out.splitlines() if "tokens:" in line]
    assert len(lines) == 4  # two sizes x two dtypes
    for line in lines:  # the kernel and SDPA agree on the same inputs
        assert float(line.rsplit("max|diff| ", 1)[1]) < (2e-2 if line.startswith("bfloat16") else 1e-4), line
    doc = result_of(tmp_path, "prefill_attention")
    assert len(doc["rounds"]) == 8  # two sizes x two dtypes x two rounds


def test_spec_decode_benchmark_runs_both_workloads(tiny_llama_folder, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["spec_decode.py"])
    bench = runpy.run_path("benchmarks/spec_decode.py")
    assert bench["main"](["--quick", "--model", str(tiny_llama_folder), "--dtype", "float32",
                          "--results", str(tmp_path)]) == 0  # exact
    out = capsys.readouterr().out
    for name in ("grounded", "random"):
        assert f"round 1 {name:<8}: off" in out
        assert f"{name}: on/off tok/s per round" in out
    for text in ("acceptance rate", "mean acceptance length", "accepted per position", "outputs identical: yes"):
        assert text in out
    doc = result_of(tmp_path, "spec_decode")
    assert {r["workload"] for r in doc["rounds"]} == {"grounded", "random"}


def test_decode_gemm_benchmark_runs_both_kernels(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["decode_gemm.py", "--layers", "1", "--vocab", "300", "--rows", "1", "13",
                                      "--rounds", "1", "--results", str(tmp_path)])
    runpy.run_path("benchmarks/decode_gemm.py", run_name="__main__")
    out = capsys.readouterr().out
    for text in ("5 weights", "   1 rows:", "  13 rows:", "oneDNN / kernel", "GB/s of weights", "max|diff|"):
        assert text in out
    doc = result_of(tmp_path, "decode_gemm")
    assert [r["rows"] for r in doc["rounds"]] == [1, 13]


def test_the_offline_comparison_floor_is_the_sum_of_its_steps(monkeypatch):
    """vs_vllm.step_floor on a toy model, by hand: one layer of 22 weights (hidden 2, one head of 2, MLP 1), lm_head
    of 6; rate, bandwidth and dtype size 1. Prefill: 2 x 22 x 4 prompt tokens + 2 x 6 x 2 last rows = 200. Decode:
    steps 1 and 2 for the request of 3 tokens only, each max(28 bytes, 56 FLOPs) plus 4 bytes of K/V per position
    at sequence lengths 4 and 5: 72 + 76."""
    from types import SimpleNamespace
    monkeypatch.syspath_prepend("benchmarks")
    import vs_vllm
    config = SimpleNamespace(num_hidden_layers=1, hidden_size=2, intermediate_size=1, num_attention_heads=1,
                             num_key_value_heads=1, vocab_size=3)
    assert vs_vllm.step_floor(config, [[1, 2, 3], [4]], [3, 1], 1, 1.0, 1.0) == (200.0, 148.0)


def test_the_alternating_benchmarks_wait_for_an_idle_machine_and_give_up_in_time(monkeypatch):
    """idle.wait_until_idle (vs_vllm, serve_vs_vllm, sweep) reads /proc/stat's busy ticks: a bar every window
    clears returns after one window; a bar none can clear (busy below a negative share) waits out the timeout
    and no longer. On a fake clock and a fake /proc/stat, so a busy machine running the test changes nothing:
    the windows slept are counted, not timed."""
    monkeypatch.syspath_prepend("benchmarks")
    import idle
    busy, total = idle.cpu_busy_ticks()  # the real /proc/stat
    assert 0 <= busy <= total

    class Machine:  # a clock that only sleep() moves; each window, `share` of 100 ticks busy
        def __init__(self, shares):
            self.now, self.slept, self.shares, self.busy, self.total = 0.0, [], iter(shares), 0, 0

        def perf_counter(self):
            return self.now

        def sleep(self, seconds):
            self.now += seconds
            self.slept.append(seconds)
            self.busy += round(100 * next(self.shares))  # a loop that never stops runs out of windows here
            self.total += 100

        def ticks(self):
            return self.busy, self.total

    def wait(shares, **kw):
        machine = Machine(shares)
        monkeypatch.setattr(idle, "time", machine)
        monkeypatch.setattr(idle, "cpu_busy_ticks", machine.ticks)
        return idle.wait_until_idle(**kw), machine.slept

    assert wait([0.0], window=0.05, busy_below=0.05, timeout=5.0) == (0.05, [0.05])  # idle at once: one window
    waited, slept = wait([1.0, 0.5, 0.2, 0.01], window=0.05, busy_below=0.05, timeout=5.0)
    assert slept == [0.05] * 4 and waited == sum(slept)  # busy windows are waited out, the first idle one ends it
    waited, slept = wait([0.0] * 100, window=0.05, busy_below=-1.0, timeout=0.3)  # no window can clear the bar
    assert len(slept) == 6 and 0.3 <= waited < 0.35  # waits out the timeout, then gives up: not one window more


def test_cpu_graph_benchmark_runs_both_engines(tiny_llama_folder, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["cpu_graph.py", "--model", str(tiny_llama_folder), "--quick", "--rounds", "2",
                                      "--dtype", "float32", "--results", str(tmp_path)])
    runpy.run_path("benchmarks/cpu_graph.py", run_name="__main__")
    out = capsys.readouterr().out
    for text in ("round 2: one request", "eager / graphs", "start-up: graphs", "same tokens: True"):
        assert text in out
    from minivllm import _C
    if _C.available():
        assert "decode batches replayed: 1-256 requests" in out
    doc = result_of(tmp_path, "cpu_graph")
    assert len(doc["rounds"]) == 4 and doc["summary"]["same tokens"] is True


def test_grade_class_benchmark_grades_a_made_up_class(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["grade_class.py", "--students", "2", "--labs", "7", "--results", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path("benchmarks/grade_class.py", run_name="__main__")
    out = capsys.readouterr().out
    assert exit_.value.code == 0, out
    assert "2 students x 1 labs" in out and "every row as expected: True" in out
    doc = result_of(tmp_path, "grade_class")
    assert doc["summary"]["students"] == 2 and [r["lab"] for r in doc["rounds"]] == [7]


def test_one_request_benchmark_prints_the_step_against_the_floor(tiny_llama_folder, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["one_request.py", "--model", str(tiny_llama_folder), "--dtype", "float32",
                                      "--tokens", "4", "--rounds", "2", "--results", str(tmp_path)])
    bench = runpy.run_path("benchmarks/one_request.py", run_name="__main__")
    out = capsys.readouterr().out
    for text in ("round 1: bandwidth", "round 2: bandwidth", "step / floor", "median: step"):
        assert text in out
    doc = result_of(tmp_path, "one_request")
    assert [r["round"] for r in doc["rounds"]] == [1, 2]
    from transformers import AutoConfig  # the weights a step reads, as throughput.py counts them, in float32
    weights = bench["throughput"].model_weights(AutoConfig.from_pretrained(tiny_llama_folder))
    assert doc["summary"]["weight MB"] * 1e6 == pytest.approx(weights * 4, rel=1e-4)
