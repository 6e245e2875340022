#!/usr/bin/env bash
# tools/eval_trained_model.py (the trained default's measurements, docs/trained_model.md) on the
# CPU at small sizes: it starts the real oasis-server on models/embedded and its head dense,
# speculate and sparse (draft, previous-query, oracle predictors), sends teacher-forced windows
# of a committed text (every forced token after the first is a sparse decode step), and must leave an eval.json whose every number is measured (sparse steps
# ran, agreement sampled on every layer, log-probs finite); the gnuplot plots from it; a text
# shorter than a window is a clear error. Then tools/eval_fetch_budget.py and
# tools/eval_speculation.py at small sizes.
# Usage: test_eval_trained_driver.sh <oasis-server's directory> <repo root>
set -uo pipefail
BIN=$1
ROOT=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
bad() { echo "FAILED: $1"; fail=1; }
# Any long English text will do: the docs (the held-out corpus is not in CI).
cat "$ROOT"/docs/engine.md "$ROOT"/docs/sparse.md > "$TMP/text.txt"
python3 "$ROOT/tools/eval_trained_model.py" --bin-dir "$BIN" --backend cpu --text "$TMP/text.txt" \
  --contexts 320,384 --windows 2 --forced 16 --threshold 128 --topks 4,8 --fetch-ratios 0.25,1 \
  --dense-layers 0,1 --out-dir "$TMP/eval" >"$TMP/eval.out" 2>&1
rc=$?
tail -25 "$TMP/eval.out"
[[ $rc -eq 0 ]] || bad "driver exit $rc"
python3 - "$TMP/eval/eval.json" <<'PY' || fail=1
import json, math, sys
r = json.load(open(sys.argv[1]))
ok = True
def check(cond, what):
    global ok
    if not cond:
        print("FAILED:", what); ok = False
check(set(r["contexts"]) == {"320", "384"}, "both contexts measured")
for ctx, c in r["contexts"].items():
    check(math.isfinite(c["dense"]["ppl"]) and c["dense"]["tokens"] == 32, f"{ctx}: dense perplexity of 2 x 16 tokens")
    acc = c["acceptance"]
    check(acc["own_greedy_text"]["drafts"] > 0 and 0 < acc["own_greedy_text"]["rate"] <= 1, f"{ctx}: acceptance measured")
    runs = {(s["predictor"], s["topk"], s["fetch_ratio"], s["dense_layers"]) for s in c["sparse"]}
    want = {(p, k, 0.25, 0) for p in ("draft", "previous-query", "oracle") for k in (4, 8)}
    want |= {(p, 8, 1.0, 0) for p in ("draft", "previous-query")}
    want.add(("draft", 8, 0.25, 1))  # --dense-layers 1: the first predictor at the middle K
    check(runs == want, f"{ctx}: configurations {sorted(runs)}")
    for s in c["sparse"]:
        tag = f"{ctx} {s['predictor']} K{s['topk']} f{s['fetch_ratio']}"
        check(s["sparse_steps"] >= 30, f"{tag}: sparse steps ran ({s['sparse_steps']})")
        check(0 <= s["top1_agreement"] <= 1 and math.isfinite(s["ppl"]), f"{tag}: accuracy numbers")
        check(s["hit_rate"] is not None and 0 < s["hit_rate"] <= 1, f"{tag}: hit rate")
        if s["predictor"] != "oracle":
            n = 6 - s["dense_layers"]  # a dense layer has no selection to compare
            check(len(s["agreement_by_layer"]) == n and 0 < s["agreement"] <= 1, f"{tag}: agreement on the {n} sparse layers")
print("ok: eval.json complete" if ok else "eval.json incomplete")
sys.exit(0 if ok else 1)
PY
if command -v gnuplot >/dev/null; then
  python3 "$ROOT/tools/plot_trained_model.py" --eval "$TMP/eval/eval.json" --out-dir "$TMP/plots" >/dev/null || bad "plot exit"
  for png in trained_training trained_eagle_training trained_agreement trained_agreement_by_layer trained_sparse_ppl; do
    [[ -s $TMP/plots/$png.png ]] || bad "no $png.png"
  done
  [[ $fail == 0 ]] && echo "ok: plots"
else
  echo "note: gnuplot not installed, plots not checked (apt-get install gnuplot-nox)"
