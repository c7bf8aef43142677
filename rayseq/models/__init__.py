"""Models (math layer: torch only): the policies behind one protocol (:mod:`.protocol`: teacher-forced log-probs,
sampling with log-probs, per-step state) — the GRU/LSTM seq2seq (:mod:`.generator`), the built-in Transformer
(:mod:`.transformer`), a local Hugging Face causal LM (:mod:`.hf`) —, the value baseline, the critic, the CNN
discriminator, the inverse-CDF sampler (:mod:`.sampling`) and a run's models from its config (:mod:`.factory`)."""

from rayseq.models.baseline import ValueBaseline
from rayseq.models.critic import Critic
from rayseq.models.discriminator import CNNDiscriminator, build_discriminator
from rayseq.models.factory import make_discriminator, make_generator, reference_policy
from rayseq.models.generator import GeneratorOutput, SampleOutput, Seq2SeqGRU
from rayseq.models.transformer import TransformerGenerator

__all__ = [
    "CNNDiscriminator", "Critic", "GeneratorOutput", "SampleOutput", "Seq2SeqGRU", "TransformerGenerator",
    "ValueBaseline",
    "build_discriminator", "make_discriminator", "make_generator", "reference_policy",
]
