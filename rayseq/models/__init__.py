"""Models (math layer: torch only)."""

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
