"""Numbers, lists and library types at every boundary: every option of every command
(walked from the CLI's own table, as test_fuzz does) and every public library function.

- A number is ASCII digits in the option's units: other scripts' digits (Arabic-Indic,
  fullwidth, Devanagari, superscripts), and what only Python reads ('1_000', '+1', a
  blank, hex where the option is no address or size) are usage errors naming the value.
- A list refuses an empty item and folds a repeated one, the same in every list.
- A library function handed the wrong type raises one of pycxl's errors, never an
  AttributeError or TypeError from inside.

Nothing on this host changes: writing commands plan (--dry-run) on a tree copy.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from pycxl.cli.memdev_cmd import AddressType
from pycxl.cli.params import (
    CountType,
    FiniteType,
    IntegerType,
    IntListType,
    NamesType,
    ObjectNamesType,
    PidType,
    RatesType,
    SizeType,
    WeightsType,
    flatten,
)

import pycxl
from pycxl.base.errors import InvalidRequestError, NotFoundError, PycxlError

from .test_fuzz import TREES, command, commands, host_state, run_in_child

NUMBER_TYPES = (SizeType, CountType, FiniteType, IntegerType, IntListType, PidType,
                RatesType, AddressType)  # fmt: skip
# Arabic-Indic, fullwidth, Devanagari, a superscript: int() and float() read them all
OTHER_DIGITS = ["\u0661\u0662", "\uff16\uff14", "\u0967\u0968", "\u00b2", "\u0660x1"]
PYTHON_ONLY = ["1_000", "+1", " 1", "0x1F", "1e3"]
# forms an option's grammar takes: sizes and addresses are hex too, sizes and list items
# may stand between blanks, seconds and rates take an exponent
ALLOWED: dict[type, set[str]] = {
    SizeType: {"0x1F", " 1"}, AddressType: {"0x1F"}, IntListType: {" 1"},
    RatesType: {" 1", "1e3"}, FiniteType: {"1e3"},
}  # fmt: skip


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    copy = tmp_path_factory.mktemp("numbers") / "tree"
    shutil.copytree(TREES / "two-dev" / "region", copy, symlinks=True)
    yield str(copy)


def params_of(kinds: tuple[type, ...]) -> list[tuple[tuple[str, ...], click.Parameter]]:
    """Every (command, parameter) whose type is one of ``kinds``."""
    return [(path, p) for path in commands() for p in command(path).params
            if isinstance(p.type, kinds) and not getattr(p, "count", False)]  # fmt: skip


def argv_with(path: tuple[str, ...], param: click.Parameter, value: str) -> list[str]:
    """``pycxl PATH`` with ``value`` for ``param`` alone: the value is converted before
    any required parameter is missed, so the refusal is the value's."""
    if isinstance(param, click.Option):
        return [*path, param.opts[0], value]
    args: list[click.Parameter] = [p for p in command(path).params
                                   if isinstance(p, click.Argument)]  # fmt: skip
    return [*path, *["1"] * args.index(param), value]  # the ones before it: good numbers


def _id(v: Any) -> str:
    return " ".join(v) if isinstance(v, tuple) else getattr(v, "name", None) or str(v)


# --- (a) numbers ----------------------------------------------------------------------------
def test_click_number_types_are_not_used() -> None:
    """click's INT and FLOAT read with int() and float(): every number goes through
    pycxl's own types (pycxl.base.values), whose digits are ASCII."""
    loose = params_of((click.types.IntParamType, click.types.FloatParamType))
    assert not loose, [(" ".join(path), p.name) for path, p in loose]


@pytest.mark.parametrize("path,param", params_of(NUMBER_TYPES), ids=_id)
def test_numbers_are_ascii_digits(path: tuple[str, ...], param: click.Parameter) -> None:
    allowed = next((v for t, v in ALLOWED.items() if isinstance(param.type, t)), set())
    for bad in OTHER_DIGITS + [v for v in PYTHON_ONLY if v not in allowed]:
        code, out, err = run_in_child(argv_with(path, param, bad))
        said = f"pycxl {' '.join(argv_with(path, param, bad))!r}: exit {code}\n{out}{err}"
        assert code == 2 and err.startswith("pycxl: error:"), said
        assert bad in err and "Traceback" not in err, said


