"""What an engine call costs, in seconds, from its shape alone.

`price` is where a call's time is computed: the replay hands it the call and the engine state,
and it reads the shapes (tokens, prefix, contexts, KV rows written and fresh) and asks the cost
model (`model`: pdsim's forms and grids; `mlxlm`: BatchGenerator's calls; `copies`: KV buffer
writes). `profile` loads a calibration's profile (checked by `schema`) into a cost model;
`speed` moves a cost model to a machine that runs faster or slower than at calibration, and
`noise` draws each call's luck, as the calibration measured it."""
