#!/usr/bin/env python3
"""The 'export' phase: checks the trained model (and head) with transformers and writes the
reference outputs a C++ test can compare against (docs/trained_model.md). GPU machine; the
math runs on the CPU in float32 (eager attention), like tools/gen_model_fixtures.py.

Reads --model (state/model: the serving files + trainer_state.json) and, when present,
--eagle (state/eagle). Writes into --out (state/reference):
  model_reference.safetensors  tools/gen_model_fixtures.py's layout for real-text prompts
                               (each starts with <|endoftext|>): prompt{i}.ids, .logits,
                               .greedy (32), .greedy_logits, .greedy_margin
  eagle_reference.safetensors  tools/eagle3_reference.py's layout: prompt{i}.ids, .aux,
                               .draft_logits, .draft_tokens, .draft_margins
  samples.txt                  greedy continuations, and a ChatML chat answer
  manifest.json                versions, sizes, training summaries, the head's greedy
                               acceptance on the greedy continuations, smallest margins
Fails when AutoTokenizer/AutoModelForCausalLM cannot load the directory, the chat template
does not render, or the model is over 30 MB.

Usage: python3 tools/train/export_check.py [--model DIR] [--eagle DIR] [--out DIR]
"""
import argparse
import json
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
from common import DEFAULT_STATE, die, require_file, write_json  # noqa: E402

PROMPTS = [
    "In the beginning God created",
    "Wedlock, n. [AS. wedl\u0101c a pledge.] The ceremony, or the state, of marriage;",
    "HACKER, n. [originally, someone who makes furniture with an axe] 1. A person who enjoys "
    "exploring the details of programmable systems and how to stretch their capabilities,",
]
MAX_MB = 30.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(DEFAULT_STATE, "model"))
    ap.add_argument("--eagle", default=os.path.join(DEFAULT_STATE, "eagle"))
    ap.add_argument("--out", default=os.path.join(DEFAULT_STATE, "reference"))
    args = ap.parse_args()
    try:
        import torch
        import transformers
        from safetensors import safe_open
        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        die(f"{e}: the export phase needs torch, transformers and safetensors (the GPU machine's python3)")
    import gen_model_fixtures
    torch.set_grad_enabled(False)
    require_file(os.path.join(args.model, "config.json"), "run the 'model' phase first")
    size = os.path.getsize(os.path.join(args.model, "model.safetensors"))
    if size > MAX_MB * 1e6:
        die(f"model.safetensors is {size / 1e6:.1f} MB, over {MAX_MB} MB")
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager").eval()
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    prompts = [torch.tensor([eot] + tok.encode(p, add_special_tokens=False), dtype=torch.int64) for p in PROMPTS]
    os.makedirs(args.out, exist_ok=True)
    tensors = gen_model_fixtures.reference_outputs(model, prompts)
    save_file(tensors, os.path.join(args.out, "model_reference.safetensors"),
              metadata={"generator": "tools/train/export_check.py", "transformers": transformers.__version__})
    min_margin = min(float(tensors[f"prompt{i}.greedy_margin"].min()) for i in range(len(prompts)))

    lines = []
    for i, p in enumerate(PROMPTS):
        lines.append(f"--- prompt {i}: {p!r}\n{tok.decode(tensors[f'prompt{i}.greedy'].tolist())}\n")
    chat = tok.apply_chat_template([{"role": "user", "content": "What is a wedlock?"}], add_generation_prompt=True,
                                   tokenize=False)
    ids = torch.tensor([tok.encode(chat, add_special_tokens=False)])
    out = model.generate(ids, max_new_tokens=48, do_sample=False)
    lines.append(f"--- chat {chat!r}\n{tok.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=False)}\n")
    with open(os.path.join(args.out, "samples.txt"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines), flush=True)

    with open(os.path.join(args.model, "trainer_state.json")) as f:
        mstate = json.load(f)
    manifest = {"transformers": transformers.__version__, "torch": torch.__version__,
                "python": platform.python_version(), "model_safetensors_bytes": size,
                "params": sum(p.numel() for p in model.parameters()), "prompt_lengths": [len(p) for p in prompts],
                "min_greedy_margin": min_margin,
                "model_training": {k: mstate.get(k) for k in ("step", "tokens", "total_tokens", "best_val_loss", "finished")},
                "model_runs": mstate.get("runs")}

    if os.path.exists(os.path.join(args.eagle, "config.json")):
        import eagle3_reference as ref
        with open(os.path.join(args.eagle, "config.json")) as f:
            hc = json.load(f)
        L = model.config.num_hidden_layers
        aux_ids = (hc.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or [2, L // 2, L - 3]
        w = {}
        with safe_open(os.path.join(args.eagle, "model.safetensors"), "pt") as f:
            for k in f.keys():
                w[k] = f.get_tensor(k)
        d2t = w.pop("d2t")
        w.pop("t2d", None)
        w = {k: v.float() for k, v in w.items()}
        embed = model.get_input_embeddings().weight.float()
        etensors, accepted, proposed, emin = {}, 0, 0, float("inf")
        for i, ids in enumerate(prompts):
            # Prompt + its greedy continuation: the draft at row p predicts token p + 2.
            seq = torch.cat([ids, tensors[f"prompt{i}.greedy"]])
            aux = ref.capture_streams(model, seq, aux_ids).float()
            logits = ref.head_forward(hc, w, embed, aux, seq[1:])
            top2 = torch.topk(logits, 2, dim=-1)
            draft = top2.indices[:, 0] + d2t[top2.indices[:, 0]]
            n = len(ids)
            decode_rows = range(n - 1, len(seq) - 2)  # drafts of generated positions
            accepted += sum(int(draft[p] == seq[p + 2]) for p in decode_rows)
            proposed += len(decode_rows)
            etensors[f"prompt{i}.ids"] = seq.contiguous()
            etensors[f"prompt{i}.aux"] = aux.contiguous()
            etensors[f"prompt{i}.draft_logits"] = logits.contiguous()
            etensors[f"prompt{i}.draft_tokens"] = draft.to(torch.int64).contiguous()
            etensors[f"prompt{i}.draft_margins"] = (top2.values[:, 0] - top2.values[:, 1]).contiguous()
            emin = min(emin, float(etensors[f"prompt{i}.draft_margins"].min()))
        save_file(etensors, os.path.join(args.out, "eagle_reference.safetensors"),
                  metadata={"generator": "tools/train/export_check.py"})
        with open(os.path.join(args.eagle, "trainer_state.json")) as f:
            estate = json.load(f)
        manifest["eagle"] = {"aux_layer_ids": aux_ids, "draft_vocab_size": hc["draft_vocab_size"],
                             "safetensors_bytes": os.path.getsize(os.path.join(args.eagle, "model.safetensors")),
                             "greedy_acceptance_on_continuations": round(accepted / max(1, proposed), 4),
                             "min_draft_margin": emin,
                             "training": {k: estate.get(k) for k in ("step", "tokens", "best_val_accept",
                                                                     "draft_vocab_coverage", "finished")},
                             "runs": estate.get("runs")}
        print(f"export_check: EAGLE-3 head accepts {accepted}/{proposed} greedy drafts on the continuations", flush=True)
    write_json(os.path.join(args.out, "manifest.json"), manifest)
    print(f"export_check: wrote {args.out}: {json.dumps({k: v for k, v in manifest.items() if 'runs' not in k})}",
          flush=True)


if __name__ == "__main__":
    main()
