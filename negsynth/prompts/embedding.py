"""The prompts of the zero-shot decoder embedders (PromptEOL, Echo, EmbedFilter), by name.

Data, not code: :mod:`negsynth.embed.decoder` applies them and the config validates names
against them (SEED_SPEC §3, §6).
"""

#: PromptEOL templates by name (one ``{text}`` slot; the final token is pooled).
#: ``prompteol``: the original PromptEOL wording (Jiang et al. 2023), the default of ``method="prompteol"``.
#: ``summarize``: EmbedFilter's Qwen/Llama prompt (seed 004 App. A; SEED_SPEC §6 "Templates"), the default
#: base prompt of ``method="embedfilter"``. ``mistral``: EmbedFilter's Mistral prompt (same table), picked
#: by ``"auto"`` for a ``model_type == "mistral"`` model under EmbedFilter.
PROMPTEOL_TEMPLATES = {
    "prompteol": 'This sentence: "{text}" means in one word:"',
    "summarize": 'Summarize the sentence: "{text}" in one word:"',
    "mistral": 'This sentence: "{text}" means [MASK]',
}

#: Echo templates by name: (query template, document template), two ``{text}`` slots each; a query
#: template may hold one ``{instruction}`` slot. The *second* ``{text}`` plus EOS is pooled.
#: ``echo``: the echo paper's templates (seed 003 README, "Usage": ``'query':
#: '<s>Instruct:{!%%prompt%%,}\nQuery:{!%%text%%}\nQuery again:{%%text%%}{</s>}'`` and ``'document':
#: '<s>Document:{!%%text%%}\nDocument again:{%%text%%}{</s>}'``; SEED_SPEC §3 "Templates"). The braces are
#: the echo parser's pooling marks, not text; its pieces are joined with no added spaces, so the query
#: reads ``Instruct:{instruction},\nQuery:{text}\nQuery again:{text}``. ``<s>`` = the tokenizer's own
#: BOS (added when the tokenizer adds one, as for Llama/Mistral; SmolLM2 has none) and ``</s>`` = EOS.
#: ``rewrite``: the zero-shot wording of EmbedFilter's ECHO runs (seed 004 App. A; SEED_SPEC §3
#: "Zero-shot variants"), the same for queries and documents, with no instruction.
ECHO_TEMPLATES = {
    "echo": ("Instruct:{instruction},\nQuery:{text}\nQuery again:{text}", "Document:{text}\nDocument again:{text}"),
    "rewrite": ("Rewrite the following paragraph: {text}. The rewritten paragraph: {text}",) * 2,
}

#: BeLLM's prompt (seed 001; SEED_SPEC §5): the hidden state of its last token (``:"``) is the
#: embedding. Used by ``train.recipe = "bellm"`` for every text at training and evaluation.
BELLM_TEMPLATE = 'The representative word for sentence {text} is:"'