fi
# tools/eval_fetch_budget.py (fixed vs adaptive fetch budget) through the same helpers.
python3 "$ROOT/tools/eval_fetch_budget.py" --bin-dir "$BIN" --backend cpu --text "$TMP/text.txt" --context 384 \
  --windows 2 --forced 16 --threshold 128 --topk 4 --fetch-ratios 0.25,1 --out-dir "$TMP/fb" >"$TMP/fb.out" 2>&1 ||
  { tail -20 "$TMP/fb.out"; bad "eval_fetch_budget exit"; }
python3 - "$TMP/fb/fetch_budget.json" <<'PY' || bad "fetch_budget.json"
import json, math, sys
r = json.load(open(sys.argv[1]))
runs = {(x["fetch_ratio"], x["budget"]): x for x in r["runs"]}
assert set(runs) == {(f, b) for f in (0.25, 1.0) for b in ("fixed", "adaptive")}, sorted(runs)
assert math.isfinite(r["dense_ppl"]) and r["dense_ppl"] > 1
for key, x in runs.items():
    assert x["sparse_steps"] >= 30 and x["h2d_bytes"] > 0 and math.isfinite(x["ppl_ratio"]), (key, x)
    assert len(x["fetch_caps"]) == 6 and all(v >= 1 for v in x["fetch_caps"].values()), (key, x["fetch_caps"])
# C = ceil(f K): 1 block at 0.25, 4 at 1 (K 4); more blocks fetched per step at the larger cap
assert runs[(1.0, "fixed")]["fetched_per_step"] > runs[(0.25, "fixed")]["fetched_per_step"]
print("ok: fetch_budget.json complete")
PY
# tools/eval_speculation.py (tokens per step and TPOT by k through oasis-server + oasis-bench):
# dense plain vs speculate k = 1, 2 and sparse reject vs speculate k = 1 on the trained default,
# held-out text prompts; every row measured, speculation emitting more than one token a step.
python3 "$ROOT/tools/eval_speculation.py" --bin-dir "$BIN" --backend cpu --text "$TMP/text.txt" --prompts 2 \
  --prompt-len 256 --output-len 24 --ks 0,1,2 --kv dense,sparse --temperatures 0 --threshold 128 --topk 8 \
  --out-dir "$TMP/spec" >"$TMP/spec.out" 2>&1 || { tail -20 "$TMP/spec.out"; bad "eval_speculation exit"; }
python3 - "$TMP/spec/speculation.json" <<'PY' || bad "speculation.json"
import json, sys
r = json.load(open(sys.argv[1]))
rows = {(x["kv"], x["k"]): x for x in r["rows"]}
assert set(rows) == {(kv, k) for kv in ("dense", "sparse") for k in (0, 1, 2)}, sorted(rows)
for key, x in rows.items():
    assert x["rc"] == 0 and x["completed"] == 2 and not x["failed"] and x["median_tpot_ms"] > 0, (key, x)
assert rows[("dense", 0)]["steps_by_kv"] == {"dense": 0, "sparse": 0}  # plain: no drafts verified
assert rows[("sparse", 0)]["tokens_per_step"]["sparse"] == 1.0  # reject: drafts verified, never emitted
for kv in ("dense", "sparse"):
    for k in (1, 2):
        x = rows[(kv, k)]
        assert x["tokens_per_step"][kv] > 1.0 and x["steps_by_kv"][kv] > 0, (kv, k, x)
        assert len(x["accepted_by_position"]) == k and x["accepted_by_position"][0][0] > 0, (kv, k, x)
        assert x["sparse_steps"] > 0 if kv == "sparse" else x["sparse_steps"] == 0, (kv, k, x)
        if kv == "dense":  # lossless: the same text as plain decoding (float32 on the CPU)
            assert x["same_text_as_k0"] == [2, 2], (k, x["same_text_as_k0"])
print("ok: speculation.json complete")
PY
out=$(python3 "$ROOT/tools/eval_speculation.py" --bin-dir "$BIN" --ks 0,5 2>&1)
[[ $? -eq 2 && $out == *"--ks 0..4"* ]] && echo "ok: --ks 5 is refused" || bad "--ks 5: $out"
head -c 3000 "$TMP/text.txt" > "$TMP/short.txt"
out=$(python3 "$ROOT/tools/eval_trained_model.py" --bin-dir "$BIN" --backend cpu --text "$TMP/short.txt" \
  --contexts 2048 --forced 16 --out-dir "$TMP/short" 2>&1)
[[ $? -ne 0 && $out == *"fewer than a 2048-token window"* ]] && echo "ok: a short text is a clear error" ||
  bad "short text: $out"
exit $fail
