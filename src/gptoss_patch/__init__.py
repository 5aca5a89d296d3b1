"""gptoss-patch: version-keyed, verifiable, reversible gpt-oss patches for stock vLLM."""

__version__ = "0.1.0"
