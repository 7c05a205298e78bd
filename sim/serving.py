"""A small serving loop: request pool, ``req_to_token``, KV slot allocator
and a scheduler that changes the batch every step (requests arrive, grow by
one decoded token, finish; some steps are IDLE, some exceed the largest
captured size). Slots are handed out shuffled, so a request's KV is never
contiguous, as in a real pool after churn. With ``draft_slots`` > 0 it also
plays a speculative drafter: every step, each request gets that many fresh
slots right after its sequence (topk branches x S steps, as an EAGLE
drafter allocates them), released at the next step."""

from __future__ import annotations

import random

import torch

from attnmeta.compiler.modes import ForwardMode
from attnmeta.runtime.forward import ForwardBatch


class PoolExhausted(RuntimeError):
    pass


class ServingSim:
    def __init__(self, max_reqs: int, max_context_len: int, num_slots: int, heads: int = 2, head_dim: int = 16,
                 device="cpu", seed: int = 0, idle_prob: float = 0.05, max_batch: int | None = None,
                 draft_slots: int = 0):
        self.rng = random.Random(seed)
        self.L, self.device = max_context_len, torch.device(device)
        self.max_batch = max_batch or max_reqs
        self.idle_prob = idle_prob
        # row 0 and slot 0 are reserved: padded rows read row 0, which stays all zero
        self.req_to_token = torch.zeros(max_reqs + 1, max_context_len, dtype=torch.int32, device=self.device)
        self.free_rows = list(range(max_reqs, 0, -1))
        self.free_slots = list(range(1, num_slots))
        self.rng.shuffle(self.free_slots)
        self.running: dict[int, int] = {}  # row -> seq_len
        self.slots: dict[int, list[int]] = {}
        g = torch.Generator().manual_seed(seed)
        self.k_cache = torch.randn(num_slots, heads, head_dim, generator=g).to(self.device)
        self.v_cache = torch.randn(num_slots, heads, head_dim, generator=g).to(self.device)
        self.qgen = g
        self.target = 1
        self.draft_slots, self.drafts = draft_slots, {}  # row -> this step's draft slots

    def _take(self, n: int) -> list[int]:
        if n > len(self.free_slots):
            raise PoolExhausted(f"KV pool exhausted: need {n} slots, {len(self.free_slots)} free")
        out, self.free_slots = self.free_slots[-n:], self.free_slots[:-n]
        return out

    def _finish(self, row: int) -> None:
        self.free_slots += self.slots.pop(row)
        del self.running[row]
        self.req_to_token[row].zero_()
        self.free_rows.append(row)

    def _arrive(self) -> None:
        if not self.free_rows:
            return
        n = self.rng.randint(1, max(1, min(self.L // 2, self.L - self.draft_slots - 1)))  # room to decode + draft
        if n + 64 > len(self.free_slots):
            return
        row = self.free_rows.pop()
        self.slots[row] = self._take(n)
        self.req_to_token[row, :n] = torch.tensor(self.slots[row], dtype=torch.int32)
        self.running[row] = n

    def step(self) -> tuple[ForwardBatch, torch.Tensor]:
        """Advance the scheduler one step; returns the decode batch and its queries."""
        for row, slots in self.drafts.items():  # last step's drafts: rejected, their slots back to the pool
            self.req_to_token[row, self.running[row] : self.running[row] + len(slots)] = 0
            self.free_slots += slots
        self.drafts = {}
        room = self.L - self.draft_slots
        for row in [r for r, n in self.running.items() if n >= room or self.rng.random() < 0.06]:
            self._finish(row)
        # a random walk pulled towards 40% of the largest batch, with bursts that overshoot it
        pull = 1 if self.target < 0.4 * self.max_batch else -1
        burst = 16 if self.rng.random() < 0.04 else 0
        self.target = max(0, min(self.max_batch, self.target + pull + burst + self.rng.choice([-3, -1, 0, 1, 3])))
        while len(self.running) < self.target and self.free_rows and len(self.free_slots) > 64 + self.L // 2:
            self._arrive()
        if not self.running or self.rng.random() < self.idle_prob:
            return ForwardBatch(ForwardMode.IDLE, 0), torch.zeros(0, *self.k_cache.shape[1:], device=self.device)
        rows = sorted(self.running)
        for row in rows:  # the token being decoded gets a slot; seq_lens include it
            (slot,) = self._take(1)
            self.slots[row].append(slot)
            self.req_to_token[row, self.running[row]] = slot
            self.running[row] += 1
            if self.draft_slots:
                n = self.running[row]
                self.drafts[row] = self._take(self.draft_slots)
                self.req_to_token[row, n : n + self.draft_slots] = torch.tensor(self.drafts[row], dtype=torch.int32)
        seq = torch.tensor([self.running[r] for r in rows], dtype=torch.int32)
        rpi = torch.tensor(rows, dtype=torch.int64)
        q = torch.randn(len(rows), *self.k_cache.shape[1:], generator=self.qgen).to(self.device)
        fb = ForwardBatch(ForwardMode.DECODE, len(rows), req_pool_indices=rpi.to(self.device),
                          seq_lens=seq.to(self.device), seq_lens_cpu=seq, seq_lens_sum=int(seq.sum()))
        return fb, q
