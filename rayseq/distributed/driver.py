"""The driver loop: MLE pretraining, then the configured algorithm; logging, evaluation, checkpoints.

Stages: ``mle`` (pretraining), ``disc`` (SeqGAN only: discriminator pretraining, ``disc.pretrain_steps``
d-steps) and ``train`` (the configured algorithm).

Per RL iteration (DESIGN.md data flow; under Ray the data moves by reference, the driver receives metrics):
  learner --weights(version), one buffer--> object store            (time/sync_s: publishing, no call)
  task prompts + that weights ref --> workers sample + score        (time/rollout_s; time/sample_s on the workers)
  SeqGAN: workers' Monte-Carlo search --> scorers' D --> Q refs      (time/mc_s, time/score_s)
  rollout + score refs --> learner fetches, updates --> metrics      (time/learn_s; time/update_s the update alone)
            and its new weights --> object store (the next iteration's weights ref)
  SeqGAN: ``disc.d_steps`` d-steps with fresh negatives             (time/disc_s)
With task rewards the update is sent right behind the sampling calls (the learner starts as the shards arrive), and
the next iteration's batch right behind the update (:meth:`Trainer._next_batch`): its sampling calls carry the
update's weights by reference, so the workers start the moment the learner has published them, without a round trip
through the driver (still on-policy: staleness 0, the same prompts, seeds and weights as one call after the other).
``time/rollout_s`` is then the sending (nothing, for a batch already sent) and ``time/learn_s`` covers sampling and
update.
"""

from __future__ import annotations

import math
import random
import signal
import time
from datetime import datetime

import numpy as np
import yaml

from rayseq import registry
from rayseq.algos import make_algo
from rayseq.checkpoint import list_checkpoints, load_checkpoint, resolve_checkpoint, save_checkpoint
from rayseq.config import RunConfig, config_to_dict
from rayseq.distributed.runtime import make_runtime
from rayseq.runlog import MetricsLog, to_json
from rayseq.storage import RunStore
from rayseq.tasks import make_task
from rayseq.types import RolloutRequest

STAGES = ("mle", "disc", "train")


class Interrupted(Exception):
    """SIGINT/SIGTERM arrived; a checkpoint was written (``checkpoint``: its location)."""

    checkpoint: str | None = None


def default_run_dir(cfg: RunConfig) -> str:
    name = cfg.name or f"{cfg.task.name}-{cfg.algo.name}-s{cfg.seed}-{datetime.now():%Y%m%d-%H%M%S}"
    return f"runs/{name}"


def _rollout_seed(cfg: RunConfig, iteration: int) -> int:
    return (cfg.seed * 1_000_003 + iteration) % 2**62


