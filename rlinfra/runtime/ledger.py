"""The resource ledger check: does Ray's accounting match what the job was planned for?

A cluster that reports 8 GPUs where the plan assumed 16 (a node that did not join, a raylet
started without ``--num-gpus``) makes every later rank map and placement group wrong; this turns
that into one clear diff before anything is launched.
"""

from collections.abc import Mapping


def resource_diff(expected: Mapping[str, float], actual: Mapping[str, float]) -> str:
    """Lines ``NAME: required X, Ray has Y`` for every mismatch; empty when all agree."""
    lines = []
    for name, want in sorted(expected.items()):
        have = float(actual.get(name, 0.0))
        if abs(have - want) >= 1e-9:
            lines.append(f"  {name}: required {want:g}, Ray has {have:g} ({have - want:+g})")
    return "\n".join(lines)
