"""The gold reward of the pleasant-replies example (docs/guides/reward-models.md): pleasant words minus unpleasant
ones in the reply. The preference pairs in this folder were drawn from it, so a reward model trained on them learns
an estimate of it, and RL against that estimate can be scored exactly here (``weight: 0`` in ``reward.terms``: logged,
not optimised)."""

PLEASANT = {"great", "wonderful", "lovely", "excellent", "fantastic"}
UNPLEASANT = {"awful", "terrible", "boring", "horrible", "dreadful"}


def gold(prompts: list[str], replies: list[str], references: list[list[str]]) -> list[float]:
    return [float(sum(w in PLEASANT for w in r.split()) - sum(w in UNPLEASANT for w in r.split())) for r in replies]
