"""Reports: built from a recorder (measurements, diagnosis), written as JSON, rendered in the
terminal; the public :class:`Watch` (``redline.watch()``) adds ``report()`` to the recorder."""

from redline.report.build import build_report
from redline.report.json_io import schema, to_dict, write_json
from redline.report.terminal import print_report
from redline.report.watch import Watch

__all__ = ["Watch", "build_report", "print_report", "schema", "to_dict", "write_json"]
