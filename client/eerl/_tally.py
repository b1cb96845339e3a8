"""A phase's workload as reported: the tally behind ``report(...)`` of :class:`eerl.session.Phase` and
:class:`eerl.job.runner.JobPhase`.

Reports add up (``max_response_tokens`` and ``max_worker_kv_tokens`` keep the largest). Plain ints take the
fast path (the caller's thread, once per micro-batch); anything else is converted with
:func:`eerl.wire.limits.to_count`, and a value that is not a whole number counts 0 and is remembered in
``_rejected`` / ``_rejected_what`` for the sender to report.
"""

from __future__ import annotations

from eerl.phases import WORKLOAD_FIELDS, Workload
from eerl.wire.limits import to_count


class WorkloadTally:
    """The six workload counters and :meth:`report`; a base with slots, so a subclass pays nothing more."""

    __slots__ = (
        "_max_response_tokens",
        "_max_worker_kv_tokens",
        "_prompt_tokens",
        "_rejected",
        "_rejected_what",
        "_sequences",
        "_tokens",
        "_valid_tokens",
    )

    def __init__(self) -> None:
        self._tokens = 0
        self._valid_tokens = 0
        self._sequences = 0
        self._max_response_tokens = 0
        self._prompt_tokens = 0
        self._max_worker_kv_tokens = 0
        self._rejected = 0
        self._rejected_what = ""

    def report(
        self,
        tokens: int = 0,
        valid_tokens: int = 0,
        sequences: int = 0,
        max_response_tokens: int = 0,
        prompt_tokens: int = 0,
        *,
        max_worker_kv_tokens: int = 0,
    ) -> None:
        """Adds to the phase's workload (``max_response_tokens`` and ``max_worker_kv_tokens`` keep the
        largest value reported).

        Never raises. A value that is not a whole number (a NumPy or PyTorch integer scalar and an
        integral float are) is dropped; the totals are checked against the daemon's limits when the phase
        ends, and a bad one is clamped or dropped with one warning per kind (see ``docs/client.md``).
        """
        if (
            type(tokens) is int
            and type(valid_tokens) is int
            and type(sequences) is int
            and type(max_response_tokens) is int
            and type(prompt_tokens) is int
            and type(max_worker_kv_tokens) is int
        ):
            self._tokens += tokens
            self._valid_tokens += valid_tokens
            self._sequences += sequences
            self._max_response_tokens = max(self._max_response_tokens, max_response_tokens)
            self._prompt_tokens += prompt_tokens
            self._max_worker_kv_tokens = max(self._max_worker_kv_tokens, max_worker_kv_tokens)
            return
        self._report_numbers(
            tokens, valid_tokens, sequences, max_response_tokens, prompt_tokens, max_worker_kv_tokens
        )

    def report_workload(self, workload: Workload) -> None:
        """Adds a whole :class:`~eerl.Workload` (what a sidecar request or a framework batch counted), as
        :meth:`report` does."""
        self.report(
            workload.tokens,
            workload.valid_tokens,
            workload.sequences,
            workload.max_response_tokens,
            workload.prompt_tokens,
            max_worker_kv_tokens=workload.max_worker_kv_tokens,
        )

    def _report_numbers(self, *values: object) -> None:
        """The slow path of :meth:`report`: values that are not plain ints, converted or dropped."""
        counts: list[int] = []
        for name, value in zip(WORKLOAD_FIELDS, values, strict=True):
            count = to_count(value)
            if count is None:
                self._rejected += 1
                if not self._rejected_what:
                    self._rejected_what = f"{name} of type {type(value).__name__}"
                count = 0
            counts.append(count)
        *plain, kv = counts
        self.report(*plain, max_worker_kv_tokens=kv)

    @property
    def workload(self) -> Workload:
        """The workload reported so far."""
        return Workload(
            tokens=self._tokens,
            valid_tokens=self._valid_tokens,
            sequences=self._sequences,
            max_response_tokens=self._max_response_tokens,
            prompt_tokens=self._prompt_tokens,
            max_worker_kv_tokens=self._max_worker_kv_tokens,
        )


class ReportsToInnermost:
    """``report(...)`` of an owner of phases (a session, a job runner): to its innermost open phase, as
    that phase's own :meth:`WorkloadTally.report` takes it; ignored when none is open."""

    __slots__ = ()

    def _innermost(self) -> WorkloadTally | None:
        raise NotImplementedError

    def report(
        self,
        tokens: int = 0,
        valid_tokens: int = 0,
        sequences: int = 0,
        max_response_tokens: int = 0,
        prompt_tokens: int = 0,
        *,
        max_worker_kv_tokens: int = 0,
    ) -> None:
        """Reports to the innermost open phase; else ignored."""
        phase = self._innermost()
        if phase is not None:
            phase.report(
                tokens,
                valid_tokens,
                sequences,
                max_response_tokens,
                prompt_tokens,
                max_worker_kv_tokens=max_worker_kv_tokens,
            )
