"""Which compute dtype runs where: ``compute_dtype: bfloat16`` pays only on hardware with bfloat16 matrix units.

A GPU runs bfloat16 as asked. A CPU computes bfloat16 matrix products fast only with AMX (``amx_bf16``) or AVX-512
BF16 (``avx512_bf16``) on x86, or the BF16 extension (``bf16``) on Arm; without them oneDNN emulates bfloat16 with
float32 instructions and conversions, slower than float32 itself. There the run computes in float32 instead and says
so once. ``compute_dtype_for`` decides from the detection result (``cpu_bfloat16_units``), so both branches are
testable on any machine.
"""

from __future__ import annotations

import torch

BFLOAT16_UNITS = ("amx_bf16", "avx512_bf16", "bf16")  # x86 AMX, x86 AVX-512 BF16, Arm BF16 (/proc/cpuinfo's names)


def cpu_bfloat16_units() -> list[str]:
    """This CPU's bfloat16 matrix units, by their /proc/cpuinfo flag names (empty: none). Without /proc/cpuinfo (not
    Linux), torch's own cpuinfo checks for AMX tiles and AVX-512 BF16."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = next((line.split(":", 1)[1].split() for line in cpuinfo if line.startswith(("flags", "Features"))), [])
        return [unit for unit in BFLOAT16_UNITS if unit in flags]
    except OSError:
        found = {"amx_bf16": torch.cpu._is_amx_tile_supported(), "avx512_bf16": torch.cpu._is_avx512_bf16_supported()}
        return [unit for unit, present in found.items() if present]


def compute_dtype_for(requested: str, device_type: str, cpu_units: list[str]) -> tuple[str, str | None]:
    """The compute dtype that runs on ``device_type`` for the config's ``compute_dtype``, and a message when it is not
    the requested one: bfloat16 on a CPU without bfloat16 matrix units (``cpu_units`` empty) runs as float32."""
    if requested != "bfloat16" or device_type != "cpu" or cpu_units:
        return requested, None
    return "float32", (
        "compute_dtype: bfloat16 asked for, but this CPU has no bfloat16 matrix unit (no amx_bf16 (AMX) nor "
        "avx512_bf16 (AVX-512 BF16) among its flags, nor Arm's bf16): bfloat16 would be emulated, slower than "
        "float32, so the model computes in float32"
    )


def runnable_compute_dtype(requested: str, device: torch.device, say: bool = True) -> str:
    """The compute dtype a model on ``device`` runs with (``compute_dtype_for`` on this machine); with ``say`` prints
    the message when it differs from ``requested``."""
    dtype, message = compute_dtype_for(requested, device.type, cpu_bfloat16_units() if device.type == "cpu" else [])
    if message and say:
        print(message, flush=True)
    return dtype


def bfloat16_is_fast(device: torch.device) -> bool:
    """Whether ``device`` has bfloat16 matrix units (a CPU: ``cpu_bfloat16_units``; CUDA: torch's check)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and bool(cpu_bfloat16_units())
