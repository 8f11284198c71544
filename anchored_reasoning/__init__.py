"""anchored-reasoning: anchor-then-generate reasoning for AR and diffusion language models."""
from anchored_reasoning.errors import AnchoredReasoningError, BackendError, ConfigError, DataError, ResumeError
from anchored_reasoning.types import Completion, Example, Grade, Prompt, SamplingSpec

__version__ = "0.1.0"

__all__ = [
    "AnchoredReasoningError",
    "BackendError",
    "Completion",
    "ConfigError",
    "DataError",
    "Example",
    "Grade",
    "Prompt",
    "ResumeError",
    "SamplingSpec",
    "__version__",
]
