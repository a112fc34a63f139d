"""docs/LATENTWIRE.md's result tables from a run's summary.json (the `latentwire` example's).

    python scripts/latentwire/tables.py RUN/summary.json
    python scripts/latentwire/tables.py RUN_A/summary.json RUN_B/summary.json ...

With one run, prints per language model every prompt kind's scores over all held-out items (each
± one standard error), the same per relation, the answers' first tokens per relation, and
LatentWire's joint two-model scores. With several, prints one row per run and model: the tests
that decide whether the latent carries the text (its own latent against another item's, and
against the question alone, with dates apart from the other relations). Standard library only.
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


def pooled(report, metric, keep):
    """`metric`'s mean over the relations `keep` accepts, each weighted by its items."""
    rows = [(r["items"], r) for name, r in report["by_relation"].items() if keep(name)]
    items = sum(n for n, _ in rows)
    return {kind: sum(n * r[kind][metric] for n, r in rows) / items for kind, _ in KINDS}, items


def compare(paths):
    print("| run | model | latent NLL | another item's latent NLL | question-only NLL | "
          "first content-token acc., other relations: text / latent / question only | "
          "dates: latent / question only | latent F1 (clean_pred) | prefix spread: between "
          "items (relations, within) |")
    print("|---" * 9 + "|")
    for path in paths:
        summary = json.load(open(path))
        run = f"M = {summary['latents']}, {summary.get('layout', 'chat')}"
        for model in models_of(summary):
            report = summary[model]
            others, n_others = pooled(report, "first_content_token_accuracy", lambda r: r != "birthday")
            dates, n_dates = pooled(report, "first_content_token_accuracy", lambda r: r == "birthday")
            print(f"| {run} | {model} | {pm(report['latent'], 'nll')} | "
                  f"{pm(report['shuffled_latent'], 'nll')} | {pm(report['question_only'], 'nll')} | "
                  f"{others['text']:.3f} / {others['latent']:.3f} / {others['question_only']:.3f} "
                  f"({n_others} items) | {dates['latent']:.3f} / {dates['question_only']:.3f} "
                  f"({n_dates}) | {report['latent']['f1']:.3f} ({report['latent']['f1_clean']:.3f}) | "
                  f"{spread(report.get('prefix_spread'))} |")


def spread(s):
    """A spread's three parts, or a dash for runs from before it was measured."""
    if s is None:
        return "—"
    return f"{s['between_items']:.2g} ({s['between_relations']:.2g}, {s['within_relations']:.2g})"


def models_of(summary):
    return [k for k, v in summary.items() if isinstance(v, dict) and "by_relation" in v]


def main():
    if len(sys.argv) > 2:
        return compare(sys.argv[1:])
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    summary = json.load(open(sys.argv[1]))
    models = models_of(summary)
    print(f"steps {summary['steps']}, M = {summary['latents']}, layout {summary.get('layout', 'chat')}, "
          f"{summary['wall_seconds'] / 60:.1f} min")
    for model in models:
        report = summary[model]
        items = report["text"]["items"]
        print(f"\n## {model}: {items} held-out items; compression {report['compression']:.1f}× "
              f"(LatentWire's, whole prompt: {report['prompt_compression']:.1f}×), "
              f"{report['payload_bytes']} bytes a text")
        print(f"prefix spread between items {spread(report.get('prefix_spread'))} "
              f"(between relations, within them)")
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
    print(f"\nthe encoder's latents spread {spread(summary.get('latent_spread'))}")
    if "joint" in summary:
        j = summary["joint"]
        print(f"\nLatentWire's joint scores of the latent answers: rescored EM {j['rescored_em']:.3f}, "
              f"F1 {j['rescored_f1']:.3f}; agreement {j['agreement']:.3f}; oracle EM {j['oracle_em']:.3f}, "
              f"F1 {j['oracle_f1']:.3f}")


if __name__ == "__main__":
    main()
