"""Timing the real engine: the grid of shapes (`grid`), the profilers that time it in shuffled,
resumable rounds (`profiler`, `mlxlm_profiler`, through `journal`), short engine runs timed
call by call (`engine_runs`, each in a fresh process: `worker`), and the speed probes that say
how fast the machine runs now against its calibration (`speed_probe`)."""
