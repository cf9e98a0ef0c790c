"""Scoring runs, simulated or measured, by one code path.

`registry` names every metric once (unit, definition, better direction); `scoring` scores an
event log by the seeds' definitions, through `tally` (bounded memory, `quantiles`);
`scored_log` tallies a long replay as it goes; `logfile` keeps a log on disk; `residuals` prices
every call of a measured run and says where a prediction misses, by call kind; `decisions`
compares a run's scheduling path with its replays'."""
