"""serve.gpus: recipes/gpus.toml is the one GPU table; the fit planner, the roofline, --arch and MCP read it."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamaforge.backends.cuda.arch import parse_cuda_archs
from llamaforge.core.errors import InvalidOption
from llamaforge.fronts.mcp.resources import gpu_arch
from llamaforge.gguf.tiny import TinyModelSpec
from llamaforge.serve.fit import plan_fit, synthetic_header
from llamaforge.serve.gpus import cuda_arch_for, find_gpu, gpu_for_device, load_gpus
from llamaforge.smoke.roofline import gpu_bandwidth

pytestmark = pytest.mark.quick

# Device names (as llama-bench's gpu_info prints them) and the bandwidth the smoke roofline's own table gave
# them before it moved into recipes/gpus.toml. Two figures changed, both to the value with a stated source:
# the RTX 4080 was 717 there and is 716.8 in gpus.toml; a bare "A100" meant the 40GB card there and means the
# 80GB SXM card here (gpus.toml's alias), so the 40GB device names are aliases of the 40GB card.
ROOFLINE_DEVICES = {
    "RTX 5090": 1792,
    "RTX 5080": 960,
    "RTX 5070 Ti": 896,
    "RTX 5070": 672,
    "RTX 4090": 1008,
    "RTX 4080 SUPER": 736,
    "RTX 4070 Ti SUPER": 672,
    "RTX 4070 Ti": 504,
    "RTX 4070 SUPER": 504,
    "RTX 4070": 504,
    "RTX 4060 Ti": 288,
    "RTX 4060": 272,
    "RTX 3090 Ti": 1008,
    "RTX 3090": 936,
    "RTX 3080 Ti": 912,
    "RTX 3080": 760,
    "RTX 3070 Ti": 608,
    "RTX 3070": 448,
    "RTX 3060 Ti": 448,
    "RTX 3060": 360,
    "RTX A6000": 768,
    "RTX A5000": 768,
    "RTX A4000": 448,
    "RTX 6000 Ada": 960,
    "A100-SXM4-80GB": 2039,
    "A100 80GB PCIe": 1935,
    "A100-SXM4-40GB": 1555,
    "A100-PCIE-40GB": 1555,
    "A40": 696,
    "A30": 933,
    "A10G": 600,
    "A10": 600,
    "L40S": 864,
    "L40": 864,
    "L4": 300,
    "T4": 320,
    "V100": 900,
    "H100 PCIe": 2000,
    "H100 NVL": 3900,
    "H100": 3350,
    "H200": 4800,
    "GH200": 4000,
    "B200": 8000,
}

# What the CUDA arch parser's own alias table said before it moved into gpus.toml.
ARCH_NAMES = {
    "rtx30": "86",
    "rtx3060": "86",
    "rtx3070": "86",
    "rtx3080": "86",
    "rtx3090": "86",
    "a6000": "86",
    "a100": "80",
    "rtx40": "89",
    "rtx4060": "89",
    "rtx4070": "89",
    "rtx4080": "89",
    "rtx4090": "89",
    "l4": "89",
    "l40s": "89",
    "h100": "90",
    "h200": "90",
    "rtx50": "120",
    "rtx5090": "120",
}


@pytest.mark.parametrize(("device", "gbs"), sorted(ROOFLINE_DEVICES.items()))
def test_roofline_device_names_keep_their_bandwidth(device: str, gbs: float) -> None:
    for spelling in (f"NVIDIA {device}", f"NVIDIA GeForce {device}", device):
        found = gpu_bandwidth(spelling)
        assert found is not None and found.gbs == gbs, spelling


def test_device_matching_prefers_the_longest_name() -> None:
    table = load_gpus()
    assert gpu_for_device("NVIDIA GeForce RTX 3060 Ti", table) == table.gpus["rtx3060ti"]
    assert gpu_for_device("NVIDIA GH200 480GB", table) == table.gpus["gh200"]  # not the H200 inside it
    assert gpu_for_device("NVIDIA RTX A4000", table) == table.gpus["rtx-a4000"]  # not the A40 inside it
    assert gpu_for_device("NVIDIA H100 80GB HBM3", table) == table.gpus["h100"]
    assert gpu_for_device("Some Unknown Accelerator", table) is None


@pytest.mark.parametrize(("name", "arch"), sorted(ARCH_NAMES.items()))
def test_arch_names_come_from_the_table(name: str, arch: str) -> None:
    assert cuda_arch_for(name) == arch
    assert parse_cuda_archs(name) == [arch]
    assert gpu_arch(name.upper()) == arch  # the MCP build prompt


def test_arch_names_spelled_like_products() -> None:
    assert parse_cuda_archs("RTX_4090,rtx-a6000 a100-40gb") == ["89", "86", "80"]
    assert gpu_arch("NVIDIA GeForce RTX 3060 Ti") == "86"
    assert gpu_arch("sm_86") == "86" and gpu_arch("Some Unknown Accelerator") is None


def test_every_card_the_fit_planner_knows_names_an_arch() -> None:
    """One table: every card `models.fit --gpu` accepts, `--arch` accepts too (a10, l40, h100-nvl were refused)."""
    table = load_gpus()
    for key, gpu in table.gpus.items():
        assert gpu.cuda_arch is not None, key
        assert parse_cuda_archs(key) == [gpu.cuda_arch], key
        assert find_gpu(key) == gpu
    named = {name: parse_cuda_archs(name) for name in ("a10", "l40", "h100-nvl", "NVIDIA H100 NVL")}
    assert named == {"a10": ["86"], "l40": ["89"], "h100-nvl": ["90"], "NVIDIA H100 NVL": ["90"]}


def test_a_card_without_a_figure_says_so(tmp_path: Path) -> None:
    gpus = tmp_path / "gpus.toml"
    gpus.write_text('[gpus.x9]\nname = "Example X9"\nbandwidth_gbs = 500\n', encoding="utf-8")
    table = load_gpus(gpus)
    assert table.gpus["x9"].cuda_arch is None and table.gpus["x9"].vram_bytes is None
    assert cuda_arch_for("x9", table) is None
    with pytest.raises(InvalidOption, match="no compute capability for Example X9") as caught:
        parse_cuda_archs("x9", table)
    assert "86" in (caught.value.hint or "") and "rtx40" in (caught.value.hint or "")
    b200 = load_gpus().gpus["b200"]
    assert b200.vram_bytes is None and b200.cuda_arch == "100"
    header = synthetic_header(TinyModelSpec(arch="qwen3", n_layer=2), n_vocab=1024)
    with pytest.raises(InvalidOption, match="no memory size for NVIDIA B200") as fit_error:
        plan_fit(header, gpu="b200", ctx=1024)
    assert "--vram" in (fit_error.value.hint or "")
    assert find_gpu("b200").bandwidth_gbs == 8000
