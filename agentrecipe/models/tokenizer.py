"""A small byte-level BPE tokenizer trained offline on the environments' text.

The tiny model has no pretrained vocabulary, so we train one on what the agent
will read and write: observations, objectives and admissible commands of the
train games. Byte-level BPE round-trips any text exactly.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

PAD, END = "<|pad|>", "<|end|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD, END, *ROLE_TOKENS)

# One turn = <|role|>content<|end|>. The policy generates content + <|end|> after <|assistant|>.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE of `vocab_size` tokens (special tokens included) on `texts`."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=END,
        additional_special_tokens=list(ROLE_TOKENS),
    )
    fast.chat_template = TINY_CHAT_TEMPLATE
    return fast


def load_tokenizer(folder: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer of a model folder, with a pad token (its EOS when it has none).

    One backed by `tokenizers` alone (every tiny model's) loads through that class: AutoTokenizer
    imports the model classes too, about 8 s of a stage that needs only the tokenizer."""
    folder = Path(folder)
    config = folder / "tokenizer_config.json"
    if not config.exists():
        raise FileNotFoundError(f"{folder}: no tokenizer found; run the prepare_model stage first")
    if json.loads(config.read_text()).get("tokenizer_class") == "TokenizersBackend":
        from transformers import TokenizersBackend as tokenizer_class
    else:
        from transformers import AutoTokenizer as tokenizer_class
    tokenizer = tokenizer_class.from_pretrained(folder)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
