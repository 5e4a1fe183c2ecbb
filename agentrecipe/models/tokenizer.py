"""A small byte-level BPE tokenizer trained offline on the environments' text.

The tiny model has no pretrained vocabulary, so we train one on what the agent
will read and write: observations, objectives and admissible commands of the
train games. Byte-level BPE round-trips any text exactly.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

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
