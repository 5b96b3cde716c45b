"""Compare pycxl's JSON with ndctl's ``cxl list`` JSON, object by object."""

from __future__ import annotations

from typing import Any

# The key that names each kind of object in ndctl's JSON.
KINDS = ("memdev", "decoder", "region", "port", "endpoint", "bus")


def flatten(doc: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """Every CXL object in a (possibly nested) ``cxl list`` document, by (kind, name)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for x in node:
                walk(x)
        elif isinstance(node, dict):
            kind = _kind(node)
            if kind:
                out[(kind, node[kind])] = node
            for v in node.values():
                if isinstance(v, (list, dict)):
                    walk(v)

    walk(doc)
    return out


def _kind(obj: dict[str, Any]) -> str | None:
    if "position" in obj or "target" in obj or "dport" in obj:
        return None  # mappings, targets, dports belong to their parent
    for k in KINDS:
        if isinstance(obj.get(k), str):
            if k == "memdev" and "host" not in obj:
                continue
            return k
    return None


def common_field_differences(ours: Any, theirs: Any, path: str = "") -> list[str]:
    """Fields present in both documents whose values differ (recursively)."""
    diffs: list[str] = []
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for k in ours.keys() & theirs.keys():
            if isinstance(ours[k], (dict, list)):
                diffs += common_field_differences(ours[k], theirs[k], f"{path}.{k}")
            elif ours[k] != theirs[k]:
                diffs.append(f"{path}.{k}: pycxl {ours[k]!r} != ndctl {theirs[k]!r}")
    elif isinstance(ours, list) and isinstance(theirs, list):
        if len(ours) != len(theirs):
            return [f"{path}: pycxl has {len(ours)} items, ndctl {len(theirs)}"]
        key = _sort_key(ours + theirs)
        for a, b in zip(sorted(ours, key=key), sorted(theirs, key=key), strict=True):
            diffs += common_field_differences(a, b, f"{path}[]")
    elif ours != theirs:
        diffs.append(f"{path}: pycxl {ours!r} != ndctl {theirs!r}")
    return diffs


def _sort_key(items: list[Any]) -> Any:
    if items and all(isinstance(i, dict) and "position" in i for i in items):
        return lambda i: i["position"]
    return lambda i: str(i)


def compare(ours_doc: Any, ndctl_doc: Any, kinds: tuple[str, ...]) -> tuple[int, list[str]]:
    """(number of objects compared, differences) for objects of ``kinds`` in both."""
    ours, theirs = flatten(ours_doc), flatten(ndctl_doc)
    diffs = []
    missing = [k for k in theirs if k[0] in kinds and k not in ours]
    diffs += [f"{k[0]} {k[1]}: printed by ndctl, missing from pycxl" for k in missing]
    n = 0
    for key in theirs.keys() & ours.keys():
        if key[0] in kinds:
            n += 1
            diffs += [f"{key[1]}{d}" for d in common_field_differences(ours[key], theirs[key])]
    return n, diffs
