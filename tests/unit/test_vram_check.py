"""kamadev.vram_check without a GPU: the plan it runs llama-server with is the one a
GPU deployment gets (whole model offloaded), and its table, ratios, verdicts, exit code
and nvidia-smi parsing."""

from __future__ import annotations

import json
from pathlib import Path

from kamadev.gguf_factory import ModelShape, write_model
from kamadev.vram_check import Row, exit_code, gpu_plan, markdown, parse_compute_apps, results_json


def test_the_plan_offloads_the_whole_model_with_kamas_flags(tmp_path: Path) -> None:
    model = write_model(tmp_path / "m.gguf", shape=ModelShape(n_layer=3, n_ctx=4096))
    planned = gpu_plan(model=model, context=2048, gpu_name="NVIDIA H200", gpu_mib=143_771)
    assert not isinstance(planned, str)
    assert planned.plan.n_gpu_layers == 4  # 3 repeating layers and the output layer
    assert planned.plan.gpus == 1
    args = planned.plan.llama_server_args(model_dir=str(tmp_path), host="127.0.0.1", port=9)
    assert args[args.index("--n-gpu-layers") + 1] == "4"
    assert args[args.index("--ctx-size") + 1] == "2048"
    assert args[args.index("--model") + 1] == f"{tmp_path}/m.gguf"
    # the CUDA context reserve alone is 512 MiB
    assert planned.estimate_mib > 512


def test_a_gpu_too_small_is_a_note_not_a_plan(tmp_path: Path) -> None:
    model = write_model(tmp_path / "m.gguf", shape=ModelShape(n_layer=3, n_ctx=4096))
    planned = gpu_plan(model=model, context=4096, gpu_name="tiny", gpu_mib=64)
    assert isinstance(planned, str) and planned.startswith("no GPU fit")


def row(measured: float | None, estimate: float | None = 1000.0, note: str | None = None) -> Row:
    return Row(
        model="m", context=2048, n_gpu_layers=25, estimate_mib=estimate,
        measured_mib=measured, note=note,
    )  # fmt: skip


def test_ratio_and_verdict() -> None:
    assert (row(800.0).ratio, row(800.0).verdict) == (0.8, "within")
    assert (row(1000.0).ratio, row(1000.0).verdict) == (1.0, "within")
    assert (row(1250.0).ratio, row(1250.0).verdict) == (1.25, "EXCEEDS")
    assert (row(None).ratio, row(None).verdict) == (None, "not measured")
    assert row(500.0, estimate=None).verdict == "not measured"


def test_exit_code_exceeding_wins_over_unmeasured() -> None:
    assert exit_code([row(900.0), row(990.0)]) == 0
    assert exit_code([row(900.0), row(None)]) == 2
    assert exit_code([row(1001.0), row(None)]) == 1
    assert exit_code([]) == 2


def test_table_and_json() -> None:
    rows = [row(812.5), row(None, note="llama-server offloaded 0 of 25 planned GPU layers")]
    table = markdown(rows, header={"gpu": "NVIDIA H200"})
    assert table.splitlines()[0] == "- gpu: NVIDIA H200"
    assert "| m | 2048 | 25 | 1,000.0 | 812.5 | 0.812 | within |" in table
    assert "| - | - | not measured: llama-server offloaded 0 of 25 planned GPU layers |" in table
    data = json.loads(results_json(rows, header={"gpu": "NVIDIA H200"}))
    assert data["exit_code"] == 2 and data["gpu"] == "NVIDIA H200"
    assert data["rows"][0]["ratio"] == 0.812 and data["rows"][0]["verdict"] == "within"


def test_compute_apps_parsing() -> None:
    text = "12345, 1830\n12346, [N/A]\n12345, 20\n\nNo running processes found\n"
    assert parse_compute_apps(text) == {12345: 1850}
