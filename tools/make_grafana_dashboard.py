#!/usr/bin/env python3
"""Writes docs/grafana/oasiskv.json: a Grafana dashboard over oasis-server's /metrics.

The panels follow vLLM's published Grafana dashboard (latency quantiles, token throughput,
scheduler state, cache use, prompt/generation length heatmaps, finish reasons, queue, prefill
and decode time) with our metric names (prefix oasis:, label model_name), plus the panels only
OasisKV has (sparse KV, the host KV store, lookahead drafts, the HTTP front). Every metric it
names is checked against a live server's /metrics by tests/e2e/test_server_http.sh
(tools/check_dashboard_metrics.py).

Usage: python3 tools/make_grafana_dashboard.py [--out docs/grafana/oasiskv.json]
"""
import argparse
import json
import os

SEL = '{model_name="$model_name"}'
RATE = "[$__rate_interval]"


def quantiles(metric):
    out = []
    for q in ("0.99", "0.95", "0.9", "0.5"):
        out.append((f"histogram_quantile({q}, sum by(le) (rate({metric}_bucket{SEL}{RATE})))", f"P{q[2:] or '100'}"))
    out.append((f"rate({metric}_sum{SEL}{RATE}) / rate({metric}_count{SEL}{RATE})", "Average"))
    return out


PANELS = [
    ("E2E Request Latency", "timeseries", "s", quantiles("oasis:e2e_request_latency_seconds")),
    ("Token Throughput", "timeseries", "tokens/s", [
        (f"rate(oasis:prompt_tokens_total{SEL}{RATE})", "Prompt tokens/s"),
        (f"rate(oasis:generation_tokens_total{SEL}{RATE})", "Generation tokens/s")]),
    ("Inter Token Latency", "timeseries", "s", quantiles("oasis:inter_token_latency_seconds")),
    ("Scheduler State", "timeseries", "none", [
        (f"oasis:num_requests_running{SEL}", "Running"),
        (f"oasis:num_requests_waiting{SEL}", "Waiting")]),
    ("Time To First Token Latency", "timeseries", "s", quantiles("oasis:time_to_first_token_seconds")),
    ("Cache Utilization", "timeseries", "percentunit", [
        (f"oasis:kv_cache_usage_perc{SEL}", "GPU KV cache"),
        (f"oasis:host_kv_usage{SEL}", "Host KV store")]),
    ("Request Prompt Length", "heatmap", "none", [
        (f"sum by(le) (increase(oasis:request_prompt_tokens_bucket{SEL}{RATE}))", "{{le}}")]),
    ("Request Generation Length", "heatmap", "none", [
        (f"sum by(le) (increase(oasis:request_generation_tokens_bucket{SEL}{RATE}))", "{{le}}")]),
    ("Finish Reason", "timeseries", "none", [
        (f"sum by(finished_reason) (increase(oasis:request_success_total{SEL}{RATE}))", "{{finished_reason}}")]),
    ("Queue Time", "timeseries", "s", [
        (f"rate(oasis:request_queue_time_seconds_sum{SEL}{RATE})", "Queue time (s per s)")]),
    ("Requests Prefill and Decode Time", "timeseries", "s", [
        (f"rate(oasis:request_prefill_time_seconds_sum{SEL}{RATE})", "Prefill"),
        (f"rate(oasis:request_decode_time_seconds_sum{SEL}{RATE})", "Decode")]),
    ("Preemptions", "timeseries", "none", [
        (f"rate(oasis:num_preemptions_total{SEL}{RATE})", "Preemptions/s")]),
    ("Sparse KV: requests and hit rate", "timeseries", "none", [
        (f"oasis:sparse_requests{SEL}", "Sparse requests"),
        (f"oasis:sparse_hit_rate{SEL}", "Working-set hit rate")]),
    ("Sparse KV: host to device traffic", "timeseries", "Bps", [
        (f"rate(oasis:sparse_h2d_bytes_total{SEL}{RATE})", "H2D bytes/s"),
        (f"rate(oasis:sparse_transfer_wait_seconds_total{SEL}{RATE})", "Transfer wait (s per s)")]),
    ("Lookahead drafts", "timeseries", "none", [
        (f"oasis:spec_decode_draft_acceptance_rate{SEL}", "Acceptance rate"),
        (f"oasis:spec_decode_tokens_per_step{SEL}", "Tokens per step")]),
    ("Prefix cache", "timeseries", "none", [
        (f"rate(oasis:prefix_cache_hits_total{SEL}{RATE}) / rate(oasis:prefix_cache_queries_total{SEL}{RATE})",
         "Hit rate (tokens)"),
        (f"rate(oasis:prefix_cache_hits_total{SEL}{RATE})", "Cached prompt tokens/s"),
        (f"rate(oasis:prefix_cache_evictions_total{SEL}{RATE})", "Evicted blocks/s"),
        (f"oasis:num_cached_free_kv_blocks{SEL}", "Cached free blocks")]),
    ("Prefix cache: host tier", "timeseries", "Bps", [
        (f"rate(oasis:prefix_cache_host_spilled_bytes_total{SEL}{RATE})", "Spilled bytes/s"),
        (f"rate(oasis:prefix_cache_host_reloaded_bytes_total{SEL}{RATE})", "Reloaded bytes/s")]),
    ("Prefix cache: decode instance (disaggregation)", "timeseries", "none", [
        (f"rate(oasis:rpf_prefix_cache_hit_tokens_total{SEL}{RATE})", "Imported prompt tokens held already/s"),
        (f"rate(oasis:rpf_admission_bytes_total{SEL}{RATE})", "Admission bytes fetched/s"),
        (f"oasis:rpf_prefix_cache_blocks{SEL}", "Cached prompt blocks"),
        (f"rate(oasis:rpf_prefix_cache_evictions_total{SEL}{RATE})", "Evicted blocks/s")]),
    ("HTTP front", "timeseries", "none", [
        (f"oasis:http_connections_open{SEL}", "Open connections"),
        (f"sum by(status) (rate(oasis:http_requests_total{SEL}{RATE}))", "HTTP {{status}}/s")]),
]


def panel(i, title, kind, unit, targets):
    return {
        "id": i + 1,
        "title": title,
        "type": kind,
        "datasource": {"type": "prometheus", "uid": "${DS_PROMETHEUS}"},
        "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [{"refId": chr(ord("A") + j), "expr": expr, "legendFormat": legend,
                     "datasource": {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}}
                    for j, (expr, legend) in enumerate(targets)],
    }


def dashboard():
    return {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource",
                      "pluginId": "prometheus", "pluginName": "Prometheus"}],
        "title": "OasisKV",
        "uid": "oasiskv",
        "description": "oasis-server's /metrics (docs/server.md, Metrics)",
        "schemaVersion": 39,
        "time": {"from": "now-30m", "to": "now"},
        "refresh": "10s",
        "templating": {"list": [
            {"name": "DS_PROMETHEUS", "type": "datasource", "query": "prometheus", "label": "datasource"},
            {"name": "model_name", "type": "query", "label": "model",
             "datasource": {"type": "prometheus", "uid": "${DS_PROMETHEUS}"},
             "query": "label_values(oasis:num_requests_running, model_name)", "refresh": 1},
        ]},
        "panels": [panel(i, *p) for i, p in enumerate(PANELS)],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "docs", "grafana", "oasiskv.json"))
    args = ap.parse_args()
    with open(args.out, "w") as f:
        json.dump(dashboard(), f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
