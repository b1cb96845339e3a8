"""A small PromQL scanner for the tests: which metric names does an expression read?

Not a parser: it drops strings, label matchers, ranges and grouping clauses, then takes every identifier
that is not a function, keyword or number. Good enough for dashboards and alert rules, and it fails
towards reporting too much (an unknown word shows up as a "metric"), which makes the tests strict.
"""

from __future__ import annotations

import re

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless"}
_KEYWORDS |= {"offset", "inf", "nan"}
# Aggregation operators may be followed by `by (...)` before their parenthesis.
_KEYWORDS |= {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values"}
_KEYWORDS |= {"bottomk", "topk", "quantile", "limitk", "limit_ratio"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_GRAFANA_VARS = re.compile(r"\$\{?\w+\}?")
_DURATION = re.compile(r"\b\d+(?:ms|[smhdwy])\b")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` reads (Grafana ``$variables`` allowed)."""
    text = _STRING.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GRAFANA_VARS.sub(" ", text)
    text = _GROUPING.sub(r" \1 ", text)
    text = _DURATION.sub(" ", text)
    names: set[str] = set()
    for match in _IDENT.finditer(text):
        word = match.group(0)
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or word.lower() in _KEYWORDS:
            continue  # a function call or keyword
        names.add(word)
    return names
