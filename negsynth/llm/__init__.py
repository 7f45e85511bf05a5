"""OpenAI-protocol LLM access: client, request cache, JSON extraction. Knows nothing of MGH."""

from negsynth.llm.cache import RequestCache
from negsynth.llm.client import LLMClient, LLMResult, resolve_api_key
from negsynth.llm.errors import BudgetStop, LLMFatalError, TransportError, ValidationFailure
from negsynth.llm.parsing import ParseError, extract_json
from negsynth.llm.session import CacheOpenError, open_client

__all__ = [
    "BudgetStop",
    "CacheOpenError",
    "LLMClient",
    "LLMFatalError",
    "LLMResult",
    "ParseError",
    "RequestCache",
    "TransportError",
    "ValidationFailure",
    "extract_json",
    "open_client",
    "resolve_api_key",
]
