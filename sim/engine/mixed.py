"""vLLM's one forward per iteration as a state transition (`sim.engine.work.Mixed`).

`MixedForward` is the part of `sim.engine.state.EngineState` that checks and applies a mixed
forward: every prompt row advances its request's prefill (the row that completes a prompt emits
its first token at the call's end; a recompute after a preemption emits none), every decode row
emits one token. The log keeps one call of kind "mixed": its rows (`rids`), each row's tokens
(`chunks`) and the tokens its cache held before (`contexts`), what a mixed call is priced by;
`batched` says whether a decode rode in it (a decode call, for the decode-completion gap).
"""
from __future__ import annotations

from sim.engine.log import Call, Column
from sim.engine.work import EngineError, Mixed


class MixedForward:
    """Mixed forwards on the engine state (queues, KV buffers, log, peak memory are the state's)."""

    def _check_mixed(self, work: Mixed) -> None:
        seen = set()
        if not work.rows:
            raise EngineError("a mixed forward with no rows")
        for rid, n in work.rows:
            if rid in seen:
                raise EngineError(f"mixed forward lists {rid!r} twice")
            seen.add(rid)
            if rid in self.ready:
                if n != 1 or self.ready[rid].pipelined:
                    raise EngineError(f"mixed forward: decode row {rid!r} of {n} tokens (a decode is one)")
            elif rid in self.queued:
                if not 1 <= n <= self.queued[rid].prefill_left:
                    raise EngineError(f"mixed forward: {n} tokens of {rid!r}, {self.queued[rid].prefill_left} left")
            else:
                raise EngineError(f"mixed forward: {rid!r} is not waiting or decoding (not arrived, or done)")

    def mixed_shape(self, work: Mixed) -> tuple[tuple[int, ...], tuple[int, ...], bool]:
        """Each row's tokens, the tokens its cache holds before the call, and whether a decode rides in it."""
        prefixes, decodes = [], False
        for rid, _ in work.rows:
            if rid in self.ready:
                prefixes.append(self.ready[rid].context - 1)
                decodes = True
            else:
                prefixes.append(self.queued[rid].prefilled)
        return tuple(n for _, n in work.rows), tuple(prefixes), decodes

    def _apply_mixed(self, work: Mixed, start: float, end: float) -> None:
        self._check_mixed(work)
        chunks, prefixes, decodes = self.mixed_shape(work)
        held = self.kv.resident() if self.memory is not None else 0
        _, (written, fresh) = self._kv_apply(work, 0)
        if self.memory is not None:
            self._peak(held, self._grown(held), "prefill", sum(chunks), max(prefixes), ())
        tokens = self.log.tokens
        for rid, n in work.rows:
            self.kv_used += n
            if rid in self.ready:
                s = self.ready[rid]
                s.generated += 1
                tokens[rid].append(end)
                if s.generated == s.req.output_len:
                    del self.ready[rid]
                    self.kv.finish(rid)
                    self.kv_used -= s.req.prompt_len + s.generated - 1
                    self.finished += 1
                    self.log.done(rid)
                continue
            s = self.queued[rid]
            s.prefilled += n
            if s.prefill_left == 0:
                del self.queued[rid]
                if s.generated:  # a recompute after a preemption: no token, it decodes on
                    self.ready[rid] = s
                    continue
                s.generated = 1
                tokens[rid].append(end)
                self._ready_or_finish(s)
        self.log.add(Call("mixed", start, end, tuple(r for r, _ in work.rows), sum(chunks), 0, prefixes, 0, 0,
                          self.iteration, written, decodes, fresh, chunks))

    def _steady_mixed(self, work: Mixed, steps: int, begin: list[float], end: list[float], held: int) -> Column:
        """`steps` forwards of the same decode rows (`sim.steady`): no row's buffer grows after the
        first, rows finish only at the last."""
        chunks, prefixes, _ = self.mixed_shape(work)
        _, (written, fresh) = self._kv_apply(work, 0)
        if self.memory is not None:  # the first forward allocates, the last holds that and attends the most
            self._peak(held, self._grown(held), "prefill", sum(chunks), max(prefixes), ())
            self._peak(self.kv.resident(), 0, "prefill", sum(chunks), max(prefixes) + steps - 1, ())
        rids = tuple(r for r, _ in work.rows)
        self.kv_used += steps * len(rids)
        for rid in rids:
            s = self.ready[rid]
            self.log.tokens[rid].extend(end)
            s.generated += steps
            if s.generated == s.req.output_len:
                del self.ready[rid]
                self.kv.finish(rid)
                self.kv_used -= s.req.prompt_len + s.generated - 1
                self.finished += 1
                self.log.done(rid)
        return Column("mixed", rids, len(rids), list(prefixes), begin, end, written, True, fresh)
