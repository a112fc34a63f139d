"""PyTorch training throughput of LatentWire's step, on the work of kiln's `latentwire` example.

The step a careful user writes after LatentWire's performance review: the items tokenized once
(read from the kiln run's `tokens/train.json`, so both sides train on the same items and ids),
batched, no host-device round trips inside the step, AdamW with `fused=True` where torch has it,
the learning-rate schedule stepped once per optimizer step, bf16 autocast where the CPU has bf16
arithmetic (`--bf16`; the development VM's AMD EPYC has none: fp32).

The model is LatentWire's own (`InterlinguaEncoder`, `Adapter` from `latentwire/models.py`,
imported from a checkout: `--latentwire-dir`, or `$KILN_LATENTWIRE_DIR`, commit 220ce571), the
language model a transformers `AutoModelForCausalLM` from `--lm` (frozen, eval, SDPA), read as
kiln reads it: the prompt is the model's chat template with LatentWire's system prompt around
the soft prompt (the user's turn), the assistant's turn opened, then the answer and its
end-of-turn token; the prefix scaled to the input embeddings' RMS. Each step, per language model:
one forward over the soft prompt (logits for the answer positions only), the teacher-forced,
first-token (0.5, autoscaled), K-token (0.5, K = 4) and distillation (1.0, τ = 2, ×τ²) terms from
it; the teacher's forward over the text without gradient; the scale penalty (0.05); backward,
`clip_grad_norm_(…, 1.0)`, AdamW (lr 1e-4, weight decay 0.01), the scheduler's step,
`zero_grad(set_to_none=True)`, the loss read back as a Python float (as kiln's trainer reads it
for metrics.jsonl).

With `--cache-opening`, the template's opening (system turn, user header: the same in every
prompt) is read once per language model into a `DynamicCache`, and every forward, the soft
prompt's with gradient and the teacher's, starts after a batch-sized copy of it (kiln's readers
always do this: `CausalLm::prefix`); without it, every forward reads the whole prompt, as
LatentWire did.

`--warmup` steps run untimed, then `--rounds` rounds of `--steps-per-round` steps are timed;
prints ms per step per round, their median, and a final JSON line.

    /work/venvs/hf/bin/python scripts/bench/latentwire_torch.py --threads 2 \
        --lm /path/to/SmolLM2-135M-Instruct --tokens runs/lw/tokens/train.json \
        --latentwire-dir /path/to/LatentWire --batch 8 --latents 16

Requirements: scripts/fixtures/requirements-hf.txt (torch, transformers).
"""

import argparse
import copy
import inspect
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fixtures"))
from latentwire_modules import latentwire_models  # noqa: E402

SYSTEM_PROMPT = ("You are a concise QA assistant. Use the context to answer with a short phrase "
                 "only. Answer in English. Respond with the answer phrase only.")
CONTENT = "KILN_LATENTWIRE_CONTENT"
ANCHOR = "Answer:"  # kiln's reader::ANCHOR, LatentWire's "Answer: " (the space joins the answer)


def template(tokenizer):
    """The ids before and after the content in `tokenizer`'s chat template around LatentWire's
    system prompt and one user turn (the assistant's turn opened, the anchor written), and its
    end-of-turn id: what kiln's `Template::of` reads."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": CONTENT}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=True)
    before, after = rendered.split(CONTENT)
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]
    return encode(before), encode(after + ANCHOR), tokenizer.convert_tokens_to_ids(tokenizer.eos_token)


class Reader:
    """A frozen language model, its template ids and its input embeddings' RMS."""

    def __init__(self, path, cache_opening):
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                       attn_implementation="sdpa")
        self.lm.eval().requires_grad_(False)
        self.before, self.after, self.end = template(self.tokenizer)
        table = self.lm.get_input_embeddings().weight
        self.rms = table.pow(2).mean().sqrt().item()
        self.opening = None
        if cache_opening:
            with torch.no_grad():
                self.opening = self.lm(input_ids=torch.tensor([self.before]), use_cache=True,
                                       past_key_values=DynamicCache()).past_key_values

    def read(self, mask, logits_to_keep, **tokens):
        """The LM's logits for `tokens` (`input_ids` or `inputs_embeds`), the opening first: read
        from the cache of it, or (no cache) as the first tokens of every row. `mask` covers the
        tokens after the opening; positions count its real tokens."""
        b = mask.shape[0]
        opened = torch.cat([torch.ones(b, len(self.before), dtype=mask.dtype), mask], 1)
        positions = (opened.cumsum(-1) - 1).clamp(min=0)
        if self.opening is None:
            if "input_ids" in tokens:
                tokens["input_ids"] = torch.cat(
                    [torch.tensor([self.before] * b), tokens["input_ids"]], 1)
            else:
                tokens["inputs_embeds"] = torch.cat(
                    [self.embed([self.before] * b), tokens["inputs_embeds"]], 1)
            return self.lm(attention_mask=opened, position_ids=positions,
                           logits_to_keep=logits_to_keep, **tokens).logits
        cache = copy.deepcopy(self.opening)
        cache.batch_repeat_interleave(b)
        return self.lm(attention_mask=opened, position_ids=positions[:, len(self.before):],
                       past_key_values=cache, use_cache=True, logits_to_keep=logits_to_keep,
                       **tokens).logits

    def embed(self, ids):
        return self.lm.get_input_embeddings()(torch.tensor(ids, dtype=torch.long))