NAME_LISTS = params_of((NamesType, ObjectNamesType))


@pytest.mark.parametrize("path,param", NAME_LISTS, ids=_id)
def test_ids_in_other_digits_are_refused(path: tuple[str, ...], param: click.Parameter) -> None:
    """Node, CPU and object ids ('\uff10', 'mem\u0661') are mistyped numbers, not unknown names."""
    for bad in ("\uff10", "mem\u0661", "0-\uff12"):
        code, _, err = run_in_child(argv_with(path, param, bad))
        assert code == 2 and bad in err, f"{path} {bad!r}: exit {code}\n{err}"


def test_library_numbers_are_ascii_digits() -> None:
    from pycxl.base.units import parse_size
    from pycxl.base.values import address_text, integer_text, pid, real_text

    for bad in [*OTHER_DIGITS, "1_000", "+1", " 1"]:
        for read in (parse_size, pid, lambda v: integer_text(v, "n"),
                     lambda v: real_text(v, "s"), lambda v: address_text(v, "a")):  # fmt: skip
            if bad == " 1" and read is parse_size:
                continue  # a size may stand between blanks
            with pytest.raises(InvalidRequestError, match=re.escape(bad)):
                read(bad)
    with pytest.raises(InvalidRequestError, match="\u0661\u0662"):
        pycxl.allocate("\u0661\u0662M", "dram0")
    for many in ({"samples": 1001}, {"loads": 1 << 40}):  # bounded before measuring
        with pytest.raises(InvalidRequestError, match="at most"):
            pycxl.bench.measure_latency("dram0", **many)


# --- (b) lists ------------------------------------------------------------------------------
# one good item for each list: options whose type is a list, lists checked by the command
GOOD = {"threads": "1", "rates": "1", "set_weights": "dram0=1", "tune": "0", "membind": "0",
        "preferred_many": "0", "interleave": "0", "weighted": "0", "cpunodebind": "0",
        "physcpubind": "0", "memdevs": "mem0", "ports": "port1", "buses": "root0",
        "regions": "region0", "mix": "read", "modes": "hbm", "targets": "dram0",
        "buses_filter": "root0", "ports_filter": "port1", "endpoints_filter": "endpoint2",
        "memdevs_filter": "mem0", "decoders_filter": "0.0", "regions_filter": "region0",
        "serial_filter": "0x1"}  # fmt: skip
LIST_TYPES = (IntListType, RatesType, WeightsType, NamesType, ObjectNamesType)
LISTS = params_of(LIST_TYPES) + [
    (path, p) for path in commands() for p in command(path).params
    if p.name in GOOD and not isinstance(p.type, LIST_TYPES) and not getattr(p, "is_flag", False)
] + [(("bench", "offload"), p) for p in command(("bench", "offload")).params
     if p.name == "target"]  # its TARGETS, a list  # fmt: skip


def test_every_list_is_known() -> None:
    assert all(p.name in GOOD for _, p in params_of(LIST_TYPES))
    assert len(LISTS) >= 30


def _bounded(path: tuple[str, ...], param: click.Parameter, tree: str) -> list[str]:
    """What keeps a command that reads the list from acting (it plans on the tree copy),
    and what it needs besides (a target)."""
    names = {p.name for p in command(path).params}
    extra = ["--dry-run"] if "dry_run" in names else []
    extra += ["--sysroot", tree] if "sysroot" in names else []
    if path[0] == "bench" and "target" in names and param.name != "target":
        extra += ["--target", "dram0"]
    return extra


@pytest.mark.parametrize("path,param", LISTS, ids=_id)
def test_lists_refuse_empty_items(path: tuple[str, ...], param: click.Parameter,
                                  tree: str) -> None:  # fmt: skip
    good = GOOD.get(str(param.name), "dram0")
    for bad in (f"{good},,{good}", f",{good}", f"{good},"):
        argv = argv_with(path, param, bad) + _bounded(path, param, tree)
        code, out, err = run_in_child(argv)
        said = f"pycxl {argv!r}: exit {code}\n{out[-300:]}{err}"
        assert code == 2 and "Traceback" not in err, said
        assert "empty" in err and (bad in err or bad.strip(",") in err), said


