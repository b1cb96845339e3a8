"""The Grafana dashboard and the Prometheus alert rules read only metrics that eerld (or, for the joins,
dcgm-exporter) exports. tests/ops/test_prometheus.py runs every panel's query against a real Prometheus."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.ops.dashboard import dashboard, dcgm_metric_names, panels, queries, variables
from tests.ops.promql import metric_names

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy/prometheus/eerl-alerts.yml"
PROMETHEUS_BUILTIN = {"up"}


def expressions(data: dict[str, Any]) -> list[str]:
    """Every panel target's expression and every variable's series selector."""
    return [q.expr for q in queries(data)] + [v.selector for v in variables(data) if v.selector]


class TestDashboard:
    def test_every_query_names_an_exported_metric(self, exported_names: set[str]) -> None:
        """Each PromQL expression of the dashboard (panels and variables) reads only metrics that eerld
        exports or that dcgm-exporter does (those of the dcgm-exporter fixture page)."""
        known = exported_names | dcgm_metric_names()
        unknown = {
            expr: sorted(metric_names(expr) - known)
            for expr in expressions(dashboard())
            if metric_names(expr) - known
        }
        assert unknown == {}

    def test_dcgm_series_are_joined_to_eerl_on_node_and_gpu_uuid(self) -> None:
        """A query reading a DCGM_FI_* metric joins it to an eerl series on Hostname and UUID, the labels
        both exporters give a GPU (dcgm-exporter's ``gpu`` is its own GPU id, not always NVML's index)."""
        dcgm = [
            q for q in queries(dashboard()) if any(n.startswith("DCGM_FI_") for n in metric_names(q.expr))
        ]
        assert {q.title for q in dcgm} >= {
            "Power of the job's GPUs (dcgm-exporter)",
            "SM clock of the job's GPUs: dcgm-exporter vs eerl's lock",
        }
        for q in dcgm:
            assert re.search(
                r"\bon \(Hostname, UUID\) group_left \(job_id, rank\) eerl_session_gpu_info\{", q.expr
            ), q.name

    def test_every_panel_filters_on_the_node(self) -> None:
        """Every query selects its series by the node variable (each eerl series carries Hostname)."""
        assert [q.name for q in queries(dashboard()) if '{Hostname=~"$Hostname"' not in q.expr] == []

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
            "Estimated energy saved vs predicted default",
            "Controller state",
            "Energy per valid token by job (generation + training)",
        } <= titles

    def test_no_panel_divides_by_generation_s_valid_tokens(self) -> None:
        """Generation credits no valid tokens: a per-phase ratio over them is NaN for it (it drew nothing),
        so the ratios sum both phases; and the DCGM panels say when no dcgm-exporter is scraped."""
        for panel in panels(dashboard()):
            for target in panel.get("targets", []):
                expr = target["expr"]
                if "valid_tokens_total" in expr:
                    assert "by (Hostname, phase)" not in expr
                    assert "by (job_id, phase)" not in expr
            if any("DCGM_FI_" in t["expr"] for t in panel.get("targets", [])):
                assert "dcgm-exporter" in panel["fieldConfig"]["defaults"]["noValue"]

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
