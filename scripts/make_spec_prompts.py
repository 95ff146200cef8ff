#!/usr/bin/env python3
"""Makes the speculative-decoding prompt sets in tests/data from this repository's own docs.

100 prose paragraphs of 25 to 50 words are taken, evenly spaced, from docs/*.md (the
benchmark and performance pages excluded: their prose is mostly figures). The first 50 become
the edit set (`spec-edit.jsonl`: "repeat this passage with the typos fixed", three typos put in
each passage), the other 50 the summarisation set (`spec-summarise.jsonl`). Everything is
deterministic: the same docs give the same files. The committed files are the ones the test
reads; re-running this script after the docs change makes different sets.

Usage: python3 scripts/make_spec_prompts.py [OUT_DIR]   (default tests/data)
"""

import json
import pathlib
import random
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXCLUDED = {"benchmarks.md", "performance.md"}
PER_SET = 50


def paragraphs(path):
    """The prose paragraphs of a markdown file: no headings, tables, lists, code or quotes."""
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    for block in re.split(r"\n\s*\n", text):
        lines = [line.strip() for line in block.strip().splitlines()]
        if not lines or any(
            line.startswith(("#", "|", "-", "*", ">", "<", "1.", "2.", "3.")) for line in lines
        ):
            continue
        para = " ".join(lines)
        words = para.split()
        if 25 <= len(words) <= 50:
            yield para


def typo(word, rng):
    """One typo in a word of at least five letters: two letters swapped, one dropped or one
    doubled, never the first letter."""
    i = rng.randrange(1, len(word) - 1)
    kind = rng.randrange(3)
    if kind == 0:
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    if kind == 1:
        return word[:i] + word[i + 1 :]
    return word[:i] + word[i] + word[i:]


def with_typos(para, rng, count=3):
    words = para.split(" ")
    candidates = [i for i, w in enumerate(words) if len(w) >= 5 and w.isalpha()]
    for i in sorted(rng.sample(candidates, min(count, len(candidates)))):
        words[i] = typo(words[i], rng)
    return " ".join(words)


def main():
    out = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests/data"
    found = []
    for path in sorted((ROOT / "docs").glob("*.md")):
        if path.name in EXCLUDED:
            continue
        found.extend((path.name, p) for p in paragraphs(path))
    if len(found) < 2 * PER_SET:
        sys.exit(f"only {len(found)} paragraphs found, {2 * PER_SET} needed")
    step = len(found) / (2 * PER_SET)
    chosen = [found[int(i * step)] for i in range(2 * PER_SET)]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "spec-edit.jsonl", "w", encoding="utf-8") as f:
        for i, (source, para) in enumerate(chosen[0::2]):
            rng = random.Random(51_000 + i)
            prompt = (
                "Repeat this passage with the typos fixed. Reply with the corrected passage "
                "only.\n\n" + with_typos(para, rng)
            )
            f.write(json.dumps({"id": f"edit-{i:02}", "source": f"docs/{source}", "prompt": prompt}) + "\n")
    with open(out / "spec-summarise.jsonl", "w", encoding="utf-8") as f:
        for i, (source, para) in enumerate(chosen[1::2]):
            prompt = "Summarise this passage in two sentences.\n\n" + para
            f.write(json.dumps({"id": f"summarise-{i:02}", "source": f"docs/{source}", "prompt": prompt}) + "\n")
    print(f"{len(found)} paragraphs; wrote {PER_SET} edit and {PER_SET} summarisation prompts to {out}")


if __name__ == "__main__":
    main()
