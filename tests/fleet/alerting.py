"""Prometheus' own rule tests (``promtool test rules``) fed with what pycxl writes.

A host's history is a list of phases; each phase holds the series node_exporter served
after reading pycxl's textfiles (``pycxl check --textfile``, ``pycxl stat --textfile``),
one sample a minute, as Prometheus would scrape them. What promtool cannot take from a
file is written here, and only that: a textfile rewritten every minute carries the time
of that minute in its ``*_timestamp_seconds`` (promtool's clock starts at 0), a series
that leaves the file gets a staleness marker (as a scrape would give it), and a counter
can be given a rate (the recorded trees' counters stand still).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "contrib" / "prometheus" / "pycxl-alerts.yml"
_LINE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{.*\})?\s+(\S+)$")
_TEMPLATE = re.compile(r"\{\{\s*\$labels\.(\w+)\s*\}\}")
STAMPS = (
    "pycxl_check_timestamp_seconds",
    "pycxl_stat_timestamp_seconds",
    "pycxl_top_timestamp_seconds",
)


def promtool() -> str | None:
    """Prometheus' promtool (Debian's prometheus package)."""
    return shutil.which("promtool")


def samples(lines: Iterable[str], prefix: str = "pycxl_") -> dict[str, float]:
    """Series (``name{labels}`` as written) -> value, of the exposition ``lines``."""
    out = {}
    for line in lines:
        m = _LINE.match(line)
        if m and m.group(1).startswith(prefix):
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


@dataclass
class Phase:
    """``minutes`` of one-a-minute scrapes serving ``series``. ``fresh``: the textfiles
    are rewritten each minute (their timestamps advance); ``rates``: series -> increase
    per minute for counters that move."""

    minutes: int
    series: dict[str, float]
    fresh: bool = True
    rates: dict[str, float] = field(default_factory=dict)


def _with(series: str, labels: Mapping[str, str]) -> str:
    extra = ",".join(f'{k}="{v}"' for k, v in labels.items())
    if "{" not in series:
        return f"{series}{{{extra}}}"
    return series[:-1] + ("," if not series.endswith("{}") else "") + extra + "}"


def input_series(phases: list[Phase], instance: str, job: str = "node") -> list[dict[str, str]]:
    """promtool's input_series for one host: every series any phase serves, with a
    value each minute (``stale`` the minute it leaves, ``_`` while it stays away), and
    Prometheus' own ``up`` at 1 (node_exporter answered every scrape)."""
    names = sorted({s for p in phases for s in p.series})
    values: dict[str, list[str]] = {s: [] for s in names}
    last: dict[str, float] = {}
    minute = 0
    for p in phases:
        for _ in range(p.minutes):
            for s in names:
                if s not in p.series:
                    gone = values[s] and values[s][-1] not in ("stale", "_")
                    values[s].append("stale" if gone else "_")
                    last.pop(s, None)
                    continue
                name = s.split("{", 1)[0]
                if name in STAMPS:
                    v = float(minute * 60) if p.fresh or s not in last else last[s]
                elif s in p.rates:
                    v = last.get(s, p.series[s]) + (p.rates[s] if s in last else 0.0)
                else:
                    v = p.series[s]
                last[s] = v
                values[s].append(repr(v))
            minute += 1
    labels = {"instance": instance, "job": job}
    out = [{"series": _with(s, labels), "values": " ".join(v)} for s, v in values.items()]
    out.append({"series": _with("up", labels), "values": " ".join(["1"] * minute)})
    return out


def rules() -> dict[str, dict[str, Any]]:
    """alertname -> rule, from the shipped rule file."""
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}


def render(text: str, labels: Mapping[str, str]) -> str:
    """An annotation as Prometheus expands it: the rule file uses only
    ``{{ $labels.NAME }}`` in annotations (a label the alert lacks expands to '')."""
    out = _TEMPLATE.sub(lambda m: labels.get(m.group(1), ""), text)
    assert "{{" not in out, f"annotation uses more than $labels: {text!r}"
    return out


def expected(alertname: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """One expected alert: the series' labels plus the rule's (``labels`` must give the
    rule's own labels where they are templated, such as severity)."""
    rule = rules()[alertname]
    every = {k: v for k, v in rule.get("labels", {}).items() if "{{" not in v} | dict(labels)
    return {
        "exp_labels": every,
        "exp_annotations": {k: render(v, every) for k, v in rule["annotations"].items()},
    }


def run(
    tmp: Path,
    series: list[dict[str, str]],
    checks: dict[int, dict[str, list[dict[str, Any]]]],
) -> subprocess.CompletedProcess[str]:
    """Run promtool on the shipped rules: ``checks`` maps an evaluation minute to
    alertname -> the alerts expected firing then (every rule is checked at every
    minute given: an alert not listed must not fire)."""
    exe = promtool()
    assert exe is not None
    names = list(rules())
    tests = [
        {"eval_time": f"{minute}m", "alertname": name, "exp_alerts": alerts.get(name, [])}
        for minute, alerts in sorted(checks.items())
        for name in names
    ]
    shutil.copy(RULES, tmp / RULES.name)
    doc = {
        "rule_files": [RULES.name],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": tests}],
    }
    (tmp / "pycxl-alerts.test.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return subprocess.run([exe, "test", "rules", "pycxl-alerts.test.yml"], cwd=tmp,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
