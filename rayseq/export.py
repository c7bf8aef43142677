"""python -m rayseq.export — a trained policy as a folder other tools load.

Run book
  python -m rayseq.export runs/<run> --out exported/           # the run's latest checkpoint
  python -m rayseq.export runs/<run>/checkpoints/ckpt_00000200.pt --out exported/ --overwrite
  python -m rayseq.export runs/<lora run> --out adapters/ --lora adapters   # LoRA: the adapters alone (peft)

``model.arch=hf``: a Hugging Face folder — ``save_pretrained`` of the trained causal LM (LoRA adapters merged into
the weights by default; ``--lora adapters`` saves only the adapters, which ``peft.PeftModel.from_pretrained`` puts
on ``model.path``'s base model) and of its tokenizer. ``AutoModelForCausalLM.from_pretrained(DIR)``
loads it with the trained policy's logits, and ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)``
then ``generate`` reads the prompt as the policy did: a policy trained on conversations keeps the tokenizer's chat
template (its generation prompt ends the prompt); a policy trained on text prompts read ``prompt <sep> reply`` (the
separator being the tokenizer's BOS, its EOS when it has none; ``rayseq_export.json`` names it), and its exported
chat template writes the last message's text and the separator.

The built-in GRU / Transformer: ``model.safetensors`` (the generator's weights), ``config.json`` (rayseq's model
config, the task spec and what produced the weights: ``format`` rayseq-export-v1) and ``vocab.json`` (the
vocabulary and tokenizer settings); ``python -m rayseq.serve --checkpoint DIR`` serves it.

A reward model (``algo.name=reward_model``) on an HF policy: a folder ``AutoModelForSequenceClassification`` loads
(``num_labels=1``), which scores ``prompt reply`` as it was trained (TRL's ``GRPOTrainer(reward_funcs=DIR)`` takes
it); on a built-in model the run itself is the reward (``reward.fn=reward_model``, kwargs ``path=RUN``).

The output folder is written into a temporary folder beside it and renamed into place; a non-empty one is an
error without ``--overwrite``. Exit code 2 and one line on a bad checkpoint or output.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch

from rayseq.checkpoint import EXPORT_FORMAT, check_base_model, load_checkpoint, resolve_checkpoint
from rayseq.config import ModelConfig
from rayseq.data.hf_text import separator_chat_template
from rayseq.data.preparation import DataError, write_atomically
from rayseq.models.factory import generator_from_parts
from rayseq.vocab import Vocab


def policy_of(ck: dict):
    """The generator of a loaded checkpoint with its trained weights, and its vocabulary."""
    task = ck["task"]
    if "hf_tokenizer" in task["vocab"]:
        from rayseq.data.hf_text import HFVocab

        vocab = HFVocab.from_spec(task["vocab"])
    else:
        vocab = Vocab.from_spec(task["vocab"])
    generator = generator_from_parts(ModelConfig(**ck["config"]["model"]), vocab, vocab.specials,
                                     conditional=task.get("conditional", True),
                                     banned_ids=tuple(task.get("banned_ids", ())))
    generator.load_state_dict(ck["learner"]["generator"])
    return generator.eval(), vocab


def export_hf(generator, vocab, out: Path, lora: str = "merged") -> None:
    """A Hugging Face folder of an :class:`rayseq.models.hf.HFCausalLM` (module docstring) written into ``out``."""
    model = generator.model
    if generator.lora and lora == "merged":
        model = copy.deepcopy(model).merge_and_unload()  # W + (alpha / r) B A, the adapters gone
    model.save_pretrained(out)
    tokenizer = copy.copy(vocab.tokenizer)
    meta = {"format": "rayseq-hf-export-v1", "lora": lora if generator.lora else None, "base_model": generator.path}
    if vocab.separator:  # the boundary it was trained with, written where the standard call reads it
        sep = vocab.specials.bos
        sep_token = vocab.tokenizer.convert_ids_to_tokens(sep)
        tokenizer.chat_template = separator_chat_template(sep_token)
        meta.update(separator_token_id=sep, separator_token=sep_token,
                    note="the policy reads the prompt's ids, then the separator, then the reply; the chat template "
                         "writes the separator as the generation prompt")
    else:
        meta.update(separator_token_id=None, separator_token=None,
                    note="the policy reads the chat template's rendering (generation prompt included), then the reply")
    tokenizer.save_pretrained(out)
    (out / "rayseq_export.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def export_builtin(generator, ck: dict, out: Path) -> None:
    """The built-in generator's weights, config and vocabulary (module docstring) written into ``out``."""
    from safetensors.torch import save_file

    weights = {k: v.detach().cpu().contiguous().clone() for k, v in generator.state_dict().items()}
    save_file(weights, str(out / "model.safetensors"))
    task = {k: v for k, v in ck["task"].items() if k != "vocab"}
    driver = ck["driver"]
    config = {"format": EXPORT_FORMAT, "model": ck["config"]["model"], "algo": ck["config"]["algo"]["name"],
              "pretrain_iters": int(ck["config"]["train"]["pretrain_iters"]), "task": task,
              "driver": {"stage": driver["stage"], "stage_iter": int(driver.get("stage_iter", 0)),
                         "iteration": int(driver["iteration"])}}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (out / "vocab.json").write_text(json.dumps(ck["task"]["vocab"], indent=2) + "\n", encoding="utf-8")


