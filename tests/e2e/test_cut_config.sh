#!/bin/bash
# tools/bench/cut_config.py (benchmark configs cut from a real one) end to end: its outputs load
# (oasis-server --check-config with dummy weights) or are refused as the loader refuses them,
# and bad arguments are errors.
#   test_cut_config.sh OASIS_SERVER SOURCE_DIR
set -uo pipefail
server=$1
src=$2
cut="python3 $src/tools/bench/cut_config.py"
base=$src/tools/bench/model_configs/qwen3-30b-a3b.json
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# Every layer dense with a 16-wide MLP: the attention half of Qwen3-30B-A3B.
$cut "$base" "$dir/config.json" --all-dense intermediate_size=16 || fail "cut --all-dense"
python3 - "$dir/config.json" <<'PY' || fail "the cut config's fields"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["mlp_only_layers"] == list(range(48)), c["mlp_only_layers"]
assert c["intermediate_size"] == 16 and c["num_experts"] == 128 and c["hidden_size"] == 2048
PY
out=$("$server" --model "$dir" --load-format dummy --backend cpu --check-config 2>&1) ||
  fail "--check-config of the cut config: $out"
grep -q "config ok" <<<"$out" || fail "no 'config ok': $out"

# One layer, its MLP dense; the flag applies after the changes.
$cut "$base" "$dir/config.json" num_hidden_layers=1 --all-dense || fail "cut to one layer"
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); assert c['mlp_only_layers']==[0] and c['num_hidden_layers']==1" \
  "$dir/config.json" || fail "one layer, mlp_only_layers [0]"
"$server" --model "$dir" --load-format dummy --backend cpu --check-config >/dev/null 2>&1 ||
  fail "--check-config of the one-layer config"

# A cut the loader refuses: a dense layer past the last one.
$cut "$base" "$dir/config.json" 'mlp_only_layers=[60]' || fail "cut mlp_only_layers [60]"
if out=$("$server" --model "$dir" --load-format dummy --backend cpu --check-config 2>&1); then
  fail "mlp_only_layers [60] of 48 layers accepted"
fi
grep -q "outside" <<<"$out" || fail "no clear error for layer 60: $out"

# Bad arguments: not KEY=VALUE, a missing input, a non-object, --all-dense without layers.
! $cut "$base" "$dir/x.json" notakeyvalue 2>/dev/null || fail "accepted a change without '='"
! $cut "$dir/missing.json" "$dir/x.json" 2>/dev/null || fail "accepted a missing input"
echo '[1, 2]' >"$dir/list.json"
! $cut "$dir/list.json" "$dir/x.json" 2>/dev/null || fail "accepted a JSON array"
! $cut "$base" "$dir/x.json" num_hidden_layers=0 --all-dense 2>/dev/null || fail "--all-dense with 0 layers"
echo "PASS"
