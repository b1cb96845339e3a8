"""The Grafana dashboard as data for the tests: its panels, queries and variables, and Grafana's
interpolation of ``$variables`` into PromQL (for the Prometheus data source), so that a test can send
Prometheus exactly what Grafana would."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy/grafana/eerl-dashboard.json"
DCGM_FIXTURE = ROOT / "tests/ops/data/dcgm-exporter.prom"

# $name, ${name}, ${name:format} and [[name]], Grafana's variable syntaxes.
_VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]")
# What Grafana's Prometheus data source escapes in the value of a multi-value or "All" variable
# (prometheusSpecialRegexEscape): the value lands in a regex matcher inside a PromQL string.
_REGEX_SPECIAL = re.compile(r"[$^*{}\[\]'+?.()|]")
_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<selector>.+),\s*)?(?P<label>\w+)\)$")


@dataclass(frozen=True)
class Query:
    """One target of one panel."""

    panel_id: int
    title: str
    ref_id: str
    expr: str

    @property
    def name(self) -> str:
        return f"{self.title} [{self.ref_id}]"


@dataclass(frozen=True)
class Variable:
    """A ``label_values(selector, label)`` query variable of the dashboard."""

    name: str
    selector: str
    """The series selector (may hold earlier variables; empty for ``label_values(label)``)."""
    label: str
    multi: bool


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(data: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    for panel in data["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queries(data: dict[str, Any]) -> list[Query]:
    """Every panel's every target, in dashboard order."""
    return [
        Query(panel["id"], panel["title"], target["refId"], target["expr"])
        for panel in panels(data)
        for target in panel.get("targets", [])
    ]


def variables(data: dict[str, Any]) -> list[Variable]:
    """The dashboard's query variables, in the order Grafana resolves them."""
    out: list[Variable] = []
    for var in data["templating"]["list"]:
        if var["type"] != "query":
            continue
        definition = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        match = _LABEL_VALUES.match(definition.strip())
        if match is None:
            raise ValueError(f"variable {var['name']}: not a label_values() query: {definition}")
        multi = bool(var.get("multi") or var.get("includeAll"))
        out.append(Variable(var["name"], match["selector"] or "", match["label"], multi))
    return out


def regex_escape(value: str) -> str:
    """A variable value as Grafana writes it into a regex matcher (``a.b`` → ``a\\\\.b``)."""
    return _REGEX_SPECIAL.sub(lambda m: "\\\\" + m.group(0), value.replace("\\", "\\\\\\\\"))


def interpolate(expr: str, values: Mapping[str, str | Sequence[str]]) -> str:
    """``expr`` with Grafana's substitutions: a sequence is a multi-value or "All" variable's selection
    (``(a|b)``, each regex-escaped; one value alone is just escaped), a string is used as it is (built-ins
    such as ``$__rate_interval``). A variable without a value raises KeyError: Grafana would send the
    query with the ``$name`` left in, which Prometheus rejects."""

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        if name not in values:
            raise KeyError(f"no value for ${name} in {expr!r}")
        value = values[name]
        if isinstance(value, str):
            return value
        escaped = [regex_escape(v) for v in value]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"

    return _VARIABLE.sub(substitute, expr)


def dcgm_metric_names() -> set[str]:
    """The metric names of the dcgm-exporter fixture page (what a node's dcgm-exporter exports)."""
    names: set[str] = set()
    for line in DCGM_FIXTURE.read_text().splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names
