"""The prompts of the zero-shot decoder embedders (PromptEOL, Echo, EmbedFilter), by name
(:mod:`negsynth.embed.decoder` applies them; SEED_SPEC §3, §6)."""

#: PromptEOL templates (one ``{text}`` slot; the final token is pooled). ``prompteol``: Jiang et al.
#: 2023; ``summarize``: EmbedFilter's Qwen/Llama prompt (seed 004 App. A), the default of
#: ``method="embedfilter"``; ``mistral``: EmbedFilter's Mistral prompt, picked by ``"auto"``.
PROMPTEOL_TEMPLATES = {
    "prompteol": 'This sentence: "{text}" means in one word:"',
    "summarize": 'Summarize the sentence: "{text}" in one word:"',
    "mistral": 'This sentence: "{text}" means [MASK]',
}

#: Echo templates: (query, document), two ``{text}`` slots each (a query may hold ``{instruction}``);
#: the *second* ``{text}`` plus EOS is pooled. ``echo``: the echo paper's templates (seed 003 README,
#: "Usage") with its pooling marks removed; the tokenizer adds its own BOS. ``rewrite``: the zero-shot
#: wording of EmbedFilter's ECHO runs (seed 004 App. A), the same for queries and documents.
ECHO_TEMPLATES = {
    "echo": ("Instruct:{instruction},\nQuery:{text}\nQuery again:{text}", "Document:{text}\nDocument again:{text}"),
    "rewrite": ("Rewrite the following paragraph: {text}. The rewritten paragraph: {text}",) * 2,
}

#: BeLLM's prompt (seed 001; SEED_SPEC §5): its last token's hidden state is the embedding.
BELLM_TEMPLATE = 'The representative word for sentence {text} is:"'
