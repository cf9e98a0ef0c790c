"""The real engine on MLX: the Qwen3 model built with mlx-lm (`model`), its step functions
(`kernels`), pdsim's executor running a policy's calls on the shared state machine
(`executor`), mlx-lm's own batches and BatchGenerator driven by a trace (`mlxlm_batches`,
`batchgen`), and the correctness gate run before any timing (`gate`)."""
