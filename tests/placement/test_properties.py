"""Property tests: on random small clusters, any placement string — built from grammar pieces or
arbitrary text — either resolves to placements that keep every invariant, or is a
``PlacementError``. Nothing else escapes. Grammar-built strings are also checked against an
independent reference implementation of the semantics (DESIGN "Placement semantics")."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlinfra.placement import ClusterSpec, ComponentPlacement, Placement, PlacementError
from rlinfra.placement.config import parse_nodes_spec

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
COMPONENT = "actor"


# ---------------------------------------------------------------- random clusters


@dataclass(frozen=True)
class Cluster:
    accelerators: list[int]
    groups: dict[str, dict[str, Any]]  # label -> the YAML entry (without reserved groups)
    node_group: Any  # what the component's node_group field says
    labels: tuple[str, ...]  # the same, as a tuple of labels

    def cluster_cfg(self, placement: str) -> dict[str, Any]:
        entry = {"node_group": self.node_group, "placement": placement}
        return {
            "num_nodes": len(self.accelerators),
            "node_groups": list(self.groups.values()),
            "component_placement": {COMPONENT: entry},
        }


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    num_nodes = draw(st.integers(1, 4))
    accelerators = draw(st.lists(st.sampled_from([0, 1, 2, 3, 4, 8]), min_size=num_nodes, max_size=num_nodes))
    groups: dict[str, dict[str, Any]] = {}
    for index in range(draw(st.integers(0, 2))):
        ranks = draw(st.lists(st.integers(0, num_nodes - 1), min_size=1, max_size=num_nodes, unique=True))
        written: Any = draw(st.sampled_from([ranks, ",".join(map(str, ranks))]))
        entry: dict[str, Any] = {"label": f"g{index}", "node_ranks": written}
        if draw(st.booleans()):
            units = draw(st.lists(st.sampled_from(ranks), min_size=1, max_size=6))
            configs = [{"node_rank": r, "ip": f"10.0.{index}.{i}"} for i, r in enumerate(units)]
            entry["hardware"] = {"type": draw(st.sampled_from(["robot", "camera"])), "configs": configs}
        elif draw(st.integers(0, 3)) == 0:
            entry["ignore_hardware"] = True
        groups[entry["label"]] = entry
    choices = ["cluster", "node", *groups]
    labels = tuple(
        draw(
            st.lists(
                st.sampled_from(choices), min_size=1, max_size=2 if draw(st.booleans()) else 1, unique=True
            )
        )
    )
    node_group = draw(st.sampled_from([",".join(labels), list(labels)]))
    return Cluster(accelerators, groups, node_group, labels)


# ---------------------------------------------------------------- reference implementation


@dataclass(frozen=True)
class Resource:
    node: int
    local: int | None  # None for node resources
    label: str
    kind: str  # GPU, robot, camera or node


def reference_pool(cluster: Cluster) -> list[Resource] | None:
    """The numbered resources of the component's node groups — groups of different kinds
    concatenate — or None if they offer some node's resources twice or a hardware type's units on
    one node come from two groups."""
    acc = cluster.accelerators
    everyone = list(range(len(acc)))
    pool: list[Resource] = []
    for label in cluster.labels:
        entry = cluster.groups.get(label, {})
        nodes = sorted(everyone if label in ("cluster", "node") else _ranks(entry["node_ranks"]))
        if (
            label == "node"
            or entry.get("ignore_hardware")
            or ("hardware" not in entry and not any(acc[n] for n in nodes))
        ):
            pool += [Resource(n, None, label, "node") for n in nodes]
        elif "hardware" in entry:
            kind = entry["hardware"]["type"]
            per_node = Counter(unit["node_rank"] for unit in entry["hardware"]["configs"])
            pool += [Resource(n, i, label, kind) for n in sorted(per_node) for i in range(per_node[n])]
        else:
            pool += [Resource(n, i, label, "GPU") for n in nodes for i in range(acc[n])]
    offers = {(res.node, res.kind, res.label) for res in pool}
    if len({(node, kind) for node, kind, _ in offers}) != len(offers):
        return None
    return pool


def config_is_valid(cluster: Cluster) -> bool:
    """Whether the node groups themselves are accepted: one group per node's units of a type."""
    owners = {
        (c["node_rank"], g["hardware"]["type"], g["label"])
        for g in cluster.groups.values()
        if "hardware" in g
        for c in g["hardware"]["configs"]
    }
    return len({(node, kind) for node, kind, _ in owners}) == len(owners)


