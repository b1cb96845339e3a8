"""The Grafana dashboard and the Prometheus alert rules read only metrics that eerld exports."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.ops.promql import metric_names

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy/grafana/eerl-dashboard.json"
ALERTS = ROOT / "deploy/prometheus/eerl-alerts.yml"
PROMETHEUS_BUILTIN = {"up"}


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(data: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in data["panels"]:
        yield panel
        yield from panel.get("panels", [])


def expressions(data: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in panels(data) for t in p.get("targets", [])]
    for var in data["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, dict):
            # label_values(metric{...}, label): the metric is the first argument.
            exprs.append(query["query"].removeprefix("label_values(").rsplit(",", 1)[0])
    return exprs


class TestDashboard:
    def test_every_query_names_an_exported_metric(self, exported_names: set[str]) -> None:
        """Each PromQL expression of the dashboard (panels and variables) reads only exported metrics."""
        unknown = {
            expr: sorted(metric_names(expr) - exported_names)
            for expr in expressions(dashboard())
            if metric_names(expr) - exported_names
        }
        assert unknown == {}

    def test_every_query_reads_some_metric(self) -> None:
        """No expression is a constant: each one reads at least one metric."""
        assert all(metric_names(expr) for expr in expressions(dashboard()))

    def test_node_and_job_views_cover_the_issue(self) -> None:
        """Clocks per phase, energy per valid token vs default, savings and controller state have panels."""
        titles = {p["title"] for p in panels(dashboard())}
        assert {"Node: GPUs", "Job"} <= titles
        assert {
            "Chosen SM clock per phase",
            "Energy per valid token vs predicted default",
            "Estimated savings vs predicted default",
            "Controller state",
        } <= titles

    def test_panel_ids_are_unique_and_targets_use_the_datasource_variable(self) -> None:
        """Grafana needs unique panel ids; targets follow the dashboard's Prometheus picker."""
        all_panels = list(panels(dashboard()))
        assert len({p["id"] for p in all_panels}) == len(all_panels)
        datasources = {t["datasource"]["uid"] for p in all_panels for t in p.get("targets", [])}
        assert datasources == {"${datasource}"}


class TestAlertRules:
    def test_rules_are_valid_for_promtool(self, promtool: str) -> None:
        """promtool check rules accepts the alert file."""
        done = subprocess.run(
            [promtool, "check", "rules", str(ALERTS)], check=False, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr

    def test_rules_read_only_exported_metrics(self, exported_names: set[str]) -> None:
        """Every alert expression reads eerld's metrics (or Prometheus's own `up`)."""
        rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
        unknown = {
            r["alert"]: sorted(metric_names(r["expr"]) - exported_names - PROMETHEUS_BUILTIN) for r in rules
        }
        assert {k: v for k, v in unknown.items() if v} == {}