@pytest.mark.parametrize("path,param", params_of(LIST_TYPES), ids=_id)
def test_list_types_fold_repeats(path: tuple[str, ...], param: click.Parameter) -> None:
    good = GOOD[str(param.name)]
    ctx = click.Context(command(path))
    if isinstance(param.type, WeightsType):
        return  # a node given two weights is refused by the command (they may differ)
    once, twice = param.type.convert(good, param, ctx), param.type.convert(f"{good},{good}",
                                                                           param, ctx)  # fmt: skip
    if isinstance(param.type, ObjectNamesType):  # folded with the other arguments' names
        once, twice = flatten((once,)), flatten((twice, once))
    assert once == twice


def test_a_region_names_each_position_once() -> None:
    """region create's MEMDEVs are the interleave set's positions: one named twice is
    refused, not folded into a narrower region."""
    fresh = str(TREES / "two-dev" / "fresh")
    for memdevs in (["mem0,mem0"], ["0x1", "0x1"], ["mem0", "mem0,mem1"]):
        code, _, err = run_in_child(["region", "create", *memdevs, "--dry-run", "--sysroot",
                                     fresh])  # fmt: skip
        assert code == 2 and "named twice" in err, err


@pytest.mark.parametrize("argv", [
    ["bus", "disable", "root0,root0", "root0", "-f"],
    ["port", "disable", "port1", "port1,port1", "-f"],
    ["memdev", "disable", "mem0", "mem0,mem0", "-f"],
    ["region", "disable", "region0", "region0", "-f"],
], ids=" ".join)  # fmt: skip
def test_objects_named_twice_are_planned_once(argv: list[str], tree: str) -> None:
    code, out, err = run_in_child([*argv, "--dry-run", "--json", "--sysroot", tree])
    assert code == 0, err
    doc = json.loads(out)
    assert len(doc if isinstance(doc, list) else [doc]) == 1, out


def test_name_lists_fold_and_refuse_empty_items() -> None:
    from pycxl.resolve.tiers import split_names

    assert split_names("dram0,dram0,0") == ["dram0", "0"]
    assert flatten((("mem0", "mem1"), ("mem0",))) == ("mem0", "mem1")
    for bad in ("dram0,,dram0", ",", ["dram0", ""], []):
        with pytest.raises(InvalidRequestError):
            split_names(bad)


