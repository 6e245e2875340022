#!/usr/bin/env python3
"""Turns oasis-bench result files (--result-file) into PNG plots with gnuplot.

  tools/plot_bench.py --out-dir plots results/c1.json results/c4.json results/c16.json

Writes into --out-dir:
  throughput_vs_concurrency.png  output and total token throughput against max concurrency
                                 (request rate when runs are paced instead), one line per label
  latency_vs_concurrency.png     median and p99 TTFT / TPOT against the same x axis
  latency_percentiles.png        p50..p99.9 of TTFT, TPOT, ITL and E2EL for every file,
                                 computed from its per-request records
and the gnuplot data files beside them (*.dat) so the numbers can be checked or re-plotted.

Runs are grouped into lines by the result's config.label (oasis-bench --label), else by
model and endpoint. Needs gnuplot (Debian: apt-get install gnuplot-nox); only the Python
standard library otherwise. Exit status: 0 on success, 1 on bad input, 2 without gnuplot.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys

PERCENTILES = [50, 75, 90, 95, 99, 99.9]


def percentile(values, p):
    """numpy's default (linear interpolation between closest ranks), as oasis-bench uses."""
    if not values:
        return float("nan")
    v = sorted(values)
    rank = p / 100.0 * (len(v) - 1)
    lo = int(math.floor(rank))
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (rank - lo)


def load(path):
    with open(path) as f:
        result = json.load(f)
    for key in ("config", "summary", "requests"):
        if key not in result:
            raise ValueError(f"{path}: not an oasis-bench result (no '{key}')")
    return result


def label_of(result, path):
    cfg = result["config"]
    if cfg.get("label"):
        return cfg["label"]
    return f"{cfg.get('model_id', '?')} {cfg.get('endpoint', '')}".strip()


def x_of(result):
    """(axis name, value): max concurrency when set, else the request rate, else num prompts."""
    cfg = result["config"]
    if cfg.get("max_concurrency") is not None:
        return "max concurrency", float(cfg["max_concurrency"])
    rate = cfg.get("request_rate")
    if isinstance(rate, (int, float)):
        return "request rate (req/s)", float(rate)
    return "concurrent requests (all at once)", float(cfg.get("num_prompts", 0))


def gp_quote(text):
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


def request_metrics(result):
    ttft, tpot, itl, e2el = [], [], [], []
    for r in result["requests"]:
        if not r.get("success"):
            continue
        ttft.append(r["ttft_ms"])
        e2el.append(r["e2el_ms"])
        if r.get("tpot_ms") is not None:
            tpot.append(r["tpot_ms"])
        itl.extend(r.get("itl_ms", []))
    return {"TTFT": ttft, "TPOT": tpot, "ITL": itl, "E2EL": e2el}


