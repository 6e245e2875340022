#!/usr/bin/env python3
"""Plots of tools/bench_long_context.py's results (summary.json) with gnuplot.

  tools/plot_long_context.py --out-dir plots RESULTS_DIR [RESULTS_DIR or summary.json ...]

Several summaries (one per device call) are merged; a run measured twice keeps its last record.
Writes into --out-dir (only the plots whose sweep has successful runs):
  throughput_vs_concurrency_in<N>.png  fig11: output tok/s against concurrency, dense vs sparse,
                                        prefill included and of the decode phase (requests / median
                                        ITL, dotted), with each one's decode roofline (dashed)
  fetch_ratio.png                       fetch: output tok/s and PCIe GB/s against the fetch ratio
                                        (dense at the same point as a flat line)
  topk.png                              topk: output tok/s and hit rate against K
  latency.png                           latency: batch-1 median TPOT against input length, dense
                                        vs sparse, with the roofline TPOT
and the gnuplot data files (*.dat) beside them. Needs gnuplot (Debian: apt-get install
gnuplot-nox); only the Python standard library otherwise. Exit status: 0 on success, 1 on bad
input, 2 without gnuplot (as tools/plot_bench.py).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_long_context import decode_phase  # noqa: E402  (the same numbers as its table)


def gp_quote(text):
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


def load(paths):
    """Successful records of every summary, the last one per run id; a run measured once but
    asked for by sweeps of several calls (fig11's K 128 / 0.05 point is the fetch sweep's 0.05
    and the topk sweep's 128) counts for all of them."""
    by_id, sweeps = {}, {}
    for p in paths:
        path = os.path.join(p, "summary.json") if os.path.isdir(p) else p
        with open(path) as f:
            summary = json.load(f)
        if "runs" not in summary:
            raise ValueError(f"{path}: not a bench_long_context summary (no 'runs')")
        for r in summary["runs"]:
            if r.get("status") == "ok" and (r.get("bench") or {}).get("output_throughput") is not None:
                by_id[r["id"]] = r
                sweeps.setdefault(r["id"], set()).update(r.get("sweeps", []))
    return [dict(r, sweeps=sorted(sweeps[i])) for i, r in by_id.items()]


def v(x):
    return "nan" if x is None else "%g" % x


class Plotter:
    def __init__(self, out_dir, title):
        self.out_dir, self.title = out_dir, title
        self.script, self.pngs = [], []

    def data(self, name, header, rows):
        path = os.path.join(self.out_dir, name)
        with open(path, "w") as f:
            f.write("# " + header + "\n")
            for row in rows:
                f.write(" ".join(v(x) for x in row) + "\n")
        return gp_quote(path)

    def plot(self, png, title, xlabel, ylabel, series, setup=()):
        self.pngs.append(os.path.join(self.out_dir, png))
        self.script += ["reset", "set terminal pngcairo size 1200,800 enhanced font 'sans,10'",
                        "set datafile missing 'nan'", "set grid", "set key below",
                        f"set output {gp_quote(self.pngs[-1])}", f"set title {gp_quote(self.title + ': ' + title)}",
                        f"set xlabel {gp_quote(xlabel)}", f"set ylabel {gp_quote(ylabel)}", *setup,
                        "plot " + ", ".join(series)]

    def run(self, gnuplot):
        proc = subprocess.run([gnuplot], input="\n".join(self.script) + "\n", text=True, capture_output=True)
        if proc.returncode != 0:
            print(f"plot_long_context: gnuplot failed:\n{proc.stderr}", file=sys.stderr)
            return 1
        for png in self.pngs:
            print(png)
        return 0


def in_sweep(records, sweep, mode=None):
    return [r for r in records if sweep in r.get("sweeps", []) and (mode is None or r["mode"] == mode)]


def thr(r):
    return r["bench"]["output_throughput"]


def decode_tok_s(r):
    """Tokens/s of the decode phase: requests in flight over the median inter-token latency
    (bench_long_context.decode_phase)."""
    return decode_phase(r["bench"], r.get("roofline"), r.get("derived"),
                        r.get("admitted") or r["concurrency"]).get("decode_tok_s")


def plot_fig11(p, records, roof=True):
    fig = in_sweep(records, "fig11")
    for inp in sorted({r["input_len"] for r in fig}):
        series = []
        for mode in ("dense", "sparse"):
            rs = sorted((r for r in fig if r["input_len"] == inp and r["mode"] == mode), key=lambda r: r["concurrency"])
            if not rs:
                continue
            d = p.data(f"fig11_in{inp}_{mode}.dat",
                       "concurrency output_tok_s roofline_tok_s median_tpot_ms max decode_tok_s(admitted/median_itl)",
                       [(r["concurrency"], thr(r), (r.get("roofline") or {}).get("tok_s"),
                         r["bench"].get("median_tpot_ms"), 1 if r["concurrency_label"] == "max" else 0,
                         decode_tok_s(r)) for r in rs])
            series.append(f"{d} using 1:2 with linespoints lw 2 title {gp_quote(mode + ' (prefill included)')}")
            series.append(f"{d} using 1:6 with linespoints dashtype 3 title {gp_quote(mode + ' decode phase')}")
            if roof:
                series.append(f"{d} using 1:3 with lines dashtype 2 title {gp_quote(mode + ' roofline')}")
        out = {r["output_len"] for r in fig if r["input_len"] == inp}
        p.plot(f"throughput_vs_concurrency_in{inp}.png",
               f"input {inp}, output {'/'.join(map(str, sorted(out)))}: dense vs sparse", "concurrency",
               "output tokens/s", series, ["set logscale x 2"])


def matching(records, sweep, fields):
    """{key: runs}: the keys (values of `fields`) of the sweep's sparse runs, each with every
    sparse run of that key, whichever sweep measured it (fig11's K 128 / 0.05 point serves the
    fetch and topk sweeps of other calls)."""
    keys = {tuple(r[f] for f in fields) for r in in_sweep(records, sweep, "sparse")}
    return {k: [r for r in records if r["mode"] == "sparse" and tuple(r[f] for f in fields) == k] for k in sorted(keys)}


def plot_fetch(p, records, roof=True):
    groups = matching(records, "fetch", ("input_len", "output_len", "concurrency", "topk"))
    if not groups:
        return
    dense = {(r["input_len"], r["output_len"], r["concurrency"]): thr(r) for r in records if r["mode"] == "dense"}
    series = []
    for key, g in groups.items():
        g = sorted(g, key=lambda r: r["fetch_ratio"])
        name = f"in {key[0]}, conc {key[2]}, K {key[3]}"
        d = p.data(f"fetch_in{key[0]}_c{key[2]}_k{key[3]}.dat",
                   "fetch_ratio output_tok_s pcie_gbps_step pcie_gbps_avg h2d_mb_per_step blocks_per_step hit_rate",
                   [(r["fetch_ratio"], thr(r), (r.get("derived") or {}).get("pcie_gbps_step"),
                     (r.get("derived") or {}).get("pcie_gbps_avg"),
                     ((r.get("derived") or {}).get("h2d_bytes_per_step") or 0) / 1e6,
                     (r.get("derived") or {}).get("blocks_fetched_per_step"), (r.get("derived") or {}).get("hit_rate"))
                    for r in g])
        series += [f"{d} using 1:2 axes x1y1 with linespoints lw 2 title {gp_quote(name + ': tok/s')}",
                   f"{d} using 1:3 axes x1y2 with linespoints dashtype 2 "
                   f"title {gp_quote(name + ': PCIe GB/s per step')}",
                   f"{d} using 1:4 axes x1y2 with linespoints dashtype 3 "
                   f"title {gp_quote(name + ': PCIe GB/s over the run')}"]
        if (key[0], key[1], key[2]) in dense:
            series.append(f"{dense[(key[0], key[1], key[2])]:g} axes x1y1 with lines lc rgb 'black' "
                          f"title {gp_quote(f'dense, in {key[0]}, conc {key[2]}')}")
    p.plot("fetch_ratio.png", "throughput and PCIe traffic vs fetch ratio", "fetch ratio (C = ceil(ratio x K))",
           "output tokens/s", series, ["set logscale x", "set y2label 'PCIe GB/s'", "set y2tics", "set ytics nomirror"])


def plot_topk(p, records, roof=True):
    groups = matching(records, "topk", ("input_len", "concurrency", "fetch_ratio", "output_len"))
    if not groups:
        return
    series = []
    for key, g in groups.items():
        g = sorted(g, key=lambda r: r["topk"])
        name = f"in {key[0]}, conc {key[1]}, fetch {key[2]:g}"
        d = p.data(f"topk_in{key[0]}_c{key[1]}_f{key[2]:g}.dat", "K output_tok_s hit_rate roofline_tok_s",
                   [(r["topk"], thr(r), (r.get("derived") or {}).get("hit_rate"),
                     (r.get("roofline") or {}).get("tok_s")) for r in g])
        series += [f"{d} using 1:2 axes x1y1 with linespoints lw 2 title {gp_quote(name + ': tok/s')}",
                   f"{d} using 1:3 axes x1y2 with linespoints dashtype 3 title {gp_quote(name + ': hit rate')}"]
        if roof:
            series.append(f"{d} using 1:4 axes x1y1 with lines dashtype 2 title {gp_quote(name + ': roofline')}")
    p.plot("topk.png", "throughput vs K", "K (blocks per KV head)", "output tokens/s", series,
           ["set y2label 'hit rate'", "set y2tics", "set ytics nomirror", "set y2range [0:1]"])


def plot_latency(p, records, roof=True):
    lat = in_sweep(records, "latency")
    series = []
    for mode in ("dense", "sparse"):
        rs = sorted((r for r in lat if r["mode"] == mode), key=lambda r: r["input_len"])
        if not rs:
            continue
        d = p.data(f"latency_{mode}.dat", "input_len median_tpot_ms roofline_tpot_ms median_ttft_ms",
                   [(r["input_len"], r["bench"].get("median_tpot_ms"), (r.get("roofline") or {}).get("step_ms"),
                     r["bench"].get("median_ttft_ms")) for r in rs])
        series.append(f"{d} using 1:2 with linespoints lw 2 title {gp_quote(mode)}")
        if roof:
            series.append(f"{d} using 1:3 with lines dashtype 2 title {gp_quote(mode + ' roofline')}")
    if series:
        p.plot("latency.png", "batch-1 time per output token", "input tokens", "median TPOT (ms)", series,
               ["set yrange [0:*]"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("summaries", nargs="+", help="bench_long_context.py --out-dir folders or summary.json files")
    ap.add_argument("--out-dir", default="long_context_plots", help="where the PNGs go (created)")
    ap.add_argument("--title", default="long context", help="title prefix of every plot")
    ap.add_argument("--no-roofline", action="store_true",
                    help="leave the H200 rooflines out (CPU smoke runs, where they are off the scale)")
    args = ap.parse_args()
    gnuplot = shutil.which("gnuplot")
    if gnuplot is None:
        print("plot_long_context: gnuplot not found; install it with: sudo apt-get install gnuplot-nox",
              file=sys.stderr)
        return 2
    try:
        records = load(args.summaries)
    except (OSError, ValueError, KeyError) as e:
        print(f"plot_long_context: {e}", file=sys.stderr)
        return 1
    if not records:
        print("plot_long_context: no successful runs in the summaries", file=sys.stderr)
        return 1
    os.makedirs(args.out_dir, exist_ok=True)
    p = Plotter(args.out_dir, args.title)
    for f in (plot_fig11, plot_fetch, plot_topk, plot_latency):
        f(p, records, roof=not args.no_roofline)
    if not p.pngs:
        print("plot_long_context: no run of fig11, fetch, topk or latency to plot", file=sys.stderr)
        return 1
    return p.run(gnuplot)


if __name__ == "__main__":
    sys.exit(main())
