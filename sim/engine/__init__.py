"""The engine as a state machine, shared by the simulator and the real executor.

`work` names the calls a policy may ask for; `state` admits arrivals, checks each call and
advances the requests it touches, writing the event log (`log`); `kvlimit` admits and preempts
under a KV-cache limit; `mlxlm` follows mlx-lm's two batches; `kvcache` and `heap` follow the
KV buffers' sizes and where they lie in the process's memory (which calls copy, which meet
fresh pages); `memory` prices a call's peak memory. Nothing here decides (policies do) or
measures time (executors hand in start and end times)."""
