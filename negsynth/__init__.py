"""negsynth: LLM-driven multi-granularity hard-negative synthesis (MGH) for text-embedding training."""

__version__ = "0.1.0"