def _ranks(written: Any) -> list[int]:
    return list(written) if isinstance(written, list) else [int(r) for r in written.split(",")]


Range = tuple[int, int]
Segment = tuple[Range | None, Range | None]  # (resources or None for 'all', processes or None)


def reference_assign(segments: list[Segment], pool: list[Resource]) -> list[tuple[int, ...]] | None:
    """Resources per process under the documented rules, or None where they forbid the string."""
    size = len(pool)
    out: list[tuple[int, ...]] = []
    last_resource = -1
    for resources, processes in segments:
        first, last = (0, size - 1) if resources is None else resources
        if last < first or (processes is not None and processes[1] < processes[0]):
            return None
        if last >= size or first <= last_resource:
            return None
        last_resource = last
        num_resources = last - first + 1
        if processes is None:
            num_processes = num_resources
        elif processes[0] != len(out):
            return None
        else:
            num_processes = processes[1] - processes[0] + 1
        if all(pool[r].kind == "node" for r in range(first, last + 1)):
            if num_processes < num_resources:
                return None
            base, extra = divmod(num_processes, num_resources)
            for k in range(num_resources):
                out += [(first + k,)] * (base + (k < extra))
        elif num_processes % num_resources == 0:
            for k in range(num_resources):
                out += [(first + k,)] * (num_processes // num_resources)
        elif num_resources % num_processes == 0:
            width = num_resources // num_processes
            for j in range(num_processes):
                chunk = tuple(range(first + j * width, first + (j + 1) * width))
                if len({pool[r].node for r in chunk}) != 1 or len({pool[r].kind for r in chunk}) != 1:
                    return None
                out.append(chunk)
        else:
            return None
    return out


# ---------------------------------------------------------------- placement strings

SPACE = st.sampled_from(["", "", "", " ", "\t"])


@st.composite
def rank_ranges(draw: st.DrawFn, high: int) -> Range:
    first = draw(st.integers(0, high))
    if draw(st.integers(0, 9)) == 0:
        return first, draw(st.integers(0, high))  # sometimes backwards
    return first, draw(st.integers(first, high))


@st.composite
def grammar_strings(draw: st.DrawFn) -> tuple[str, list[Segment]]:
    """A placement string made of valid tokens (the rules may still reject it) and its meaning.

    Most segments continue where the previous one ended, with process counts that are multiples
    or divisors of the resource count, so that a good share of the strings resolve.
    """
    segments: list[Segment] = []
    parts: list[str] = []
    next_resource = next_process = 0
    for _ in range(draw(st.integers(1, 4))):
        choice = draw(st.integers(0, 9))
        resources: Range | None
        if choice == 0:
            resources = None
        elif choice == 1:
            resources = draw(rank_ranges(20))
        else:
            first = next_resource + draw(st.sampled_from([0, 0, 0, 1, 2]))
            resources = (first, first + draw(st.sampled_from([1, 1, 2, 2, 3, 4, 8])) - 1)
        num_resources = 1 if resources is None else abs(resources[1] - resources[0]) + 1
        next_resource = 0 if resources is None else resources[1] + 1

        choice = draw(st.integers(0, 9))
        processes: Range | None = None
        if choice < 4:
            next_process += num_resources
        elif choice < 9:
            factor = draw(st.sampled_from([1, 2, 3, 0.5, 0.25, None]))
            count = draw(st.integers(1, 12)) if factor is None else max(1, int(num_resources * factor))
            processes = (next_process, next_process + count - 1)
            next_process += count
        else:
            processes = draw(rank_ranges(30))
        segments.append((resources, processes))
        parts.append(_render(draw, resources, processes))
    return ",".join(parts), segments


def _render(draw: st.DrawFn, resources: Range | None, processes: Range | None) -> str:
    def one(rank_range: Range) -> str:
        first, last = rank_range
        if first == last and draw(st.booleans()):
            return f"{draw(SPACE)}{first}{draw(SPACE)}"
        return f"{draw(SPACE)}{first}{draw(SPACE)}-{draw(SPACE)}{last}{draw(SPACE)}"

    text = (
        f"{draw(SPACE)}{draw(st.sampled_from(['all', 'ALL', 'All']))}{draw(SPACE)}"
        if resources is None
        else one(resources)
    )
    return text if processes is None else f"{text}:{one(processes)}"


PIECES = st.sampled_from(["0", "1", "2", "3", "7", "8", "15", "-", ":", ",", " ", "all", "x", "0-3", "4-7"])
MUTATED = st.lists(PIECES, min_size=0, max_size=12).map("".join)
ANY_TEXT = st.one_of(MUTATED, st.text(max_size=30), st.text(alphabet="0123456789-:, al", max_size=20))


# ---------------------------------------------------------------- the checks


def resolve(cluster: Cluster, text: str) -> tuple[ComponentPlacement | None, PlacementError | None]:
    cluster_cfg = cluster.cluster_cfg(text)
    spec = ClusterSpec.from_config(cluster_cfg, cluster.accelerators)
    try:
        return ComponentPlacement({"cluster": cluster_cfg}, spec), None
    except PlacementError as error:
        return None, error


def check_error(error: PlacementError, text: str) -> None:
    """Every error names the component; an error about the string puts its caret inside it."""
    message = str(error)
    assert error.where is not None and COMPONENT in error.where, message
    if error.span is not None:
        assert error.text == text
        assert 0 <= error.span.start <= error.span.end <= len(text) + 1, message
        caret_line = message.splitlines()[2]
        assert caret_line.strip() and set(caret_line.strip()) == {"^"}, message
        assert len(caret_line) - len(caret_line.lstrip()) == len("  in: ") + error.span.start
        assert message.splitlines()[-1].startswith("  expected: "), message


def check_invariants(cluster: Cluster, placement: ComponentPlacement) -> list[Placement]:
    pool = reference_pool(cluster)
    assert pool is not None, "the engine combined node groups that cannot combine"
    placements = placement.get_placements(COMPONENT)
    n = len(placements)
    assert n >= 1
    assert placement.get_world_size(COMPONENT) == n
    assert [p.rank for p in placements] == list(range(n))
    assert {p.world_size for p in placements} == {n}

    per_node = Counter(p.cluster_node_rank for p in placements)
    seen: Counter[int] = Counter()
    order: dict[int, int] = {}
    previous: tuple[int, ...] | None = None
    holders: dict[tuple[int, ...], int] = Counter(tuple(p.hardware_ranks) for p in placements)
    for p in placements:
        kind = pool[p.hardware_ranks[0]].kind
        assert p.hardware_type == kind
        assert {pool[r].kind for r in p.hardware_ranks} == {kind}, "one kind per process"
        assert p.hardware_ranks, p
        assert list(p.hardware_ranks) == list(range(p.hardware_ranks[0], p.hardware_ranks[-1] + 1))
        assert p.hardware_ranks[-1] < len(pool)
        nodes = {pool[r].node for r in p.hardware_ranks}
        assert nodes == {p.cluster_node_rank}, "a process's resources lie on its one node"
        assert p.node_group_label == pool[p.hardware_ranks[0]].label
        node = p.cluster_node_rank
        order.setdefault(node, len(order))
        assert p.placement_node_rank == order[node]
        assert p.local_rank == seen[node]
        seen[node] += 1
        assert p.local_world_size == per_node[node]
        if kind == "node":
            assert p.local_hardware_ranks == []
            assert p.visible_devices is None
        else:
            assert p.local_hardware_ranks == [pool[r].local for r in p.hardware_ranks]
            if kind == "GPU":
                assert all(d < cluster.accelerators[node] for d in p.local_hardware_ranks)
                assert p.visible_devices == ",".join(map(str, p.local_hardware_ranks))
            else:
                units = sum(1 for res in pool if res.node == node)
                assert all(d < units for d in p.local_hardware_ranks)
                assert p.visible_devices is None
            if holders[tuple(p.hardware_ranks)] > 1:
                assert len(p.hardware_ranks) == 1, "only single devices are shared"
        if previous is not None:
            # Resources ascend with ranks: a process starts at or after where the last one ended,
            # and overlaps it only by being the very same shared device.
            assert p.hardware_ranks[0] >= previous[-1]
            assert p.hardware_ranks[0] > previous[-1] or p.hardware_ranks == previous
        previous = p.hardware_ranks

    unisolated = placement.get_placements(COMPONENT, isolate_accelerator=False)
    assert unisolated == [
        p._replace(
            isolate_accelerator=False,
            visible_accelerators=[str(i) for i in range(cluster.accelerators[p.cluster_node_rank])],
            local_accelerator_rank=0 if cluster.accelerators[p.cluster_node_rank] else -1,
        )
        for p in placements
    ]
    return placements


@SETTINGS
@given(cluster=clusters(), string=grammar_strings())
def test_grammar_strings_match_the_reference(cluster: Cluster, string: tuple[str, list[Segment]]) -> None:
    text, segments = string
    if not config_is_valid(cluster):
        return
    placement, error = resolve(cluster, text)
    reference = reference_pool(cluster)
    expected = None if reference is None else reference_assign(segments, reference)
    if error is not None:
        check_error(error, text)
        assert expected is None, f"{text!r} was rejected: {error}"
        return
    assert placement is not None
    assert expected is not None, f"{text!r} was accepted but the rules forbid it"
    placements = check_invariants(cluster, placement)
    assert [tuple(p.hardware_ranks) for p in placements] == expected


@SETTINGS
@given(cluster=clusters(), text=ANY_TEXT)
def test_any_text_is_a_plan_or_a_placement_error(cluster: Cluster, text: str) -> None:
    if not config_is_valid(cluster):
        return
    placement, error = resolve(cluster, text)
    if error is not None:
        check_error(error, text)
    else:
        assert placement is not None
        check_invariants(cluster, placement)


# ---------------------------------------------------------------- arbitrary config values

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 9) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
GROUP_FIELDS = ["label", "node_ranks", "hardware", "env_configs", "ignore_hardware"]


