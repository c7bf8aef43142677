# my_env.py: call a hidden coin; a wrong first call is answered "no" and may be made again, for half the reward
import random


class CoinCall:
    vocabulary = ["call", "heads", "or", "tails", "no", "again"]  # every word it writes and every action it reads

    def __init__(self, calls: int = 2):  # env.kwargs.calls
        self.calls = calls

    def reset(self, seed, **row):  # the G episodes of a GRPO group share the seed: the same coin
        self.coin = random.Random(seed).choice(["heads", "tails"])
        self.made = 0
        return "call heads or tails"

    def step(self, action):  # action: the policy's reply as text (action.token_ids: the sampled ids)
        self.made += 1
        words = action.split()
        hit = bool(words) and words[0] == self.coin
        reward = (1.0 if self.made == 1 else 0.5) if hit else 0.0
        done = hit or self.made >= self.calls
        return "no call again", reward, done, {"success": hit}
