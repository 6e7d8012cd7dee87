"""Tokenizers that work offline for the tiny backbones, built in code: a character-level one (every
printable ASCII instruction round-trips) and a word-level one (the words of tabletop instructions are one
token each, like a pretrained subword vocabulary makes them; any other word is spelled in characters);
`bins` dedicated action tokens take the last ids of both. Or the tokenizer of a local language-model
checkpoint."""
from __future__ import annotations

from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>")
PRINTABLE = [chr(code) for code in range(33, 127)]
# words of manipulation instructions (LIBERO, CALVIN, Language-Table and our LangTabletop): verbs, objects,
# colours, directions and relations, function words
MANIPULATION_WORDS = """
a above across after ahead along and another away back backward backwards basket before behind below beside
between black block blocks blue bottle bottom bowl box button cabinet can caddy center close closer cup cube
cubes door down drawer drop edge far farther first forward from front gently go grasp green gripper hand
handle hold in inside into it its keep knob lamp left leave lever lid lift lifting light lower marker
microwave middle move mug near next nudge object of off on one onto open orange other out over pan pick
pink place plate pot pull purple push put rack raise reach red release right robot robot's rotate sphere
ball shelf side slide slightly stack stove switch table take the them then this to toggle top touch toward
towards turn twice under until up upward white with without yellow
""".split()


def action_token_names(action_tokens: int) -> list[str]:
    return [f"<a{i}>" for i in range(action_tokens)]


def fast_tokenizer(model: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=model, pad_token="<pad>", unk_token="<unk>",
                                   bos_token="<bos>", eos_token="<eos>")


def char_tokenizer(action_tokens: int) -> PreTrainedTokenizerFast:
    """One token per printable ASCII character, then `action_tokens` tokens <a0> ... at the end."""
    names = [*SPECIALS, " ", *PRINTABLE, *action_token_names(action_tokens)]
    model = Tokenizer(models.WordLevel({tok: i for i, tok in enumerate(names)}, unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    model.decoder = decoders.Fuse()
    return fast_tokenizer(model)


def word_tokenizer(action_tokens: int) -> PreTrainedTokenizerFast:
    """Lower-cased words and punctuation: each of MANIPULATION_WORDS is one token, any other word its
    characters (WordPiece pieces, so nothing becomes <unk>); then the action tokens at the end."""
    pieces = [*PRINTABLE, *(f"##{c}" for c in PRINTABLE)]
    names = list(dict.fromkeys([*SPECIALS, *MANIPULATION_WORDS, *pieces]))
    names += action_token_names(action_tokens)
    model = Tokenizer(models.WordPiece({tok: i for i, tok in enumerate(names)}, unk_token="<unk>"))
    model.normalizer = normalizers.Lowercase()
    model.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                   pre_tokenizers.Split(Regex(r"\w+(?:'\w+)?|[^\w\s]"), "isolated")])
    model.decoder = decoders.WordPiece()
    return fast_tokenizer(model)


TOKENIZERS = {"char": char_tokenizer, "word": word_tokenizer}


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """A tokenizer saved in a local directory, with a pad token (the eos or unk token if it has none)."""
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return tokenizer
