"""docs/LATENTWIRE.md's result tables from a run's summary.json (the `latentwire` example's).

    python scripts/latentwire/tables.py RUN/summary.json

Prints, per language model, every prompt kind's scores over all held-out items (each ± one
standard error), the same per relation, the answers' first tokens per relation, and LatentWire's
joint two-model scores. Standard library only.
"""

import json
import sys

KINDS = [
    ("text", "text"),
    ("latent", "latent (M)"),
    ("token_budget", "token budget (first M)"),
    ("question_only", "question only"),
    ("token_budget_question", "question first, M tokens"),
    ("shuffled_latent", "another item's latent"),
]


def pm(scores, key, digits=3):
    return f"{scores[key]:.{digits}f} ± {scores['standard_errors'][key]:.{digits}f}"


def kinds_table(by_kind, title):
    print(f"\n{title}\n")
    print("| prompt | answer NLL / token | first-token acc. | first content-token acc. | EM | F1 | F1 (clean_pred) |")
    print("|---|---|---|---|---|---|---|")
    for key, name in KINDS:
        s = by_kind[key]
        print(f"| {name} | {pm(s, 'nll')} | {pm(s, 'first_token_accuracy')} | "
              f"{pm(s, 'first_content_token_accuracy')} | {pm(s, 'em')} | {pm(s, 'f1')} | {s['f1_clean']:.3f} |")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    summary = json.load(open(sys.argv[1]))
    models = [k for k, v in summary.items() if isinstance(v, dict) and "by_relation" in v]
    print(f"steps {summary['steps']}, M = {summary['latents']}, layout {summary.get('layout', 'chat')}, "
          f"{summary['wall_seconds'] / 60:.1f} min")
    for model in models:
        report = summary[model]
        items = report["text"]["items"]
        print(f"\n## {model}: {items} held-out items; compression {report['compression']:.1f}× "
              f"(LatentWire's, whole prompt: {report['prompt_compression']:.1f}×), "
              f"{report['payload_bytes']} bytes a text")
        kinds_table(report, "all relations")
        print("\nfirst content-token accuracy per relation (± one standard error)\n")
        header = " | ".join(name for _, name in KINDS)
        print(f"| relation (items; answers' first tokens) | {header} |")
        print("|---" * (len(KINDS) + 1) + "|")
        for relation, r in report["by_relation"].items():
            firsts = ", ".join(f"`{t}` {n}" for t, n in sorted(r["answer_first_tokens"].items(), key=lambda x: -x[1])[:3])
            cells = " | ".join(pm(r[key], "first_content_token_accuracy", 2) for key, _ in KINDS)
            print(f"| {relation} ({r['items']}; {firsts}) | {cells} |")
        print("\nanswer NLL per relation\n")
        print(f"| relation | {header} |")
        print("|---" * (len(KINDS) + 1) + "|")
        for relation, r in report["by_relation"].items():
            cells = " | ".join(pm(r[key], "nll", 2) for key, _ in KINDS)
            print(f"| {relation} | {cells} |")
    if "joint" in summary:
        j = summary["joint"]
        print(f"\nLatentWire's joint scores of the latent answers: rescored EM {j['rescored_em']:.3f}, "
              f"F1 {j['rescored_f1']:.3f}; agreement {j['agreement']:.3f}; oracle EM {j['oracle_em']:.3f}, "
              f"F1 {j['oracle_f1']:.3f}")


if __name__ == "__main__":
    main()
