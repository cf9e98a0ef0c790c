"""Spot checks: run chosen settings on the real engine by the seeds' protocol and score the
prediction metric by metric and call kind by call kind (`protocol`); finished runs wait in
`<report>.runs/` for an interrupted confirm to resume (`runs`)."""
