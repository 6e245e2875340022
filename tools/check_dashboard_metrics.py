#!/usr/bin/env python3
"""Checks that every metric a Grafana dashboard's queries name exists in a /metrics text.

Usage: python3 tools/check_dashboard_metrics.py DASHBOARD.json METRICS.txt
Exits 1 naming the metrics the text lacks (histogram series _bucket/_sum/_count count as
their histogram), 0 when all are there.
"""
import json
import re
import sys


def main():
    dash = json.load(open(sys.argv[1]))
    text = open(sys.argv[2]).read()
    declared = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    wanted = set()
    for p in dash["panels"]:
        for t in p["targets"]:
            wanted.update(re.findall(r"oasis:[a-z0-9_]+", t["expr"]))
    for v in dash.get("templating", {}).get("list", []):
        wanted.update(re.findall(r"oasis:[a-z0-9_]+", v.get("query", "")))
    missing = sorted(m for m in wanted
                     if m not in declared and re.sub(r"_(bucket|sum|count)$", "", m) not in declared)
    if missing:
        print("metrics the dashboard names but /metrics lacks: " + ", ".join(missing))
        return 1
    print(f"all {len(wanted)} metrics of the dashboard are in /metrics")
    return 0


if __name__ == "__main__":
    sys.exit(main())
