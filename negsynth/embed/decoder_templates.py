"""The decoder embedders' input templates: a template named in :mod:`negsynth.prompts.embedding`
or written out, checked for its slots, and filled with the text and instruction, with the
character spans of each copy of the text (what :class:`~negsynth.embed.decoder.DecoderEmbedder`
locates among the tokens to pool). Pure string functions, unit-tested on their own."""

from __future__ import annotations

import re

from negsynth.prompts.embedding import ECHO_TEMPLATES, PROMPTEOL_TEMPLATES

_ANY_SLOT = re.compile(r"\{text\}|\{instruction\}")


def resolve_prompteol_template(template: str, method: str, model_type: str | None = None) -> str:
    """A PromptEOL template by name (:data:`PROMPTEOL_TEMPLATES`) or literal text with one ``{text}``.

    ``"auto"``: ``prompteol`` (original wording) for ``method="prompteol"``; under EmbedFilter the
    seed's prompt for the backbone, ``mistral`` when ``model_type == "mistral"`` else ``summarize``.
    """
    if template == "auto":
        if method == "embedfilter":
            template = "mistral" if model_type == "mistral" else "summarize"
        else:
            template = "prompteol"
    out = PROMPTEOL_TEMPLATES.get(template, template)
    if out.count("{text}") != 1 or "{instruction}" in out:
        raise ValueError(f"prompteol_template needs exactly one {{text}} slot (or a name: {sorted(PROMPTEOL_TEMPLATES)}), got {template!r}")
    return out


def resolve_echo_templates(template: str, doc_template: str | None = None) -> tuple[str, str]:
    """(query, document) echo templates from names (:data:`ECHO_TEMPLATES`) or literal text.

    ``template`` names a pair or is literal query text; ``doc_template=None`` takes the document
    half of the named pair, or the query text without its ``{instruction}`` line for literal text.
    Each needs two ``{text}`` slots; only the query one may hold an ``{instruction}`` slot.
    """
    if template in ECHO_TEMPLATES:
        query, doc = ECHO_TEMPLATES[template]
    else:
        query, doc = template, drop_instruction(template)
    if doc_template is not None:
        doc = ECHO_TEMPLATES[doc_template][1] if doc_template in ECHO_TEMPLATES else doc_template
    for name, t, max_ins in (("echo_template", query, 1), ("echo_doc_template", doc, 0)):
        if t.count("{text}") != 2 or t.count("{instruction}") > max_ins:
            raise ValueError(
                f"{name} needs two {{text}} slots"
                + (" and at most one {instruction}" if max_ins else " and no {instruction}")
                + f" (or a name: {sorted(ECHO_TEMPLATES)}), got {t!r}"
            )
    return query, doc


def drop_instruction(template: str) -> str:
    """The template without the line that holds ``{instruction}`` (used when a query has none):
    ``'Instruct:{instruction},\\nQuery:{text}…'`` -> ``'Query:{text}…'``. Unchanged without the slot."""
    i = template.find("{instruction}")
    if i < 0:
        return template
    lo = template.rfind("\n", 0, i) + 1
    hi = template.find("\n", i)
    return template[:lo] + ("" if hi < 0 else template[hi + 1 :])


def render(template: str, text: str, instruction: str | None = None) -> tuple[str, list[tuple[int, int]]]:
    """Fill a template -> (string, character spans of each ``{text}`` slot). ``{instruction}`` is
    filled with ``instruction`` (its line is dropped when that is empty)."""
    if not instruction:
        template = drop_instruction(template)
    s, spans, pos = "", [], 0
    for m in _ANY_SLOT.finditer(template):
        s += template[pos : m.start()]
        if m.group() == "{text}":
            spans.append((len(s), len(s) + len(text)))
            s += text
        else:
            s += instruction.strip()
        pos = m.end()
    return s + template[pos:], spans
