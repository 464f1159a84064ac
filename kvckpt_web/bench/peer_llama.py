"""llama.cpp (llama-cpp-python 0.3.36) as the peer of :mod:`kvckpt_web.bench.peers`: a worker that runs in its own venv
and times what the driver asks, one JSON line in, one JSON line out (each answer's ``seconds`` timed here,
in-process; a prefill's or decode's ``cpu`` is the CPU time the process used meanwhile, all its threads).

Run by its path as ``python kvckpt_web/bench/peer_llama.py MODEL.gguf --threads 2 --ctx 2048`` with
``OMP_WAIT_POLICY=passive`` (the driver sets it: llama.cpp's busy-waiting threads collapse on a shared 2-core
machine). It imports nothing of kvckpt_web. Requests (``op``): ``prefill`` (tokens: a fresh context evaluated, then
the greedy next token), ``decode`` (token, steps: greedy steps after the current context), ``save`` (path: the
current context's state to a file with ``llama_state_save_file`` and kept in memory with ``Llama.save_state``),
``load_file`` (path: ``llama_state_load_file``), ``load_state`` (``Llama.load_state`` of the kept state),
``set_data`` (``llama_state_set_data`` of the kept state's bytes), ``quit``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import resource
import sys
import time

import numpy as np

import llama_cpp
from llama_cpp import llama_cpp as lib


def open_model(path: str, threads: int, n_ctx: int) -> llama_cpp.Llama:
    """The model, on ``threads`` threads, without the extra buffer types (weight repacking): on this VM the
    native build enables AMX, whose tile setup segfaults; the ordinary AVX-512 path runs."""
    default = lib.llama_model_default_params

    def params() -> lib.llama_model_params:
        p = default()
        p.use_extra_bufts = False
        return p

    lib.llama_model_default_params = params
    return llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)


def cpu_seconds() -> float:
    """CPU time this process used so far (all its threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Peer:
    def __init__(self, llm: llama_cpp.Llama) -> None:
        self.llm = llm
        self.ctx = llm._ctx.ctx
        self.vocab = llm.n_vocab()
        self.state: llama_cpp.LlamaState | None = None

    def argmax(self) -> int:
        logits = np.ctypeslib.as_array(lib.llama_get_logits_ith(self.ctx, -1), shape=(self.vocab,))
        return int(np.argmax(logits))

    def prefill(self, tokens: list[int]) -> dict:
        self.llm.reset()
        start, used = time.perf_counter(), cpu_seconds()
        self.llm.eval(tokens)
        token = self.argmax()
        return {"seconds": time.perf_counter() - start, "cpu": cpu_seconds() - used, "token": token}

    def decode(self, token: int, steps: int) -> dict:
        start, used = time.perf_counter(), cpu_seconds()
        out = []
        for _ in range(steps):
            self.llm.eval([token])
            token = self.argmax()
            out.append(token)
        return {"seconds": time.perf_counter() - start, "cpu": cpu_seconds() - used, "tokens": out}

    def save(self, path: str) -> dict:
        n = self.llm.n_tokens
        tokens = (lib.llama_token * n)(*self.llm.input_ids[:n].tolist())
        if not lib.llama_state_save_file(self.ctx, path.encode(), tokens, n):
            raise RuntimeError(f"llama_state_save_file({path!r}) failed")
        self.state = self.llm.save_state()
        return {"tokens": n, "state_bytes": self.state.llama_state_size}

    def load_file(self, path: str) -> dict:
        capacity = self.llm.n_ctx()
        tokens = (lib.llama_token * capacity)()
        count = ctypes.c_size_t(0)
        start = time.perf_counter()
        if not lib.llama_state_load_file(self.ctx, path.encode(), tokens, capacity, ctypes.byref(count)):
            raise RuntimeError(f"llama_state_load_file({path!r}) failed")
        return {"seconds": time.perf_counter() - start, "tokens": count.value}

    def load_state(self) -> dict:
        start = time.perf_counter()
        self.llm.load_state(self.state)
        return {"seconds": time.perf_counter() - start}

    def set_data(self) -> dict:
        data = (ctypes.c_uint8 * self.state.llama_state_size).from_buffer_copy(self.state.llama_state)
        start = time.perf_counter()
        if lib.llama_state_set_data(self.ctx, data, self.state.llama_state_size) != self.state.llama_state_size:
            raise RuntimeError("llama_state_set_data failed")
        return {"seconds": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=2048)
    args = parser.parse_args()
    peer = Peer(open_model(args.model, args.threads, args.ctx))
    print(json.dumps({"ready": llama_cpp.__version__, "system": lib.llama_print_system_info().decode()}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        if op == "quit":
            break
        print(json.dumps(getattr(peer, op)(**request)), flush=True)


if __name__ == "__main__":
    main()
