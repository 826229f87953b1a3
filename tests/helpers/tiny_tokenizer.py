"""A tiny byte-level BPE tokenizer trained on the fly, for fast offline tests.

Only ``tokenizers`` and ``transformers`` are used, so any test module can import this without pulling in the
package under test. Training takes a few milliseconds.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)

# A small hand-written English corpus covering the prompt templates, news/summary vocabulary, restaurant (E2E)
# vocabulary and the built-in weather task, so common words become single tokens.
CORPUS: tuple[str, ...] = (
    "Summarize the article. Article: the city council met on Monday to discuss the new budget. Summary:",
    "Summarize the article in one sentence. Article: a local team won the final after a long season. Summary:",
    "The government said more people than ever were getting help with housing problems this year.",
    "Officials announced that the new bridge will open next spring, two years later than planned.",
    "The report found that prices rose sharply in the first half of the year, hitting families hardest.",
    "Police said a man had been arrested after the incident and that an investigation was under way.",
    "Scientists have discovered a new species of frog in the rain forest, according to a study published today.",
    "The company reported strong sales and said it would hire hundreds of new workers across the country.",
    "Voters will go to the polls next week in an election that many expect to be close.",
    "The museum, which opened in 1990, attracts thousands of visitors every summer.",
    "Describe the restaurant in one sentence. Attributes: name[The Eagle], eatType[coffee shop] Sentence:",
    "The Eagle is a cheap coffee shop near Burger King with a customer rating of 5 out of 5.",
    "Giraffe is a moderately priced, child friendly pub in the riverside area that serves French food.",
    "If you are looking for a family friendly restaurant in the city centre, try The Wrestlers.",
    "Near the river, there is an Italian restaurant called Zizzi with a low customer rating and high prices.",
    "The Cricketers serves English food at average prices and is not family friendly.",
    "Describe the weather in one sentence. Forecast: city[Oslo], day[Monday], condition[rainy], high[12] Sentence:",
    "Monday in Oslo will be rainy, with a high of 12 and a low of 4 degrees. Expect strong winds.",
    "Expect sunshine in Lisbon on Tuesday. There will be temperatures between 15 and 24 degrees.",
    "The forecast for Cairo on Wednesday is sunny with a light breeze and a 10 percent chance of rain.",
    "Denver can look forward to a snowy Thursday with temperatures from -8 up to 2 degrees.",
    "On Friday, the weather in Dublin will be cloudy, and there will be moderate winds and fog.",
    "Saturday and Sunday will be partly cloudy, with thunderstorms likely in the evening.",
    "She walked to the market, bought bread, cheese and apples, and then went home to cook dinner.",
    "It was the best of times, it was the worst of times, it was the age of wisdom and of foolishness.",
    "Once upon a time there lived a king who had three daughters, and the youngest was the most beautiful.",
    "The quick brown fox jumps over the lazy dog while the children laugh and play in the garden.",
    "Numbers like 0 1 2 3 4 5 6 7 8 9 10 20 50 100 and 2015 appear often in news stories.",
)


def build_tiny_tokenizer(
    tmp_dir: str | Path | None = None,
    with_pad: bool = True,
    add_bos: bool = False,
    vocab_size: int = 640,
) -> PreTrainedTokenizerFast:
    """Train a tiny byte-level BPE tokenizer (GPT-2 style, so any text round-trips without unknown tokens).

    Args:
        tmp_dir: If given, the tokenizer is also saved there with ``save_pretrained`` so tests can pass the
            directory as a tokenizer name/path.
        with_pad: Set ``<pad>`` as the pad token. With ``False`` the tokenizer has no pad token (the ``<pad>``
            entry stays in the vocabulary but is not registered), to test the eos-as-pad fallback.
        add_bos: Prepend ``<s>`` when encoding with ``add_special_tokens=True`` (Llama style); GPT-2 style otherwise.
        vocab_size: Target vocabulary size (256 byte symbols + 4 special tokens + merges).

    Returns:
        A ``PreTrainedTokenizerFast`` with ``<s>``/``</s>``/``<unk>`` (and optionally ``<pad>``) special tokens;
        ids are ``<pad>``=0, ``<s>``=1, ``</s>``=2, ``<unk>``=3.
    """
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    if add_bos:
        bos_id = tokenizer.token_to_id(BOS)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    kwargs = {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK}
    if with_pad:
        kwargs["pad_token"] = PAD
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **kwargs)
    if tmp_dir is not None:
        fast.save_pretrained(str(tmp_dir))
    return fast
