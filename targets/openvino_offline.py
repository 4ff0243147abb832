"""Imported by a warm worker before it preloads openvino or nncf: their import sets up usage
statistics that count a user who never answered as consenting (``targets.openvino.decline_telemetry``),
so telemetry is declined for the process first, as a pass or session does before its own import."""

from targets.openvino import decline_telemetry

decline_telemetry()
