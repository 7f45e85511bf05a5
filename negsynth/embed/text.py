"""How a trained model expects its texts: a template around every text (and a clean-up before it).

BeLLM (``train.recipe = "bellm"``) embeds ``The representative word for sentence {text} is:"``
and pools its last token, so the texts must be wrapped the same way at training and at
evaluation. sentence-transformers' ``prompts`` can only *prefix* a text, so the trainer writes
the format to ``negsynth_text.json`` in the saved model folder and negsynth's loader applies it
(:class:`negsynth.embed.st.SentenceTransformerEmbedder`); plain ``SentenceTransformer(path)``
users call :func:`load_text_format` and wrap the texts themselves::

    fmt = load_text_format(path)
    model.encode([fmt.apply(t) for t in texts])
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

FILE = "negsynth_text.json"
PREPROCESS = ("none", "bellm")


def bellm_clean(text: str) -> str:
    """BeLLM's STS preprocessing (SEED_SPEC §5): a final ``?`` becomes ``.``, and a text without
    final punctuation gets one.

    >>> bellm_clean("Is it raining?"), bellm_clean("a dog runs"), bellm_clean("Done!")
    ('Is it raining.', 'a dog runs.', 'Done!')
    """
    t = text.strip()
    if t.endswith("?"):
        return t[:-1] + "."
    if t and t[-1] not in ".!;:\"'":
        return t + "."
    return t


@dataclass(frozen=True)
class TextFormat:
    """``template`` (one ``{text}`` slot) applied after ``preprocess`` (``none`` or ``bellm``)."""

    template: str = "{text}"
    preprocess: str = "none"

    def __post_init__(self):
        if self.template.count("{text}") != 1:
            raise ValueError(f"text_template {self.template!r}: needs exactly one {{text}} slot")
        if self.preprocess not in PREPROCESS:
            raise ValueError(f"text_preprocess {self.preprocess!r}: choose from {', '.join(PREPROCESS)}")

    @property
    def is_identity(self) -> bool:
        return self.template == "{text}" and self.preprocess == "none"

    def apply(self, text: str) -> str:
        t = bellm_clean(text) if self.preprocess == "bellm" else text
        return self.template.replace("{text}", t)

    def save(self, folder: str | Path) -> None:
        (Path(folder) / FILE).write_text(json.dumps(asdict(self), indent=1) + "\n", encoding="utf-8")


def load_text_format(folder: str | Path) -> TextFormat | None:
    """The format saved beside a trained model, or None when it embeds texts as they are."""
    p = Path(folder) / FILE
    if not p.is_file():
        return None
    d = json.loads(p.read_text(encoding="utf-8"))
    return TextFormat(template=d.get("template", "{text}"), preprocess=d.get("preprocess", "none"))