def is_reward_model(ck: dict) -> bool:
    """Whether a loaded checkpoint holds a reward model (``algo.name=reward_model``)."""
    return ck["config"]["algo"]["name"] == "reward_model"


def reward_model_of(ck: dict):
    """(generator, head, vocab) of a reward model's checkpoint loaded with its training state: r(x, y) =
    head(state at y's <eos>) (:mod:`rayseq.algos.reward_model`)."""
    from rayseq.models.reward_head import trained_head

    generator, vocab = policy_of(ck)
    return generator, trained_head(ck, generator.state_dim), vocab


def export_hf_reward_model(generator, head, vocab, out: Path) -> None:
    """A reward model on an HF policy as a folder ``AutoModelForSequenceClassification.from_pretrained`` loads
    (``num_labels=1``): the policy's backbone (LoRA adapters merged), the head as the classifier's ``score`` layer
    (both read the last hidden layer at the last token, without a bias), and the tokenizer. It scores the ids of the
    prompt followed by those of the reply (a conversation: the chat template's rendering of the prompt with the
    assistant's turn opened, then the reply), as it was trained."""
    from transformers import AutoModelForSequenceClassification

    lm = generator.model
    if generator.lora:
        lm = copy.deepcopy(lm).merge_and_unload()
    config = copy.deepcopy(lm.config)
    config.num_labels, config.id2label, config.label2id = 1, {0: "reward"}, {"reward": 0}
    config.pad_token_id = vocab.specials.pad
    config.architectures = None
    model = AutoModelForSequenceClassification.from_config(config)
    prefix = model.base_model_prefix
    getattr(model, prefix).load_state_dict(getattr(lm, prefix).state_dict())
    score = getattr(model, "score", None)
    if not isinstance(score, torch.nn.Linear) or score.bias is not None or score.weight.shape != head.weight.shape:
        raise ValueError(f"{type(model).__name__}: no bias-free score layer of shape {tuple(head.weight.shape)} to "
                         "hold the reward head")
    score.weight.data.copy_(head.weight.data)
    model.save_pretrained(out)
    vocab.tokenizer.save_pretrained(out)
    meta = {"format": "rayseq-hf-reward-model-v1", "lora": "merged" if generator.lora else None,
            "base_model": generator.path,
            "note": "the reward of (prompt, reply) is the logit of the ids of the prompt followed by those of the "
                    "reply, read at the reply's last token; a conversational prompt is the chat template's rendering "
                    "with the assistant's turn opened"}
    (out / "rayseq_export.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def export(checkpoint: str, out: str, *, lora: str = "merged", overwrite: bool = False) -> Path:
    """Export ``checkpoint`` (a run directory, a checkpoint file or a URI) into the folder ``out``; returns it. A
    reward model on an HF policy becomes a sequence-classification folder (:func:`export_hf_reward_model`)."""
    ck = load_checkpoint(checkpoint, training_state=False)  # the weights, not the optimizers
    check_base_model(ck, checkpoint)
    out = Path(out).expanduser()
    hf = "hf_tokenizer" in ck["task"]["vocab"]
    if is_reward_model(ck):
        if not hf:
            raise ValueError(f"{checkpoint}: a reward model on a built-in model has no transformers form; use the "
                             "run itself as a reward (reward.fn=reward_model, kwargs path=RUN)")
        if lora != "merged":
            raise ValueError("--lora adapters: a reward model is exported whole (its head is not an adapter)")
        generator, head, vocab = reward_model_of(load_checkpoint(checkpoint))

        def write(tmp: Path) -> None:
            with torch.no_grad():
                export_hf_reward_model(generator, head, vocab, tmp)

        write_atomically(out, overwrite, write)
        return out
    generator, vocab = policy_of(ck)

    def write(tmp: Path) -> None:
        with torch.no_grad():
            (export_hf(generator, vocab, tmp, lora) if hf else export_builtin(generator, ck, tmp))

    write_atomically(out, overwrite, write)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rayseq.export", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", metavar="RUN", help="a run directory, a checkpoint file, or a URI")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created atomically)")
    p.add_argument("--lora", choices=("merged", "adapters"), default="merged",
                   help="model.lora_r > 0: merge the adapters into the weights, or save the adapters alone")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")
    args = p.parse_args(argv)
    try:
        where = resolve_checkpoint(args.checkpoint)
        out = export(args.checkpoint, args.out, lora=args.lora, overwrite=args.overwrite)
    except (FileNotFoundError, DataError, ValueError, KeyError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{where} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
