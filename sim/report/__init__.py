"""Reports: altair charts of sweeps, confirmations, calibrations and single runs, as one HTML page.

`sources` reads what a report is made from, `frames` turns it into small data frames, `charts`
draws each one, and `page` puts them on a self-contained page (no network needed to view it)
with a PNG per chart. Charts whose input was not given are skipped with a note.
"""
from sim.report.charts import (
                               calibration_chart,
                               confirm_chart,
                               confirm_error_chart,
                               ecdf_chart,
                               gap_percentile_chart,
                               timeline_chart,
                               tradeoff_chart,
)
from sim.report.frames import (
                               calibration_frame,
                               call_frame,
                               confirm_frame,
                               ecdf_frame,
                               gap_percentile_frame,
                               path_frame,
                               pick_marks,
                               timeline_frame,
                               tradeoff_frame,
)
from sim.report.page import Section, build_sections, make_report, write_report
from sim.report.sources import (
                               LogSeries,
                               ReportError,
                               Sweep,
                               load_confirm,
                               load_simulate,
                               load_sweep,
)

__all__ = ["LogSeries", "ReportError", "Section", "Sweep", "build_sections", "calibration_chart", "calibration_frame",
           "call_frame", "confirm_chart", "confirm_error_chart", "confirm_frame", "ecdf_chart", "ecdf_frame",
           "gap_percentile_chart", "gap_percentile_frame", "load_confirm", "load_simulate", "load_sweep", "make_report",
           "path_frame", "pick_marks", "timeline_chart", "timeline_frame", "tradeoff_chart", "tradeoff_frame",
           "write_report"]
