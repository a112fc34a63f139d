"""A figure of a LatentWire run's first content-token accuracy per relation and prompt kind, one
panel per language model, from the run's summary.json (the `latentwire` example's).

    python scripts/latentwire/relations_plot.py RUN/summary.json OUT.png

Needs matplotlib.
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

KINDS = [
    ("text", "text"),
    ("latent", "latent"),
    ("token_budget", "token budget"),
    ("question_only", "question only"),
    ("token_budget_question", "question first"),
    ("shuffled_latent", "another item's latent"),
]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    summary = json.load(open(sys.argv[1]))
    models = [k for k, v in summary.items() if isinstance(v, dict) and "by_relation" in v]
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.2), sharey=True, squeeze=False)
    width = 0.8 / len(KINDS)
    for ax, model in zip(axes[0], models):
        relations = summary[model]["by_relation"]
        names = list(relations)
        for k, (key, label) in enumerate(KINDS):
            values = [relations[r][key]["first_content_token_accuracy"] for r in names]
            errors = [relations[r][key]["standard_errors"]["first_content_token_accuracy"] for r in names]
            xs = [i + (k - (len(KINDS) - 1) / 2) * width for i in range(len(names))]
            ax.bar(xs, values, width, yerr=errors, label=label, capsize=2)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels([f"{r}\n({relations[r]['items']})" for r in names])
        layout = summary.get("layout", "chat")
        ax.set_title(f"{model}, M = {summary['latents']}, {layout} layout, {summary['steps']} steps")
        ax.set_ylim(0, 1)
    axes[0][0].set_ylabel("first content-token accuracy (± 1 s.e.)")
    axes[0][-1].legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=90)


if __name__ == "__main__":
    main()
