"""my_reward.py: what a good reply is, for this bot."""

THANKS = ("thanks", "thank you", "cheers")


def polite(prompts: list[str], replies: list[str], references: list[list[str]]) -> list[float]:
    """1.0 for a reply that thanks, else 0.0. replies[i] answers prompts[i]; references[i] are the file's replies
    to that prompt. rayseq calls it with a batch of replies at a time, as lower-cased text."""
    return [float(any(t in reply for t in THANKS)) for reply in replies]
