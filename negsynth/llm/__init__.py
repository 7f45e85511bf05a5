"""OpenAI-protocol LLM access: client, request cache, JSON extraction. Knows nothing of MGH."""