@st.composite
def messy_configs(draw: st.DrawFn) -> dict[str, Any]:
    """Configs whose fields hold anything YAML could: wrong types, typos, nesting."""
    groups = []
    for _ in range(draw(st.integers(0, 2))):
        keys = draw(st.lists(st.sampled_from([*GROUP_FIELDS, "node_rank"]), unique=True, max_size=5))
        entry = {key: draw(JSON) for key in keys}
        if draw(st.booleans()):
            entry["label"] = draw(st.sampled_from(["a", "b", "node", 4090]))
            entry["node_ranks"] = draw(
                st.one_of(JSON, st.sampled_from(["0", "0-1", [1, 0], "0-99999999999"]))
            )
        if draw(st.booleans()):
            entry["hardware"] = {
                "type": draw(st.one_of(JSON, st.just("robot"))),
                "configs": draw(
                    st.one_of(JSON, st.lists(st.fixed_dictionaries({"node_rank": JSON}), max_size=3))
                ),
            }
        if draw(st.booleans()):
            entry["env_configs"] = draw(
                st.one_of(
                    JSON,
                    st.lists(
                        st.fixed_dictionaries({"node_ranks": JSON, "env_vars": JSON}),
                        max_size=2,
                    ),
                )
            )
        groups.append(entry)
    component_value = draw(
        st.one_of(
            JSON,
            ANY_TEXT,
            st.fixed_dictionaries(
                {"placement": st.one_of(JSON, ANY_TEXT)},
                optional={
                    "node_group": st.one_of(JSON, st.sampled_from(["a", "a,b", ["b", "a"], "node", 4090]))
                },
            ),
        )
    )
    key = draw(st.sampled_from(["actor", "actor,critic", "actor,", 7]))
    return {
        "num_nodes": draw(st.integers(1, 3)),
        "node_groups": draw(st.one_of(st.just(groups), JSON)),
        "component_placement": {key: component_value},
    }


@SETTINGS
@given(cluster_cfg=messy_configs(), accelerators=st.integers(0, 4))
def test_any_config_is_a_plan_or_a_placement_error(cluster_cfg: dict[str, Any], accelerators: int) -> None:
    try:
        spec = ClusterSpec.from_config(cluster_cfg, accelerators)
        placement = ComponentPlacement({"cluster": cluster_cfg}, spec)
    except PlacementError:
        return
    for name in placement.components:
        placements = placement.get_placements(name)
        assert [p.rank for p in placements] == list(range(placement.get_world_size(name)))


@SETTINGS
@given(text=st.one_of(st.text(max_size=20), st.text(alphabet="0123456789xX, ", max_size=12)))
def test_nodes_spec_is_counts_or_a_placement_error(text: str) -> None:
    try:
        counts = parse_nodes_spec(text)
    except PlacementError as error:
        assert error.where == "--nodes"
        return
    assert 1 <= len(counts) <= 100_000
    assert all(isinstance(c, int) and c >= 0 for c in counts)
