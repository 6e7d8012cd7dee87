"""Tokenizers that work offline: a character-level one built in code for the tiny backbones (every
printable ASCII instruction round-trips; `bins` dedicated action tokens take the last ids), or the
tokenizer of a local language-model checkpoint."""
from __future__ import annotations

from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>")


def char_tokenizer(action_tokens: int) -> PreTrainedTokenizerFast:
    """One token per printable ASCII character, then `action_tokens` tokens <a0> ... at the end."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for code in range(32, 127):
        vocab[chr(code)] = len(vocab)
    for i in range(action_tokens):
        vocab[f"<a{i}>"] = len(vocab)
    model = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    model.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=model, pad_token="<pad>", unk_token="<unk>",
                                   bos_token="<bos>", eos_token="<eos>")


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """A tokenizer saved in a local directory, with a pad token (the eos or unk token if it has none)."""
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return tokenizer
