"""What the THL's alignment granularity does to a peer trace on the shipped benchmarks (PRP's ``peer_aligned``
denominator): ``word`` (the paper's rule) against ``span`` (the finest common segmentation, ours).

For each direction S->R of a shipped preset pair: S samples ``--k`` responses to ``--prompts`` training prompts
(temperature 1, as in training); S's log-probs of its own tokens are the trace (teacher-forced, the response
re-encoded by S's tokenizer, EOS scored when the response ended on it); the trace is aligned onto R's tokens of the
same text (R's EOS appended, zero width, as the trainer does) at both granularities. Printed per granularity:

* ``moved``: the share of the trace's mass (|log-prob|, summed) that lands on receiver tokens whose characters the
  source token does not cover, computed per alignment group as the mass spread beyond the overlapping tokens --
  what the alignment moves between characters (0 when each source token's mass stays on its own characters);
* ``eos``: mean |aligned log-prob of R's EOS - S's log-prob of its EOS| over responses that ended on EOS (the mass
  the alignment adds to or takes from the end token);
* ``residual``: mean |aligned - R's own log-prob| per receiver token (what THL residual logs; includes the
  models' disagreement, the same for both granularities).

Usage::

    python scripts/thl_granularity.py --benchmark v4 [--prompts 64 --k 4]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from mutual_rl.data.chain import ChainTask
from mutual_rl.data.task import ArithmeticTask
from mutual_rl.thl import align_traces, alignment_groups
from mutual_rl.thl.offsets import encode_batch_with_offsets

SHIPPED = Path(__file__).parents[1] / "src" / "mutual_rl" / "presets" / "shipped"


def load(preset: str, task_class: str):
    for d in sorted(SHIPPED.iterdir()):
        done = json.loads((d / "done.json").read_text())
        if done["preset"] == preset and done["task"]["class"] == task_class:
            tok = PreTrainedTokenizerFast.from_pretrained(d)
            tok.padding_side = "left"
            return AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval(), tok
    raise SystemExit(f"no shipped preset {preset} for {task_class} in {SHIPPED}")


@torch.no_grad()
def sample(model, tok, prompts: list[str], k: int, max_new_tokens: int) -> list[tuple[str, str, bool]]:
    """(prompt, response text, ended on EOS) for k samples of each prompt."""
    out = []
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    gen = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
                         num_return_sequences=k, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    width = enc["input_ids"].shape[1]
    for i, row in enumerate(gen):
        ids = row[width:].tolist()
        eos = tok.eos_token_id in ids
        ids = ids[: ids.index(tok.eos_token_id)] if eos else [t for t in ids if t != tok.pad_token_id]
        out.append((prompts[i // k], tok.decode(ids, skip_special_tokens=True), eos))
    return out


@torch.no_grad()
def own_logp(model, tok, prompt: str, text: str, eos: bool) -> tuple[list[int], list, torch.Tensor]:
    """The response's ids and spans in ``tok`` (+ EOS, zero width) and ``model``'s log-probs of them."""
    (ids, offsets), = encode_batch_with_offsets(tok, [text])
    if eos:
        ids, offsets = ids + [tok.eos_token_id], offsets + [(len(text), len(text))]
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    full = torch.tensor([p + ids])
    logits = model(full).logits[0, len(p) - 1: -1].float()
    return ids, offsets, logits.log_softmax(-1).gather(-1, torch.tensor(ids)[:, None])[:, 0]


def moved_mass(text, src_offsets, src_logp, tgt_offsets, aligned, granularity) -> tuple[float, float]:
    """(mass moved off its own characters, total mass): per alignment group, the group's mass placed on receiver
    tokens in proportion to their characters, against each source token's mass kept on the receiver tokens that
    overlap it (the best any alignment can do)."""
    moved = total = 0.0
    for g in alignment_groups(text, src_offsets, tgt_offsets, granularity):
        s_idx, t_idx = list(g.source), list(g.target)
        total += float(src_logp[s_idx].abs().sum())
        if not t_idx:
            continue
        for t in t_idx:
            ts, te = tgt_offsets[t]
            overlap = sum(float(src_logp[s].abs()) for s in s_idx
                          if min(te, src_offsets[s][1]) > max(ts, src_offsets[s][0])
                          or (ts == te and src_offsets[s][0] == src_offsets[s][1] == ts))
            moved += max(float(aligned[t].abs()) - overlap, 0.0)
    return moved, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--benchmark", choices=["v3", "v4"], default="v4")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    task, cls, max_new = ((ChainTask(), "ChainTask", 40) if args.benchmark == "v4"
                          else (ArithmeticTask(operators=["+", "-"], digits=2), "ArithmeticTask", 8))
    prompts = [p.problem for p in task.train_problems()[: args.prompts]]
    pair = {"gpt2": load("tiny:gpt2-bpe", cls), "llama": load("tiny:llama-char", cls)}
    print(f"benchmark {args.benchmark}: {args.prompts} prompts x {args.k} samples per direction, seed {args.seed}")
    print("| direction | granularity | moved off its characters | EOS |Δ| (nats) | residual (nats/token) | tokens |")
    print("|---|---|---|---|---|---|")
    for src, rcv in (("gpt2", "llama"), ("llama", "gpt2")):
        (sm, st), (rm, rt) = pair[src], pair[rcv]
        rows = []
        for prompt, text, eos in sample(sm, st, prompts, args.k, max_new):
            s_ids, s_off, s_lp = own_logp(sm, st, prompt, text, eos)
            r_ids, r_off, r_lp = own_logp(rm, rt, prompt, text, eos)
            rows.append((text, eos, s_off, s_lp, r_off, r_lp))
        for gran in ("word", "span"):
            aligned = align_traces([r[0] for r in rows], [r[2] for r in rows], [r[3] for r in rows],
                                   [r[4] for r in rows], granularity=gran)
            moved = total = res = n = 0.0
            eos_dev = []
            for (text, eos, s_off, s_lp, r_off, r_lp), a in zip(rows, aligned):
                m, t = moved_mass(text, s_off, s_lp, r_off, a, gran)
                moved, total = moved + m, total + t
                res, n = res + float((a - r_lp).abs().sum()), n + len(a)
                if eos:
                    eos_dev.append(abs(float(a[-1]) - float(s_lp[-1])))
            eos_txt = f"{sum(eos_dev) / len(eos_dev):.3f}" if eos_dev else "n/a"
            print(f"| {src}->{rcv} | {gran} | {100 * moved / max(total, 1e-12):.1f} % | {eos_txt} | "
                  f"{res / max(n, 1):.3f} | {int(n)} |")


if __name__ == "__main__":
    main()