# --- names: one case rule -------------------------------------------------------------------
@pytest.mark.parametrize("argv,near", [
    (["bench", "latency", "-t", "DRAM0"], "dram0"),
    (["list", "-m", "MEM0"], "mem0"),
    (["run", "-m", "DRAM0", "--", "true"], "dram0"),
    (["bus", "disable", "ROOT0", "--dry-run"], "root0"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else v)  # fmt: skip
def test_names_are_case_sensitive_with_a_hint(argv: list[str], near: str, tree: str) -> None:
    extra = ["--sysroot", tree] if argv[0] in ("list", "bus") else []
    code, _, err = run_in_child([*argv, *extra])
    assert code == 5 and f"did you mean '{near}'" in err, err


# --- (c) the library ------------------------------------------------------------------------
def public_functions() -> list[tuple[str, Callable[..., Any]]]:
    """Every public function of pycxl and pycxl.bench (list_json and matrix_pairs too),
    and the public classes a caller fills in (a policy, a buffer, requests, an alert)."""
    from pycxl.cxl.alerts import AlertChange

    out = [(f"{m.__name__}.{n}", getattr(m, n)) for m in (pycxl, pycxl.bench)
           for n in m.__all__ if inspect.isfunction(getattr(m, n))]  # fmt: skip
    classes = (pycxl.Policy, pycxl.NumaBuffer, pycxl.RegionRequest, pycxl.ListRequest,
               AlertChange, pycxl.Policy.preferred)  # fmt: skip
    return out + [(getattr(c, "__qualname__", str(c)), c) for c in classes]


WRONG = [None, 3, "x", b"x", object()]


def good_value(name: str) -> Any:
    """A value that passes for a required parameter, so the wrong one is what fails."""
    from pycxl.cxl.alerts import AlertChange

    return {"request": pycxl.RegionRequest(), "changes": [AlertChange("life_used", False)],
            "system": None, "req": pycxl.ListRequest(), "policy": pycxl.Policy.bind(0),
            "alert": "life_used", "enable": False, "mode": 2, "node": 0,
            "size": 4096}.get(name, "mem0")  # fmt: skip


@pytest.mark.parametrize("name,function", public_functions(), ids=lambda v: str(v)[:40])
def test_wrong_types_raise_pycxl_errors(name: str, function: Callable[..., Any],
                                        tree: str) -> None:  # fmt: skip
    params = [p for p in inspect.signature(function).parameters.values()
              if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]  # fmt: skip
    writes = {"dry_run", "sysroot"} <= {p.name for p in params}
    before = host_state()
    os.environ["PYCXL_BENCH_QUICK"] = "1"
    try:
        for p in params:
            for wrong in WRONG:
                kwargs = {q.name: good_value(q.name) for q in params
                          if q.default is inspect.Parameter.empty}  # fmt: skip
                kwargs |= {"dry_run": True, "sysroot": tree} if writes else {}
                kwargs[p.name] = wrong
                try:
                    result = function(**kwargs)
                    if hasattr(result, "close"):
                        result.close()
                except PycxlError:
                    pass
                except Exception as e:  # what this test looks for: not pycxl's error
                    pytest.fail(f"{name}({p.name}={wrong!r}): {type(e).__name__}: {e}")
    finally:
        os.environ.pop("PYCXL_BENCH_QUICK", None)
    assert host_state() == before


def test_library_and_cli_share_the_alert_checker(tree: str) -> None:
    from pycxl.cxl.alerts import AlertChange

    for alert, threshold in (("bogus", 5), ("life_used", -1), ("life_used", 101),
                             ("over_temperature", 2**20), ("life_used", True)):  # fmt: skip
        host = pycxl.snapshot(tree, gpus=False)
        with pytest.raises(InvalidRequestError):
            pycxl.set_alert_config("mem0", [AlertChange(alert, True, threshold)], system=host,
                                   dry_run=True)  # fmt: skip
    argv = ["memdev", "set-alert-config", "mem0", "-L", "101", "--life-used-alert", "on"]
    code, _, err = run_in_child([*argv, "--dry-run", "--sysroot", tree])
    assert code == 2 and "from 0 to 100" in err, err


def test_messages_name_their_own_kind(tree: str) -> None:
    from pycxl.resolve.tiers import gpu_name

    with pytest.raises(InvalidRequestError, match="such as gpu0"):
        gpu_name(" ")
    with pytest.raises(InvalidRequestError, match="0-3,8 or cpu2"):
        pycxl.snapshot(gpus=False).cpus("0,,1")
    with pytest.raises(InvalidRequestError, match="port1"):
        pycxl.disable_port("", system=pycxl.snapshot(tree, gpus=False), dry_run=True)
    with pytest.raises(NotFoundError, match="did you mean 'mem0'"):
        pycxl.disable_memdev("MEM0", system=pycxl.snapshot(tree, gpus=False), dry_run=True)
    code, _, err = run_in_child(["bench", "loaded-latency", "-t", "dram0", "--rates", "-1"])
    assert code == 2 and "rate '-1' GB/s" in err and "e+" not in err and "-1000" not in err
    code, _, err = run_in_child(["bench", "loaded-latency", "-t", "dram0", "--rates", "1",
                                 "--steps", "2"])  # fmt: skip
    assert code == 2 and "fractions" not in err, err
    fresh = str(TREES / "two-dev" / "fresh")
    code, _, err = run_in_child(["memdev", "free-dpa", "mem0", "--dry-run", "--sysroot", fresh])
    assert code == 2 and "nothing to free" in err, err
    code, out, err = run_in_child(["bus", "enable", "root0", "--dry-run", "--sysroot", tree])
    assert code == 0 and "nothing to do" in out, err
    assert Path(fresh).is_dir()


def test_an_expectation_given_twice_is_one_unless_they_differ() -> None:
    from pycxl.ops.check_expect import parse_expectations

    assert parse_expectations(["regions=1", "regions=1"]).counts == {"regions": 1}
    with pytest.raises(InvalidRequestError, match="give it once"):
        parse_expectations(["cxl0=1G", "cxl0=2G"])  # never the last one silently
