"""The memory plan as a table and as JSON: each device's predicted holders, phases and peak.

Devices whose prediction is the same (the usual case: every GPU of a node, every node of a group)
share one row, so 8,000 devices read as a few lines; the JSON keeps every device.
"""

from typing import Any

from rich.table import Table
from rich.text import Text

from rlinfra.placement import ComponentPlacement
from rlinfra.placement.memory import GIB, DeviceMemory, assumptions
from rlinfra.views.tables import titled_table


def _gib(value: int) -> float:
    return round(value / GIB, 2)


def memory_to_dict(placement: ComponentPlacement) -> dict[str, Any]:
    """``rlinfra plan --json``'s ``memory``: every device (GiB) and each declaring component's
    assumptions and KV cache."""
    return {
        "devices": [
            {
                "devices": [list(pair) for pair in device.devices],
                "capacity_gib": _gib(device.capacity),
                "phases_gib": {phase: _gib(value) for phase, value in device.phases.items()},
                "peak_phase": device.peak_phase,
                "fits": device.fits,
                "held": [
                    {
                        "component": held.component,
                        "total_gib": _gib(held.total),
                        "terms_gib": {name: _gib(value) for name, value in held.terms.items()},
                    }
                    for held in device.held
                ],
            }
            for device in placement.memory
        ],
        "components": {
            name: {"assumptions": assumptions(entry.memory)} | _kv(placement.memory, name)
            for entry in placement.config.components
            if entry.memory is not None
            for name in entry.names
        },
    }


def _kv(devices: list[DeviceMemory], component: str) -> dict[str, Any]:
    kv = next((held.kv for device in devices for held in device.held if held.component == component), None)
    if kv is None:
        return {}
    return {
        "kv_cache": {
            "blocks": kv.blocks,
            "block_size": kv.block_size,
            "tokens": kv.tokens,
            "max_model_len": kv.max_model_len,
            "max_concurrency": round(kv.concurrency, 2),
        }
    }


def memory_table(placement: ComponentPlacement) -> Table | None:
    """Predicted memory per device: one row per component holding it, devices with the same
    prediction together; None without any declaration."""
    if not placement.memory:
        return None
    title = Text("Memory per device (GiB, predicted)", style="bold")
    table = titled_table(
        title, "\n".join(_notes(placement)), "devices", "component", "holds", "largest terms"
    )
    for column in ("peak", "capacity", "free"):
        table.add_column(column, justify="right")
    for device in placement.memory:
        free = device.capacity - device.peak
        peak = [
            f"{device.peak / GIB:.1f} ({device.peak_phase})",
            f"{device.capacity / GIB:.1f}",
            Text(f"{free / GIB:.1f}", style="" if free >= 0 else "bold red"),
        ]
        for index, held in enumerate(device.held):
            top = sorted(held.terms.items(), key=lambda item: -item[1])[:3]
            terms = ", ".join(f"{name} {value / GIB:.1f}" for name, value in top)
            where = device.where if index == 0 else ""
            table.add_row(
                where, held.component, f"{held.total / GIB:.1f}", terms, *(peak if index == 0 else ())
            )
        table.add_section()
    return table


def _notes(placement: ComponentPlacement) -> list[str]:
    notes = []
    for entry in placement.config.components:
        if entry.memory is None:
            continue
        for name in entry.names:
            kv = _kv(placement.memory, name).get("kv_cache")
            if kv is not None:
                notes.append(
                    f"{name}: KV cache {kv['tokens']:,} tokens, {kv['max_concurrency']:.2f} requests of "
                    f"max_model_len {kv['max_model_len']:,} at once"
                )
            assumed = assumptions(entry.memory)
            if assumed:
                notes.append(f"{name} assumes " + ", ".join(assumed))
    return notes
