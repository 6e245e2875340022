#!/usr/bin/env python3
"""Converts a bf16 fixture checkpoint into a block-scaled FP8 one, and writes its exact
dequantized weights next to it, for the CPU test of FP8 checkpoints (test_fp8_models).

Pure Python 3 (no torch, no numpy): runs anywhere, deterministic. For each 2-D
`*_proj.weight` of the source (q/k/v/o, gate/up/down) with blocks of B0 x B1:
  scale_inv[bo, bi] = float32(amax(|w| over the block) / 448)   (1 when the block is all 0)
  weight[o, i]      = e4m3fn nearest to w[o, i] / scale_inv[o // B0, i // B1] (ties to even)
stored as F8_E4M3 `X.weight` + `X.weight_scale_inv` (F32; BF16 — the scale rounded first —
for the last layer, to cover both spellings). Every other tensor is copied as it is (bf16
embeddings and norms). config.json gains Qwen's
  "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme":
                          "dynamic", "weight_block_size": [B0, B1],
                          "modules_to_not_convert": ["lm_head"]}
<out>/dequantized/ holds the same model in F32 whose quantized weights are exactly
float32(e4m3 value * scale_inv) (IEEE float32 product), and config.json without the
quantization_config: the C++ loader's dequantization must reproduce it bit for bit.
Usage (the committed fixture; block sizes that divide none of the fixture's dims):
  python3 tools/convert_fp8_fixture.py --src tests/fixtures/models/qwen3-tiny \
      --out tests/fixtures/models/qwen3-tiny-fp8-cpu --block 48 24
"""
import argparse
import json
import math
import os
import re
import struct

E4M3_MAX = 448.0


def e4m3_to_float(bits):
    sign = -1.0 if bits & 0x80 else 1.0
    exp, man = (bits >> 3) & 0xF, bits & 0x7
    if exp == 0xF and man == 0x7:
        return math.nan
    if exp == 0:
        return sign * man * 2.0 ** -9
    return sign * (1 + man / 8.0) * 2.0 ** (exp - 7)


# Non-negative finite codes 0x00..0x7e in increasing value order.
POSITIVE = [(e4m3_to_float(b), b) for b in range(0x7F)]


def float_to_e4m3(x):
    """Nearest e4m3fn code, ties to the even code, saturating at 448 (|x| <= 448 here)."""
    sign = 0x80 if x < 0 or (x == 0 and math.copysign(1, x) < 0) else 0
    a = min(abs(x), E4M3_MAX)
    lo, hi = 0, len(POSITIVE) - 1
    while hi - lo > 1:  # POSITIVE[lo].value <= a <= POSITIVE[hi].value
        mid = (lo + hi) // 2
        if POSITIVE[mid][0] <= a:
            lo = mid
        else:
            hi = mid
    (vlo, blo), (vhi, bhi) = POSITIVE[lo], POSITIVE[hi]
    if a - vlo < vhi - a or (a - vlo == vhi - a and blo % 2 == 0):
        return sign | blo
    return sign | bhi


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def bf16_bits(x):
    (u,) = struct.unpack("<I", struct.pack("<f", x))
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    tensors = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        tensors[name] = (e["dtype"], e["shape"], body[begin:end])
    return tensors


def write_safetensors(path, tensors):
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt", "generator": "tools/convert_fp8_fixture.py"}
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text.encode() + b"".join(chunks))


def bf16_values(raw):
    return [struct.unpack("<f", struct.pack("<I", h << 16))[0]
            for (h,) in struct.iter_unpack("<H", raw)]


def quantize(values, rows, cols, b0, b1, bf16_scales):
    sr, sc = -(-rows // b0), -(-cols // b1)
    scales = []
    for br in range(sr):
        for bc in range(sc):
            amax = max(abs(values[r * cols + c]) for r in range(br * b0, min(rows, (br + 1) * b0))
                       for c in range(bc * b1, min(cols, (bc + 1) * b1)))
            s = f32(amax / E4M3_MAX) if amax > 0 else 1.0
            if bf16_scales:
                s = struct.unpack("<f", struct.pack("<I", bf16_bits(s) << 16))[0]
            scales.append(s)
    codes, real = bytearray(rows * cols), []
    for r in range(rows):
        for c in range(cols):
            s = scales[(r // b0) * sc + c // b1]
            code = float_to_e4m3(values[r * cols + c] / s)
            codes[r * cols + c] = code
            real.append(f32(e4m3_to_float(code) * s))  # the exact float32 product
    if bf16_scales:
        scale_raw = struct.pack(f"<{len(scales)}H", *(bf16_bits(s) for s in scales))
        scale_t = ("BF16", [sr, sc], scale_raw)
    else:
        scale_t = ("F32", [sr, sc], struct.pack(f"<{len(scales)}f", *scales))
    return bytes(codes), scale_t, real


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--block", type=int, nargs=2, default=[128, 128])
    args = ap.parse_args()
    b0, b1 = args.block
    with open(os.path.join(args.src, "config.json")) as f:
        config = json.load(f)
    src = read_safetensors(os.path.join(args.src, "model.safetensors"))
    last_layer = config["num_hidden_layers"] - 1
    fp8, dequant = {}, {}
    for name, (dtype, shape, raw) in src.items():
        if not (name.endswith("_proj.weight") and len(shape) == 2):
            fp8[name] = dequant[name] = (dtype, shape, raw)
            continue
        assert dtype == "BF16", name
        m = re.match(r"model\.layers\.(\d+)\.", name)
        bf16_scales = m is not None and int(m.group(1)) == last_layer
        codes, scale_t, real = quantize(bf16_values(raw), shape[0], shape[1], b0, b1, bf16_scales)
        fp8[name] = ("F8_E4M3", shape, codes)
        fp8[name + "_scale_inv"] = scale_t
        dequant[name] = ("F32", shape, struct.pack(f"<{len(real)}f", *real))
    os.makedirs(os.path.join(args.out, "dequantized"), exist_ok=True)
    write_safetensors(os.path.join(args.out, "model.safetensors"), fp8)
    write_safetensors(os.path.join(args.out, "dequantized", "model.safetensors"), dequant)
    quantized = dict(config)
    quantized["quantization_config"] = {
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
        "weight_block_size": [b0, b1], "modules_to_not_convert": ["lm_head"]}
    for path, cfg in ((os.path.join(args.out, "config.json"), quantized),
                      (os.path.join(args.out, "dequantized", "config.json"), config)):
        with open(path, "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
