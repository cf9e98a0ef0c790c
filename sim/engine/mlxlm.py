"""mlx-lm's BatchGenerator as state transitions: its prompt batch and generation batch.

`MlxLmTransitions` is the part of `sim.engine.state.EngineState` that applies mlx-lm's calls
(`sim.engine.work`: `JoinPrompt`, `BatchPrefill`, `FirstForward`, `Generate`), checks that
each names exactly the rows its batch holds, and logs them. A `Generate` step returns to every
row the token its previous forward sampled (a one-step pipeline): `RequestState.pipelined`.
"""
from __future__ import annotations

from sim.engine.log import Call, Column
from sim.engine.work import BatchPrefill, EngineError, FirstForward, Generate, JoinPrompt, Work


class MlxLmTransitions:
    """mlx-lm's calls on the engine state; `stepped` (the generation batch's rows at its last
    step) and `_returned` (a `Generate`'s tokens, handed back when `next()` returns) are the state's."""

    @property
    def prompt_rows(self) -> tuple[str, ...]:
        """mlx-lm's prompt batch: the requests prefilling together, in the batch's order."""
        return tuple(self.kv.prompt.rows)

    def _check_mlx_lm(self, work: Work) -> None:
        """mlx-lm's calls: each names exactly the rows its batch holds, in the batch's order."""
        rows = self.prompt_rows
        if isinstance(work, JoinPrompt):
            for rid in work.rids:
                if rid not in self.queued or rid in rows or work.rids.count(rid) > 1:
                    raise EngineError(f"join of {rid!r}: not waiting (not arrived, already joined, or prefilled)")
                if self.queued[rid].prefilled:
                    raise EngineError(f"join of {rid!r}: part of its prompt ran on pdsim's engine")
        elif isinstance(work, BatchPrefill):
            if tuple(r for r, _ in work.rows) != rows:
                raise EngineError(f"batch prefill of {[r for r, _ in work.rows]}: the prompt batch holds {list(rows)} "
                                  "(every row prefills, in the batch's order)")
            for rid, n in work.rows:
                if not 1 <= n < self.queued[rid].prefill_left:
                    raise EngineError(f"batch prefill of {rid!r}: {n} tokens, {self.queued[rid].prefill_left} left "
                                      "(the last one is held back for the first forward)")
        elif isinstance(work, FirstForward):
            due = tuple(r for r in rows if self.queued[r].prefill_left == 1)
            if not work.rids or work.rids != due:
                raise EngineError(f"first forward of {list(work.rids)}: the prompt batch's rows with only their "
                                  f"last token left are {list(due)}")
        elif isinstance(work, Generate):
            if not work.rids or work.rids != tuple(self.ready) or not all(s.pipelined for s in self.ready.values()):
                raise EngineError(f"generate of {list(work.rids)}: the generation batch holds {list(self.ready)}")
        else:
            raise EngineError(f"unknown work {work!r}")

    def _apply_mlx_lm(self, work: Work, start: float, end: float) -> None:
        """An mlx-lm call (`sim.engine.work`). A `Generate`'s tokens are returned when `next()` returns:
        each later call of the same iteration moves their emission time to its own end."""
        self.check(work)
        it, returned = self._returned
        if it == self.iteration:
            for times in returned:
                times[-1] = end
        if isinstance(work, JoinPrompt):
            self.kv.join_prompt(work.rids)
            return
        idx = self.kv.prompt.idx  # the prompt batch's write position before the call (after any split)
        held = self.kv.resident() if self.memory is not None else 0
        if isinstance(work, BatchPrefill):
            _, (written, fresh) = self._kv_apply(work, 0)
            rids, chunks = tuple(r for r, _ in work.rows), tuple(n for _, n in work.rows)
            if self.memory is not None:
                self._peak(held, self.kv.call_largest, "prompt", max(chunks), idx, rids)
            self.log.add(Call("prompt", start, end, rids, max(chunks), idx,
                              tuple(self.queued[r].prefilled for r in rids), 0, 0, self.iteration, written, True,
                              fresh, chunks))
            for rid, n in work.rows:
                self.queued[rid].prefilled += n
            return
        _, (written, fresh) = self._kv_apply(work, 0)
        if isinstance(work, FirstForward):
            contexts = tuple(self.queued[r].req.prompt_len for r in work.rids)
            if self.memory is not None:
                self._peak(held, self.kv.call_largest, "first", len(contexts), 0, contexts)
            self.log.add(Call("first", start, end, work.rids, len(work.rids), 0, contexts, 0, 0, self.iteration,
                              written, True, fresh))
            for rid in work.rids:
                s = self.queued.pop(rid)
                s.prefilled, s.pipelined = s.req.prompt_len, True
                self.ready[rid] = s
            return
        states = [self.ready[r] for r in work.rids]
        contexts = tuple(s.context for s in states)
        if self.memory is not None:
            self._peak(held, self.kv.call_largest, "generate", len(states), 0, contexts)
        before = set(self.stepped)
        joined, left = sum(r not in before for r in work.rids), len(before - set(work.rids))
        self.log.add(Call("generate", start, end, work.rids, len(work.rids), 0, contexts,
                          joined, left, self.iteration, written, True, fresh))
        self.stepped = work.rids
        returned = []
        for s in states:
            s.generated += 1
            times = self.log.tokens[s.req.id]
            times.append(end)
            returned.append(times)
            if s.generated == s.req.output_len:
                del self.ready[s.req.id]
                self.finished += 1
        self._returned = (self.iteration, returned)

    def _steady_generate(self, w: Generate, steps: int, begin: list[float], end: list[float], held: int) -> Column:
        """`steps` generation steps of the same rows; rows leave only after the last."""
        states = [self.ready[r] for r in w.rids]
        written, fresh = self.kv.generate(w.rids, set())
        if self.memory is not None:
            first = tuple(s.context for s in states)
            self._peak(held, self.kv.call_largest, "generate", len(states), 0, first)
            self._peak(self.kv.resident(), 0, "generate", len(states), 0, tuple(c + steps - 1 for c in first))
        self.kv.gen.idx += steps - 1
        column = Column("generate", w.rids, len(w.rids), [s.context for s in states], begin, end, written, True, fresh)
        leaving = set()
        for s in states:
            self.log.tokens[s.req.id].extend(end)
            s.generated += steps
            if s.generated == s.req.output_len:
                del self.ready[s.req.id]
                self.finished += 1
                leaving.add(s.req.id)
        self.kv.leave_gen(leaving)
        self._returned = (-1, [])
        return column
