"""The eval runner's progress bars: one for generation, one for grading.

    gsm8k/cot generate:  40%|████      | 8/20 [00:12<00:18, 0.66sample/s, 41.3 tok/s]
    gsm8k/cot grade:     40%|████      | 8/20 [00:12<00:18, 0.66sample/s, acc 0.375, 0.002 s/sample]

The generation bar moves while a batch runs when the backend reports progress
(:data:`~anchored_reasoning.backends.ProgressFn`: the runner passes :meth:`PhaseBars.live`): one step per
finished sample, tokens/s counting the batch in flight; at the batch's end it shows the samples recorded.
"""
from __future__ import annotations

import time
from typing import Any

from tqdm.auto import tqdm


class PhaseBars:
    """Two bars for the two long phases: ``generate`` (samples, tokens/s of generation time alone)
    and ``grade`` (samples, accuracy so far, seconds per sample). Both start at the samples a
    resumed run already has."""

    #: seconds between redraws of the generation bar from :meth:`live`
    LIVE_INTERVAL = 0.5

    def __init__(self, total: int, done: int, records: list[dict[str, Any]], name: str, *, show: bool = True) -> None:
        self.correct = sum(bool(r.get("correct")) for r in records)
        self.n = len(records)
        self.graded_now = 0
        self.tokens = 0
        self.gen_seconds = 0.0
        self.grade_seconds = 0.0
        self._t = self._batch_t0 = self._drawn_t = time.perf_counter()
        self._live_done = self._live_tokens = self._live_shown = 0
        self._left = total - done  # samples not yet recorded (a disabled bar counts nothing itself)
        common = dict(total=total, initial=done, disable=not show, unit="sample", dynamic_ncols=True)
        self.gen = tqdm(desc=f"{name} generate", position=0, **common)
        self.grade = tqdm(desc=f"{name} grade", position=1, **common)

    def live(self, done: int, tokens: int) -> None:
        """A backend's report from inside a batch (:data:`~anchored_reasoning.backends.ProgressFn`)."""
        self._live_done += done
        self._live_tokens += tokens
        now = time.perf_counter()
        if not done and now - self._drawn_t < self.LIVE_INTERVAL:
            return
        self._drawn_t = now
        rate = (self.tokens + self._live_tokens) / max(self.gen_seconds + now - self._batch_t0, 1e-9)
        self.gen.set_postfix_str(f"{rate:.1f} tok/s", refresh=False)
        step = max(0, min(self._live_done, self._left) - self._live_shown)
        self._live_shown += step
        self.gen.update(step)
        self.gen.refresh()

    def generated(self, samples: int, tokens: int, seconds: float) -> None:
        self.tokens += tokens
        self.gen_seconds += seconds
        self.gen.set_postfix_str(f"{self.tokens / max(self.gen_seconds, 1e-9):.1f} tok/s", refresh=False)
        self.gen.update(samples - self._live_shown)  # what live() showed of this batch is already counted
        self._left -= samples
        self._live_done = self._live_tokens = self._live_shown = 0
        self._t = time.perf_counter()

    def graded(self, new: list[dict[str, Any]]) -> None:
        self.grade_seconds += time.perf_counter() - self._t
        self.n += len(new)
        self.correct += sum(bool(r["correct"]) for r in new)
        self.graded_now += len(new)
        self.grade.set_postfix_str(
            f"acc {self.correct / max(self.n, 1):.3f}, {self.grade_seconds / max(self.graded_now, 1):.3f} s/sample",
            refresh=False)
        self.grade.update(len(new))
        self._batch_t0 = time.perf_counter()  # the next batch's generation starts now

    def close(self) -> None:
        self.grade.close()
        self.gen.close()