class Trainer:
    """Owns the run directory, the data RNG, the runtime and the loop. ``run()`` returns the summary."""

    def __init__(self, cfg: RunConfig, *, resume: bool = False, placement_group=None, report=None):
        self.cfg = cfg
        self.store = RunStore(cfg.run_dir or default_run_dir(cfg))  # local path or pyarrow.fs URI
        self.run_dir = self.store.display()
        self.resume = resume
        self.report = report  # optional callback(metrics_row, trainer) per iteration (Tune)
        self._placement_group = placement_group
        cfg.task_class.prepare_data(cfg.task)  # e.g. pairs' task.prepare: once, before any actor reads the data
        self.task = make_task(cfg.task, cfg.reward)
        self.rng = np.random.default_rng(cfg.seed)
        self.iteration = 0  # global iteration counter across stages (1-based after the first update)
        self.stage = "mle"
        self.stage_iter = 0
        self.pretrain_metrics: dict = {}
        self._test_cache: tuple | None = None  # (learner version, test metrics, details)
        self._stop = False
        self._next: list | None = None  # rollout.pipeline: shard handles of the next batch, sampling
        self._ahead = False  # the next batch went out with the last update (the runtime holds it: rt.take_next())
        self._rng_ahead: dict | None = None  # the data RNGs before that batch (or _next) was drawn: checkpointed

    # -- bookkeeping ------------------------------------------------------------------------------
    def _plan(self) -> dict[str, int]:
        disc = self.cfg.disc.pretrain_steps if self.cfg.is_gan else 0
        return {"mle": self.cfg.train.pretrain_iters, "disc": disc, "train": self.cfg.train_stage_iters}

    def _driver_state(self) -> dict:
        return {
            "iteration": self.iteration,
            "stage": self.stage,
            "stage_iter": self.stage_iter,
            # a batch drawn ahead (sent with the last update, or pipelined) is drawn again by a resumed run
            **(self._rng_ahead or self._rng_state()),
            "pretrain_metrics": self.pretrain_metrics,
        }

    def _rng_state(self) -> dict:
        return {"numpy_rng": self.rng.bit_generator.state, "python_rng": random.getstate()}

    def save(self, rt) -> str:
        """Checkpoint (metrics first: rows past a checkpoint are dropped again on resume)."""
        self.metrics.flush()
        t0 = time.perf_counter()
        payload = {
            "format": "rayseq-checkpoint-v1",
            "config": config_to_dict(self.cfg),
            "task": self.task.spec(),
            "learner": rt.learner("state_dict"),
            "driver": self._driver_state(),
        }
        if getattr(registry.model_class(self.cfg.model.arch), "weights_format", "torch") == "safetensors":
            payload["weights_format"] = "safetensors"  # the trained weights beside the .pt (rayseq.checkpoint)
        path = save_checkpoint(self.store, self.iteration, payload, keep=self.cfg.train.keep_checkpoints)
        if self.metrics.rows:  # written with the next flush
            self.metrics.rows[-1]["time/checkpoint_s"] = time.perf_counter() - t0
        return path

    def _resume_checkpoint(self) -> dict:
        """The latest checkpoint, read and checked against this run's config before anything is written or
        started: its task, model and algorithm must be this config's (else the weights would not fit)."""
        ckpts = list_checkpoints(self.store)
        if not ckpts:
            raise FileNotFoundError(f"--resume: no checkpoint in {self.store.display('checkpoints')}")
        ck = load_checkpoint(ckpts[-1])
        try:  # as this version reads it: keys added since (model.arch) take their defaults
            theirs = config_to_dict(RunConfig.model_validate(ck["config"]))
        except ValueError:
            theirs = ck["config"]
        ours = config_to_dict(self.cfg)
        diff = [f"{sec}.{k}" for sec in ("task", "model") for k in ours[sec]
                if theirs.get(sec, {}).get(k) != ours[sec][k]]
        diff += ["algo.name"] if theirs.get("algo", {}).get("name") != self.cfg.algo.name else []
        if diff:
            raise ValueError(f"--resume: {self.run_dir} was trained with another {', '.join(diff)} (its checkpoint's "
                             f"config); resume it with its own config: python -m rayseq.train "
                             f"run_dir={self.run_dir} --resume")
        return ck

    def _restore(self, rt, ck: dict) -> None:
        rt.learner("load_state_dict", ck["learner"])
        rt.learner("apply_config_lrs")  # this run's learning rates, not the saved ones (Tune PBT mutates them)
        d = ck["driver"]
        self.iteration, self.stage, self.stage_iter = int(d["iteration"]), d["stage"], int(d["stage_iter"])
        self.rng.bit_generator.state = d["numpy_rng"]
        random.setstate(_as_random_state(d["python_rng"]))
        self.pretrain_metrics = dict(d["pretrain_metrics"])
        rows = [r for r in MetricsLog.read_rows(self.store) if r["iteration"] <= self.iteration]
        self.metrics.rows = [{k: v for k, v in r.items() if v is not None} for r in rows]

    def _init_from(self, rt, source: str) -> None:
        """Start the algorithm stage from a pretrained run (``train.init_from``)."""
        ck = load_checkpoint(resolve_checkpoint(source))
        theirs = config_to_dict(RunConfig.model_validate(ck["config"]))  # as this version reads it (task.data_dir)
        ours = config_to_dict(self.cfg)
        diff = [f"{sec}.{k}" for sec in ("task", "model") for k in ours[sec]
                if theirs.get(sec, {}).get(k) != ours[sec][k]]
        if diff:
            raise ValueError(f"train.init_from={source}: its config differs in {', '.join(diff)}; "
                             "the generator must be built the same way")
        d = ck["driver"]
        if d["stage"] == "mle" and d["stage_iter"] < theirs["train"]["pretrain_iters"]:
            raise ValueError(f"train.init_from={source}: that run has not finished MLE pretraining")
        loaded = rt.learner("init_from", ck["learner"])
        self.iteration = int(d["iteration"])
        # no discriminator there (an MLE run): SeqGAN pretrains its D (stage disc) from that generator first
        self.stage, self.stage_iter = ("disc" if self.cfg.is_gan and not loaded["disc"] else "train"), 0
        self.pretrain_metrics = dict(d["pretrain_metrics"])

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.cfg
        t_start = time.time()
        ck = self._resume_checkpoint() if self.resume else None  # checked before anything is written or started
        if ck is None and list_checkpoints(self.store):
            raise FileExistsError(f"{self.run_dir} already holds a run; pass --resume or another run_dir")
        self.store.makedirs()
        self.store.write_text("config.yaml", yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
        self.metrics = MetricsLog(self.store)
        rt = self._runtime = make_runtime(cfg, self._placement_group)
        old_handlers = _install_signal_handlers(self)
        bar = Progress(cfg.progress, cfg.progress_every)
        try:
            if ck is not None:
                self._restore(rt, ck)
                del ck
            elif cfg.train.init_from:
                self._init_from(rt, cfg.train.init_from)
            plan = self._plan()
            for stage in STAGES[STAGES.index(self.stage) :]:
                if stage != self.stage:
                    self.stage, self.stage_iter = stage, 0
                if plan[stage] == 0 and stage != "train":
                    continue
                rt.learner("start_stage", stage)  # (the first call waits for the learner actor: before the bar)
                if self.stage_iter < plan[stage]:
                    bar.start(STAGE_LABELS.get(stage, cfg.algo.name), plan[stage], self.stage_iter)
                final = self._run_stage(rt, stage, plan[stage], bar)
                bar.close()
                if stage == "mle":  # the pretrained model's test figures are reported beside the final ones
                    self.pretrain_metrics = {**final, **self._test(rt)[0]}
            test, details = self._test(rt)
            ckpt = self.save(rt)
            summary = {
                "task": cfg.task.name,
                "algo": cfg.algo.name,
                "seed": cfg.seed,
                "metrics": {**final, **test},
                "pretrain_metrics": self.pretrain_metrics,
                "details": details,
                "iterations": self.iteration,
                "wall_s": round(time.time() - t_start, 2),
                "run_dir": self.run_dir,
                "checkpoint": ckpt,
                "rollout_workers": cfg.rollout.num_workers,
            }
            self.store.write_text("summary.json", to_json(summary))
            return summary
        except Interrupted as exc:
            bar.close()  # the bar's final redraw comes before the caller's message
            exc.checkpoint = self.save(rt)
            raise
        finally:
            bar.close()
            _restore_signal_handlers(old_handlers)
            self.metrics.close()
            rt.shutdown()

    def _test(self, rt) -> tuple[dict, dict]:
        """``test/*`` metrics and details of the learner's generator now, computed once per weights version:
        reported (summary.json, the final table), never selected on."""
        version = rt.learner("get_version")
        if self._test_cache is None or self._test_cache[0] != version:
            self._test_cache = (version, *rt.learner("evaluate", "test"))
        return self._test_cache[1], self._test_cache[2]

    def _run_stage(self, rt, stage: str, n_iters: int, bar) -> dict:
        """Runs the rest of ``stage``; returns the validation metrics (``val/*``) at its end."""
        cfg = self.cfg
        algo = make_algo(cfg.algo, cfg.seed) if stage == "train" else None
        supervised = algo is None or algo.kind == "supervised"  # MLE pretraining, or a supervised algorithm
        # the disc stage leaves G, hence its evaluation, as pretraining ended; other stages evaluate as they go
        ev = {k: v for k, v in self.pretrain_metrics.items() if k.startswith("val/")} if stage == "disc" else None
        if self.stage_iter >= n_iters:
            return ev if stage == "disc" else rt.learner("evaluate", "val")[0]
        while self.stage_iter < n_iters:
            if self._stop:
                raise Interrupted()
            t0 = time.perf_counter()
            m: dict = {}
            if stage == "disc":
                m.update(self._d_step(rt))
            elif supervised:
                bs = cfg.train.pretrain_batch_size if stage == "mle" else cfg.train.batch_size
                batch = self.task.sample_prompts(self.rng, bs, with_targets=True)
                if algo is not None:  # RAML's reward-weighted samples, data noising; others: the batch as it is
                    batch, aug = algo.augment(self.task, batch, self.rng, self.stage_iter)
                    if aug:
                        m.update(aug)
                        m["time/augment_s"] = time.perf_counter() - t0
                t1 = time.perf_counter()
                m.update(rt.learner("update", batch, self.stage_iter))
                m["time/learn_s"] = time.perf_counter() - t1
            else:
                m.update(self._rollout_iteration(rt, algo, last=self.stage_iter + 1 == n_iters))
            self.stage_iter += 1
            self.iteration += 1
            if algo is not None and algo.validate_every and self.stage_iter % algo.validate_every == 0:
                m.update(rt.learner("validate"))
            m["time/iter_s"] = time.perf_counter() - t0
            every = cfg.train.eval_every
            if stage == "mle" and cfg.train.pretrain_eval_every is not None:
                every = cfg.train.pretrain_eval_every
            if stage != "disc" and ((every and self.stage_iter % every == 0) or self.stage_iter == n_iters):
                ev = rt.learner("evaluate", "val")[0]
                m.update(ev)
            self.metrics.log(stage, self.iteration, m)
            if cfg.train.checkpoint_every and self.iteration % cfg.train.checkpoint_every == 0:
                self.save(rt)
            if self.report is not None:
                self.report(self.metrics.rows[-1], self)
            bar.update(_postfix(m))
        return ev


    # -- SeqGAN (Yu et al. Algorithm 1) ---------------------------------------------------------------
    def _d_step(self, rt) -> dict:
        """Fresh negatives from G_θ (on the workers) and as many real examples; ``disc.epochs`` epochs."""
        cfg, t0 = self.cfg, time.perf_counter()
        n = cfg.disc.num_negatives
        _sync_generator(rt)
        request = RolloutRequest(max_len=self.task.max_tgt_len, temperature=1.0,
                                 seed=_rollout_seed(cfg, self.iteration) ^ 0x5EED)
        negatives = rt.sample(self.task.sample_prompts(self.rng, n), request)
        positives = self.task.sample_prompts(self.rng, n, with_targets=True)
        t1 = time.perf_counter()
        m = rt.learner("train_discriminator", positives, negatives, _rollout_seed(cfg, self.iteration))
        m.update({"time/negatives_s": t1 - t0, "time/disc_s": time.perf_counter() - t0})
        return m

    def _prompts(self, algo, n: int):
        """``n`` prompts for the algorithm's rollouts: ``n / algo.prompt_copies()`` inputs, each repeated that many
        times in consecutive rows (GRPO's and RLOO's groups of samples of one prompt)."""
        copies = algo.prompt_copies()
        if n % copies:
            raise ValueError(f"train.batch_size={n} is not a multiple of the {copies} samples per prompt")
        prompts = self.task.sample_prompts(self.rng, n // copies, with_targets=algo.needs_targets)
        return prompts if copies == 1 else prompts.repeat(copies)

    def _rollout_iteration(self, rt, algo, last: bool = False) -> dict:
        """One iteration of a rollout algorithm: ``algo.policy_steps()`` times sample, score as the algorithm says
        (``algo.scoring``), update; then, for an adversarial one, ``algo.discriminator_steps`` d-steps (SeqGAN
        Algorithm 1: g-steps, then d-steps). The rollout stays where it was sampled until the learner fetches it:
        the driver holds its shard handles and receives metrics only. ``rollout.pipeline``: :meth:`_pipelined_step`
        (``last``: the stage's last iteration, after which no batch is sampled)."""
        cfg = self.cfg
        m: dict = {}
        received = rt.recv_bytes
        if algo.validate_every and self.stage_iter == 0:
            m.update(rt.learner("validate"))  # the starting point the first interval is judged against
        steps = 0 if cfg.rollout.pipeline else algo.policy_steps()
        if cfg.rollout.pipeline:
            m.update(self._pipelined_step(rt, algo, last))
        for g in range(steps):
            t0 = time.perf_counter()
            _sync_generator(rt)
            t1 = time.perf_counter()
            seed = _rollout_seed(cfg, self.iteration * steps + g)
            if self._ahead:  # sent with the last update, sampled with its weights
                shards = rt.take_next()
                self._ahead, self._rng_ahead = False, None
            else:
                prompts = self._prompts(algo, cfg.train.batch_size)
                request_args = (self.stage_iter, self.task.max_tgt_len, cfg.rollout.temperature, seed)
                request = (rt.learner("rollout_request", *request_args) if algo.stateful_request
                           else algo.rollout_request(*request_args))
                # task rewards: the update is sent at once behind the sampling (the learner takes the shards as
                # they come)
                shards = rt.sample(prompts, request, wait=algo.scoring != "task")
            t2 = time.perf_counter()
            scores, timing = self._score(rt, algo, shards, seed)
            t3 = time.perf_counter()
            next_batch = self._next_batch(algo, steps, last)
            m.update(rt.update(shards, self.stage_iter, scores, next_batch=next_batch))
            self._ahead = next_batch is not None
            t4 = time.perf_counter()
            m.update(timing)
            m.update({"time/sync_s": t1 - t0, "time/rollout_s": t2 - t1, "time/learn_s": t4 - t3})
            if algo.scoring != "task":
                m["time/mc_total_s"] = t3 - t2
        if algo.adversarial:
            t5 = time.perf_counter()
            for _ in range(algo.discriminator_steps(self.stage_iter, cfg.disc.d_steps)):
                m.update(self._d_step(rt))
            m["time/disc_s"] = time.perf_counter() - t5
        m["rollout/worker_restarts"] = float(rt.restarts)
        if rt.remote:
            m["driver/recv_bytes"] = float(rt.recv_bytes - received)
        return m

    def _next_batch(self, algo, steps: int, last: bool):
        """``() -> (prompts, request)`` of the next iteration, to go out with this update (``rt.update``'s
        ``next_batch``: under Ray its sampling is chained on the update's weights by reference), when nothing the
        driver does between the two can change them: one policy step per iteration, task rewards, a request the
        algorithm's driver copy builds, no validation (interpolation may undo the update) and not the stage's last
        iteration. Else None (the next iteration draws and sends its batch itself)."""
        cfg = self.cfg
        validates = algo.validate_every and (self.stage_iter + 1) % algo.validate_every == 0
        if (last or steps != 1 or algo.scoring != "task" or algo.stateful_request or algo.adversarial or validates
                or cfg.rollout.pipeline):
            return None
        stage_iter, iteration = self.stage_iter + 1, self.iteration + 1

        def draw() -> tuple:
            self._rng_ahead = self._rng_state()
            prompts = self._prompts(algo, cfg.train.batch_size)
            request = algo.rollout_request(stage_iter, self.task.max_tgt_len, cfg.rollout.temperature,
                                           _rollout_seed(cfg, iteration))
            return prompts, request

        return draw

    def _submit_rollout(self, rt, algo, stage_iter: int, iteration: int) -> list:
        """Start sampling the batch of iteration ``iteration`` (``stage_iter`` of the stage): prompts, request and
        seed as the synchronous loop draws them; returns its shard handles at once (under Ray, while it samples)."""
        cfg = self.cfg
        prompts = self._prompts(algo, cfg.train.batch_size)
        request = algo.rollout_request(stage_iter, self.task.max_tgt_len, cfg.rollout.temperature,
                                       _rollout_seed(cfg, iteration))
        return rt.sample(prompts, request, wait=False)

    def _pipelined_step(self, rt, algo, last: bool) -> dict:
        """``rollout.pipeline``: the learner updates on batch k, sampled while update k−1 ran (with the weights
        before it: staleness 1, ``rollout/staleness``), while the workers sample batch k+1 with the current weights.
        The algorithm's ratio π_θ / π_behaviour uses the log-probs recorded at sampling (``Rollout.logp``), which
        corrects for the older weights (``off_policy_ratio``; rayseq.config.check_pipeline refuses the others).
        In-process the same happens one call after the other: batch k+1 is sampled before update k.

        The stage's first batch (and the first after a resume, where nothing is in flight) is sampled with the
        current weights (staleness 0); prompts and seeds follow the synchronous loop's."""
        t0 = time.perf_counter()
        _sync_generator(rt)
        t1 = time.perf_counter()
        if self._next is None:
            self._next = self._submit_rollout(rt, algo, self.stage_iter, self.iteration)
        shards, self._next, self._rng_ahead = self._next, None, None
        if not last:
            self._rng_ahead = self._rng_state()
            self._next = self._submit_rollout(rt, algo, self.stage_iter + 1, self.iteration + 1)
        t2 = time.perf_counter()
        m = rt.update(shards, self.stage_iter)
        t3 = time.perf_counter()
        m.update({"time/sync_s": t1 - t0, "time/rollout_s": t2 - t1, "time/learn_s": t3 - t2})
        return m

    def _score(self, rt, algo, shards: list, seed: int) -> tuple[dict | None, dict]:
        """Score a sampled rollout (its shard handles) as the algorithm says (``algo.scoring``): returns the
        ``scores`` argument of the learner's ``update_rollout`` (handles of per-shard scores, which the learner gives
        the rollout: :func:`rayseq.distributed.learner.assign_scores`) and timing metrics.

        - ``task``: the task's reward, already computed where it was sampled (workers or scorer actors): None;
        - ``monte_carlo_q``: SeqGAN's Q(Y_1:t−1, y_t) for every token (Eq. 4): N continuations of each prefix by
          the rollout policy on the workers, scored by D on the scorers, as ``Rollout.returns``;
        - ``discriminator``: D(Y) of each whole sequence as its terminal reward (SeqGAN-critic).
        """
        if algo.scoring == "task":
            return None, {}
        a = self.cfg.algo
        rt.sync_disc(rt.learner("get_disc_version"))
        if algo.scoring == "monte_carlo_q":
            parts, info = rt.mc_q(shards, a.mc_rollouts, self.cfg.rollout.temperature, seed)
        elif algo.scoring == "discriminator":  # D scores the sampled sequences only; a critic may do the rest
            parts, info = rt.disc_scores(shards)
            info = {"mc_s": 0.0, **info}
        else:
            raise ValueError(f"algo.name={a.name}: unknown scoring {algo.scoring!r} (task, monte_carlo_q, "
                             "discriminator)")
        scores = {"scoring": algo.scoring, "parts": parts, "mc_rollouts": a.mc_rollouts}
        return scores, {"time/mc_s": info["mc_s"], "time/score_s": info["score_s"]}


def _sync_generator(rt) -> None:
    """Publish the learner's weights tagged with its update count (what ``rollout/staleness`` compares
    against, also after ``train.init_from`` or a D-pretraining stage, where it differs from the iteration)."""
    rt.sync_weights(rt.learner_version())


def _postfix(m: dict) -> dict:
    out = {}
    for key, short in (("rollout/reward_mean", "reward"), ("loss/nll", "nll"), ("val/precision", "val_prec"),
                       ("val/nll_oracle", "val_nll_oracle"), ("val/bleu2", "val_bleu2"), ("disc/accuracy", "d_acc")):
        if key in m and math.isfinite(m[key]):
            out[short] = f"{m[key]:.3f}"
    return out


STAGE_LABELS = {"mle": "MLE pretraining", "disc": "D pretraining"}  # stage train: the algorithm's name


class Progress:
    """What a run shows on stderr while it runs (``progress``): on a terminal a tqdm bar per stage, left on
    screen with its last figures when the next stage starts; elsewhere (``ray job logs``, CI, a file) a plain
    line every ``progress_every`` seconds and one at the end of each stage; nothing with ``progress=false``.
    No rate or time left is shown before a stage's third iteration (its first ones carry start-up costs)."""

    WARMUP = 3  # iterations of a stage (this session) before a rate is shown

    def __init__(self, mode: bool | str, every: float = 30.0, stream=None, clock=time.monotonic):
        import sys

        self.stream, self.clock = stream or sys.stderr, clock
        if mode is True:
            mode = "bar" if _terminal_width(self.stream) else "lines"
        self.mode = mode or "off"
        self.every = every
        self._bar = None
        self._open = False

    def start(self, label: str, total: int, done: int) -> None:
        self.close()
        self.label, self.total, self.n, self.first = label, total, done, done
        self.figures: dict = {}
        self.t0 = self.t_last_line = self.clock()
        self.t_warm = None  # when the warm-up iterations were done: rates are measured from there
        self._open = self.mode != "off"
        if self.mode == "bar":
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=done, desc=label, unit="it", dynamic_ncols=True,
                             file=self.stream, bar_format=self._warmup_format)

    _warmup_format = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"

    def update(self, figures: dict) -> None:
        """One iteration done; ``figures``: the short metrics it produced (kept until replaced)."""
        if not self._open:
            return
        self.n += 1
        self.figures.update(figures)
        now = self.clock()
        if self.n - self.first == self.WARMUP:
            self.t_warm = now
        if self._bar is not None:
            if self.n - self.first == self.WARMUP:
                self._bar.bar_format = None  # tqdm's own, with rate and time left from here on
            self._bar.set_postfix(self.figures, refresh=False)
            self._bar.update(1)
        elif now - self.t_last_line >= self.every:
            self._line(now)

    def close(self) -> None:
        """End of the stage (or of the run): the bar's final redraw, or the stage's last line."""
        if not self._open:
            return
        self._open = False
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.n > self.first:
            self._line(self.clock())

    def _line(self, now: float) -> None:
        self.t_last_line = now
        pct = f" {100 * self.n / self.total:3.0f}%" if self.total else ""
        text = f"{self.label} {self.n}/{self.total}{pct}  elapsed {_clock(now - self.t0)}"
        if self.t_warm is not None and self.n - self.first > self.WARMUP and self.n < self.total:
            rate = (self.n - self.first - self.WARMUP) / max(now - self.t_warm, 1e-9)
            text += f", ~{_clock((self.total - self.n) / rate)} left"
        figures = " ".join(f"{k}={v}" for k, v in self.figures.items())
        print(f"{text}  {figures}".rstrip(), file=self.stream, flush=True)


def _terminal_width(stream) -> int:
    """Columns of the terminal ``stream`` writes to; 0 when it is not one, or one without a size (a pseudo-
    terminal nobody sized, where tqdm draws nothing)."""
    import os

    try:
        size = os.get_terminal_size(stream.fileno()) if stream.isatty() else None
    except (AttributeError, OSError, ValueError):
        return 0
    return size.columns if size and size.lines else 0


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _as_random_state(s):
    """python's random state, whose inner sequence may come back from a checkpoint as a list."""
    return (s[0], tuple(s[1]), s[2])


def _install_signal_handlers(trainer: Trainer):
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        trainer._stop = True

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}


def _restore_signal_handlers(old) -> None:
    if old:
        for sig, h in old.items():
            signal.signal(sig, h)


def run_training(cfg: RunConfig, *, resume: bool = False) -> dict:
    return Trainer(cfg, resume=resume).run()
