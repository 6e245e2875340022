#!/usr/bin/env bash
# oasis-server with lookahead decoding, CPU backend, the embedded model and a dummy EAGLE-3
# head (random weights at the model's shapes): with --lookahead speculate and reject, the
# completions (greedy and seeded, text and token ids, logprobs, stop strings, streaming)
# equal the plain server's, /metrics exports the spec-decode metrics with drafts verified;
# bad lookahead settings fail with clear messages (exit 2 for settings, 1 for a head that
# does not fit the model).
# Usage: test_server_lookahead.sh <oasis-server> <repo root>
set -uo pipefail
SERVER=$1
ROOT=$2
cd "$ROOT"
source "$ROOT/tests/e2e/server_lib.sh"
server_test_init
py() { python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(eval(sys.argv[2]))' "$1" "$2" 2>&1; }

BODIES=(
  '{"prompt": "Hello, world", "max_tokens": 24, "temperature": 0, "ignore_eos": true, "logprobs": 2}'
  '{"prompt": [5, 6, 7, 8, 9], "max_tokens": 30, "temperature": 0, "ignore_eos": true}'
  '{"prompt": "The quick brown fox", "max_tokens": 20, "temperature": 1.5, "seed": 11, "logprobs": 1}'
  '{"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0.8, "top_p": 0.9, "seed": 3, "n": 2}'
  '{"prompt": "abc", "max_tokens": 32, "temperature": 0, "stop": ["e", "the"]}'
)
# run_all <tag>: each body's JSON answer minus id/created into $TMP/<tag>.<i>, plus one stream.
run_all() {
  local i=0
  for b in "${BODIES[@]}"; do
    post /v1/completions "$b" | python3 -c 'import json,sys; d=json.load(sys.stdin); d.pop("id",None); d.pop("created",None); d.get("usage",{}).pop("prompt_tokens_details",None); print(json.dumps(d, sort_keys=True))' >"$TMP/$1.$i"
    i=$((i + 1))
  done
  curl -sN -X POST "$BASE/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "Stream me", "max_tokens": 16, "temperature": 0, "ignore_eos": true, "stream": true}' |
    python3 -c '
import json,sys
text=""
for line in sys.stdin:
    line=line.strip()
    if line.startswith("data: {"):
        d=json.loads(line[6:])
        for c in d.get("choices", []): text += c.get("text", "")
print(json.dumps(text))' >"$TMP/$1.stream"
}

start_server "$TMP/server-plain.log" --backend cpu || exit 1
run_all plain
[[ $(metric 'oasis:spec_decode_num_draft_tokens_total') == 0 ]] && ok "plain server: no drafts" || bad "plain server verified drafts"
stop_server || fail=1

for mode in speculate reject; do
  start_server "$TMP/server-$mode.log" --backend cpu --draft-load-format dummy --lookahead "$mode" || exit 1
  run_all "$mode"
  same=1
  for f in "$TMP"/plain.*; do
    suffix=${f##*/plain.}
    if ! cmp -s "$f" "$TMP/$mode.$suffix"; then
      same=0
      bad "--lookahead $mode: answer $suffix differs from the plain server's" "$(cat "$f"; echo; cat "$TMP/$mode.$suffix")"
    fi
  done
  [[ $same == 1 ]] && ok "--lookahead $mode: every answer equals the plain server's"
  drafts=$(metric 'oasis:spec_decode_num_draft_tokens_total')
  accepted=$(metric 'oasis:spec_decode_num_accepted_tokens_total')
  steps=$(metric 'oasis:spec_decode_num_steps_total')
  emitted=$(metric 'oasis:spec_decode_num_emitted_tokens_total')
  blocks=$(metric 'oasis:num_draft_kv_blocks')
  free=$(metric 'oasis:num_free_draft_kv_blocks')
  rate=$(metric 'oasis:spec_decode_draft_acceptance_rate')
  tps=$(metric 'oasis:spec_decode_tokens_per_step')
  proposed=$(metric 'oasis:spec_decode_num_proposed_tokens_total')
  if [[ -n $drafts && $drafts -gt 50 && -n $accepted && -n $rate && -n $tps && $proposed -ge $drafts && $steps == "$drafts" ]]; then
    ok "--lookahead $mode: /metrics has the spec-decode metrics ($drafts drafts verified, $accepted accepted, rate $rate, $tps tokens/step)"
  else
    bad "--lookahead $mode: spec-decode metrics" "$(curl -s "$BASE/metrics" | grep -E 'spec_decode|draft')"
  fi
  if [[ $mode == reject ]]; then
    [[ $emitted == "$steps" ]] && ok "reject: one token per step" || bad "reject emitted $emitted tokens in $steps steps"
  else
    [[ $emitted == $((steps + accepted)) ]] && ok "speculate: emitted = steps + accepted" || bad "speculate: $emitted tokens, $steps steps, $accepted accepted"
  fi
  [[ -n $blocks && $blocks -gt 0 && $free == "$blocks" ]] && ok "--lookahead $mode: draft KV pool of $blocks blocks, all free when idle" || bad "draft KV blocks $free / $blocks"
  stop_server || fail=1
done

# ---- a head whose drafts are right: speculate emits two tokens per step -----------------
# The "copy" head (docs/lookahead.md, Tests): aux layer L, fc selecting it, zero attention
# and MLP outputs, the model's final norm and (tied) lm_head: it drafts the model's own
# greedy prediction, "repeat the last token", which the random embedded model often does.
python3 - "$ROOT/tests/fixtures/tiny-default" "$TMP/copy-head" <<'PY'
import json, os, struct, sys
src, out = sys.argv[1], sys.argv[2]
cfg = json.load(open(os.path.join(src, "config.json")))
H, L, I, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"], cfg["vocab_size"]
nh, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
with open(os.path.join(src, "model.safetensors"), "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    data = f.read()
def raw(name):
    a, b = header[name]["data_offsets"]
    return data[a:b]
zeros = lambda *shape: ("BF16", list(shape), bytes(2 * eval("*".join(map(str, shape)))))
ones = lambda n: ("BF16", [n], b"\x80\x3f" * n)
fc = bytearray(2 * H * 3 * H)
for i in range(H):
    fc[2 * (i * 3 * H + 2 * H + i)] = 0x80
    fc[2 * (i * 3 * H + 2 * H + i) + 1] = 0x3F
t = {
    "fc.weight": ("BF16", [H, 3 * H], bytes(fc)),
    "midlayer.hidden_norm.weight": ones(H), "midlayer.input_layernorm.weight": ones(H),
    "midlayer.post_attention_layernorm.weight": ones(H),
    "midlayer.self_attn.q_proj.weight": zeros(nh * hd, 2 * H), "midlayer.self_attn.k_proj.weight": zeros(kv * hd, 2 * H),
    "midlayer.self_attn.v_proj.weight": zeros(kv * hd, 2 * H), "midlayer.self_attn.o_proj.weight": zeros(H, nh * hd),
    "midlayer.mlp.gate_proj.weight": zeros(I, H), "midlayer.mlp.up_proj.weight": zeros(I, H),
    "midlayer.mlp.down_proj.weight": zeros(H, I),
    "norm.weight": ("BF16", [H], raw("model.norm.weight")),
    "lm_head.weight": ("BF16", [V, H], raw("lm_head.weight" if "lm_head.weight" in header else "model.embed_tokens.weight")),
    "d2t": ("I64", [V], bytes(8 * V)),
}
head, blob = {}, b""
for name, (dt, shape, b) in t.items():
    head[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(blob), len(blob) + len(b)]}
    blob += b
hj = json.dumps(head).encode()
hj += b" " * (-len(hj) % 8)
os.makedirs(out, exist_ok=True)
open(os.path.join(out, "model.safetensors"), "wb").write(struct.pack("<Q", len(hj)) + hj + blob)
json.dump({"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
           "num_hidden_layers": 1, "num_attention_heads": nh, "num_key_value_heads": kv, "head_dim": hd,
           "intermediate_size": I, "vocab_size": V, "draft_vocab_size": V, "target_hidden_size": H,
           "max_position_embeddings": cfg["max_position_embeddings"], "rms_norm_eps": cfg["rms_norm_eps"],
           "rope_theta": cfg["rope_theta"], "hidden_act": "silu", "tie_word_embeddings": False,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, L // 2, L]}},
          open(os.path.join(out, "config.json"), "w"))
PY
start_server "$TMP/server-copy.log" --backend cpu --draft-model "$TMP/copy-head" --lookahead speculate || exit 1
run_all copy
same=1
for f in "$TMP"/plain.*; do
  suffix=${f##*/plain.}
  cmp -s "$f" "$TMP/copy.$suffix" || { same=0; bad "copy head: answer $suffix differs" "$(cat "$f"; echo; cat "$TMP/copy.$suffix")"; }
done
[[ $same == 1 ]] && ok "--draft-model (copy head) --lookahead speculate: every answer equals the plain server's"
accepted=$(metric 'oasis:spec_decode_num_accepted_tokens_total')
tps=$(metric 'oasis:spec_decode_tokens_per_step')
if [[ -n $accepted && $accepted -gt 20 ]] && python3 -c "import sys; sys.exit(0 if float('$tps') > 1.2 else 1)"; then
  ok "copy head: $accepted drafts accepted, $tps tokens per step"
else
  bad "copy head: accepted $accepted, tokens per step $tps" "$(curl -s "$BASE/metrics" | grep spec_decode)"
fi
stop_server || fail=1

# ---- chains of drafts: --num-speculative-tokens 3 -------------------------------------
# The copy head's chain repeats its draft, the model greedily repeats its token: most steps
# emit several tokens; every answer still equals the plain server's.
start_server "$TMP/server-chain.log" --backend cpu --draft-model "$TMP/copy-head" --lookahead speculate \
  --num-speculative-tokens 3 || exit 1
run_all chain
same=1
for f in "$TMP"/plain.*; do
  suffix=${f##*/plain.}
  cmp -s "$f" "$TMP/chain.$suffix" || { same=0; bad "k 3: answer $suffix differs" "$(cat "$f"; echo; cat "$TMP/chain.$suffix")"; }
done
[[ $same == 1 ]] && ok "--num-speculative-tokens 3 (copy head): every answer equals the plain server's"
tps=$(metric 'oasis:spec_decode_tokens_per_step')
pos2=$(curl -s "$BASE/metrics" | grep '^oasis:spec_decode_num_accepted_tokens_per_pos{.*position="2"}' | awk '{print $2}')
dense_steps=$(curl -s "$BASE/metrics" | grep '^oasis:spec_decode_num_steps_by_kv_total{.*kv="dense"}' | awk '{print $2}')
if python3 -c "import sys; sys.exit(0 if float('$tps') > 1.6 and float('${pos2:-0}') > 0 and float('${dense_steps:-0}') > 0 else 1)"; then
  ok "k 3: $tps tokens per step, $pos2 drafts accepted at position 2, per-pos and by-kv metrics exported"
else
  bad "k 3: tokens per step $tps, position 2 accepted '$pos2', dense steps '$dense_steps'" "$(curl -s "$BASE/metrics" | grep spec_decode)"
fi
stop_server || fail=1

# ---- adaptive chain depth: --speculative-depth adaptive --------------------------------
# The engine picks the depth in 1..3 per step: every answer still equals the plain server's,
# and the steps by depth chosen are exported.
start_server "$TMP/server-adaptive.log" --backend cpu --draft-model "$TMP/copy-head" --lookahead speculate \
  --num-speculative-tokens 3 --speculative-depth adaptive || exit 1
run_all adaptive
same=1
for f in "$TMP"/plain.*; do
  suffix=${f##*/plain.}
  cmp -s "$f" "$TMP/adaptive.$suffix" || { same=0; bad "adaptive: answer $suffix differs" "$(cat "$f"; echo; cat "$TMP/adaptive.$suffix")"; }
done
[[ $same == 1 ]] && ok "--speculative-depth adaptive (copy head, k 3): every answer equals the plain server's"
depth_steps=$(curl -s "$BASE/metrics" | grep '^oasis:spec_decode_chain_depth_steps_total{' | awk '{s += $2} END {print s + 0}')
depth4=$(curl -s "$BASE/metrics" | grep '^oasis:spec_decode_chain_depth_steps_total{.*depth="4"}' | awk '{print $2}')
depth_now=$(metric 'oasis:spec_decode_chain_depth')
if [[ $depth_steps -gt 0 && $depth4 == 0 && $depth_now -ge 1 && $depth_now -le 3 ]]; then
  ok "adaptive: $depth_steps steps by depth chosen exported (none past k), last depth $depth_now"
else
  bad "adaptive: steps by depth $depth_steps, depth 4 '$depth4', last '$depth_now'" "$(curl -s "$BASE/metrics" | grep chain_depth)"
fi
stop_server || fail=1

# ---- bad settings ---------------------------------------------------------------------
for v in sometimes Adaptive ""; do
  out=$("$SERVER" --port 0 --draft-load-format dummy --num-speculative-tokens 3 --speculative-depth "$v" 2>&1)
  [[ $? == 2 ]] && grep -q "speculative-depth must be one of fixed, adaptive" <<<"$out" && ok "--speculative-depth '$v' -> exit 2 naming the choices" || bad "--speculative-depth '$v'" "$out"
done
out=$("$SERVER" --port 0 --draft-load-format dummy --lookahead speculate --speculative-depth adaptive 2>&1)
[[ $? == 2 ]] && grep -q "needs --num-speculative-tokens 2 to 4" <<<"$out" && ok "--speculative-depth adaptive with k 1 -> exit 2" || bad "adaptive with k 1" "$out"
out=$("$SERVER" --backend cpu --check-config --draft-load-format dummy --num-speculative-tokens 3 --speculative-depth adaptive 2>&1)
grep -q '"speculative-depth": "adaptive"' <<<"$out" && grep -q '"speculative_depth": "adaptive"' <<<"$out" &&
  grep -q "^config ok$" <<<"$out" && ok "--check-config shows --speculative-depth adaptive" || bad "check-config adaptive" "$out"
for v in 0 5 -1 three 2.5 ""; do
  out=$("$SERVER" --port 0 --draft-load-format dummy --lookahead speculate --num-speculative-tokens "$v" 2>&1)
  [[ $? == 2 ]] && grep -q "num-speculative-tokens" <<<"$out" && ok "--num-speculative-tokens '$v' -> exit 2 naming the flag" || bad "--num-speculative-tokens '$v'" "$out"
done
out=$("$SERVER" --port 0 --draft-load-format dummy --lookahead reject --num-speculative-tokens 2 2>&1)
[[ $? == 2 ]] && grep -q "needs --lookahead speculate" <<<"$out" && ok "--num-speculative-tokens 2 with reject -> exit 2" || bad "k 2 with reject" "$out"
out=$("$SERVER" --port 0 --num-speculative-tokens 2 2>&1)
[[ $? == 2 ]] && grep -q "needs --lookahead speculate" <<<"$out" && ok "--num-speculative-tokens 2 without a head -> exit 2" || bad "k 2 without a head" "$out"
out=$("$SERVER" --backend cpu --check-config --draft-load-format dummy --num-speculative-tokens 3 2>&1)
grep -q '"num-speculative-tokens": 3' <<<"$out" && grep -q '"num_speculative_tokens": 3' <<<"$out" &&
  grep -q '"lookahead": "speculate"' <<<"$out" && grep -q "^config ok$" <<<"$out" &&
  ok "--check-config shows --num-speculative-tokens 3 (lookahead auto resolves to speculate)" || bad "check-config k 3" "$out"

out=$("$SERVER" --port 0 --lookahead speculate 2>&1)
[[ $? == 2 ]] && grep -q "needs an EAGLE-3 draft head" <<<"$out" && ok "--lookahead speculate without a draft -> exit 2" || bad "lookahead without draft" "$out"
out=$("$SERVER" --port 0 --lookahead sometimes 2>&1)
[[ $? == 2 ]] && grep -q "lookahead" <<<"$out" && ok "--lookahead sometimes -> exit 2" || bad "bad lookahead value" "$out"
out=$("$SERVER" --backend cpu --check-config --draft-model "$ROOT/tests/fixtures/eagle3/llama-tiny-rope-scaling" 2>&1)
[[ $? == 1 ]] && grep -q "target_hidden_size" <<<"$out" && ok "a head for another model -> exit 1 naming target_hidden_size" || bad "misfit head" "$out"
out=$("$SERVER" --backend cpu --check-config --draft-model /nonexistent-head 2>&1)
[[ $? == 1 ]] && grep -q "draft-model" <<<"$out" && ok "missing --draft-model dir -> exit 1" || bad "missing draft dir" "$out"
out=$("$SERVER" --backend cpu --check-config --draft-load-format dummy 2>&1)
grep -q '"lookahead": "reject"' <<<"$out" && grep -q "^config ok$" <<<"$out" && ok "a draft head defaults to --lookahead reject" || bad "default lookahead" "$out"

exit $fail
