"""Models (math layer: torch only)."""

from rayseq.models.baseline import ValueBaseline
from rayseq.models.generator import GeneratorOutput, SampleOutput, Seq2SeqGRU

__all__ = ["GeneratorOutput", "SampleOutput", "Seq2SeqGRU", "ValueBaseline"]
