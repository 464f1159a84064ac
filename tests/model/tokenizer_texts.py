"""Texts every tokenizer is checked on against its reference: code, whitespace runs, numbers, scripts, emoji,
combining marks, control characters and punctuation runs."""

TEXTS = [
    "",
    "Hello world!",
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { x[i] = y[i] * 2.5f; }  // C\n\tint *p = &x;",
    "1234567890 3.14159 -42 1e-9 0x1F 1,000,000 ½ ² ٣٤٥ 一二三 Ⅻ",
    "   leading spaces, trailing spaces   ",
    "tabs\t\tand\n\nnewlines\r\n\r\nand   \n   mixed \t \n",
    "\n", " ", "  ", "\t", "a\u00a0b\u2003c\u3000d",
    "Café, naïve, façade, Ångström, São Paulo, Dvořák, Łódź",
    "e\u0301 combining, n\u0303, Z\u0335\u0308",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "emoji 😀🎉👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️",
    "I'm, you're, he's, we've, they'll, I'd, can't, DON'T, it'S, 'twas, rock'n'roll, ''quoted''",
    "Ünïcödé 'Ünïcödé' ß ẞ ﬁ ﬀ",
    "math: ∀x ∈ ℝ, x² ≥ 0 → √x ∈ ℝ⁺; ∑_{i=1}^{n} i = n(n+1)/2",
    "control \x00\x01\x04\x06\x13\x14\x16\x1d\x1c\x1f\x7f chars",
    "!!!??? ... --- *** ### @@@ $$$ %%% ^^^ &&& ((())) [[]] {{}}",
    "https://example.com/path?query=1&b=2#frag user@example.org",
    "<div class=\"x\">\n  <p>Text &amp; more</p>\n</div>",
]
