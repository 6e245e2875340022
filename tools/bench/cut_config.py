#!/usr/bin/env python3
"""Writes a copy of a model config.json with some fields replaced, for bench_decode --config.

  tools/bench/cut_config.py tools/bench/model_configs/qwen3-30b-a3b.json /tmp/attn_only.json \
      --all-dense intermediate_size=16
  tools/bench/cut_config.py IN OUT num_hidden_layers=1 'mlp_only_layers=[0]'

Each KEY=VALUE sets KEY to VALUE parsed as JSON (a bare word that is not JSON is taken as a
string). --all-dense sets mlp_only_layers to every layer (a Qwen3-MoE config whose layers all
take the dense MLP). Used to cut a model's step into parts (docs/benchmarks.md, thirty-second
session: the attention half of Qwen3-30B-A3B at batch 1).
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--all-dense", action="store_true",
                    help="mlp_only_layers = every layer (after the KEY=VALUE changes)")
    ap.add_argument("changes", nargs="*", metavar="KEY=VALUE")
    a = ap.parse_intermixed_args()
    try:
        with open(a.input) as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"cut_config: {a.input}: {e}")
    if not isinstance(config, dict):
        sys.exit(f"cut_config: {a.input}: not a JSON object")
    for change in a.changes:
        key, sep, value = change.partition("=")
        if not sep or not key:
            sys.exit(f"cut_config: expected KEY=VALUE, got {change!r}")
        try:
            config[key] = json.loads(value)
        except json.JSONDecodeError:
            config[key] = value
    if a.all_dense:
        layers = config.get("num_hidden_layers")
        if not isinstance(layers, int) or layers < 1:
            sys.exit("cut_config: --all-dense needs an integer num_hidden_layers >= 1")
        config["mlp_only_layers"] = list(range(layers))
    with open(a.output, "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