def answer_rows(answers, end):
    """Answers with the end id, right-padded; per-row weights of the loss terms (kiln's `Rows`)."""
    scored = [a + [end] for a in answers]
    window = max(len(a) for a in scored) + 1
    b = len(answers)
    targets = torch.full((b, window), -100, dtype=torch.long)
    tf, first, first_k = (torch.zeros(b, window) for _ in range(3))
    total = sum(len(a) for a in scored)
    longest = max(len(a) for a in answers)
    counts = [sum(len(a) > t for a in answers) for t in range(min(4, longest))]
    for r, a in enumerate(scored):
        for j, token in enumerate(a):
            targets[r, j] = token
            tf[r, j] = 1.0 / total
            if j == 0:
                first[r, j] = 1.0 / b
            if j < len(counts) and j < len(answers[r]):
                first_k[r, j] = 1.0 / (counts[j] * len(counts))
    return scored, window, targets, tf, first, first_k


def reader_loss(reader, prefix, texts, answers):
    scored, window, targets, w_tf, w_first, w_k = answer_rows(answers, reader.end)
    b, m, _ = prefix.shape
    longest = max(len(a) for a in scored)
    right = [reader.after + a + [reader.end] * (longest - len(a)) for a in scored]
    x = torch.cat([prefix, reader.embed(right)], 1)
    real = m + len(reader.after)
    mask = torch.tensor([[1] * real + [1] * len(a) + [0] * (longest - len(a)) for a in scored])
    logits = reader.read(mask, window, inputs_embeds=x)
    flat = logits.reshape(b * window, -1).float()
    ce = F.cross_entropy(flat, targets.reshape(-1), ignore_index=-100, reduction="none")
    tf = (ce * w_tf.reshape(-1)).sum()
    first = (ce * w_first.reshape(-1)).sum()
    k_token = (ce * w_k.reshape(-1)).sum()
    ratio = first.item() / max(tf.item(), 1e-4)
    first_weight = 0.5 * min(ratio, 8.0) if ratio > 1.0 else 0.5
    with torch.no_grad():
        longest_text = max(len(t) for t in texts)
        rows = [[reader.end] * (longest_text - len(t)) + t + reader.after + a
                + [reader.end] * (longest - len(a)) for t, a in zip(texts, scored)]
        tmask = torch.tensor([[0] * (longest_text - len(t)) + [1] * (len(t) + len(reader.after)
                              + len(a)) + [0] * (longest - len(a)) for t, a in zip(texts, scored)])
        teacher = reader.read(tmask, window, input_ids=torch.tensor(rows))
        teacher = teacher.reshape(b * window, -1).float()
    tau = 2.0
    kl = F.kl_div(F.log_softmax(flat / tau, -1), F.log_softmax(teacher / tau, -1),
                  reduction="none", log_target=True).sum(-1)
    kd = (kl * w_k.reshape(-1)).sum() * tau * tau
    return tf + first_weight * first + 0.5 * k_token + kd


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lm", action="append", required=True)
    parser.add_argument("--tokens", required=True)
    parser.add_argument("--latentwire-dir", default=os.environ.get("KILN_LATENTWIRE_DIR"))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--latents", type=int, default=16)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--cache-opening", action="store_true")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps-per-round", type=int, default=2)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    models = latentwire_models(args.latentwire_dir)
    readers = [Reader(path, args.cache_opening) for path in args.lm]
    split = json.load(open(args.tokens))
    if len(split["readers"]) != len(readers):
        sys.exit(f"{args.tokens} is tokenized for {len(split['readers'])} models, --lm gives "
                 f"{len(readers)}")
    encoder = models.InterlinguaEncoder(d_z=256, n_layers=6, n_heads=8, ff_mult=4,
                                        latent_len=args.latents)
    adapters = torch.nn.ModuleList(
        models.Adapter(256, r.lm.config.hidden_size, args.latents, enable_metadata=True,
                       length_norm=32.0, hidden_mult=2) for r in readers)
    params = list(encoder.parameters()) + list(adapters.parameters())
    fused = {"fused": True} if "fused" in inspect.signature(torch.optim.AdamW).parameters else {}
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, **fused)
    total = args.warmup + args.rounds * args.steps_per_round
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(total, 1),
                                                          eta_min=2e-6)
    byte_tokenizer = models.ByteTokenizer(max_bytes=512)
    from latentwire.core_utils import collate_bytes
    items = len(split["sources"])
    order = torch.randperm(items, generator=torch.Generator().manual_seed(0)).tolist()
    cursor = [0]

    def step():
        idx = [order[(cursor[0] + i) % items] for i in range(args.batch)]
        cursor[0] += args.batch
        bytes_ = collate_bytes([split["sources"][i] for i in idx], byte_tokenizer, "cpu")
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            z = encoder(bytes_)
            loss = 0.0
            for reader, ids, adapter in zip(readers, split["readers"], adapters):
                prefix = adapter(z, None).float()
                row_rms = prefix.pow(2).mean(dim=(1, 2), keepdim=True).sqrt().clamp_min(1e-6)
                prefix = prefix / row_rms * reader.rms
                texts = [ids["texts"][i] for i in idx]
                answers = [ids["answers"][i] for i in idx]
                loss = loss + reader_loss(reader, prefix, texts, answers)
            loss = loss / len(readers)
            loss = loss + 0.05 * sum((a.scale - 1).pow(2).sum() for a in adapters)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    for _ in range(args.warmup):
        step()
    rounds = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        for _ in range(args.steps_per_round):
            step()
        ms = 1000 * (time.perf_counter() - start) / args.steps_per_round
        rounds.append(ms)
        print(f"latentwire: {ms:.1f} ms per step", flush=True)
    print(json.dumps({"workload": "latentwire", "threads": torch.get_num_threads(),
                      "batch": args.batch, "latents": args.latents, "bf16": args.bf16,
                      "cache_opening": args.cache_opening,
                      "torch": torch.__version__, "ms_per_step_rounds": rounds,
                      "median_ms_per_step": statistics.median(rounds)}))


if __name__ == "__main__":
    main()