def write_series_data(out_dir, groups):
    """One data file per label: x, output tok/s, total tok/s, req/s, ttft med/p99, tpot med/p99."""
    files = []
    for i, (label, runs) in enumerate(sorted(groups.items())):
        path = os.path.join(out_dir, f"series_{i}.dat")
        with open(path, "w") as f:
            f.write(f"# {label}\n# x output_tok_s total_tok_s req_s ttft_median ttft_p99 tpot_median tpot_p99\n")
            for x, result in sorted(runs, key=lambda t: t[0]):
                s = result["summary"]
                m = request_metrics(result)
                f.write("%g %g %g %g %g %g %g %g\n" % (
                    x, s["output_throughput"], s["total_token_throughput"], s["request_throughput"],
                    percentile(m["TTFT"], 50), percentile(m["TTFT"], 99),
                    percentile(m["TPOT"], 50), percentile(m["TPOT"], 99)))
        files.append((label, path))
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="oasis-bench --result-file outputs")
    ap.add_argument("--out-dir", default="bench_plots", help="where the PNGs go (created)")
    ap.add_argument("--title", default="oasis-bench", help="title prefix of every plot")
    args = ap.parse_args()

    gnuplot = shutil.which("gnuplot")
    if gnuplot is None:
        print("plot_bench: gnuplot not found; install it with: sudo apt-get install gnuplot-nox",
              file=sys.stderr)
        return 2
    try:
        results = [(p, load(p)) for p in args.results]
    except (OSError, ValueError) as e:
        print(f"plot_bench: {e}", file=sys.stderr)
        return 1
    os.makedirs(args.out_dir, exist_ok=True)

    axes = {x_of(r)[0] for _, r in results}
    x_name = axes.pop() if len(axes) == 1 else "max concurrency / request rate"
    groups = {}
    for path, r in results:
        groups.setdefault(label_of(r, path), []).append((x_of(r)[1], r))
    series = write_series_data(args.out_dir, groups)

    pct_path = os.path.join(args.out_dir, "percentiles.dat")
    with open(pct_path, "w") as f:
        f.write("# one block per file: percentile TTFT TPOT ITL E2EL (ms)\n")
        for path, r in results:
            m = request_metrics(r)
            f.write(f"# {path}\n")
            for p in PERCENTILES:
                f.write("%g %g %g %g %g\n" % (p, *(percentile(m[k], p) for k in ("TTFT", "TPOT", "ITL", "E2EL"))))
            f.write("\n\n")

    # noenhanced: labels are plain text (an underscore in a label is not a subscript).
    term = "set terminal pngcairo size 1200,800 noenhanced font 'sans,10'"
    lines = ["set datafile missing 'nan'", "set grid", "set key outside right top"]
    out = lambda name: f"set output {gp_quote(os.path.join(args.out_dir, name))}"
    xs = {x_of(r)[1] for _, r in results}
    logx = "set logscale x 2" if len(xs) > 2 and min(xs) > 0 else ""

    script = [term, *lines, logx, out("throughput_vs_concurrency.png"),
              f"set title {gp_quote(args.title + ': throughput')}", f"set xlabel {gp_quote(x_name)}",
              "set ylabel 'tokens/s'"]
    plots = []
    for label, path in series:
        plots.append(f"{gp_quote(path)} using 1:2 with linespoints title {gp_quote(label + ' output')}")
        plots.append(f"{gp_quote(path)} using 1:3 with linespoints dashtype 2 title {gp_quote(label + ' total')}")
    script.append("plot " + ", ".join(plots))

    script += [out("latency_vs_concurrency.png"), "set multiplot layout 1,2",
               f"set title {gp_quote(args.title + ': time to first token')}", "set ylabel 'ms'"]
    script.append("plot " + ", ".join(
        f"{gp_quote(p)} using 1:{c} with linespoints {d} title {gp_quote(label + ' ' + n)}"
        for label, p in series for c, n, d in ((5, "median", ""), (6, "p99", "dashtype 2"))))
    script.append(f"set title {gp_quote(args.title + ': time per output token')}")
    script.append("plot " + ", ".join(
        f"{gp_quote(p)} using 1:{c} with linespoints {d} title {gp_quote(label + ' ' + n)}"
        for label, p in series for c, n, d in ((7, "median", ""), (8, "p99", "dashtype 2"))))
    script += ["unset multiplot", "unset logscale x"]

    script += [out("latency_percentiles.png"), "set multiplot layout 2,2", "set xlabel 'percentile'",
               "set ylabel 'ms'", f"set xrange [-0.5:{len(PERCENTILES) - 0.5}]",
               "set xtics (" + ", ".join(f"'p{p:g}' {i}" for i, p in enumerate(PERCENTILES)) + ")",
               "set key inside left top"]
    for col, metric in ((2, "TTFT"), (3, "TPOT"), (4, "ITL"), (5, "E2EL")):
        script.append(f"set title {gp_quote(args.title + ': ' + metric + ' percentiles')}")
        script.append("plot " + ", ".join(
            f"{gp_quote(pct_path)} index {i} using 0:{col} with linespoints title {gp_quote(os.path.basename(path))}"
            for i, (path, _) in enumerate(results)))
    script.append("unset multiplot")

    proc = subprocess.run([gnuplot], input="\n".join(s for s in script if s) + "\n", text=True,
                          capture_output=True)
    if proc.returncode != 0:
        print(f"plot_bench: gnuplot failed:\n{proc.stderr}", file=sys.stderr)
        return 1
    for name in ("throughput_vs_concurrency.png", "latency_vs_concurrency.png", "latency_percentiles.png"):
        print(os.path.join(args.out_dir, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
